//! Times batched decode steps: N sequences, each after a prompt of P tokens, advanced
//! together one token per step (what the server's continuous batching runs).
//!
//!     cargo run --release -p ferrox-models --example decode_steps -- [N] [P] [STEPS]
use std::time::Instant;

use ferrox_models::decoder::{Decoder, DecoderOptions, SequenceStep};
use ferrox_models::{DecoderState, LogitsFor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap())
        .collect();
    let n = args.first().copied().unwrap_or(8);
    let prompt = args.get(1).copied().unwrap_or(128);
    let steps = args.get(2).copied().unwrap_or(64);
    let decoder = Decoder::open(
        ferrox_models::default_model_path(),
        &DecoderOptions::default(),
    )?;
    let mut states: Vec<DecoderState> = (0..n)
        .map(|_| ferrox_models::Engine::new_state(&decoder))
        .collect();
    let prompts: Vec<Vec<u32>> = (0..n)
        .map(|s| {
            (0..prompt)
                .map(|i| (1000 + 7 * i + 13 * s) as u32)
                .collect()
        })
        .collect();
    {
        let mut batch: Vec<SequenceStep> = states
            .iter_mut()
            .zip(&prompts)
            .map(|(state, p)| SequenceStep {
                tokens: p,
                state,
                logits: LogitsFor::Last,
            })
            .collect();
        decoder.forward_many(&mut batch)?;
    }
    let token = [2000u32];
    let mut times = Vec::new();
    for _ in 0..steps {
        let t = Instant::now();
        let mut batch: Vec<SequenceStep> = states
            .iter_mut()
            .map(|state| SequenceStep {
                tokens: &token,
                state,
                logits: LogitsFor::Last,
            })
            .collect();
        decoder.forward_many(&mut batch)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    println!("{n} sequences after {prompt} tokens: step mean {mean:.2} ms, median {:.2} ms, {:.1} tokens/s", times[times.len() / 2], n as f64 * 1e3 / mean);
    Ok(())
}
