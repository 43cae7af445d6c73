//! Float-weight matrix products (F16, BF16, F32) at a vision encoder's shapes (SigLIP-so400m:
//! width 1152, FFN 4304) against 1024 activation rows (a 448-pixel image's patches), and
//! at a text model's (Qwen2.5-1.5B: 1536 and 8960) against 512 rows (a prompt), on the
//! global thread pool (`RAYON_NUM_THREADS`).
//!
//! `cargo run --release -p ferrox-core --example float_gemm -- [f16|bf16|f32 ...]` (f16 by
//! default). Prints GFLOP/s of the fastest of several runs per shape.

use std::hint::black_box;
use std::time::{Duration, Instant};

use ferrox_core::{row_byte_len, GgmlType, WeightMatrix};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SHAPES: [(usize, usize, usize); 5] = [
    (1152, 1152, 1024),
    (4304, 1152, 1024),
    (1152, 4304, 1024),
    (1536, 1536, 512),
    (8960, 1536, 512),
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let names = if args.is_empty() {
        vec!["f16".to_string()]
    } else {
        args
    };
    let mut rng = StdRng::seed_from_u64(7);
    for name in names {
        let ty = match name.as_str() {
            "f16" => GgmlType::F16,
            "bf16" => GgmlType::Bf16,
            "f32" => GgmlType::F32,
            _ => panic!("unknown type {name}"),
        };
        for (rows, cols, tokens) in SHAPES {
            let values: Vec<f32> = (0..rows * cols)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let mut bytes = vec![0u8; rows * row_byte_len(ty, cols).unwrap()];
            ferrox_core::quantize_row(ty, &values, &mut bytes).unwrap();
            let m = WeightMatrix::new(ty, rows, cols, &bytes).unwrap();
            let x: Vec<f32> = (0..tokens * cols)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let mut xq = Vec::new();
            for row in x.chunks(cols) {
                let mut q = Vec::new();
                m.quantize_activation(row, &mut q).unwrap();
                xq.extend_from_slice(&q);
            }
            let mut y = vec![0f32; rows * tokens];
            let mut best = Duration::MAX;
            let deadline = Instant::now() + Duration::from_secs(3);
            let mut runs = 0;
            while runs < 3 || (Instant::now() < deadline && runs < 50) {
                let start = Instant::now();
                m.matmul(black_box(&xq), tokens, &mut y).unwrap();
                best = best.min(start.elapsed());
                runs += 1;
            }
            let flops = 2.0 * (rows * cols * tokens) as f64;
            println!(
                "{name} {rows}x{cols} x {tokens} tokens: {:.1} ms, {:.1} GFLOP/s",
                best.as_secs_f64() * 1e3,
                flops / best.as_secs_f64() / 1e9
            );
        }
    }
}
