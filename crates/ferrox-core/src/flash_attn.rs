//! The inner loop of attention over an f16 KV cache, for a group of queries that share one
//! KV head (grouped-query attention), with the running sums in registers.
//!
//! For each query, key by key: `s = (q·k)·scale` (optionally `cap·tanh(s)`), an online
//! softmax (`ms` rescales what has accumulated when a new maximum appears, `vs` weighs the
//! key), and an f32 accumulator updated as `acc = acc·ms` (when `ms != 1`) then
//! `acc = v·vs + acc` (fused). Queries and accumulators stay f32, as in ggml's tiled CPU
//! flash attention (its prompt path); keys and values are widened from f16. q·k sums
//! eight lanes in four accumulators over steps of 32 values (AVX2's shape), so every
//! instruction set, the scalar code included, gives the same bits, however keys are split
//! into runs (paged caches) or queries into groups (tested).
//!
//! Keys are taken in blocks: scores of a block first (their horizontal sums eight keys at a
//! time), the softmax steps of every query at once ([`crate::online_softmax`]), then the
//! value rows of the block are read once for all the group's queries while their
//! accumulators stay in registers.

use half::f16;

use crate::kernels::{best_isa, Isa};
pub use crate::online_softmax::MAX_GROUP;
use crate::online_softmax::{KeyBlock, RunningSoftmax, Steps, BLOCK_KEYS};

/// Largest head size.
pub const MAX_HEAD_DIM: usize = 1024;

/// The shape of one group of queries and how their scores are formed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GroupShape {
    pub n_queries: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// Multiplies q·k.
    pub scale: f32,
    /// Attention logit soft cap (Gemma-2): `s = cap·tanh(q·k·scale / cap)`.
    pub softcap: Option<f32>,
}

/// A run of consecutive cached positions of one KV head.
#[derive(Clone, Copy, Debug)]
pub struct KvRun<'a> {
    /// Key `j` is `keys[j * key_stride..][..head_dim_k]`.
    pub keys: &'a [f16],
    pub key_stride: usize,
    /// Value `j` is `values[j * value_stride..][..head_dim_v]`.
    pub values: &'a [f16],
    pub value_stride: usize,
    pub len: usize,
}

/// The running softmax of every query of a group (large: keep one per thread and
/// [`start`](Self::start) it for each group).
pub struct GroupState {
    shape: GroupShape,
    softmax: RunningSoftmax,
    /// Accumulators, `head_dim_v` per query.
    acc: Box<[f32]>,
    /// The queries, `head_dim_k` per query.
    queries: Box<[f32]>,
}

impl Default for GroupState {
    fn default() -> Self {
        GroupState {
            shape: GroupShape {
                n_queries: 0,
                head_dim_k: 0,
                head_dim_v: 0,
                scale: 1.0,
                softcap: None,
            },
            softmax: RunningSoftmax::default(),
            acc: vec![0.0; MAX_GROUP * MAX_HEAD_DIM].into_boxed_slice(),
            queries: vec![0.0; MAX_GROUP * MAX_HEAD_DIM].into_boxed_slice(),
        }
    }
}

impl GroupState {
    /// Starts a group: `queries` holds `shape.n_queries` rows of `head_dim_k` values.
    pub fn start(&mut self, shape: GroupShape, queries: &[f32]) {
        let (n, dk, dv) = (shape.n_queries, shape.head_dim_k, shape.head_dim_v);
        assert!(n <= MAX_GROUP && dk <= MAX_HEAD_DIM && dv <= MAX_HEAD_DIM);
        self.queries[..n * dk].copy_from_slice(&queries[..n * dk]);
        self.shape = shape;
        self.softmax = RunningSoftmax::default();
        self.acc[..n * dv].fill(0.0);
    }

    /// Adds `run`'s positions (following everything added so far) to every query's
    /// softmax.
    pub fn attend_run(&mut self, run: &KvRun<'_>) {
        self.attend_run_with(best_isa(), run)
    }

