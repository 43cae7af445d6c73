//! The DeepSeek-V4 engine (`deepseek4`) on the synthetic model of `synthetic/deepseek4.rs`,
//! beyond the comparison with llama.cpp in `length_sweep.rs`:
//!
//! - a prompt prefilled as one batch gives the logits of the same tokens decoded one by one;
//! - sequences stepped together, and a prompt whose prefix comes from the prefix cache, give
//!   the logits of a cold solo run (compressed rows are paged and shared, the rings start
//!   from the block-end checkpoint of the shared prefix);
//! - a sequence rolled back by up to the rings' slack continues as if it had never gone
//!   further, and a longer rollback is refused;
//! - the memory holds exactly what the formula says;
//! - bad metadata and tensors are clear errors, and absurd counts never panic.

mod synthetic;

#[path = "synthetic/hostile.rs"]
#[allow(dead_code)]
mod hostile;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use ferrox_core::KvStorage;
use ferrox_gguf::{GgmlType, Gguf, OwnedArray, OwnedValue};
use ferrox_memory::{MemoryShape, SequenceMemory};
use ferrox_models::{
    step_sequences, AnyEngine, Deepseek4Engine, Engine, EngineExt, EngineOptions, LogitsFor,
    ModelError, SeqWork,
};

use synthetic::deepseek4 as ds4;

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

fn engine(kv_storage: KvStorage) -> AnyEngine {
    let gguf = Gguf::from_bytes(ds4::gguf_bytes()).unwrap();
    let e = AnyEngine::from_gguf(Arc::new(gguf), &options(kv_storage)).unwrap();
    assert!(e.downcast_ref::<Deepseek4Engine>().is_some());
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
    for storage in [KvStorage::F32, KvStorage::F16] {
        let e = engine(storage);
        let tokens = ds4::token_ids(synthetic::SWEEP_TOKENS);
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
        eprintln!("deepseek4 ({storage:?}): prefill vs token by token {worst:.2e}");
        assert!(worst <= 1e-5, "{storage:?}: {worst}");
    }
}

/// Paged, one row per compressor block: per ratio-4 layer a compressed row (D) and an
/// indexer key (Di) every 4 positions, per ratio-128 layer a compressed row every 128. Per
/// sequence, in f32: every layer's raw ring (W + slack rows of D), each ratio-4 layer's two
/// compressor rings ((8 + slack) entries of 4·D and of 4·Di) and each ratio-128 layer's
/// ((128 + slack) entries of 2·D).
#[test]
fn memory_follows_the_formula() {
    let (d, di, w) = (ds4::HEAD_DIM, ds4::INDEXER_DIM, ds4::WINDOW);
    let slack = ferrox_models::deepseek4::RING_SLACK;
    let n_layer = ds4::RATIOS.len();
    let csa = ds4::RATIOS.iter().filter(|&&r| r == 4).count();
    let hca = ds4::RATIOS.iter().filter(|&&r| r == 128).count();
    let state =
        n_layer * (w + slack) * d + csa * (8 + slack) * 4 * (d + di) + hca * (128 + slack) * 2 * d;
    for (storage, bytes) in [(KvStorage::F32, 4), (KvStorage::F16, 2)] {
        let spec = engine(storage).memory_spec();
        let long_run = (csa * (d + di)) as f64 / 4.0 + (hca * d) as f64 / 128.0;
        assert_eq!(spec.bytes_per_position(), long_run * bytes as f64);
        // A block of 16 positions: 4 rows of each ratio-4 store, one slot of the 128x one.
        assert_eq!(
            spec.bytes_per_block(16),
            (csa * 4 * (d + di) + hca * d) * bytes
        );
        assert_eq!(spec.recurrent_bytes(), state * 4, "{storage:?}");
        assert_eq!(spec.rollback_reach(), slack);
        let shapes: Vec<_> = spec
            .paged
            .iter()
            .map(|s| (s.n_layers, s.key_width, s.value_width, s.stride))
            .collect();
        assert_eq!(shapes, [(csa, d, 0, 4), (hca, d, 0, 128), (csa, di, 0, 4)]);
        // A solo sequence of 256 positions: 64 rows of each ratio-4 store, 2 of the 128x.
        let memory = SequenceMemory::solo(spec, 256).unwrap();
        assert_eq!(
            memory.reserved_bytes(),
            (csa * 64 * (d + di) + hca * 2 * d) * bytes + state * 4
        );
    }
}

