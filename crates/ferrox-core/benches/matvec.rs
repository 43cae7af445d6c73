//! Matrix-vector and batched matrix products at Gemma-3-270M shapes, reported as weight
//! bytes streamed per second, on 1 and 2 threads.
//!
//! `cargo bench -p ferrox-core --bench matvec [-- FILTER]`. Weights are random bytes with
//! sane f16 scales (quantizing 170M values would dominate the run); speed does not depend
//! on the values. The kernels are the best this machine has; `FERROX_ISA=avx2` (or
//! `scalar`) measures a lower instruction set's.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferrox_core::packed::PackedMatrix;
use ferrox_core::{row_byte_len, GgmlType, WeightMatrix};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TYPES: [GgmlType; 15] = [
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4K,
    GgmlType::Q6K,
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_1,
    GgmlType::Iq4Nl,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q5K,
    GgmlType::Iq4Xs,
];

/// (rows, cols) of Gemma-3-270M's projections: FFN down, FFN gate/up, attention.
const SHAPES: [(usize, usize); 3] = [(640, 2048), (2048, 640), (640, 1024)];
const THREADS: [usize; 2] = [1, 2];

/// Offsets of the f16 scales in one block, set to small finite values so no NaN appears.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType as T;
    match ty {
        T::F32 | T::F16 | T::Bf16 => &[],
        T::Q4_1 | T::Q5_1 | T::Q4K | T::Q5K => &[0, 2],
        T::Q2K => &[80, 82],
        T::Q3K => &[108],
        T::Q6K => &[208],
        _ => &[0],
    }
}

fn random_weights(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(7);
    let mut bytes = vec![0u8; rows * row_byte_len(ty, cols).unwrap()];
    rng.fill(&mut bytes[..]);
    let block_bytes = ty.block_bytes().unwrap() as usize;
    match ty {
        GgmlType::F32 => {
            for v in bytes.chunks_exact_mut(4) {
                v.copy_from_slice(&rng.random_range(-1.0f32..1.0).to_le_bytes());
            }
        }
        GgmlType::F16 | GgmlType::Bf16 => {
            // Clear the top exponent bit: finite values.
            bytes.chunks_exact_mut(2).for_each(|v| v[1] &= 0x3F);
        }
        _ => {
            let scale = half::f16::from_f32(1e-3).to_le_bytes();
            for block in bytes.chunks_exact_mut(block_bytes) {
                for &at in f16_fields(ty) {
                    block[at..at + 2].copy_from_slice(&scale);
                }
            }
        }
    }
    bytes
}

fn pools() -> Vec<(usize, rayon::ThreadPool)> {
    THREADS
        .iter()
        .map(|&n| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .unwrap();
            (n, pool)
        })
        .collect()
}

fn activation(matrix: &WeightMatrix, tokens: usize) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(11);
    let x: Vec<f32> = (0..tokens * matrix.cols())
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let mut xq = Vec::new();
    matrix.quantize_activation(&x, &mut xq).unwrap();
    xq
}

fn bench_matvec(c: &mut Criterion) {
    let pools = pools();
    let mut group = c.benchmark_group("matvec");
    group.warm_up_time(Duration::from_millis(300));
    group.measurement_time(Duration::from_millis(1200));
    // 640 columns are not whole 256-value super-blocks: the K-quants skip that shape.
    let mut cases: Vec<(GgmlType, usize, usize)> = TYPES
        .iter()
        .flat_map(|&ty| SHAPES.iter().map(move |&(r, c)| (ty, r, c)))
        .filter(|&(ty, _, cols)| row_byte_len(ty, cols).is_ok())
        .collect();
    // The output head: 262144 × 640 Q8_0, 178 MB that no cache holds.
    cases.push((GgmlType::Q8_0, 262_144, 640));
    for (ty, rows, cols) in cases {
        let bytes = random_weights(ty, rows, cols);
        let matrix = WeightMatrix::new(ty, rows, cols, &bytes).unwrap();
        let xq = activation(&matrix, 1);
        let mut y = vec![0f32; rows];
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        if rows > 100_000 {
            group.sample_size(10);
        }
        for (threads, pool) in &pools {
            let id = BenchmarkId::new(format!("{ty}/{rows}x{cols}"), format!("{threads}t"));
            group.bench_function(id, |b| {
                pool.install(|| b.iter(|| matrix.matvec(black_box(&xq), &mut y).unwrap()))
            });
        }
    }
    group.finish();
}