    /// [`attend_run`](Self::attend_run) on a given instruction set (scalar code where it
    /// is not available).
    pub fn attend_run_with(&mut self, isa: Isa, run: &KvRun<'_>) {
        let shape = self.shape;
        let (g_n, dk, dv) = (shape.n_queries, shape.head_dim_k, shape.head_dim_v);
        if run.len > 0 {
            assert!(run.keys.len() >= (run.len - 1) * run.key_stride + dk);
            assert!(run.values.len() >= (run.len - 1) * run.value_stride + dv);
        }
        let mut scores: KeyBlock = [[0.0; MAX_GROUP]; BLOCK_KEYS];
        let mut ms: KeyBlock = [[1.0; MAX_GROUP]; BLOCK_KEYS];
        let mut vs: KeyBlock = [[0.0; MAX_GROUP]; BLOCK_KEYS];
        let mut start = 0;
        while start < run.len {
            let n = (run.len - start).min(BLOCK_KEYS);
            let keys = &run.keys[start * run.key_stride..];
            self.score_block(isa, keys, run.key_stride, n, &mut scores);
            let rescaled = self.softmax.step(
                isa,
                (shape.scale, shape.softcap),
                (g_n, n),
                &mut scores,
                &mut ms,
                &mut vs,
            );
            let block = ValueBlock {
                values: &run.values[start * run.value_stride..],
                stride: run.value_stride,
                n,
                dv,
            };
            let steps = Steps::new(&ms[..n], &vs[..n], rescaled);
            accumulate_values(isa, &block, (steps, g_n), &mut self.acc[..g_n * dv]);
            start += n;
        }
    }

    /// `scores[j][g] = q_g·k_j` for the first `n` keys at `keys` ([`dot`]'s bits), each
    /// key read once for the whole group where a kernel exists.
    fn score_block(&self, isa: Isa, keys: &[f16], stride: usize, n: usize, scores: &mut KeyBlock) {
        let (g_n, dk) = (self.shape.n_queries, self.shape.head_dim_k);
        #[cfg(target_arch = "x86_64")]
        if isa.has_avx2() && isa.is_available() {
            let per_pass = if isa == Isa::Avx512Vnni { MAX_GROUP } else { 2 };
            for g0 in (0..g_n).step_by(per_pass) {
                let group = (g_n - g0).min(per_pass);
                let pass = ScorePass {
                    keys,
                    stride,
                    n,
                    queries: &self.queries[g0 * dk..(g0 + group) * dk],
                    g0,
                    dk,
                };
                macro_rules! run {
                    ($kernel:ident, $($g:literal)*) => {
                        match group {
                            // SAFETY: the kernel's features are available; `keys` holds `n`
                            // rows at `stride` (checked by the caller), `queries` `group`
                            // rows of `dk`.
                            $($g => unsafe { x86::$kernel::<$g>(pass, scores) },)*
                            _ => unreachable!("at most {per_pass} queries per pass"),
                        }
                    };
                }
                if isa == Isa::Avx512Vnni {
                    run!(scores_512, 1 2 3 4 5 6 7 8);
                } else {
                    run!(scores_256, 1 2);
                }
            }
            return;
        }
        let _ = isa;
        for (g, q) in self.queries.chunks_exact(dk).take(g_n).enumerate() {
            for (j, scores) in scores[..n].iter_mut().enumerate() {
                scores[g] = dot(&keys[j * stride..][..dk], q);
            }
        }
    }

    /// Writes each query's normalised output (`head_dim_v` per query) to `out`.
    pub fn finish(&self, out: &mut [f32]) {
        let dv = self.shape.head_dim_v;
        for g in 0..self.shape.n_queries {
            let inv = if self.softmax.sum[g] > 0.0 {
                1.0 / self.softmax.sum[g]
            } else {
                0.0
            };
            for (o, a) in out[g * dv..(g + 1) * dv]
                .iter_mut()
                .zip(&self.acc[g * dv..(g + 1) * dv])
            {
                *o = a * inv;
            }
        }
    }
}

