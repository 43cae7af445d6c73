//! The DeepSeek Sparse Attention engine (`deepseek32`, `glm-dsa`) on the synthetic models of
//! `synthetic/dsa.rs`, beyond the comparison with llama.cpp in `length_sweep.rs`:
//!
//! - a prompt prefilled as one batch gives the logits of the same tokens decoded one by one;
//! - sequences stepped together, and a prompt whose prefix comes from the prefix cache, give
//!   the logits of a cold solo run (the indexer keys are paged and shared with the latents);
//! - the memory holds a latent row per layer and an indexer key per full layer;
//! - the multi-token-prediction layer at the end of the files is never needed;
//! - bad metadata and missing tensors are clear errors, never panics.

mod synthetic;

#[path = "synthetic/hostile.rs"]
#[allow(dead_code)]
mod hostile;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use ferrox_core::KvStorage;
use ferrox_gguf::{Gguf, OwnedArray, OwnedValue};
use ferrox_memory::{MemoryShape, SequenceMemory};
use ferrox_models::{
    step_sequences, AnyEngine, DsaEngine, Engine, EngineExt, EngineOptions, LogitsFor, ModelError,
    SeqWork,
};

use synthetic::dsa::DSA_MODELS;

fn options(kv_storage: KvStorage) -> EngineOptions {
    EngineOptions {
        n_ctx: 256,
        threads: 2,
        kv_storage,
        ..EngineOptions::default()
    }
}

fn load(bytes: Vec<u8>) -> Result<AnyEngine, ModelError> {
    let gguf = Gguf::from_bytes(bytes)?;
    AnyEngine::from_gguf(Arc::new(gguf), &options(KvStorage::F32))
}

fn engine(name: &str, kv_storage: KvStorage) -> AnyEngine {
    let gguf = Gguf::from_bytes(synthetic::dsa::gguf_bytes(name)).unwrap();
    let e = AnyEngine::from_gguf(Arc::new(gguf), &options(kv_storage)).unwrap();
    assert!(e.downcast_ref::<DsaEngine>().is_some(), "{name}");
    e
}

/// Largest |a - b| / max(|b|, 1) over two logit rows.
fn relative_difference(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
        .fold(0.0, f32::max)
}

#[test]
fn prefill_equals_token_by_token() {
    for &name in DSA_MODELS {
        for storage in [KvStorage::F32, KvStorage::F16] {
            let e = engine(name, storage);
            let tokens = synthetic::dsa::token_ids(name, synthetic::SWEEP_TOKENS);
            let mut state = e.new_state().unwrap();
            let batch = e
                .forward_batch(&tokens, 0, &mut state, LogitsFor::All)
                .unwrap()
                .to_vec();
            let mut state = e.new_state().unwrap();
            let mut worst = 0.0f32;
            for (pos, &t) in tokens.iter().enumerate() {
                let step = e.forward_token(t, pos, &mut state).unwrap();
                let row = &batch[pos * step.len()..(pos + 1) * step.len()];
                worst = worst.max(relative_difference(row, step));
            }
            eprintln!("{name} ({storage:?}): prefill vs token by token {worst:.2e}");
            assert!(worst <= 1e-5, "{name} ({storage:?}): {worst}");
        }
    }
}

#[test]
fn indexer_keys_live_beside_the_latents() {
    for (name, n_layer, n_indexer) in [("deepseek32", 3, 3), ("glm-dsa", 4, 2)] {
        let spec = engine(name, KvStorage::F16).memory_spec();
        assert_eq!(spec.paged.len(), 2, "{name}");
        // The latent (64) and the rotated key (16) of every trunk layer.
        assert_eq!(
            (spec.paged[0].n_layers, spec.paged[0].key_width),
            (n_layer, 80)
        );
        // One indexer key (64) per layer that computes its own selection.
        assert_eq!(
            (spec.paged[1].n_layers, spec.paged[1].key_width),
            (n_indexer, 64)
        );
        assert!(spec.recurrent.is_none());
    }
}

/// Logits of `tokens` after `seq`'s positions, run alone.
fn run(
    e: &AnyEngine,
    m: &mut SequenceMemory,
    seq: ferrox_memory::SeqId,
    tokens: &[u32],
) -> Vec<f32> {
    let mut out = Vec::new();
    let work = [SeqWork {
        seq,
        tokens,
        logits: LogitsFor::Last,
        output: ferrox_models::Output::Logits,
        position_shift: 0,
    }];
    step_sequences(e, m, &mut e.new_scratch(), &work, &mut [&mut out]).unwrap();
    out
}