fn argmax(v: &[f32]) -> u32 {
    (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap() as u32
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

/// Greedy continuations of `prompts` stepped together: each sequence's logits at every step,
/// and how many of its prompt positions came from the prefix cache.
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
    let e = engine(KvStorage::F16);
    let shape = MemoryShape {
        n_blocks: 64,
        block_tokens: 16,
        max_sequences: 4,
        n_ctx: 256,
        prefix_cache: true,
    };
    let base = ds4::token_ids(150);
    let mut forked = base.clone();
    forked[130] = 7;
    let prompts = vec![base[..70].to_vec(), base.clone(), forked];
    let solo: Vec<_> = prompts
        .iter()
        .map(|p| {
            let mut m = SequenceMemory::new(e.memory_spec(), shape).unwrap();
            together(&e, &mut m, std::slice::from_ref(p), 8).0.remove(0)
        })
        .collect();
    // Warm the prefix cache with the longest prompt, then run all three together: the
    // second and third reuse its blocks (compressor rows and the 128x row at 127 included).
    let mut m = SequenceMemory::new(e.memory_spec(), shape).unwrap();
    let warm = m.admit(&base, 256).unwrap();
    run(&e, &mut m, warm.seq, &base);
    m.release(warm.seq);
    let (batched, reused) = together(&e, &mut m, &prompts, 8);
    // Whole blocks of 16 up to the prompt's end or the fork at position 130.
    assert_eq!(reused, [64, 144, 128]);
    for (i, (a, b)) in batched.iter().zip(&solo).enumerate() {
        for (step, (x, y)) in a.iter().zip(b).enumerate() {
            let d = relative_difference(x, y);
            assert!(d <= 1e-5, "sequence {i}, step {step}: {d}");
        }
    }
}

/// Rolled back by up to the rings' slack from the furthest position they were written to
/// (inside a compressor block, at a block's end, across a 128x row), a sequence continues
/// exactly as a fresh run of the kept prefix; a longer rollback with no checkpoint there is
/// refused and changes nothing.
#[test]
fn rolls_back_within_the_ring_slack() {
    let e = engine(KvStorage::F32);
    let slack = e.memory_spec().rollback_reach();
    let tokens = ds4::token_ids(150);
    let mut state = e.new_state().unwrap();
    e.forward_batch(&tokens, 0, &mut state, LogitsFor::Last)
        .unwrap();
    // The furthest position the rings were written to.
    let (mut len, mut top) = (tokens.len(), tokens.len());
    for keep in [149, 131, 128, 127, 126, 125, 120] {
        assert!(top - keep <= slack);
        state.truncate(keep).unwrap();
        assert_eq!(state.len(), keep);
        let next = [tokens[keep], 11, 40];
        let rolled = e
            .forward_batch(&next, keep, &mut state, LogitsFor::All)
            .unwrap()
            .to_vec();
        len = keep + next.len();
        top = top.max(len);
        let mut fresh = e.new_state().unwrap();
        e.forward_batch(&tokens[..keep], 0, &mut fresh, LogitsFor::Last)
            .unwrap();
        let expected = e
            .forward_batch(&next, keep, &mut fresh, LogitsFor::All)
            .unwrap();
        let d = relative_difference(&rolled, expected);
        assert!(d <= 1e-5, "kept {keep}: {d}");
    }
    // The rings were written up to position 152 (149 + 3): 119 is out of reach, though only
    // 4 positions back from here.
    assert_eq!((len, top), (123, 152));
    let err = state.truncate(top - slack - 1).unwrap_err();
    assert!(err.to_string().contains("cannot roll back"), "{err}");
    assert_eq!(state.len(), len);
}

/// The file with one key set to `value` (added if absent).
fn with(key: &str, value: OwnedValue) -> Vec<u8> {
    let gguf = Gguf::from_bytes(ds4::gguf_bytes()).unwrap();
    hostile::with_value(&gguf, key, value)
}

/// The file with its keys and tensors rewritten by `edit` (dropped where it returns None).
fn edited(
    keys: impl Fn(&str, OwnedValue) -> Option<OwnedValue>,
    tensors: impl Fn(&str, GgmlType, &[u64], &[u8]) -> Option<(GgmlType, Vec<u64>, Vec<u8>)>,
) -> Vec<u8> {
    let original = Gguf::from_bytes(ds4::gguf_bytes()).unwrap();
    let mut w = ferrox_gguf::GgufWriter::new();
    for (key, value) in original.metadata().iter() {
        if let Some(v) = keys(key, value.to_owned_value()) {
            w.set(key, v);
        }
    }
    for t in original.tensors() {
        let data = original.tensor_data(t).unwrap();
        if let Some((ty, shape, data)) = tensors(&t.name, t.ty, &t.shape, data) {
            w.add_tensor(&t.name, ty, &shape, data).unwrap();
        }
    }
    w.to_bytes()
}

fn without(drop: impl Fn(&str) -> bool) -> Vec<u8> {
    edited(
        |k, v| (!drop(k)).then_some(v),
        |name, ty, shape, data| (!drop(name)).then(|| (ty, shape.to_vec(), data.to_vec())),
    )
}

fn error_of(bytes: Vec<u8>) -> String {
    match load(bytes) {
        Ok(_) => panic!("loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_metadata_and_tensors_are_clear_errors() {
    let u32_key = |key: &str, v: u32| with(&format!("deepseek4.{key}"), OwnedValue::U32(v));
    for (key, value, says) in [
        ("hyper_connection.count", 2, "must be 4"),
        ("expert_gating_func", 2, "sqrt-softplus"),
        ("attention.head_count_kv", 2, "must be 1"),
        ("attention.output_group_count", 3, "must divide"),
        ("attention.sliding_window", 0, "must be positive"),
        ("attention.value_length", 32, "must equal"),
        ("rope.dimension_count", 15, "must be even"),
        ("hash_layer_count", 9, "hash_layer_count"),
    ] {
        let err = error_of(u32_key(key, value));
        assert!(err.contains(key) && err.contains(says), "{key}: {err}");
    }
    let ratios = |v: Vec<u32>| {
        with(
            "deepseek4.attention.compress_ratios",
            OwnedValue::Array(OwnedArray::U32(v)),
        )
    };
    let err = error_of(ratios(vec![4, 0, 64, 4]));
    assert!(err.contains("0, 4 or 128"), "{err}");
    let err = error_of(ratios(vec![4, 0, 128]));
    assert!(err.contains("3 entries for 4 layers"), "{err}");
    // A layer made 128x finds no 128x compressor of its own.
    let err = error_of(ratios(vec![4, 128, 128, 4]));
    assert!(err.contains("blk.1.attn_compressor_kv"), "{err}");
    let err = error_of(without(|k| k == "blk.3.indexer_compressor_ape.weight"));
    assert!(err.contains("blk.3.indexer_compressor_ape"), "{err}");
    let err = error_of(without(|k| k == "blk.2.exp_probs_b.bias"));
    assert!(err.contains("blk.2.exp_probs_b.bias"), "{err}");
    let err = error_of(without(|k| k == "deepseek4.swiglu_clamp_exp"));
    assert!(err.contains("deepseek4.swiglu_clamp_exp"), "{err}");
    // A hash table routing to an expert that does not exist.
    let bad_table = edited(
        |_, v| Some(v),
        |name, ty, shape, data| {
            let mut data = data.to_vec();
            if name == "blk.0.ffn_gate_tid2eid.weight" {
                data[..4].copy_from_slice(&(ds4::N_EXPERT as i32).to_le_bytes());
            }
            Some((ty, shape.to_vec(), data))
        },
    );
    let err = error_of(bad_table);
    assert!(
        err.contains("ffn_gate_tid2eid") && err.contains("expert 4"),
        "{err}"
    );
}

/// Every integer key of the file set to absurd values loads with an error or runs; nothing
/// panics.
#[test]
fn hostile_counts_never_panic() {
    let gguf = Gguf::from_bytes(ds4::gguf_bytes()).unwrap();
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
                assert!(outcome.is_ok(), "{} [{index:?}] = {value}", key.key);
            }
        }
    }
}

