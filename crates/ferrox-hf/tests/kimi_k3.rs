//! Hugging Face `kimi-k3` checkpoint directories (text model under `language_model.`,
//! config in `text_config`), written from the synthetic K3 GGUFs' weights, load into the
//! same engine with the same tensors and logits.

mod hf_checkpoint;
#[path = "../../ferrox-models/tests/synthetic/mod.rs"]
mod synthetic;

use ferrox_gguf::{GgmlType, Gguf};

#[test]
fn k3_directories_give_the_gguf_tensors_and_logits() {
    for &name in synthetic::kimi::K3_MODELS {
        let gguf = || Gguf::from_bytes(synthetic::kimi::gguf_bytes(name)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        hf_checkpoint::write_kimi_linear_dir(dir.path(), &gguf());
        let hf = ferrox_hf::open(dir.path()).unwrap();
        let reference = gguf();
        assert_eq!(hf.metadata().architecture().unwrap(), "kimi-k3");
        // K3 ends a turn with the config's EOS, not the tokenizer's.
        let config = hf_checkpoint::kimi_config(&reference);
        let eos = hf
            .metadata()
            .get_u32("tokenizer.ggml.eos_token_id")
            .unwrap();
        assert_eq!(u64::from(eos), config["text_config"]["eos_token_id"]);
        assert_eq!(hf.tensors().len(), reference.tensors().len(), "{name}");
        let trim = |s: &[u64]| -> Vec<u64> {
            let n = s.iter().rposition(|&d| d != 1).map_or(0, |i| i + 1);
            s[..n].to_vec()
        };
        for t in reference.tensors() {
            let h = hf.require_tensor(&t.name).unwrap();
            assert_eq!(h.ty, GgmlType::F32, "{name}: {}", t.name);
            assert_eq!(trim(&h.shape), trim(&t.shape), "{name}: {}", t.name);
            if !t.name.ends_with("ssm_a") {
                let (a, b) = (
                    hf.tensor_data(h).unwrap(),
                    reference.tensor_data(t).unwrap(),
                );
                assert_eq!(a, b, "{name}: {}", t.name);
            }
        }
        let tokens = synthetic::kimi::token_ids_of(name, 40);
        let (want, got) = (
            hf_checkpoint::all_logits(gguf(), &tokens),
            hf_checkpoint::all_logits(hf, &tokens),
        );
        let worst = want
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        eprintln!("{name}: directory vs GGUF, 40 positions, largest logit difference {worst:e}");
        assert!(worst <= 1e-6, "{name}: {worst}");
    }
}