fn bench_matmul(c: &mut Criterion) {
    const TOKENS: usize = 512;
    let pools = pools();
    let mut group = c.benchmark_group("matmul512");
    group.warm_up_time(Duration::from_millis(300));
    group.measurement_time(Duration::from_secs(2));
    group.sample_size(10);
    for ty in TYPES {
        let (rows, cols) = if row_byte_len(ty, 640).is_ok() {
            (2048, 640)
        } else {
            (640, 2048)
        };
        let bytes = random_weights(ty, rows, cols);
        let matrix = WeightMatrix::new(ty, rows, cols, &bytes).unwrap();
        let xq = activation(&matrix, TOKENS);
        let mut y = vec![0f32; rows * TOKENS];
        // Weight bytes as streamed by 512 separate matvecs, so the rate compares directly.
        group.throughput(Throughput::Bytes((bytes.len() * TOKENS) as u64));
        for (threads, pool) in &pools {
            let id = BenchmarkId::new(format!("{ty}/{rows}x{cols}"), format!("{threads}t"));
            group.bench_function(id, |b| {
                pool.install(|| b.iter(|| matrix.matmul(black_box(&xq), TOKENS, &mut y).unwrap()))
            });
        }
    }
    group.finish();
}

/// The output head against the few tokens of a server's decode step: one row per sequence.
fn bench_head_batch(c: &mut Criterion) {
    let (rows, cols) = (262_144, 640);
    let pools = pools();
    let mut group = c.benchmark_group("head_batch");
    group.warm_up_time(Duration::from_millis(300));
    group.measurement_time(Duration::from_secs(2));
    group.sample_size(10);
    let bytes = random_weights(GgmlType::Q8_0, rows, cols);
    let plain = WeightMatrix::new(GgmlType::Q8_0, rows, cols, &bytes).unwrap();
    let packed = PackedMatrix::pack(GgmlType::Q8_0, rows, cols, &bytes, |_| {}).unwrap();
    let layouts = [
        ("rows", plain),
        ("packed", plain.with_packed(&packed).unwrap()),
    ];
    for tokens in [1, 2, 4, 7, 8, 16] {
        let mut y = vec![0f32; rows * tokens];
        group.throughput(Throughput::Elements(tokens as u64));
        for (layout, matrix) in &layouts {
            let xq = activation(matrix, tokens);
            for (threads, pool) in &pools {
                let id = BenchmarkId::new(
                    format!("Q8_0/{rows}x{cols}/{layout}/{tokens}tok"),
                    format!("{threads}t"),
                );
                group.bench_function(id, |b| {
                    pool.install(|| {
                        b.iter(|| matrix.matmul(black_box(&xq), tokens, &mut y).unwrap())
                    })
                });
            }
        }
    }
    group.finish();
}

/// Packed products of a cache-resident matrix against a decode step's eight tokens, one
/// thread: multiply-adds per second, the kernels' compute rate.
fn bench_packed_compute(c: &mut Criterion) {
    const TOKENS: usize = 8;
    let (rows, cols) = (512, 1024);
    let mut group = c.benchmark_group("packed8");
    group.warm_up_time(Duration::from_millis(300));
    group.measurement_time(Duration::from_secs(1));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
    ] {
        let bytes = random_weights(ty, rows, cols);
        let plain = WeightMatrix::new(ty, rows, cols, &bytes).unwrap();
        let packed = PackedMatrix::pack(ty, rows, cols, &bytes, |_| {}).unwrap();
        let mut y = vec![0f32; rows * TOKENS];
        group.throughput(Throughput::Elements((rows * cols * TOKENS) as u64));
        for (layout, matrix) in [
            ("rows", plain),
            ("packed", plain.with_packed(&packed).unwrap()),
        ] {
            let xq = activation(&matrix, TOKENS);
            let id = BenchmarkId::new(format!("{ty}/{rows}x{cols}"), layout);
            group.bench_function(id, |b| {
                pool.install(|| b.iter(|| matrix.matmul(black_box(&xq), TOKENS, &mut y).unwrap()))
            });
        }
    }
    group.finish();
}

criterion_group!(
    benches,
    bench_matvec,
    bench_matmul,
    bench_head_batch,
    bench_packed_compute
);
criterion_main!(benches);