/// `nextn_predict_layers` counts only where the file holds the multi-token-prediction
/// layer (as llama.cpp decides): declared without its tensors, every block is trunk; with
/// `blk.3.nextn.eh_proj`, block 3 is the draft head and the trunk is 3 layers.
#[test]
fn declared_mtp_layers_count_only_when_present() {
    let tokens = ds4::token_ids(40);
    let logits = |e: AnyEngine| {
        let mut state = e.new_state().unwrap();
        e.forward_batch(&tokens, 0, &mut state, LogitsFor::Last)
            .unwrap()
            .to_vec()
    };
    let whole = logits(engine(KvStorage::F32));
    let declared = load(with("deepseek4.nextn_predict_layers", OwnedValue::U32(1))).unwrap();
    // The ratio-4 layers' store: blocks 0 and 3.
    assert_eq!(declared.memory_spec().paged[0].n_layers, 2);
    assert_eq!(logits(declared), whole);
    let mut with_mtp = ferrox_gguf::GgufWriter::new();
    let original = Gguf::from_bytes(ds4::gguf_bytes()).unwrap();
    for (key, value) in original.metadata().iter() {
        with_mtp.set(key, value.to_owned_value());
    }
    with_mtp.set("deepseek4.nextn_predict_layers", 1u32);
    for t in original.tensors() {
        with_mtp
            .add_tensor(&t.name, t.ty, &t.shape, original.tensor_data(t).unwrap())
            .unwrap();
    }
    let e = ds4::N_EMBD as u64;
    let eh_proj = vec![0u8; (2 * e * e * 4) as usize];
    with_mtp
        .add_tensor(
            "blk.3.nextn.eh_proj.weight",
            GgmlType::F32,
            &[2 * e, e],
            eh_proj,
        )
        .unwrap();
    let trunk = load(with_mtp.to_bytes()).unwrap();
    assert_eq!(trunk.memory_spec().paged[0].n_layers, 1);
    assert_ne!(logits(trunk), whole);
}
