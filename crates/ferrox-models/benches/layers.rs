//! The per-token pieces around the matrix products, at Gemma-3-270M's shapes: RMSNorm of
//! one hidden row, RoPE of one token's query heads, and attention of one token's GQA group
//! (4 query heads sharing one KV head of 256) over f16 caches of several lengths.
//!
//! `cargo bench -p ferrox-models --bench layers [-- FILTER]`. One thread; the kernels are
//! the best this machine has (`FERROX_ISA=avx2` or `scalar` to measure a lower level).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferrox_core::flash_attn::{GroupShape, GroupState, KvRun};
use ferrox_models::layers::norm::rms_norm;
use ferrox_models::layers::rope::{Rope, RopeStyle};
use half::f16;

const N_EMBD: usize = 640;
const N_HEAD: usize = 4;
const HEAD_DIM: usize = 256;

fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2654435761) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn norm_and_rope(c: &mut Criterion) {
    let mut group = c.benchmark_group("layers");
    group.measurement_time(Duration::from_secs(2));
    let x = values(N_EMBD, 1);
    let w = values(N_EMBD, 2);
    let mut out = vec![0.0; N_EMBD];
    group.throughput(Throughput::Elements(N_EMBD as u64));
    group.bench_function("rms_norm/640", |b| {
        b.iter(|| rms_norm(black_box(&x), &w, 1e-6, &mut out))
    });

    let rope = Rope::plain(RopeStyle::Neox, HEAD_DIM, 10_000.0);
    let mut angles = Vec::new();
    let mut q = values(N_HEAD * HEAD_DIM, 3);
    group.throughput(Throughput::Elements((N_HEAD * HEAD_DIM) as u64));
    group.bench_function("rope/4x256", |b| {
        b.iter(|| {
            rope.angles(black_box(1234), &mut angles);
            rope.apply(&mut q, HEAD_DIM, &angles);
        })
    });
    group.finish();
}

fn attention(c: &mut Criterion) {
    let mut group = c.benchmark_group("attention");
    group.measurement_time(Duration::from_secs(3));
    let shape = GroupShape {
        n_queries: N_HEAD,
        head_dim_k: HEAD_DIM,
        head_dim_v: HEAD_DIM,
        scale: 1.0 / 16.0,
        softcap: None,
    };
    let queries = values(N_HEAD * HEAD_DIM, 4);
    let mut state = GroupState::default();
    let mut out = vec![0.0; N_HEAD * HEAD_DIM];
    for len in [128usize, 512, 2048] {
        let keys: Vec<f16> = values(len * HEAD_DIM, 5)
            .into_iter()
            .map(f16::from_f32)
            .collect();
        let vals: Vec<f16> = values(len * HEAD_DIM, 6)
            .into_iter()
            .map(f16::from_f32)
            .collect();
        let run = KvRun {
            keys: &keys,
            key_stride: HEAD_DIM,
            values: &vals,
            value_stride: HEAD_DIM,
            len,
        };
        // Throughput in (query, key) pairs.
        group.throughput(Throughput::Elements((N_HEAD * len) as u64));
        group.bench_with_input(BenchmarkId::new("gqa4x256", len), &run, |b, run| {
            b.iter(|| {
                state.start(shape, &queries);
                state.attend_run(black_box(run));
                state.finish(&mut out);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, norm_and_rope, attention);
criterion_main!(benches);
