//! Attention's inner loop at depth, one thread: the time for one group of queries sharing
//! a KV head (Qwen2.5-0.5B's decode shape: 7 queries, head 64) to attend to every cached
//! position, per cache type, with the keys and values of two KV heads interleaved as the
//! sequence memory stores them.
//!
//! `cargo run --release -p ferrox-core --example attention_depth -- [POSITIONS] [QUERIES]
//! [CACHE] [PAGE]` (16384, 7, every cache and one run of all positions by default; CACHE:
//! flash, f16, q8_0, q4_0, q8_0/f16 for q8_0 keys with f16 values, f16/q8_0 the other way;
//! PAGE: positions per run,
//! as the server's paged memory hands them over, 16 there). Prints the fastest of many
//! runs and the rate at which the cache's bytes were read.

use std::hint::black_box;
use std::time::{Duration, Instant};

use ferrox_core::flash_attn::{GroupShape, GroupState, KvRun};
use ferrox_core::quantize_row;
use ferrox_core::typed_attn::{TypedGroup, TypedRun};
use ferrox_core::KvType;
use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const HEAD: usize = 64;
const HEADS: usize = 2;

fn fastest(mut run: impl FnMut()) -> Duration {
    let mut best = Duration::MAX;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        let t = Instant::now();
        run();
        best = best.min(t.elapsed());
    }
    best
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize, default: usize| {
        args.get(i).map_or(default, |a| {
            a.parse()
                .unwrap_or_else(|_| panic!("POSITIONS and QUERIES are whole numbers, not {a:?}"))
        })
    };
    let positions = number(0, 16384);
    let n_queries = number(1, 7);
    let only = args.get(2).map(String::as_str);
    let chosen = |name: &str| only.is_none_or(|o| o == name);
    let page = number(3, positions).max(1);
    let pages = || {
        (0..positions)
            .step_by(page)
            .map(move |p| p..(p + page).min(positions))
    };
    let mut rng = StdRng::seed_from_u64(7);
    let keys: Vec<f32> = (0..positions * HEADS * HEAD)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let values: Vec<f32> = (0..positions * HEADS * HEAD)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let queries: Vec<f32> = (0..n_queries * HEAD)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let shape = GroupShape {
        n_queries,
        head_dim_k: HEAD,
        head_dim_v: HEAD,
        scale: 0.125,
        softcap: None,
    };
    let mut out = vec![0f32; n_queries * HEAD];
    println!(
        "{positions} positions in runs of {}, {n_queries} queries of head {HEAD}, one thread",
        page.min(positions)
    );

    let kh: Vec<f16> = keys.iter().map(|&x| f16::from_f32(x)).collect();
    let vh: Vec<f16> = values.iter().map(|&x| f16::from_f32(x)).collect();
    let mut state = GroupState::default();
    if chosen("flash") {
        let stride = HEADS * HEAD;
        let time = fastest(|| {
            state.start(shape, &queries);
            for run in pages() {
                state.attend_run(&KvRun {
                    keys: &kh[run.start * stride..],
                    key_stride: stride,
                    values: &vh[run.start * stride..],
                    value_stride: stride,
                    len: run.len(),
                });
            }
            state.finish(&mut out);
            black_box(&out);
        });
        report("f16 (flash_attn)", time, positions * HEAD * 4);
    }

    for (name, kt, vt) in [
        ("f16", KvType::F16, KvType::F16),
        ("q8_0", KvType::Q8_0, KvType::Q8_0),
        ("q4_0", KvType::Q4_0, KvType::Q4_0),
        ("q8_0/f16", KvType::Q8_0, KvType::F16),
        ("f16/q8_0", KvType::F16, KvType::Q8_0),
    ] {
        if !chosen(name) {
            continue;
        }
        let (k_row, v_row) = (kt.bytes(HEADS * HEAD), vt.bytes(HEADS * HEAD));
        let mut kb = vec![0u8; positions * k_row];
        let mut vb = vec![0u8; positions * v_row];
        for p in 0..positions {
            let at = p * HEADS * HEAD..(p + 1) * HEADS * HEAD;
            quantize_row(kt.ggml(), &keys[at.clone()], &mut kb[p * k_row..][..k_row]).unwrap();
            quantize_row(vt.ggml(), &values[at], &mut vb[p * v_row..][..v_row]).unwrap();
        }
        let mut group = TypedGroup::default();
        let time = fastest(|| {
            group.start((kt, vt), shape, &queries).unwrap();
            for run in pages() {
                group.attend_run(&TypedRun {
                    keys: &kb[run.start * k_row..],
                    key_stride: k_row,
                    values: &vb[run.start * v_row..],
                    value_stride: v_row,
                    len: run.len(),
                });
            }
            group.finish(&mut out);
            black_box(&out);
        });
        let bytes = positions * (kt.bytes(HEAD) + vt.bytes(HEAD));
        report(&format!("{name} (typed)"), time, bytes);
    }
}

fn report(name: &str, time: Duration, bytes: usize) {
    println!(
        "{name:<18} {:>9.1} µs  {:>6.2} GB/s of cache",
        time.as_secs_f64() * 1e6,
        bytes as f64 / time.as_secs_f64() / 1e9
    );
}
