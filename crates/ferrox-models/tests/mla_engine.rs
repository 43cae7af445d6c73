//! The MLA engine's state on the synthetic deepseek2/mistral4 models: what the cache holds
//! per token, and rolling a sequence back.

mod synthetic;

use std::sync::Arc;

use ferrox_core::KvStorage;
use ferrox_gguf::Gguf;
use ferrox_models::EngineExt;
use ferrox_models::{AttentionPath, Engine, EngineOptions, LogitsFor, MlaEngine};

fn engine(name: &str, kv_storage: KvStorage) -> MlaEngine {
    let gguf = Gguf::from_bytes(synthetic::gguf_bytes(name)).expect("parse");
    let options = EngineOptions {
        n_ctx: 96,
        threads: 2,
        kv_storage,
        ..EngineOptions::default()
    };
    ferrox_models::load_as::<MlaEngine>(Arc::new(gguf), &options).expect("MLA engine")
}

#[test]
fn cache_holds_only_the_latent_and_the_rope_part() {
    for &name in synthetic::MLA_MODELS {
        let spec = synthetic::spec(name);
        let mla = spec.mla.as_ref().unwrap();
        for (storage, elem) in [(KvStorage::F16, 2), (KvStorage::F32, 4)] {
            let e = engine(name, storage);
            let c = e.config();
            assert_eq!((c.kv_lora_rank, c.n_rot), (mla.kv_lora_rank, mla.qk_rope));
            let state = e.new_state().unwrap();
            let per_token = (mla.kv_lora_rank + mla.qk_rope) * spec.n_layer * elem;
            assert_eq!(state.bytes_per_position(), per_token as f64, "{name}");
            // What a per-head key and value cache would need instead.
            let per_head = spec.n_head * (mla.qk_nope + mla.qk_rope + mla.v_head);
            assert!(per_token * 3 < per_head * spec.n_layer * elem, "{name}");
        }
    }
}

#[test]
fn a_quantized_latent_cache_takes_its_blocks_where_it_is_built() {
    use ferrox_core::KvType;
    // `-ctk q8_0`: the latent rows as Q8_0 blocks of 32 (34 bytes), whatever `-ctv` says (the
    // rows hold the values too).
    let mut storage = KvStorage::uniform(KvType::Q8_0);
    storage.values = KvType::F16;
    let spec = synthetic::spec("deepseek2");
    let mla = spec.mla.as_ref().unwrap();
    let e = engine("deepseek2", storage);
    let width = mla.kv_lora_rank + mla.qk_rope;
    let per_token = width / 32 * 34 * spec.n_layer;
    let state = e.new_state().unwrap();
    assert_eq!(state.bytes_per_position(), per_token as f64);
    // Refused by name: an `attn_kv_b` file (llama.cpp caches whole heads for it), and the
    // multi-token-prediction block (its stored states would be rounded with the cache).
    let refused = |name: &str, mtp: bool| {
        let gguf = Gguf::from_bytes(synthetic::gguf_bytes(name)).expect("parse");
        let options = EngineOptions {
            n_ctx: 96,
            threads: 2,
            kv_storage: KvStorage::uniform(KvType::Q8_0),
            mtp,
            ..EngineOptions::default()
        };
        ferrox_models::load_as::<MlaEngine>(Arc::new(gguf), &options)
            .err()
            .expect("refused")
            .to_string()
    };
    assert!(refused("deepseek2-kvb", false).contains("attn_kv_b"));
    assert!(refused("deepseek2-mtp", true).contains("multi-token-prediction"));
}

#[test]
fn truncation_rolls_the_sequence_back() {
    let e = engine("deepseek2-v3", KvStorage::F16);
    let tokens = synthetic::token_ids("deepseek2-v3");
    // Token by token after a 20-token prompt, straight through.
    let continue_from_20 = |state: &mut ferrox_models::State| -> Vec<f32> {
        (20..48)
            .flat_map(|pos| e.forward_token(tokens[pos], pos, state).unwrap().to_vec())
            .collect()
    };
    let mut straight = e.new_state().unwrap();
    e.forward_batch(&tokens[..20], 0, &mut straight, LogitsFor::Last)
        .unwrap();
    let expected = continue_from_20(&mut straight);

    // The same after going down another path and rolling back: identical logits.
    let mut state = e.new_state().unwrap();
    e.forward_batch(&tokens[..20], 0, &mut state, LogitsFor::Last)
        .unwrap();
    e.forward_batch(&tokens[30..40], 20, &mut state, LogitsFor::Last)
        .unwrap();
    state.truncate(20).unwrap();
    assert_eq!(state.len(), 20);
    assert_eq!(continue_from_20(&mut state), expected);
    assert_eq!(state.len(), 48);
    let next = e
        .forward_token(tokens[48], 48, &mut state)
        .unwrap()
        .to_vec();
    assert_eq!(
        next,
        e.forward_token(tokens[48], 48, &mut straight).unwrap()
    );
    assert!(e.forward_token(tokens[0], 7, &mut straight).is_err());
}

