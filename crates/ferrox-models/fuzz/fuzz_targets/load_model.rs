#![no_main]
//! Any byte string must load as a model (tokenizer, configuration, weights) or fail to,
//! without a panic, an abort, a hang or a large allocation; a model that loads must run one
//! token with the file's own context length (half the inputs with their routed experts
//! streamed through a small cache, when they have any).
//!
//! Seeds: the synthetic models (`cargo run --release -p ferrox-models --example
//! write_synthetic -- corpus/load_model`). Run with
//!
//! ```sh
//! ASAN_OPTIONS=allocator_may_return_null=1 cargo +nightly fuzz run load_model \
//!     corpus/load_model -O -- -max_len=4890000 -timeout=10 -rss_limit_mb=6144 \
//!     -malloc_limit_mb=24000
//! ```
//!
//! (the caches are calloc'ed and refused allocations must come back as null, not abort;
//! the seeds are up to 4.9 MB; libFuzzer keeps its corpus in memory, hence the RSS limit,
//! while a single allocation above the machine's memory is reported).
//!
//! Besides libFuzzer's own byte mutations, the mutator rewrites the file with one integer
//! key (or array element) set to an edge value (0, powers of two and their neighbours, 2^29,
//! 2^31-1, 2^32-1, u64::MAX, -1, ...) and mutates the header (metadata and tensor infos)
//! alone, where byte mutations of a megabyte-sized file would mostly land in tensor data.

use std::sync::Arc;

use ferrox_gguf::{Gguf, OwnedValue, Value};
use ferrox_tokenizer::tokenizer::Tokenizer;
use ferrox_models::plan::{ExpertPlacement, MemoryPlan};
use ferrox_models::{AnyEngine, EngineOptions, Engine, EngineExt};
use libfuzzer_sys::{fuzz_mutator, fuzz_target, fuzzer_mutate};

#[allow(dead_code)]
#[path = "../../tests/synthetic/hostile.rs"]
mod hostile;

fuzz_target!(|data: &[u8]| {
    let Ok(gguf) = Gguf::from_bytes(data.to_vec()) else {
        return;
    };
    let _ = Tokenizer::from_gguf(&gguf);
    // Every other input with a budget that streams the routed experts through a cache of
    // two (when the file has experts to stream).
    let streamed = data.last().is_some_and(|b| b % 2 == 1);
    let memory_budget = streamed
        .then(|| MemoryPlan::for_budget(gguf.tensors(), 0, false, true).ok())
        .flatten()
        .and_then(|plan| match plan.experts {
            ExpertPlacement::Streamed { slot_bytes, .. } => {
                Some(plan.dense_bytes.saturating_add(slot_bytes.saturating_mul(2)))
            }
            _ => None,
        });
    let options = EngineOptions {
        n_ctx: 0,
        threads: 1,
        memory_budget,
        ..EngineOptions::default()
    };
    let Ok(engine) = AnyEngine::from_gguf(Arc::new(gguf), &options) else {
        return;
    };
    let Ok(mut state) = engine.new_state() else {
        return;
    };
    if let Ok(logits) = engine.forward_token(0, 0, &mut state) {
        assert_eq!(logits.len(), engine.vocab_size());
    }
});

/// xorshift64*: the mutator must be deterministic in its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// An edge value for a count, or one near the old value.
fn edge_value(rng: &mut Rng, old: i128) -> i128 {
    const EDGES: &[i128] = &[
        0,
        1,
        2,
        3,
        7,
        8,
        255,
        256,
        511,
        512,
        513,
        1023,
        1024,
        1025,
        65535,
        65536,
        1 << 24,
        1 << 29,
        (1 << 31) - 1,
        1 << 31,
        (1 << 32) - 1,
        1 << 32,
        (1 << 63) - 1,
        u64::MAX as i128,
        -1,
    ];
    match rng.below(4) {
        0 => old + 1,
        1 => (old - 1).max(0),
        2 => old.saturating_mul(2),
        _ => EDGES[rng.below(EDGES.len())],
    }
}

/// The file with one integer key, or one element of an integer array, set to an edge value.
fn set_count(data: &[u8], rng: &mut Rng) -> Option<Vec<u8>> {
    let gguf = Gguf::from_bytes(data.to_vec()).ok()?;
    let meta = gguf.metadata();
    let keys: Vec<(String, Value<'_>)> = meta
        .iter()
        .filter(|(_, v)| match v {
            Value::Array(a) => !a.is_empty() && a.get(0).is_some_and(|e| e.as_i128().is_some()),
            v => v.as_i128().is_some(),
        })
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    if keys.is_empty() {
        return None;
    }
    let (key, value) = &keys[rng.below(keys.len())];
    let (index, old) = match value {
        Value::Array(a) => {
            let i = rng.below(a.len());
            (Some(i), a.get(i)?.as_i128()?)
        }
        v => (None, v.as_i128()?),
    };
    let new = edge_value(rng, old);
    match u64::try_from(new) {
        Ok(n) => hostile::try_with_count(&gguf, key, index, n),
        // Negative: a signed scalar of the width the file used, or i64.
        Err(_) if index.is_none() => {
            let v = match value {
                Value::I32(_) | Value::U32(_) => OwnedValue::I32(new as i32),
                _ => OwnedValue::I64(new as i64),
            };
            hostile::try_with_value(&gguf, key, v)
        }
        Err(_) => None,
    }
}

/// The file with libFuzzer's byte mutations applied to its header only.
fn mutate_header(data: &[u8], rng: &mut Rng) -> Option<Vec<u8>> {
    let header = match Gguf::from_bytes(data.to_vec()) {
        Ok(g) => usize::try_from(g.data_offset()).ok()?.min(data.len()),
        Err(_) => data.len().min(1 << 16),
    };
    let room = 64 + rng.below(64);
    let mut head = data[..header].to_vec();
    head.resize(header + room, 0);
    let len = fuzzer_mutate(&mut head, header, header + room);
    head.truncate(len);
    head.extend_from_slice(&data[header..]);
    Some(head)
}

fuzz_mutator!(|data: &mut [u8], size: usize, max_size: usize, seed: u32| {
    let mut rng = Rng(u64::from(seed) | 1 << 40);
    let mutated = match rng.below(4) {
        0 | 1 => set_count(&data[..size], &mut rng),
        2 => mutate_header(&data[..size], &mut rng),
        _ => None,
    };
    match mutated {
        Some(out) if out.len() <= max_size => {
            data[..out.len()].copy_from_slice(&out);
            out.len()
        }
        _ => fuzzer_mutate(data, size, max_size),
    }
});