fn argmax(v: &[f32]) -> u32 {
    (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap() as u32
}

/// Greedy continuations of `prompts` stepped together (prompts in one step, then one token
/// per sequence per step): each sequence's logits at every step, and how many of its prompt
/// positions came from the prefix cache.
fn together(
    e: &AnyEngine,
    m: &mut SequenceMemory,
    prompts: &[Vec<u32>],
    n: usize,
) -> (Vec<Vec<Vec<f32>>>, Vec<usize>) {
    let admitted: Vec<_> = prompts.iter().map(|p| m.admit(p, 256).unwrap()).collect();
    let reused = admitted.iter().map(|a| a.reused).collect();
    let mut inputs: Vec<Vec<u32>> = prompts
        .iter()
        .zip(&admitted)
        .map(|(p, a)| p[a.reused..].to_vec())
        .collect();
    let mut logits = vec![Vec::new(); prompts.len()];
    for _ in 0..n {
        let work: Vec<SeqWork<'_>> = admitted
            .iter()
            .zip(&inputs)
            .map(|(a, tokens)| SeqWork {
                seq: a.seq,
                tokens,
                logits: LogitsFor::Last,
                output: ferrox_models::Output::Logits,
                position_shift: 0,
            })
            .collect();
        let mut out = vec![Vec::new(); prompts.len()];
        let mut refs: Vec<&mut Vec<f32>> = out.iter_mut().collect();
        step_sequences(e, m, &mut e.new_scratch(), &work, &mut refs).unwrap();
        inputs = out.iter().map(|l| vec![argmax(l)]).collect();
        for (all, l) in logits.iter_mut().zip(out) {
            all.push(l);
        }
    }
    for a in admitted {
        m.release(a.seq);
    }
    (logits, reused)
}

#[test]
fn batched_and_prefix_cached_sequences_match_solo_runs() {
    for &name in DSA_MODELS {
        let e = engine(name, KvStorage::F16);
        let shape = MemoryShape {
            n_blocks: 64,
            block_tokens: 16,
            max_sequences: 4,
            n_ctx: 256,
            prefix_cache: true,
        };
        let base = synthetic::dsa::token_ids(name, 120);
        let mut forked = base.clone();
        forked[100] = 7;
        let prompts = vec![base[..70].to_vec(), base.clone(), forked];
        let solo: Vec<_> = prompts
            .iter()
            .map(|p| {
                let mut m = SequenceMemory::new(e.memory_spec(), shape).unwrap();
                together(&e, &mut m, std::slice::from_ref(p), 8).0.remove(0)
            })
            .collect();
        // Warm the prefix cache with the longest prompt, then run all three together: the
        // second and third reuse its blocks (indexer keys included).
        let mut m = SequenceMemory::new(e.memory_spec(), shape).unwrap();
        let warm = m.admit(&base, 256).unwrap();
        run(&e, &mut m, warm.seq, &base);
        m.release(warm.seq);
        let (batched, reused) = together(&e, &mut m, &prompts, 8);
        // Whole blocks of 16 up to the prompt's end or the fork at position 100.
        assert_eq!(reused, [64, 112, 96], "{name}");
        for (i, (a, b)) in batched.iter().zip(&solo).enumerate() {
            for (step, (x, y)) in a.iter().zip(b).enumerate() {
                let d = relative_difference(x, y);
                assert!(d <= 1e-5, "{name}: sequence {i}, step {step}: {d}");
            }
        }
    }
}

/// `name`'s file with one key set to `value` (added if absent).
fn with(name: &str, key: &str, value: OwnedValue) -> Vec<u8> {
    let gguf = Gguf::from_bytes(synthetic::dsa::gguf_bytes(name)).unwrap();
    hostile::with_value(&gguf, key, value)
}

/// `name`'s file without the keys and tensors `drop` names.
fn without(name: &str, drop: impl Fn(&str) -> bool) -> Vec<u8> {
    let original = Gguf::from_bytes(synthetic::dsa::gguf_bytes(name)).unwrap();
    let mut w = ferrox_gguf::GgufWriter::new();
    for (key, value) in original.metadata().iter().filter(|(k, _)| !drop(k)) {
        w.set(key, value.to_owned_value());
    }
    for t in original.tensors().iter().filter(|t| !drop(&t.name)) {
        w.add_tensor(&t.name, t.ty, &t.shape, original.tensor_data(t).unwrap())
            .unwrap();
    }
    w.to_bytes()
}

fn error_of(bytes: Vec<u8>) -> String {
    match load(bytes) {
        Ok(_) => panic!("loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_indexer_metadata_is_a_clear_error() {
    let u32_key = |name: &str, key: &str, v: u32| with(name, key, OwnedValue::U32(v));
    let err = error_of(u32_key(
        "deepseek32",
        "deepseek32.attention.indexer.top_k",
        0,
    ));
    assert!(err.contains("deepseek32.attention.indexer.top_k"), "{err}");
    let err = error_of(u32_key(
        "glm-dsa",
        "glm-dsa.attention.indexer.head_count",
        0,
    ));
    assert!(err.contains("indexer.head_count"), "{err}");
    // Narrower than the 16 rotated dimensions, or wider than any head.
    for width in [8, 1 << 20] {
        let err = error_of(u32_key(
            "deepseek32",
            "deepseek32.attention.indexer.key_length",
            width,
        ));
        assert!(err.contains("indexer.key_length"), "{err}");
    }
    let flags = |v: Vec<bool>| OwnedValue::Array(OwnedArray::Bool(v));
    let types = "glm-dsa.attention.indexer.types";
    let err = error_of(with(
        "glm-dsa",
        types,
        flags(vec![false, true, true, false]),
    ));
    assert!(err.contains("layer 0"), "{err}");
    let err = error_of(with("glm-dsa", types, flags(vec![true, false, true])));
    assert!(err.contains("3 entries for 4 layers"), "{err}");
    let err = error_of(with("glm-dsa", types, OwnedValue::String("full".into())));
    assert!(err.contains(types), "{err}");
    // A full layer needs its indexer; deepseek32 needs its gating function.
    let err = error_of(with("glm-dsa", types, flags(vec![true, true, true, false])));
    assert!(err.contains("blk.1.indexer"), "{err}");
    let err = error_of(without("deepseek32", |k| k == "blk.2.indexer.proj.weight"));
    assert!(err.contains("blk.2.indexer.proj.weight"), "{err}");
    let err = error_of(without("deepseek32", |k| {
        k == "deepseek32.expert_gating_func"
    }));
    assert!(err.contains("deepseek32.expert_gating_func"), "{err}");
    let err = error_of(without("deepseek32", |k| {
        k == "deepseek32.attention.q_lora_rank"
    }));
    assert!(err.contains("q_lora_rank"), "{err}");
}

/// A file whose metadata declares its multi-token-prediction layer but holds none of its
/// tensors (the trunk split from the draft head) runs like the whole file: the trunk never
/// uses that layer.
#[test]
fn the_mtp_layer_is_not_needed() {
    for (name, mtp) in [("deepseek32", "blk.3."), ("glm-dsa", "blk.4.")] {
        let tokens = synthetic::dsa::token_ids(name, 48);
        let logits = |e: AnyEngine| {
            let mut state = e.new_state().unwrap();
            e.forward_batch(&tokens, 0, &mut state, LogitsFor::Last)
                .unwrap()
                .to_vec()
        };
        let whole = logits(engine(name, KvStorage::F32));
        let trunk = logits(load(without(name, |k| k.starts_with(mtp))).unwrap());
        assert_eq!(whole, trunk, "{name}");
    }
}

/// glm-dsa routes with sigmoid gating when the file does not say (the file states 2,
/// sigmoid): the same logits without the key.
#[test]
fn glm_dsa_gates_with_sigmoid_by_default() {
    let tokens = synthetic::dsa::token_ids("glm-dsa", 40);
    let logits = |e: AnyEngine| {
        let mut state = e.new_state().unwrap();
        e.forward_batch(&tokens, 0, &mut state, LogitsFor::Last)
            .unwrap()
            .to_vec()
    };
    let stated = logits(engine("glm-dsa", KvStorage::F32));
    let default = logits(load(without("glm-dsa", |k| k == "glm-dsa.expert_gating_func")).unwrap());
    assert_eq!(stated, default);
}

/// Integer index types and scalar flags are read as llama.cpp reads them, and a shared
/// layer's indexer tensors, when a file has them, are not needed.
#[test]
fn indexer_types_in_every_form() {
    let types = "glm-dsa.attention.indexer.types";
    let ints = OwnedValue::Array(OwnedArray::I32(vec![1, 0, 5, 0]));
    let as_ints = load(with("glm-dsa", types, ints)).unwrap();
    let all_full = load(with("glm-dsa", types, OwnedValue::Bool(true)));
    assert!(all_full.is_err(), "the shared layers' indexers are absent");
    let spec = as_ints.memory_spec();
    assert_eq!(spec.paged[1].n_layers, 2);
    // Without the key, a GLM-5 context (under 2^20) means every layer full.
    let err = error_of(without("glm-dsa", |k| k == types));
    assert!(err.contains("blk.1.indexer"), "{err}");
}

/// Every integer key of the DSA files set to absurd values loads with an error or runs;
/// nothing panics.
#[test]
fn hostile_counts_never_panic() {
    for &name in DSA_MODELS {
        let gguf = Gguf::from_bytes(synthetic::dsa::gguf_bytes(name)).unwrap();
        for key in hostile::count_keys(&gguf) {
            let indices: Vec<Option<usize>> = match key.array_len {
                Some(n) => (0..n).map(Some).collect(),
                None => vec![None],
            };
            for index in indices {
                for &value in hostile::HOSTILE_VALUES {
                    let Some(bytes) = hostile::try_with_count(&gguf, &key.key, index, value) else {
                        continue;
                    };
                    let outcome = catch_unwind(AssertUnwindSafe(|| {
                        let options = EngineOptions {
                            n_ctx: 64,
                            threads: 1,
                            ..EngineOptions::default()
                        };
                        let Ok(gguf) = Gguf::from_bytes(bytes) else {
                            return;
                        };
                        if let Ok(e) = AnyEngine::from_gguf(Arc::new(gguf), &options) {
                            let mut state = e.new_state().unwrap();
                            let _ = e.forward_batch(&[1, 5, 9], 0, &mut state, LogitsFor::Last);
                        }
                    }));
                    assert!(outcome.is_ok(), "{name}: {} [{index:?}] = {value}", key.key);
                }
            }
        }
    }
}