/// A block's keys and one pass of queries over them, for the score kernels.
#[derive(Clone, Copy)]
struct ScorePass<'a> {
    /// `n` key rows of `dk` values at `stride`.
    keys: &'a [f16],
    stride: usize,
    n: usize,
    /// The pass's queries, `dk` values each; the first is query `g0` of the group.
    queries: &'a [f32],
    g0: usize,
    dk: usize,
}

/// The value rows of one block of keys.
struct ValueBlock<'a> {
    values: &'a [f16],
    stride: usize,
    n: usize,
    dv: usize,
}

/// For each query `g` and key `j` in order: `acc_g = acc_g·ms` when `ms != 1`, then
/// `acc_g = v_j·vs + acc_g` (fused).
fn accumulate_values(
    isa: Isa,
    block: &ValueBlock<'_>,
    (steps, n_queries): (Steps<'_>, usize),
    acc: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        let chunk = if isa == Isa::Avx512Vnni && isa.is_available() {
            x86::CHUNK_512
        } else if isa.has_avx2() && isa.is_available() {
            x86::CHUNK_256
        } else {
            0
        };
        if chunk > 0 {
            for g0 in (0..n_queries).step_by(4) {
                let queries = (g0, (n_queries - g0).min(4));
                let acc = &mut acc[g0 * block.dv..];
                // SAFETY: the kernel's features are available; every slice holds the rows
                // the block reads and writes.
                unsafe {
                    match chunk {
                        x86::CHUNK_512 => x86::accumulate_512(block, steps, queries, acc),
                        _ => x86::accumulate_256(block, steps, queries, acc),
                    }
                }
            }
            // Each value is updated on its own, so the columns past the whole chunks take
            // the scalar code with the same bits (its fused multiply-adds as instructions).
            let cols = block.dv - block.dv % chunk;
            if cols < block.dv {
                // SAFETY: the kernels above needed FMA, so it is available.
                unsafe { x86::scalar_accumulate_fma(block, (steps, n_queries), acc, cols) };
            }
            return;
        }
    }
    let _ = isa;
    scalar_accumulate(block, (steps, n_queries), acc, 0);
}

/// Values per step of [`dot`].
const DOT_STEP: usize = 32;

/// `Σ k[i]·q[i]` in the shape of the AVX2 kernel: four accumulators of eight lanes over
/// steps of 32 values (fused multiply-adds), reduced as `(a0 + a2) + (a1 + a3)`, then the
/// lanes `l` and `l + 4` added and the four sums pairwise; a tail shorter than a step adds
/// on in order.
pub fn dot(k: &[f16], q: &[f32]) -> f32 {
    let n = k.len().min(q.len());
    let whole = n - n % DOT_STEP;
    let mut acc = [[0.0f32; 8]; 4];
    for i in (0..whole).step_by(DOT_STEP) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, a) in lanes.iter_mut().enumerate() {
                let at = i + j * 8 + l;
                *a = k[at].to_f32().mul_add(q[at], *a);
            }
        }
    }
    let total: [f32; 8] =
        std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let s: [f32; 4] = std::array::from_fn(|l| total[l] + total[l + 4]);
    let mut sum = (s[0] + s[1]) + (s[2] + s[3]);
    for i in whole..n {
        sum += k[i].to_f32() * q[i];
    }
    sum
}

