//! Times batched decode steps: N sequences, each after a prompt of P tokens, advanced
//! together one token per step in one paged memory (what the server's continuous batching
//! runs). `-m MODEL` picks another model (any architecture; default: the default model).
//!
//!     cargo run --release -p ferrox-models --example decode_steps -- [-m MODEL] [N] [P] [STEPS]
use std::time::Instant;

use ferrox_memory::{MemoryShape, SequenceMemory};
use ferrox_models::{step_sequences, AnyEngine, Engine, EngineOptions, LogitsFor, SeqWork};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut model = ferrox_models::default_model_path();
    if args.first().map(String::as_str) == Some("-m") && args.len() >= 2 {
        model = args[1].clone().into();
        args.drain(..2);
    }
    let nums: Vec<usize> = args.iter().map(|a| a.parse().unwrap()).collect();
    let n = nums.first().copied().unwrap_or(8);
    let prompt = nums.get(1).copied().unwrap_or(128);
    let steps = nums.get(2).copied().unwrap_or(64);
    let engine = AnyEngine::open(&model, &EngineOptions::default())?;
    let block_tokens = 16;
    let per_seq = (prompt + steps).div_ceil(block_tokens);
    let mut memory = SequenceMemory::new(
        engine.memory_spec(),
        MemoryShape {
            n_blocks: n * per_seq,
            block_tokens,
            max_sequences: n,
            n_ctx: engine.context_size(),
            prefix_cache: true,
        },
    )?;
    let prompts: Vec<Vec<u32>> = (0..n)
        .map(|s| {
            (0..prompt)
                .map(|i| ((1000 + 7 * i + 13 * s) % engine.vocab_size()) as u32)
                .collect()
        })
        .collect();
    let seqs: Vec<_> = prompts
        .iter()
        .map(|p| memory.admit(p, prompt + steps).map(|a| a.seq))
        .collect::<Result<_, _>>()
        .map_err(|r| format!("{r:?}"))?;
    let mut scratch = engine.new_scratch();
    let mut logits = vec![Vec::new(); n];
    let work: Vec<SeqWork> = seqs
        .iter()
        .zip(&prompts)
        .map(|(&seq, p)| SeqWork {
            seq,
            tokens: p,
            logits: LogitsFor::Last,
            output: ferrox_models::Output::Logits,
            position_shift: 0,
        })
        .collect();
    let mut outs: Vec<&mut Vec<f32>> = logits.iter_mut().collect();
    step_sequences(&engine, &mut memory, &mut scratch, &work, &mut outs)?;
    let token = [(2000 % engine.vocab_size()) as u32];
    let mut times = Vec::new();
    for _ in 0..steps {
        let t = Instant::now();
        let work: Vec<SeqWork> = seqs
            .iter()
            .map(|&seq| SeqWork {
                seq,
                tokens: &token,
                logits: LogitsFor::Last,
                output: ferrox_models::Output::Logits,
                position_shift: 0,
            })
            .collect();
        let mut outs: Vec<&mut Vec<f32>> = logits.iter_mut().collect();
        step_sequences(&engine, &mut memory, &mut scratch, &work, &mut outs)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    println!("{n} sequences after {prompt} tokens: step mean {mean:.2} ms, median {:.2} ms, {:.1} tokens/s", times[times.len() / 2], n as f64 * 1e3 / mean);
    Ok(())
}
