//! Decode-shaped matrix-vector products over a stack of packed matrices far larger than the
//! caches, as one decoded token of a dense model streams them: each matrix once, one after
//! the other, across the rayon pool. Prints the weight bytes streamed per second and the
//! machine's read bandwidth, so a kernel's share of the bound is read off directly.
//!
//! `cargo run --release -p ferrox-core --example decode_stack -- [TYPE] [THREADS] [LAYERS] [OPTION...]`
//! (TYPE: q4_k (default), q6_k, q5_k, q2_k, q3_k, q4_0, q5_0, q8_0, iq4_nl, iq4_xs, nvfp4, tq2_0, tq1_0, packed; iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m,
//! row-major as a file stores them, each pass's products one after the other; the shapes are
//! Qwen2.5-1.5B's FFN and attention: 1536 x 8960, 8960 x 1536, 1536 x 1536, 256 x 1536).
//! `FERROX_ISA` caps the kernels as everywhere. OPTIONs:
//!
//! * `row-major`: a packed type's row-major kernels instead (as `--no-repack` runs them);
//! * `cached`: one small matrix swept from the cache, the kernels' compute ceiling (with
//!   `tokens=N`, against N activation rows);
//! * `moe`: an MoE decode step's products instead (per layer, 16 expert matrices of
//!   1408 x 2048 in one pass over the pool, then 8 of 2048 x 1408);
//! * `shape=ROWSxCOLS`: every matrix of the stack of that shape;
//! * `tokens=N`: products against N activation rows at once (speculation's and batched
//!   serving's steps), 1 by default;
//! * `prefetch=D1,D2,...`: the stack streamed with each prefetch distance (bytes, or
//!   `none`), the distances alternated sweep by sweep so that other processes slow them
//!   alike; prints each one's median against the first's and how often it was faster.

use std::time::Instant;

use ferrox_core::bandwidth::ReadSweep;
use ferrox_core::packed::tuning::{self, Prefetch};
use ferrox_core::packed::{PackedMatrix, Product};
use ferrox_core::{row_byte_len, GgmlType, MatrixProduct, WeightMatrix};
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

/// A file's bytes for a `rows x cols` matrix of `ty`: random, with a small scale where
/// each block keeps its f16 scales (the speed does not depend on the values).
fn random_bytes(ty: GgmlType, rows: usize, cols: usize, rng: &mut StdRng) -> Vec<u8> {
    let mut bytes = vec![0u8; rows * row_byte_len(ty, cols).unwrap()];
    rng.fill(&mut bytes[..]);
    let block = ty.block_bytes().unwrap() as usize;
    let scale_at: &[usize] = match ty {
        GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q6K => &[208],
        GgmlType::Tq2_0 => &[64],
        GgmlType::Tq1_0 => &[52],
        _ => &[0],
    };
    let scale = half::f16::from_f32(1e-3).to_le_bytes();
    for b in bytes.chunks_exact_mut(block) {
        for &at in scale_at {
            b[at..at + 2].copy_from_slice(&scale);
        }
    }
    bytes
}

fn random_matrix(ty: GgmlType, rows: usize, cols: usize, rng: &mut StdRng) -> PackedMatrix {
    let bytes = random_bytes(ty, rows, cols, rng);
    PackedMatrix::pack(ty, rows, cols, &bytes, |_| {}).unwrap()
}

/// Whether `ty` runs row-major, as the file stores it (the i-quants), not packed.
fn row_major(ty: GgmlType) -> bool {
    ferrox_core::packed::PackedFormat::of(ty).is_none()
}

fn cached(ty: GgmlType, threads: usize, sweeps: usize, n_tokens: usize) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let (rows, cols) = (512 * threads, 1536);
    let m = random_matrix(ty, rows, cols, &mut rng);
    let x: Vec<f32> = (0..cols * n_tokens)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let mut xq = vec![0u8; m.activation_row_bytes() * n_tokens];
    for (x, xq) in x
        .chunks_exact(cols)
        .zip(xq.chunks_exact_mut(m.activation_row_bytes()))
    {
        m.quantize_activation(x, xq).unwrap();
    }
    let mut y = vec![0f32; rows * n_tokens];
    let bytes = rows * row_byte_len(ty, cols).unwrap();
    let mut best = f64::MAX;
    pool.install(|| {
        for _ in 0..5 {
            let start = Instant::now();
            for _ in 0..sweeps * 100 {
                m.matmul(&xq, n_tokens, &mut y).unwrap();
            }
            best = best.min(start.elapsed().as_secs_f64());
        }
    });
    println!(
        "{ty:?} {threads}t cached ({} KB), {n_tokens} token(s): {:.3} GB/s of weights",
        bytes / 1024,
        (bytes * sweeps * 100) as f64 / best / 1e9
    );
}

/// A matrix, its quantized input and its output.
type Operand = (PackedMatrix, Vec<u8>, Vec<f32>);

/// A row-major matrix, its quantized input and its output.
type RowMajorOperand<'a> = (WeightMatrix<'a>, Vec<u8>, Vec<f32>);

