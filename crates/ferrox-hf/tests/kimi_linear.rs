//! A Hugging Face `kimi-linear` checkpoint directory, written from the synthetic GGUF's
//! weights (`hf_checkpoint`), loads into the same engine with the same logits; its
//! tiktoken tokenizer gives hand-derived ids; broken directories give errors that name
//! what is wrong.

mod hf_checkpoint;
#[path = "../../ferrox-models/tests/synthetic/mod.rs"]
mod synthetic;

use std::path::Path;

use ferrox_gguf::{GgmlType, Gguf};
use ferrox_tokenizer::tokenizer::Tokenizer;
use hf_checkpoint::*;
use safetensors::Dtype;

fn fixture() -> Gguf {
    Gguf::from_bytes(synthetic::kimi::kimi_linear_gguf_bytes()).unwrap()
}

fn written_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_kimi_linear_dir(dir.path(), &fixture());
    dir
}

/// The largest difference between two tensors' values (F32).
fn max_diff(a: &[u8], b: &[u8]) -> f32 {
    let f = |x: &[u8]| -> Vec<f32> {
        x.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    f(a).iter()
        .zip(f(b))
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn every_tensor_is_the_gguf_tensor() {
    let dir = written_dir();
    let hf = ferrox_hf::open(dir.path()).unwrap();
    let gguf = fixture();
    assert_eq!(hf.metadata().architecture().unwrap(), "kimi-linear");
    assert_eq!(hf.tensors().len(), gguf.tensors().len());
    let trim = |s: &[u64]| -> Vec<u64> {
        let n = s.iter().rposition(|&d| d != 1).map_or(0, |i| i + 1);
        s[..n].to_vec()
    };
    for t in gguf.tensors() {
        let h = hf.require_tensor(&t.name).unwrap();
        assert_eq!(h.ty, GgmlType::F32, "{}", t.name);
        assert_eq!(trim(&h.shape), trim(&t.shape), "{}", t.name);
        let (a, b) = (hf.tensor_data(h).unwrap(), gguf.tensor_data(t).unwrap());
        if t.name.ends_with("ssm_a") {
            // exp(ln(x)) in f32 may land one step off.
            assert!(max_diff(a, b) <= 1e-6, "{}", t.name);
        } else {
            assert_eq!(a, b, "{}", t.name);
        }
    }
}

#[test]
fn directory_gives_the_gguf_logits() {
    let dir = written_dir();
    let tokens = synthetic::kimi::token_ids(40);
    let from_gguf = hf_checkpoint::all_logits(fixture(), &tokens);
    let from_dir = hf_checkpoint::all_logits(ferrox_hf::open(dir.path()).unwrap(), &tokens);
    assert_eq!(from_gguf.len(), from_dir.len());
    let worst = from_gguf
        .iter()
        .zip(&from_dir)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    eprintln!("kimi-linear: directory vs GGUF, 40 positions, largest logit difference {worst:e}");
    assert!(worst <= 1e-6, "{worst}");
}

#[test]
fn tiktoken_tokenizer_gives_hand_derived_ids() {
    let dir = written_dir();
    let hf = ferrox_hf::open(dir.path()).unwrap();
    let tok = Tokenizer::from_gguf(&hf).unwrap();
    let vocab = tok.vocab();
    let first_special = 256 + MERGED.len() as u32;
    assert_eq!(vocab.len(), 288);
    assert_eq!(vocab.bos(), Some(first_special));
    assert_eq!(vocab.eos(), Some(first_special + 2), "<|im_end|>");
    let meta = hf.metadata();
    let template = meta.get_str("tokenizer.chat_template").unwrap();
    assert_eq!(template, CHAT_TEMPLATE);
    assert_eq!(tok.token_to_piece(287), b"<|reserved_token_287|>");

    // Ranks: bytes are their own values; "he" 256, "ll" 257, "llo" 258, "hello" 259,
    // " w" 260, "or" 261, " wor" 262, "ld" 263, " world" 264, "in" 265, "ing" 266,
    // " t" 267, "th" 268, " th" 269. BPE on each pre-tokenized word, lowest rank first:
    // "the" is t + he (no "the" token), " thing" is " th" + "ing".
    let cases: &[(&str, &[u32])] = &[
        ("hello world", &[259, 264]),
        ("the thing", &[116, 256, 269, 266]),
        ("hi", &[104, 105]),
        ("日本", &[0xe6, 0x97, 0xa5, 0xe6, 0x9c, 0xac]),
        ("hello\n\nworld", &[259, 10, 10, 119, 261, 263]),
    ];
    for (text, ids) in cases {
        assert_eq!(tok.encode(text, false, false), *ids, "{text:?}");
    }
    assert_eq!(
        tok.encode("[BOS]hello<|im_end|>", false, true),
        [first_special, 259, first_special + 2]
    );
    for text in [
        "hello world",
        "Tiếng Việt, 中文 and emoji 🦀\r\n\ttabs",
        "  leading spaces and 12345 digits",
    ] {
        assert_eq!(tok.decode(&tok.encode(text, false, false)), text);
    }
}

fn open_err(dir: &Path) -> String {
    match ferrox_hf::open(dir) {
        Ok(_) => panic!("{} opened", dir.display()),
        Err(e) => {
            eprintln!("error: {e}");
            e.to_string()
        }
    }
}

#[test]
fn a_missing_shard_is_named() {
    let dir = written_dir();
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let e = open_err(dir.path());
    assert!(e.contains("model-00002-of-00002.safetensors"), "{e}");
    assert!(e.contains("missing"), "{e}");
}

#[test]
fn a_wrong_shape_is_named() {
    let dir = tempfile::tempdir().unwrap();
    write_kimi_linear_dir(dir.path(), &fixture());
    let mut tensors = kimi_linear_tensors(&fixture());
    let name = "model.layers.1.self_attn.f_a_proj.weight";
    tensors.get_mut(name).unwrap().1.swap(0, 1);
    write_shards(dir.path(), &tensors, 2);
    let e = open_err(dir.path());
    assert!(e.contains(name) && e.contains("shape"), "{e}");
}

#[test]
fn an_unknown_architecture_is_named() {
    let dir = written_dir();
    let mut config = kimi_linear_config(&fixture());
    config["architectures"] = serde_json::json!(["FooForCausalLM"]);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let e = open_err(dir.path());
    assert!(e.contains("FooForCausalLM"), "{e}");
    assert!(e.contains("KimiLinearForCausalLM"), "{e}");
}

#[test]
fn an_unsupported_dtype_is_named() {
    let dir = written_dir();
    let mut tensors = kimi_linear_tensors(&fixture());
    let name = "model.norm.weight";
    let entry = tensors.get_mut(name).unwrap();
    entry.0 = Dtype::I32;
    write_shards(dir.path(), &tensors, 2);
    let e = open_err(dir.path());
    assert!(e.contains(name) && e.contains("I32"), "{e}");
}

#[test]
fn bf16_stays_mapped_and_fp8_is_decoded_with_its_scales() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = fixture();
    let mut config = kimi_linear_config(&gguf);
    config["quantization_config"] =
        serde_json::json!({"quant_method": "fp8", "weight_block_size": [128, 128]});
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    std::fs::write(dir.path().join("tiktoken.model"), tiktoken_model()).unwrap();
    let mut tensors = kimi_linear_tensors(&gguf);

    // A BF16 norm: used as stored.
    let norm = tensors.get_mut("model.norm.weight").unwrap();
    let bf16: Vec<u8> = norm
        .2
        .chunks_exact(4)
        .flat_map(|c| {
            half::bf16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes()
        })
        .collect();
    *norm = (Dtype::BF16, norm.1.clone(), bf16.clone());

    // An FP8 matrix [256, 128]: every value 1.0 (0x38), row blocks scaled 0.5 and 2.0.
    let gate = "model.layers.0.mlp.gate_proj.weight";
    let (rows, cols) = (256, 128);
    tensors.insert(
        gate.into(),
        (Dtype::F8_E4M3, vec![rows, cols], vec![0x38; rows * cols]),
    );
    let scales: Vec<u8> = [0.5f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    tensors.insert(
        format!("{gate}_scale_inv"),
        (Dtype::F32, vec![2, 1], scales),
    );
    write_shards(dir.path(), &tensors, 1);

    let hf = ferrox_hf::open(dir.path()).unwrap();
    let norm = hf.require_tensor("output_norm.weight").unwrap();
    assert_eq!(norm.ty, GgmlType::Bf16);
    assert_eq!(hf.tensor_data(norm).unwrap(), &bf16[..]);
    let paths: Vec<_> = hf.paths().collect();
    assert_eq!(paths, [dir.path().join("model.safetensors")]);

    let gate = hf.require_tensor("blk.0.ffn_gate.weight").unwrap();
    assert_eq!(gate.ty, GgmlType::Bf16);
    let values: Vec<f32> = hf
        .tensor_data(gate)
        .unwrap()
        .chunks_exact(2)
        .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect();
    assert!(values[..128 * cols].iter().all(|&v| v == 0.5));
    assert!(values[128 * cols..].iter().all(|&v| v == 2.0));
}

#[test]
fn a_malformed_safetensors_header_is_an_error() {
    let dir = written_dir();
    let path = dir.path().join("model-00001-of-00002.safetensors");
    // A header claiming far more bytes than the file has.
    let mut bytes = u64::MAX.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    std::fs::write(&path, bytes).unwrap();
    let e = open_err(dir.path());
    assert!(e.contains("model-00001-of-00002.safetensors"), "{e}");
}

#[test]
fn hostile_config_values_are_errors() {
    for (key, value) in [
        ("num_experts", serde_json::json!(4_294_967_295u64)),
        ("vocab_size", serde_json::json!(4_000_000_000u64)),
        ("num_hidden_layers", serde_json::json!(100_000)),
        ("hidden_size", serde_json::json!(-1)),
        ("linear_attn_config", serde_json::json!([])),
    ] {
        let dir = written_dir();
        let mut config = kimi_linear_config(&fixture());
        config[key] = value;
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        let e = open_err(dir.path());
        assert!(e.contains(key), "{key}: {e}");
    }
}

#[test]
fn an_index_naming_files_elsewhere_or_misplacing_tensors_is_an_error() {
    let dir = written_dir();
    let index_path = dir.path().join("model.safetensors.index.json");
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&index_path).unwrap()).unwrap();

    let mut escaping = index.clone();
    escaping["weight_map"]["model.norm.weight"] = serde_json::json!("../model.safetensors");
    std::fs::write(&index_path, escaping.to_string()).unwrap();
    let e = open_err(dir.path());
    assert!(e.contains("not a plain file name"), "{e}");

    let mut misplaced = index.clone();
    let map = misplaced["weight_map"].as_object_mut().unwrap();
    let (name, file) = map
        .iter()
        .next()
        .map(|(k, v)| (k.clone(), v.clone()))
        .unwrap();
    let other = if file == "model-00001-of-00002.safetensors" {
        "model-00002-of-00002.safetensors"
    } else {
        "model-00001-of-00002.safetensors"
    };
    map.insert(name.clone(), other.into());
    std::fs::write(&index_path, misplaced.to_string()).unwrap();
    let e = open_err(dir.path());
    assert!(e.contains(&name) && e.contains(other), "{e}");
}