/// `name`'s synthetic file without the keys and tensors `drop` rejects.
fn without(
    name: &str,
    drop: impl Fn(&str) -> bool,
) -> Result<MlaEngine, ferrox_models::ModelError> {
    let original = Gguf::from_bytes(synthetic::gguf_bytes(name)).unwrap();
    let mut w = ferrox_gguf::GgufWriter::new();
    for (key, value) in original.metadata().iter().filter(|(k, _)| !drop(k)) {
        w.set(key, value.to_owned_value());
    }
    for t in original.tensors().iter().filter(|t| !drop(&t.name)) {
        w.add_tensor(&t.name, t.ty, &t.shape, original.tensor_data(t).unwrap())
            .unwrap();
    }
    let options = EngineOptions {
        n_ctx: 16,
        threads: 1,
        ..Default::default()
    };
    ferrox_models::load_as::<MlaEngine>(Arc::new(Gguf::from_bytes(w.to_bytes()).unwrap()), &options)
}

#[test]
fn what_is_missing_is_named() {
    let err = without("deepseek2", |k| k == "blk.1.attn_v_b.weight")
        .err()
        .unwrap();
    assert!(
        matches!(&err, ferrox_models::ModelError::MissingTensor(t) if t == "blk.1.attn_v_b.weight"),
        "{err}"
    );
    let err = without("mistral4", |k| k == "mistral4.attention.kv_lora_rank")
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("mistral4.attention.kv_lora_rank"),
        "{err}"
    );
    let err = without("deepseek2", |k| k == "deepseek2.attention.value_length_mla")
        .err()
        .unwrap();
    assert!(err.to_string().contains("value_length_mla"), "{err}");
    let err = without("mistral4", |k| k == "mistral4.attention.temperature_length")
        .err()
        .unwrap();
    assert!(err.to_string().contains("temperature_length"), "{err}");
}

/// By default a prompt takes llama.cpp's form for the file (absorbed with split
/// `attn_k_b`/`attn_v_b`, decompressed with a legacy `attn_kv_b`) and single tokens the
/// absorbed one.
#[test]
fn prompts_take_the_files_form_and_single_tokens_absorb() {
    for (name, native) in [
        ("deepseek2", AttentionPath::Absorbed),
        ("deepseek2-kvb", AttentionPath::Decompressed),
    ] {
        let mut e = engine(name, KvStorage::F16);
        let tokens = synthetic::token_ids(name);
        // The 64-token prompt's logits, then one more token's.
        let run = |e: &MlaEngine| {
            let mut state = e.new_state().unwrap();
            let batch = e
                .forward_batch(&tokens, 0, &mut state, LogitsFor::All)
                .unwrap()
                .to_vec();
            (batch, state)
        };
        let (auto_batch, mut auto_state) = run(&e);
        let auto_next = e
            .forward_token(tokens[1], tokens.len(), &mut auto_state)
            .unwrap()
            .to_vec();
        e.set_attention_path(native);
        let (forced, mut state) = run(&e);
        e.set_attention_path(AttentionPath::Absorbed);
        let absorbed_next = e
            .forward_token(tokens[1], tokens.len(), &mut state)
            .unwrap();
        assert_eq!(auto_batch, forced, "{name}");
        assert_eq!(auto_next, absorbed_next, "{name}");
    }
}

#[test]
fn long_prompts_run_in_micro_batches_with_the_same_logits() {
    let gguf = Gguf::from_bytes(synthetic::gguf_bytes("deepseek2-lite")).expect("parse");
    let options = EngineOptions {
        n_ctx: 700,
        threads: 2,
        kv_storage: KvStorage::F16,
        ..EngineOptions::default()
    };
    let mut e = ferrox_models::load_as::<MlaEngine>(Arc::new(gguf), &options).unwrap();
    let n_vocab = e.vocab_size();
    // 600 tokens: more than one 512-token micro-batch. Each form of attention gives a
    // token the same logits however the prompt is cut (the default picks a form per cut).
    let tokens: Vec<u32> = (0..600u32).map(|i| 3 + (i * 97 + 11) % 270).collect();
    for path in [AttentionPath::Absorbed, AttentionPath::Decompressed] {
        e.set_attention_path(path);
        let mut one = e.new_state().unwrap();
        let all = e
            .forward_batch(&tokens, 0, &mut one, LogitsFor::From(250))
            .unwrap()
            .to_vec();
        assert_eq!(all.len(), 350 * n_vocab);
        let mut split = e.new_state().unwrap();
        e.forward_batch(&tokens[..300], 0, &mut split, LogitsFor::Last)
            .unwrap();
        let tail = e
            .forward_batch(&tokens[300..], 300, &mut split, LogitsFor::All)
            .unwrap();
        assert!(
            tail == &all[50 * n_vocab..],
            "{path:?}: logits depend on the cut"
        );
    }
}
