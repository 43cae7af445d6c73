//! Decode-shaped matrix-vector products over a stack of packed matrices far larger than the
//! caches, as one decoded token of a dense model streams them: each matrix once, one after
//! the other, across the rayon pool. Prints the weight bytes streamed per second and the
//! machine's read bandwidth, so a kernel's share of the bound is read off directly.
//!
//! `cargo run --release -p ferrox-core --example decode_stack -- [TYPE] [THREADS] [LAYERS]`
//! (TYPE: q4_k (default), q6_k, q5_k, q4_0, q8_0; the shapes are Qwen2.5-1.5B's FFN and
//! attention: 1536 x 8960, 8960 x 1536, 1536 x 1536, 256 x 1536). `FERROX_ISA` caps the
//! kernels as everywhere.

use std::time::Instant;

use ferrox_core::bandwidth::read_bandwidth;
use ferrox_core::packed::PackedMatrix;
use ferrox_core::{row_byte_len, GgmlType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SHAPES: [(usize, usize); 6] = [
    (1536, 1536),
    (256, 1536),
    (256, 1536),
    (1536, 1536),
    (17920, 1536),
    (1536, 8960),
];

fn random_matrix(ty: GgmlType, rows: usize, cols: usize, rng: &mut StdRng) -> PackedMatrix {
    let mut bytes = vec![0u8; rows * row_byte_len(ty, cols).unwrap()];
    rng.fill(&mut bytes[..]);
    let block = ty.block_bytes().unwrap() as usize;
    let scale_at: &[usize] = match ty {
        GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q6K => &[208],
        _ => &[0],
    };
    let scale = half::f16::from_f32(1e-3).to_le_bytes();
    for b in bytes.chunks_exact_mut(block) {
        for &at in scale_at {
            b[at..at + 2].copy_from_slice(&scale);
        }
    }
    PackedMatrix::pack(ty, rows, cols, &bytes, |_| {}).unwrap()
}

fn cached(ty: GgmlType, threads: usize, sweeps: usize) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let (rows, cols) = (512 * threads, 1536);
    let m = random_matrix(ty, rows, cols, &mut rng);
    let x: Vec<f32> = (0..cols).map(|_| rng.random_range(-1.0..1.0)).collect();
    let mut xq = vec![0u8; m.activation_row_bytes()];
    m.quantize_activation(&x, &mut xq).unwrap();
    let mut y = vec![0f32; rows];
    let bytes = rows * row_byte_len(ty, cols).unwrap();
    let mut best = f64::MAX;
    pool.install(|| {
        for _ in 0..5 {
            let start = Instant::now();
            for _ in 0..sweeps * 100 {
                m.matmul(&xq, 1, &mut y).unwrap();
            }
            best = best.min(start.elapsed().as_secs_f64());
        }
    });
    println!(
        "{ty:?} {threads}t cached ({} KB): {:.1} GB/s",
        bytes / 1024,
        (bytes * sweeps * 100) as f64 / best / 1e9
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ty = match args.first().map(String::as_str).unwrap_or("q4_k") {
        "q4_k" => GgmlType::Q4K,
        "q5_k" => GgmlType::Q5K,
        "q6_k" => GgmlType::Q6K,
        "q4_0" => GgmlType::Q4_0,
        "q8_0" => GgmlType::Q8_0,
        other => panic!("unknown type {other}"),
    };
    let threads: usize = args.get(1).map_or(2, |s| s.parse().unwrap());
    let layers: usize = args.get(2).map_or(16, |s| s.parse().unwrap());
    // `cached`: one 512 x 1536 matrix swept again and again from the cache: the kernels'
    // compute ceiling, without memory in the way.
    if args.get(3).map(String::as_str) == Some("cached") {
        return cached(ty, threads, layers);
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let stack: Vec<PackedMatrix> = pool.install(|| {
        (0..layers)
            .flat_map(|_| SHAPES)
            .map(|(rows, cols)| random_matrix(ty, rows, cols, &mut rng))
            .collect()
    });
    let bytes: usize = stack
        .iter()
        .map(|m| m.rows() * row_byte_len(ty, m.cols()).unwrap())
        .sum();
    let inputs: Vec<(Vec<u8>, Vec<f32>)> = stack
        .iter()
        .map(|m| {
            let x: Vec<f32> = (0..m.cols()).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut xq = vec![0u8; m.activation_row_bytes()];
            m.quantize_activation(&x, &mut xq).unwrap();
            (xq, vec![0f32; m.rows()])
        })
        .collect();
    let mut inputs = inputs;
    let mut best = f64::MAX;
    pool.install(|| {
        for _ in 0..12 {
            let start = Instant::now();
            for (m, (xq, y)) in stack.iter().zip(&mut inputs) {
                m.matmul(xq, 1, y).unwrap();
            }
            best = best.min(start.elapsed().as_secs_f64());
        }
    });
    let bandwidth = read_bandwidth(threads, 5);
    let rate = bytes as f64 / best;
    println!(
        "{ty:?} {threads}t: {:.0} MB in {:.2} ms: {:.1} GB/s; read bandwidth {:.1} GB/s ({:.0}%)",
        bytes as f64 / 1e6,
        best * 1e3,
        rate / 1e9,
        bandwidth / 1e9,
        100.0 * rate / bandwidth
    );
}
