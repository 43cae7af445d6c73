//! The i-quant kernels' time per matrix product on one thread (or `-t N`), at Qwen2.5-1.5B's attention
//! (1536 x 1536) and FFN (8960 x 1536) shapes, against 1, 3, 6, 8 and 128 activation rows
//! (3 and 6: what an MoE prompt hands most experts; 128: the int8 prompt path), and one
//! token against 131072 x 1536, a matrix larger than the last-level cache, read from
//! memory as a decode step reads its weights (the smaller ones stay cached between runs).
//!
//! `cargo run --release -p ferrox-core --example iq_kernels -- [-t THREADS] [shape=RxC...]
//! [tokens=N,N...] [TYPE...]` (TYPE: iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m; all
//! by default; `shape=` and `tokens=` replace the shapes and token counts, e.g. DeepSeek-V3's
//! experts `shape=2048x7168 shape=7168x2048 tokens=1,4,8`). Prints the
//! fastest of many runs (other processes only ever slow a run down). Weights are random bytes with a
//! small f16 scale at offset 0: the speed does not depend on the values.

use std::hint::black_box;
use std::time::{Duration, Instant};

use ferrox_core::{row_byte_len, GgmlType, WeightMatrix};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SHAPES: [(usize, usize); 3] = [(1536, 1536), (8960, 1536), (131072, 1536)];
const TOKENS: [usize; 5] = [1, 3, 6, 8, 128];

fn parse(name: &str) -> GgmlType {
    match name {
        "iq2_xxs" => GgmlType::Iq2Xxs,
        "iq2_xs" => GgmlType::Iq2Xs,
        "iq2_s" => GgmlType::Iq2S,
        "iq3_xxs" => GgmlType::Iq3Xxs,
        "iq3_s" => GgmlType::Iq3S,
        "iq1_s" => GgmlType::Iq1S,
        "iq1_m" => GgmlType::Iq1M,
        _ => panic!("unknown type {name}"),
    }
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let threads = match args.iter().position(|a| a == "-t") {
        Some(at) => {
            let n = args.get(at + 1).and_then(|n| n.parse().ok()).expect("-t N");
            args.drain(at..at + 2);
            n
        }
        None => 1,
    };
    let mut shapes: Vec<(usize, usize)> = Vec::new();
    let mut tokens: Option<Vec<usize>> = None;
    args.retain(|a| {
        if let Some(shape) = a.strip_prefix("shape=") {
            let (r, c) = shape.split_once('x').expect("shape=RxC");
            shapes.push((r.parse().expect("rows"), c.parse().expect("columns")));
        } else if let Some(list) = a.strip_prefix("tokens=") {
            tokens = Some(
                list.split(',')
                    .map(|n| n.parse().expect("tokens"))
                    .collect(),
            );
        } else {
            return true;
        }
        false
    });
    if shapes.is_empty() {
        shapes = SHAPES.to_vec();
    }
    let names = if args.is_empty() {
        [
            "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m",
        ]
        .map(String::from)
        .to_vec()
    } else {
        args
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    for name in &names {
        let ty = parse(name);
        for &(rows, cols) in &shapes {
            let mut bytes = vec![0u8; rows * row_byte_len(ty, cols).unwrap()];
            rng.fill(&mut bytes[..]);
            let block = ty.block_bytes().unwrap() as usize;
            let scale = half::f16::from_f32(1e-3).to_le_bytes();
            for b in bytes.chunks_exact_mut(block) {
                b[..2].copy_from_slice(&scale);
            }
            let matrix = WeightMatrix::new(ty, rows, cols, &bytes).unwrap();
            let tokens_here: &[usize] = match &tokens {
                Some(list) => list,
                None if rows > 8960 => &[1],
                None => &TOKENS,
            };
            for &tokens in tokens_here {
                let x: Vec<f32> = (0..tokens * cols)
                    .map(|_| rng.random_range(-1.0..1.0))
                    .collect();
                let mut xq = Vec::new();
                matrix.quantize_activation(&x, &mut xq).unwrap();
                let mut y = vec![0f32; rows * tokens];
                let mut best = Duration::MAX;
                let start = Instant::now();
                while start.elapsed() < Duration::from_millis(1500) {
                    let t = Instant::now();
                    pool.install(|| matrix.matmul(black_box(&xq), tokens, &mut y).unwrap());
                    best = best.min(t.elapsed());
                }
                println!(
                    "{name:8} {rows:5}x{cols} {tokens} tok: {:8.1} us",
                    best.as_secs_f64() * 1e6
                );
            }
        }
    }
}
