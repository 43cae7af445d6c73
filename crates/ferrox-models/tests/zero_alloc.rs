//! Decoding a token allocates nothing: every buffer a step needs is kept from the steps
//! before. A counting global allocator watches every thread (the engines' workers too)
//! while each engine decodes, alone and four sequences to a step in one paged memory, once
//! the first steps have sized the buffers: the dense decoder on the default model, the MLA
//! engine (routed experts included) on the synthetic deepseek2-v3 and mistral4 models, the
//! DeepSeek Sparse Attention engine on deepseek32 and glm-dsa, and the DeepSeek-V4 engine.

mod common;
mod synthetic;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use ferrox_core::{KvStorage, KvType};

use ferrox_generate::sampling::argmax;
use ferrox_gguf::Gguf;
use ferrox_memory::{MemoryShape, SequenceMemory};
use ferrox_models::{
    step_sequences, AnyEngine, Engine, EngineExt, EngineOptions, LogitsFor, SeqWork,
};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's layout contract is passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs of [`STEPS`] decode steps measured; the fewest allocations count. A step that
/// allocates does so in every run, while rayon's own bookkeeping (jobs entering the pool
/// from outside are queued in blocks of 63, and on a busy machine more of them wait) comes
/// and goes between runs.
const RUNS: usize = 3;
const STEPS: usize = 32;

/// The fewest heap allocations made while `step` runs [`STEPS`] times, over [`RUNS`] runs.
fn allocations(mut step: impl FnMut()) -> usize {
    (0..RUNS)
        .map(|_| {
            let before = ALLOCATIONS.load(Ordering::SeqCst);
            COUNTING.store(true, Ordering::SeqCst);
            for _ in 0..STEPS {
                step();
            }
            COUNTING.store(false, Ordering::SeqCst);
            ALLOCATIONS.load(Ordering::SeqCst) - before
        })
        .min()
        .unwrap_or(0)
}

fn solo(engine: &impl Engine, prompt: &[u32]) -> usize {
    let mut state = engine.new_state().unwrap();
    let mut next = argmax(
        engine
            .forward_batch(prompt, 0, &mut state, LogitsFor::Last)
            .unwrap(),
    );
    // Warm-up: buffers grow to their decode sizes, each worker makes its own state.
    for _ in 0..8 {
        let pos = state.len();
        next = argmax(engine.forward_token(next, pos, &mut state).unwrap());
    }
    allocations(|| {
        let pos = state.len();
        next = argmax(engine.forward_token(next, pos, &mut state).unwrap());
    })
}

fn batched(engine: &impl Engine, prompt: &[u32]) -> usize {
    let n = 4;
    let mut memory = SequenceMemory::new(
        engine.memory_spec(),
        MemoryShape {
            n_blocks: 64,
            block_tokens: 16,
            max_sequences: n,
            n_ctx: engine.context_size(),
            prefix_cache: false,
        },
    )
    .unwrap();
    let seqs: Vec<_> = (0..n)
        .map(|_| {
            memory
                .admit(prompt, prompt.len() + 8 + RUNS * STEPS)
                .unwrap()
                .seq
        })
        .collect();
    let mut scratch = engine.new_scratch();
    let mut logits = vec![Vec::new(); n];
    let mut next = vec![[0u32; 1]; n];
    let mut step = |memory: &mut SequenceMemory, first: bool| {
        let work: [SeqWork<'_>; 4] = std::array::from_fn(|i| SeqWork {
            seq: seqs[i],
            tokens: if first { prompt } else { &next[i][..] },
            logits: LogitsFor::Last,
            output: ferrox_models::Output::Logits,
            position_shift: 0,
        });
        let [a, b, c, d] = &mut logits[..] else {
            unreachable!()
        };
        let mut outs = [a, b, c, d];
        step_sequences(engine, memory, &mut scratch, &work, &mut outs).unwrap();
        for (t, l) in next.iter_mut().zip(&logits) {
            t[0] = argmax(l);
        }
    };
    step(&mut memory, true);
    for _ in 0..8 {
        step(&mut memory, false);
    }
    allocations(|| step(&mut memory, false))
}

#[test]
fn decoding_a_token_allocates_nothing() {
    let decoder = common::gemma_decoder(256, 2);
    let prompt = common::gemma_tokenizer().encode("Once upon a time", true, false);
    let mut engines: Vec<(String, AnyEngine, Vec<u32>)> = Vec::new();
    // (name, file, prompt, context): the DeepSeek Sparse Attention models' 12-token prompts
    // pass their indexers' top 32 while decoding; deepseek4's 100-token prompt passes the
    // first 128x compressed row (position 127) and its indexers' top 8.
    let mut models: Vec<(String, Vec<u8>, Vec<u32>, usize)> = ["deepseek2-v3", "mistral4"]
        .iter()
        .map(|&name| {
            let prompt = synthetic::token_ids(name)[..12].to_vec();
            (name.to_string(), synthetic::gguf_bytes(name), prompt, 128)
        })
        .collect();
    for &name in synthetic::dsa::DSA_MODELS {
        let prompt = synthetic::dsa::token_ids(name, 12);
        models.push((name.into(), synthetic::dsa::gguf_bytes(name), prompt, 128));
    }
    let ds4_prompt = synthetic::deepseek4::token_ids(100);
    models.push((
        "deepseek4".into(),
        synthetic::deepseek4::gguf_bytes(),
        ds4_prompt,
        256,
    ));
    // A grouped-query model with a quantized, rotated cache.
    let q8_prompt = synthetic::token_ids("qwen2")[..12].to_vec();
    models.push((
        "qwen2 q8_0 cache".into(),
        synthetic::gguf_bytes("qwen2"),
        q8_prompt,
        128,
    ));
    for (name, bytes, prompt, n_ctx) in models {
        let gguf = Gguf::from_bytes(bytes).unwrap();
        let kv_storage = match name.ends_with("q8_0 cache") {
            true => KvStorage::uniform(KvType::Q8_0),
            false => KvStorage::F16,
        };
        let options = EngineOptions {
            n_ctx,
            threads: 2,
            kv_storage,
            ..EngineOptions::default()
        };
        let engine = AnyEngine::from_gguf(Arc::new(gguf), &options).unwrap();
        engines.push((name, engine, prompt));
    }
    let mut counts = vec![
        ("gemma3 alone".to_string(), solo(&decoder, &prompt)),
        ("gemma3 batched".to_string(), batched(&decoder, &prompt)),
    ];
    for (name, engine, prompt) in &engines {
        counts.push((format!("{name} alone"), solo(engine, prompt)));
        counts.push((format!("{name} batched"), batched(engine, prompt)));
    }
    eprintln!("heap allocations in {STEPS} decode steps: {counts:?}");
    // Each step enters the engine's thread pool from outside it; rayon queues such jobs in a
    // list of 63-job blocks and allocates a block when one fills: at most one allocation in
    // 32 steps that is not ours. One allocation per token would show as 32 or more.
    assert!(
        counts.iter().all(|(_, c)| *c <= 1),
        "heap allocations in {STEPS} decode steps: {counts:?}"
    );
}