/// [`accumulate_values`] for the columns `from..dv`.
#[inline(always)]
fn scalar_accumulate(
    block: &ValueBlock<'_>,
    (steps, n_queries): (Steps<'_>, usize),
    acc: &mut [f32],
    from: usize,
) {
    let dv = block.dv;
    for (g, acc) in acc.chunks_exact_mut(dv).enumerate().take(n_queries) {
        let acc = &mut acc[from..];
        for j in 0..block.n {
            let v = &block.values[j * block.stride + from..][..dv - from];
            let (m, w) = (steps.ms[j][g], steps.vs[j][g]);
            if m != 1.0 {
                acc.iter_mut().for_each(|a| *a *= m);
            }
            for (a, x) in acc.iter_mut().zip(v) {
                *a = x.to_f32().mul_add(w, *a);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    use super::{KeyBlock, ScorePass, ValueBlock, BLOCK_KEYS};
    use crate::kernels::x86::avx2_common::hsum8_adjacent;
    use crate::online_softmax::{Steps, MAX_GROUP};

    use super::DOT_STEP;

    /// `scores[j][g0 + g] = q_g·k_j` for `G` queries in [`super::dot`]'s order: two
    /// accumulators of sixteen lanes per query (the AVX2 kernel's `[a0 | a1]` and
    /// `[a2 | a3]`) over steps of 32 values, then `(acc0 + acc1)` and its two halves added:
    /// the AVX2 kernel's eight-lane total, summed by [`finish_scores`].
    ///
    /// SAFETY: needs the AVX-512 kernel features; `keys` holds `n` (at most a block) rows
    /// of `dk` at `stride`, `queries` holds `G` (at most eight) rows of `dk`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn scores_512<const G: usize>(pass: ScorePass<'_>, scores: &mut KeyBlock) {
        let ScorePass {
            keys,
            stride,
            n,
            queries,
            dk,
            ..
        } = pass;
        debug_assert!(queries.len() >= G * dk && n <= BLOCK_KEYS);
        let whole = dk - dk % DOT_STEP;
        // Written for the first `n` keys, read only there (no clearing of the rest).
        let mut totals = [[MaybeUninit::<__m256>::uninit(); G]; BLOCK_KEYS];
        for (j, totals) in totals.iter_mut().enumerate().take(n) {
            // SAFETY: row `j` lies inside `keys` (the caller's contract).
            let k = unsafe { keys.as_ptr().add(j * stride) };
            let mut acc = [[_mm512_setzero_ps(); 2]; G];
            let mut i = 0;
            while i < whole {
                // SAFETY: `i + 32 <= dk`: inside the row and every query.
                unsafe {
                    let k0 = load_h512(k.add(i));
                    let k1 = load_h512(k.add(i + 16));
                    for (g, acc) in acc.iter_mut().enumerate() {
                        let q = queries.as_ptr().add(g * dk + i);
                        acc[0] = _mm512_fmadd_ps(k0, _mm512_loadu_ps(q), acc[0]);
                        acc[1] = _mm512_fmadd_ps(k1, _mm512_loadu_ps(q.add(16)), acc[1]);
                    }
                }
                i += DOT_STEP;
            }
            for (total, acc) in totals.iter_mut().zip(&acc) {
                let pairs = _mm512_add_ps(acc[0], acc[1]);
                total.write(_mm256_add_ps(
                    _mm512_castps512_ps256(pairs),
                    _mm512_extractf32x8_ps::<1>(pairs),
                ));
            }
        }
        // SAFETY: AVX2 is part of the AVX-512 kernel features; the caller's contract.
        unsafe { finish_scores(&totals, pass, scores) }
    }

    /// [`super::scalar_accumulate`] compiled with FMA (its `mul_add`s one instruction each
    /// instead of a library call).
    ///
    /// SAFETY: needs FMA.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scalar_accumulate_fma(
        block: &ValueBlock<'_>,
        steps: (Steps<'_>, usize),
        acc: &mut [f32],
        from: usize,
    ) {
        super::scalar_accumulate(block, steps, acc, from)
    }

    /// `sum` with `k[i]·q[i]` added for `i` in `whole..dk`, one at a time, unfused: the
    /// tail of [`super::dot`].
    ///
    /// SAFETY: `k` points at `dk` readable halves; `q` holds at least `dk` values.
    #[inline(always)]
    unsafe fn add_tail(
        mut sum: f32,
        k: *const half::f16,
        q: &[f32],
        whole: usize,
        dk: usize,
    ) -> f32 {
        for (i, &qi) in q.iter().enumerate().take(dk).skip(whole) {
            // SAFETY: `i < dk`, inside the row (the caller's contract).
            let ki = unsafe { *k.add(i) };
            sum += ki.to_f32() * qi;
        }
        sum
    }

    /// [`scores_512`] with eight-lane registers: four accumulators per query, `G` (1 or 2)
    /// queries per pass.
    ///
    /// SAFETY: needs AVX2, FMA and F16C; as [`scores_512`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scores_256<const G: usize>(pass: ScorePass<'_>, scores: &mut KeyBlock) {
        let ScorePass {
            keys,
            stride,
            n,
            queries,
            dk,
            ..
        } = pass;
        debug_assert!(queries.len() >= G * dk && n <= BLOCK_KEYS);
        let whole = dk - dk % DOT_STEP;
        // Written for the first `n` keys, read only there (no clearing of the rest).
        let mut totals = [[MaybeUninit::<__m256>::uninit(); G]; BLOCK_KEYS];
        for (j, totals) in totals.iter_mut().enumerate().take(n) {
            // SAFETY: row `j` lies inside `keys` (the caller's contract).
            let k = unsafe { keys.as_ptr().add(j * stride) };
            let mut acc = [[_mm256_setzero_ps(); 4]; G];
            let mut i = 0;
            while i < whole {
                // SAFETY: `i + 32 <= dk`: inside the row and every query.
                unsafe {
                    let kv: [__m256; 4] = std::array::from_fn(|r| load_h256(k.add(i + 8 * r)));
                    for (g, acc) in acc.iter_mut().enumerate() {
                        let q = queries.as_ptr().add(g * dk + i);
                        for r in 0..4 {
                            acc[r] = _mm256_fmadd_ps(kv[r], _mm256_loadu_ps(q.add(8 * r)), acc[r]);
                        }
                    }
                }
                i += DOT_STEP;
            }
            for (total, acc) in totals.iter_mut().zip(&acc) {
                total.write(_mm256_add_ps(
                    _mm256_add_ps(acc[0], acc[2]),
                    _mm256_add_ps(acc[1], acc[3]),
                ));
            }
        }
        // SAFETY: the caller's contract.
        unsafe { finish_scores(&totals, pass, scores) }
    }

    /// `scores[j][g0 + g]` from each key's and query's eight-lane total: the lanes `l` and
    /// `l + 4` added, then the four sums pairwise, for eight keys at once (the additions
    /// [`super::dot`] makes for each), then any tail shorter than a step, in order.
    ///
    /// SAFETY: needs AVX2; `totals` holds the first `n` (at least one) keys' values, `keys`
    /// `n` rows of `dk` at `stride`, `queries` `G` rows.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish_scores<const G: usize>(
        totals: &[[MaybeUninit<__m256>; G]; BLOCK_KEYS],
        pass: ScorePass<'_>,
        scores: &mut KeyBlock,
    ) {
        let ScorePass {
            keys,
            stride,
            n,
            queries,
            g0,
            dk,
        } = pass;
        let whole = dk - dk % DOT_STEP;
        for g in 0..G {
            for j0 in (0..n).step_by(8) {
                // SAFETY: keys past the `n` written repeat the last one.
                let sums = hsum8_adjacent(std::array::from_fn(|t| unsafe {
                    totals[(j0 + t).min(n - 1)][g].assume_init()
                }));
                let mut lanes = [0f32; 8];
                // SAFETY: eight values.
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sums) };
                for (t, &sum) in lanes.iter().enumerate().take(n - j0) {
                    let j = j0 + t;
                    let mut sum = sum;
                    if whole < dk {
                        // SAFETY: row `j` lies inside `keys`; the query holds `dk` values.
                        sum = unsafe {
                            add_tail(
                                sum,
                                keys.as_ptr().add(j * stride),
                                &queries[g * dk..],
                                whole,
                                dk,
                            )
                        };
                    }
                    scores[j][g0 + g] = sum;
                }
            }
        }
    }

    /// Values per register group: four zmm registers.
    pub const CHUNK_512: usize = 64;
    /// Values per register group: two ymm registers (AVX2 has sixteen registers).
    pub const CHUNK_256: usize = 16;

    macro_rules! accumulate_body {
        ($block:ident, $steps:ident, $g0:ident, $acc:ident, $G:literal, $R:literal, $W:literal,
         $vec:ty, $load_h:expr, $load_f:expr, $store_f:expr,
         $set1:expr, $mul:expr, $fma:expr) => {{
            let dv = $block.dv;
            let cols = dv - dv % ($R * $W);
            let mut c = 0;
            while c < cols {
                let mut acc: [[$vec; $R]; $G] = [[$set1(0.0); $R]; $G];
                for g in 0..$G {
                    for r in 0..$R {
                        acc[g][r] = $load_f($acc.as_ptr().add(g * dv + c + r * $W));
                    }
                }
                for j in 0..$block.n {
                    let row = $block.values.as_ptr().add(j * $block.stride + c);
                    let mut v: [$vec; $R] = [$set1(0.0); $R];
                    for r in 0..$R {
                        v[r] = $load_h(row.add(r * $W));
                    }
                    if $steps.rescales(j) {
                        for g in 0..$G {
                            let m = $steps.ms[j][$g0 + g];
                            if m != 1.0 {
                                let mv = $set1(m);
                                for r in 0..$R {
                                    acc[g][r] = $mul(acc[g][r], mv);
                                }
                            }
                        }
                    }
                    for g in 0..$G {
                        let w = $set1($steps.vs[j][$g0 + g]);
                        for r in 0..$R {
                            acc[g][r] = $fma(v[r], w, acc[g][r]);
                        }
                    }
                }
                for g in 0..$G {
                    for r in 0..$R {
                        $store_f($acc.as_mut_ptr().add(g * dv + c + r * $W), acc[g][r]);
                    }
                }
                c += $R * $W;
            }
        }};
    }

    macro_rules! dispatch_groups {
        ($name:ident, $feat:literal, $R:literal, $W:literal, $vec:ty, $load_h:expr, $load_f:expr,
         $store_f:expr, $set1:expr, $mul:expr, $fma:expr) => {
            /// The columns past the last whole chunk are left to the caller.
            ///
            /// SAFETY: needs the named target features; `acc` holds `group` (1 to 4) rows
            /// of `dv` values (queries `g0..g0 + group`), each value row `dv` halves.
            #[target_feature(enable = $feat)]
            pub unsafe fn $name(
                block: &ValueBlock<'_>,
                steps: Steps<'_>,
                (g0, group): (usize, usize),
                acc: &mut [f32],
            ) {
                assert!(acc.len() >= group * block.dv && g0 + group <= MAX_GROUP);
                assert!(block.n <= steps.len());
                // SAFETY: bounds as stated by the caller; every pointer offset stays inside.
                unsafe {
                    match group {
                        1 => accumulate_body!(
                            block, steps, g0, acc, 1, $R, $W, $vec, $load_h, $load_f, $store_f,
                            $set1, $mul, $fma
                        ),
                        2 => accumulate_body!(
                            block, steps, g0, acc, 2, $R, $W, $vec, $load_h, $load_f, $store_f,
                            $set1, $mul, $fma
                        ),
                        3 => accumulate_body!(
                            block, steps, g0, acc, 3, $R, $W, $vec, $load_h, $load_f, $store_f,
                            $set1, $mul, $fma
                        ),
                        _ => accumulate_body!(
                            block, steps, g0, acc, 4, $R, $W, $vec, $load_h, $load_f, $store_f,
                            $set1, $mul, $fma
                        ),
                    }
                }
            }
        };
    }

    #[inline(always)]
    unsafe fn load_h512(p: *const half::f16) -> __m512 {
        // SAFETY: the caller guarantees sixteen readable halves.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }

    #[inline(always)]
    unsafe fn load_h256(p: *const half::f16) -> __m256 {
        // SAFETY: the caller guarantees eight readable halves.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }

    dispatch_groups!(
        accumulate_512,
        "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c",
        4,
        16,
        __m512,
        load_h512,
        _mm512_loadu_ps,
        _mm512_storeu_ps,
        _mm512_set1_ps,
        _mm512_mul_ps,
        _mm512_fmadd_ps
    );

    dispatch_groups!(
        accumulate_256,
        "avx2,fma,f16c",
        2,
        8,
        __m256,
        load_h256,
        _mm256_loadu_ps,
        _mm256_storeu_ps,
        _mm256_set1_ps,
        _mm256_mul_ps,
        _mm256_fmadd_ps
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn halves(n: usize, seed: u32) -> Vec<f16> {
        let mut x = seed.wrapping_mul(2654435761).wrapping_add(12345);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                f16::from_f32((x % 2001) as f32 / 1000.0 - 1.0)
            })
            .collect()
    }

    /// The one-key-at-a-time loop, one query at a time, in scalar code.
    fn one_key_at_a_time(group: &GroupShape, queries: &[f32], run: &KvRun<'_>) -> Vec<f32> {
        let (dk, dv) = (group.head_dim_k, group.head_dim_v);
        let mut out = vec![0.0; group.n_queries * dv];
        for g in 0..group.n_queries {
            let q = &queries[g * dk..(g + 1) * dk];
            let mut acc = vec![0.0f32; dv];
            let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
            let (scale, cap) = match group.softcap {
                Some(c) => (group.scale / c, c),
                None => (group.scale, 0.0),
            };
            for j in 0..run.len {
                let mut s = dot(&run.keys[j * run.key_stride..][..dk], q) * scale;
                if group.softcap.is_some() {
                    s = cap * s.tanh();
                }
                let (m, w) = if s > max {
                    let m = crate::online_softmax::exp(max - s);
                    max = s;
                    (m, 1.0)
                } else {
                    (1.0, crate::online_softmax::exp(s - max))
                };
                let v = &run.values[j * run.value_stride..][..dv];
                for (a, x) in acc.iter_mut().zip(v) {
                    *a = x.to_f32().mul_add(w, *a * m);
                }
                sum = sum * m + w;
            }
            let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
            for (o, a) in out[g * dv..(g + 1) * dv].iter_mut().zip(&acc) {
                *o = a * inv;
            }
        }
        out
    }

    #[test]
    fn every_isa_grouping_and_split_gives_the_reference_bits() {
        for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
            for &(n_q, dk, dv, len, softcap) in &[
                (4, 256, 256, 77, None),
                (1, 64, 64, 5, None),
                (3, 128, 96, 40, Some(50.0)),
                (8, 80, 80, 33, None),
                (2, 40, 24, 17, None),
                (5, 256, 128, 1, None),
                // Head sizes between whole SIMD steps (SigLIP's 72): a scalar tail.
                (6, 72, 72, 29, None),
                (1, 8, 8, 3, None),
                (2, 100, 36, 19, Some(30.0)),
            ] {
                let stride_k = dk * 2 + 8;
                let stride_v = dv + 16;
                let keys = halves(len * stride_k, 1);
                let values = halves(len * stride_v, 2);
                let queries: Vec<f32> = halves(n_q * dk, 3)
                    .iter()
                    .map(|h| h.to_f32() * 1.37)
                    .collect();
                let group = GroupShape {
                    n_queries: n_q,
                    head_dim_k: dk,
                    head_dim_v: dv,
                    scale: 0.7,
                    softcap,
                };
                let whole = KvRun {
                    keys: &keys,
                    key_stride: stride_k,
                    values: &values,
                    value_stride: stride_v,
                    len,
                };
                let want = one_key_at_a_time(&group, &queries, &whole);
                // The same keys cut into runs of every length from 1 to 20.
                for cut in [1, 3, 16, 20, len] {
                    let mut state = GroupState::default();
                    state.start(group, &queries);
                    let mut p = 0;
                    while p < len {
                        let n = cut.min(len - p);
                        let run = KvRun {
                            keys: &keys[p * stride_k..],
                            values: &values[p * stride_v..],
                            len: n,
                            ..whole
                        };
                        state.attend_run_with(isa, &run);
                        p += n;
                    }
                    let mut got = vec![0.0; n_q * dv];
                    state.finish(&mut got);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{isa:?} {n_q}x{dk}/{dv} len {len} cut {cut}");
                }
            }
        }
    }
}