/// A variant's set-up, run before each of its sweeps.
type Setting = Box<dyn Fn() + Send + Sync>;

/// Sweeps `variants` (a name and what to set before the sweep) alternately, `rounds`
/// times each, starting each round at the next variant; prints each one's median sweep
/// time against the first's and the share of rounds in which it beat the first.
fn paired(bytes: usize, rounds: usize, variants: &[(String, Setting)], sweep: &mut dyn FnMut()) {
    let n = variants.len();
    let mut times = vec![Vec::with_capacity(rounds); n];
    for round in 0..rounds {
        for k in 0..n {
            let v = (round + k) % n;
            (variants[v].1)();
            let start = Instant::now();
            sweep();
            times[v].push(start.elapsed().as_secs_f64());
        }
    }
    let median = |t: &[f64]| quantile(t, 0.5);
    let base = median(&times[0]);
    for (v, (name, _)) in variants.iter().enumerate() {
        let m = median(&times[v]);
        let wins = times[v]
            .iter()
            .zip(&times[0])
            .filter(|(a, b)| a < b)
            .count();
        println!(
            "  {name:>16}: median {:.2} ms, {:.1} GB/s, {:.3}x the first, faster in {wins}/{rounds} rounds",
            m * 1e3,
            bytes as f64 / m / 1e9,
            base / m
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ty = match args.first().map(String::as_str).unwrap_or("q4_k") {
        "q4_k" => GgmlType::Q4K,
        "q5_k" => GgmlType::Q5K,
        "q6_k" => GgmlType::Q6K,
        "q2_k" => GgmlType::Q2K,
        "q3_k" => GgmlType::Q3K,
        "q4_0" => GgmlType::Q4_0,
        "q5_0" => GgmlType::Q5_0,
        "q8_0" => GgmlType::Q8_0,
        "iq4_nl" => GgmlType::Iq4Nl,
        "iq4_xs" => GgmlType::Iq4Xs,
        "iq2_xxs" => GgmlType::Iq2Xxs,
        "iq2_xs" => GgmlType::Iq2Xs,
        "iq3_xxs" => GgmlType::Iq3Xxs,
        "iq3_s" => GgmlType::Iq3S,
        "iq2_s" => GgmlType::Iq2S,
        "iq1_s" => GgmlType::Iq1S,
        "iq1_m" => GgmlType::Iq1M,
        "tq2_0" => GgmlType::Tq2_0,
        "tq1_0" => GgmlType::Tq1_0,
        "nvfp4" => GgmlType::Nvfp4,
        other => panic!("unknown type {other}"),
    };
    let threads: usize = args.get(1).map_or(2, |s| s.parse().unwrap());
    let layers: usize = args.get(2).map_or(16, |s| s.parse().unwrap());
    let options = &args[args.len().min(3)..];
    let option = |name: &str| {
        options
            .iter()
            .find_map(|o| o.strip_prefix(name)?.strip_prefix('='))
    };
    // `cached`: one 512 x 1536 matrix swept again and again from the cache: the kernels'
    // compute ceiling, without memory in the way.
    let n_tokens: usize = option("tokens").map_or(1, |n| n.parse().expect("tokens=N"));
    if options.iter().any(|o| o == "cached") {
        assert!(!row_major(ty), "`cached` times packed types");
        return cached(ty, threads, layers, n_tokens);
    }
    let moe = options.iter().any(|o| o == "moe");
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    // Passes of products, each pass one `matmul_products` (a dense layer's matrices one
    // by one; an MoE layer's experts together).
    let shapes: Vec<Vec<(usize, usize)>> = if moe {
        let (n_ff, n_embd) = (1408, 2048);
        (0..layers)
            .flat_map(|_| [vec![(n_ff, n_embd); 16], vec![(n_embd, n_ff); 8]])
            .collect()
    } else if let Some(shape) = option("shape") {
        let (rows, cols) = shape.split_once('x').expect("shape=ROWSxCOLS");
        let shape = (
            rows.parse().expect("shape=ROWSxCOLS"),
            cols.parse().expect("shape=ROWSxCOLS"),
        );
        (0..layers * SHAPES.len()).map(|_| vec![shape]).collect()
    } else {
        (0..layers)
            .flat_map(|_| SHAPES.map(|shape| vec![shape]))
            .collect()
    };
    let bytes: usize = shapes
        .iter()
        .flatten()
        .map(|&(rows, cols)| rows * row_byte_len(ty, cols).unwrap())
        .sum();
    let input = |rows: usize, cols: usize, rng: &mut StdRng| {
        let x: Vec<f32> = (0..cols * n_tokens)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        (x, vec![0f32; rows * n_tokens])
    };
    if row_major(ty) || options.iter().any(|o| o == "row-major") {
        let files: Vec<Vec<(Vec<u8>, usize, usize)>> = shapes
            .iter()
            .map(|pass| {
                pass.iter()
                    .map(|&(rows, cols)| (random_bytes(ty, rows, cols, &mut rng), rows, cols))
                    .collect()
            })
            .collect();
        let mut passes: Vec<Vec<RowMajorOperand<'_>>> = files
            .iter()
            .map(|pass| {
                pass.iter()
                    .map(|(file, rows, cols)| {
                        let m = WeightMatrix::new(ty, *rows, *cols, file).unwrap();
                        let (x, y) = input(*rows, *cols, &mut rng);
                        let mut xq = Vec::new();
                        m.quantize_activation(&x, &mut xq).unwrap();
                        (m, xq, y)
                    })
                    .collect()
            })
            .collect();
        let mut sweep = || {
            for pass in passes.iter_mut() {
                let mut products: Vec<MatrixProduct<'_, '_>> = pass
                    .iter_mut()
                    .map(|(m, xq, y)| MatrixProduct {
                        matrix: m,
                        xq,
                        n_tokens,
                        out: y,
                    })
                    .collect();
                WeightMatrix::matmul_products(&mut products).unwrap();
            }
        };
        return measure(
            &pool,
            &format!("{ty:?} {threads}t"),
            bytes,
            options,
            &mut sweep,
        );
    }
    let mut passes: Vec<Vec<Operand>> = pool.install(|| {
        shapes
            .iter()
            .map(|pass| {
                pass.iter()
                    .map(|&(rows, cols)| {
                        let m = random_matrix(ty, rows, cols, &mut rng);
                        let (x, y) = input(rows, cols, &mut rng);
                        let mut xq = vec![0u8; m.activation_row_bytes() * n_tokens];
                        let act = m.activation_row_bytes();
                        for (x, xq) in x.chunks_exact(cols).zip(xq.chunks_exact_mut(act)) {
                            m.quantize_activation(x, xq).unwrap();
                        }
                        (m, xq, y)
                    })
                    .collect()
            })
            .collect()
    });
    let mut sweep = || {
        for pass in passes.iter_mut() {
            let mut products: Vec<Product<'_>> = pass
                .iter_mut()
                .map(|(m, xq, y)| Product {
                    matrix: m,
                    xq,
                    n_tokens,
                    out: y,
                })
                .collect();
            PackedMatrix::matmul_products(&mut products).unwrap();
        }
    };
    let what = format!(
        "{ty:?} {threads}t{}, {n_tokens} token(s)",
        if moe { " MoE" } else { "" }
    );
    measure(&pool, &what, bytes, options, &mut sweep);
}

/// Times `sweep` (`bytes` of weights) on `pool`: against each prefetch distance of the
/// `prefetch=` option, or against the read bandwidth measured between sweeps.
fn measure(
    pool: &rayon::ThreadPool,
    what: &str,
    bytes: usize,
    options: &[String],
    sweep: &mut (dyn FnMut() + Send),
) {
    let threads = pool.current_num_threads();
    let option = |name: &str| {
        options
            .iter()
            .find_map(|o| o.strip_prefix(name)?.strip_prefix('='))
    };
    if let Some(distances) = option("prefetch") {
        let variants: Vec<(String, Setting)> = distances
            .split(',')
            .map(|d| {
                let prefetch = match d {
                    "none" => Prefetch::Off,
                    d => Prefetch::Ahead(d.parse().expect("prefetch=BYTES,...|none")),
                };
                let set: Setting = Box::new(move || tuning::set_prefetch(prefetch));
                (format!("prefetch {d}"), set)
            })
            .collect();
        println!("{what}, {:.0} MB per sweep:", bytes as f64 / 1e6);
        pool.install(|| paired(bytes, 60, &variants, sweep));
        return;
    }
    // Each sweep of the stack is followed by one of the read-bandwidth buffer, so that
    // each share compares two measurements a moment apart (the bandwidth of a shared host
    // drifts by tens of percent within a minute).
    let reader = ReadSweep::new(threads).expect("memory for the read-bandwidth buffer");
    let rounds = 15;
    let mut rates = Vec::with_capacity(rounds);
    let mut bounds = Vec::with_capacity(rounds);
    pool.install(|| {
        sweep();
        for _ in 0..rounds {
            let start = Instant::now();
            sweep();
            rates.push(bytes as f64 / start.elapsed().as_secs_f64());
            bounds.push(reader.measure());
        }
    });
    let shares: Vec<f64> = rates.iter().zip(&bounds).map(|(r, b)| r / b).collect();
    println!(
        "{what}: {:.0} MB per sweep, {rounds} rounds: median {:.1} GB/s (best {:.1}); read bandwidth median {:.1} GB/s; share of the bound, round by round: median {:.0}% (quartiles {:.0}-{:.0}%)",
        bytes as f64 / 1e6,
        quantile(&rates, 0.5) / 1e9,
        rates.iter().copied().fold(0.0, f64::max) / 1e9,
        quantile(&bounds, 0.5) / 1e9,
        100.0 * quantile(&shares, 0.5),
        100.0 * quantile(&shares, 0.25),
        100.0 * quantile(&shares, 0.75),
    );
}

/// The `q`-quantile of `values` (nearest rank).
fn quantile(values: &[f64], q: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}
