//! Attention of every row over every row of a span (bidirectional, no cache): the form of a
//! vision encoder's layers. All queries are known at once, so the product is laid out as
//! a matrix product: keys are repacked per head into blocks of [`KEY_BLOCK`] keys
//! transposed (`[dim][key]`), so that the scores of a block are sixteen lanes that each
//! query fills by one multiply-add per dimension (no horizontal sums), the online softmax
//! runs on those lanes, and values are added into each query's output sixteen columns at
//! a time.
//!
//! The arithmetic of one output is fixed, lane by lane, and the scalar code
//! ([`DenseAttention::run_with`] on [`Isa::Scalar`]) is its reference, which the SIMD
//! code matches bit for bit: for each block of keys, `s_l = fma(q_d, k_dl, s_l)` over the
//! dimensions in order from zero, `s_l = s_l·scale`; `m' = max(m, max_l s_l)` (keys past
//! the span excluded), `α = exp(m - m')`, `p_l = exp(s_l - m')` (zero for excluded keys),
//! per-lane sums `l_l = fma(l_l, α, p_l)`; each output column `o = o·α`, then
//! `o = fma(p_j, v_j, o)` for the block's keys in order. At the end the sixteen lane sums
//! are added pairwise (lanes `i` and `i + 8`, then `+ 4`, `+ 2`, `+ 1`) and each column
//! is `o · (1 / l)`. [`exp`] is a polynomial both forms evaluate identically.

use half::f16;
use rayon::prelude::*;

use crate::kernels::{best_isa, Isa};
use crate::online_softmax::exp;

/// Keys per block: the lanes of one AVX-512 register.
pub const KEY_BLOCK: usize = 16;
/// Queries per task, their scores in registers.
const QUERY_BLOCK: usize = 16;
/// Largest head size.
pub const MAX_HEAD_DIM: usize = 256;

/// How keys and values are held while attending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvPrecision {
    /// Rounded to f16 (llama.cpp's flash attention stores them so).
    F16,
    /// Kept f32.
    F32,
    /// Keys, values and queries rounded to f16 and each output accumulated in f16, one key
    /// at a time: the arithmetic of ggml's one-query flash-attention kernel, which llama.cpp's
    /// CPU backend runs when an attention has fewer than [`TILED_MIN_QUERIES`] queries (from
    /// there on, its tiled kernel, which [`KvPrecision::F16`] follows). Scalar only: it is
    /// for small inputs.
    F16Accumulated,
}

/// The fewest queries for which llama.cpp's CPU flash attention takes its tiled kernel
/// (`GGML_FA_TILE_Q`).
pub const TILED_MIN_QUERIES: usize = 64;

/// The shape of one dense attention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DenseAttention {
    pub n_head: usize,
    pub head_dim: usize,
    /// Multiplies q·k.
    pub scale: f32,
    pub kv: KvPrecision,
}

/// Repacked keys and values, reused between calls.
#[derive(Default)]
pub struct DenseScratch {
    keys16: Vec<f16>,
    values16: Vec<f16>,
    keys32: Vec<f32>,
    values32: Vec<f32>,
}

impl DenseAttention {
    /// `out` = attention of each of the `n` rows of `q` over the `n` rows of `k` and `v`,
    /// all token-major with `n_head · head_dim` values per row (head `h` at
    /// `h · head_dim`).
    pub fn run(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut DenseScratch,
    ) {
        self.run_with(best_isa(), q, k, v, n, out, scratch)
    }

    /// [`Self::run`] on a given instruction set (the scalar reference where it is not
    /// available).
    #[allow(clippy::too_many_arguments)]
    pub fn run_with(
        &self,
        isa: Isa,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut DenseScratch,
    ) {
        let (heads, hd) = (self.n_head, self.head_dim);
        let e = heads * hd;
        assert!(hd > 0 && hd <= MAX_HEAD_DIM, "head size {hd}");
        for (what, len) in [
            ("queries", q.len()),
            ("keys", k.len()),
            ("values", v.len()),
            ("outputs", out.len()),
        ] {
            assert_eq!(len, n * e, "{what}: {n} rows of {e}");
        }
        if n == 0 {
            return;
        }
        let isa = if isa.is_available() { isa } else { Isa::Scalar };
        match self.kv {
            KvPrecision::F16Accumulated => self.attend_f16_accumulated(q, k, v, n, out),
            KvPrecision::F16 => {
                let (kt, vt) = repack(
                    k,
                    v,
                    n,
                    heads,
                    hd,
                    &mut scratch.keys16,
                    &mut scratch.values16,
                    f16::from_f32,
                );
                self.attend_all::<f16>(isa, q, kt, vt, n, out);
            }
            KvPrecision::F32 => {
                let (kt, vt) = repack(
                    k,
                    v,
                    n,
                    heads,
                    hd,
                    &mut scratch.keys32,
                    &mut scratch.values32,
                    |x| x,
                );
                self.attend_all::<f32>(isa, q, kt, vt, n, out);
            }
        }
    }

    /// [`KvPrecision::F16Accumulated`]: for each query and head, ggml's online softmax with
    /// the output held in f16 (`v·w + acc` fused, then rounded; a new maximum scales it,
    /// rounded), the sum in f32, the output divided by the sum at the end.
    fn attend_f16_accumulated(&self, q: &[f32], k: &[f32], v: &[f32], n: usize, out: &mut [f32]) {
        let (heads, hd) = (self.n_head, self.head_dim);
        let e = heads * hd;
        let round = |x: f32| f16::from_f32(x).to_f32();
        let keys: Vec<f32> = k.iter().map(|&x| round(x)).collect();
        let values: Vec<f32> = v.iter().map(|&x| round(x)).collect();
        out.par_chunks_mut(hd).enumerate().for_each(|(i, o)| {
            let (t, h) = (i / heads, i % heads);
            let qh: Vec<f32> = q[t * e + h * hd..][..hd]
                .iter()
                .map(|&x| round(x))
                .collect();
            let (mut sum, mut max) = (0.0f32, f32::NEG_INFINITY);
            o.fill(0.0);
            for j in 0..n {
                let kj = &keys[j * e + h * hd..][..hd];
                let dot = kj
                    .iter()
                    .zip(&qh)
                    .fold(0.0f32, |acc, (a, b)| a.mul_add(*b, acc));
                let s = dot * self.scale;
                let (mut ms, mut vs) = (1.0f32, 1.0f32);
                if s > max {
                    ms = (max - s).exp();
                    max = s;
                    o.iter_mut().for_each(|x| *x = round(*x * ms));
                } else {
                    vs = (s - max).exp();
                }
                let vj = &values[j * e + h * hd..][..hd];
                o.iter_mut()
                    .zip(vj)
                    .for_each(|(x, &vv)| *x = round(vv.mul_add(vs, *x)));
                sum = sum.mul_add(ms, vs);
            }
            let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
            o.iter_mut().for_each(|x| *x *= inv);
        });
    }

    fn attend_all<E: Element>(
        &self,
        isa: Isa,
        q: &[f32],
        kt: &[E],
        vt: &[E],
        n: usize,
        out: &mut [f32],
    ) {
        let (heads, hd) = (self.n_head, self.head_dim);
        let e = heads * hd;
        let blocks = n.div_ceil(KEY_BLOCK);
        let per_head = blocks * KEY_BLOCK * hd;
        let query_blocks = n.div_ceil(QUERY_BLOCK);
        let outputs = crate::matrix::Outputs {
            ptr: out.as_mut_ptr(),
            len: out.len(),
        };
        (0..heads * query_blocks).into_par_iter().for_each(|task| {
            let (head, qb) = (task / query_blocks, task % query_blocks);
            let first = qb * QUERY_BLOCK;
            let rows = QUERY_BLOCK.min(n - first);
            let mut queries = [0f32; QUERY_BLOCK * MAX_HEAD_DIM];
            for r in 0..rows {
                let at = (first + r) * e + head * hd;
                queries[r * hd..(r + 1) * hd].copy_from_slice(&q[at..at + hd]);
            }
            let mut acc = [0f32; QUERY_BLOCK * MAX_HEAD_DIM];
            let head_keys = &kt[head * per_head..(head + 1) * per_head];
            let head_values = &vt[head * per_head..(head + 1) * per_head];
            let task = Task {
                queries: &queries[..QUERY_BLOCK * hd],
                keys: head_keys,
                values: head_values,
                n_keys: n,
                hd,
                scale: self.scale,
            };
            let sums = attend_block(isa, &task, &mut acc[..QUERY_BLOCK * hd]);
            for r in 0..rows {
                let inv = 1.0 / sums[r];
                // SAFETY: each task writes its own queries' columns of its own head.
                let o = unsafe { outputs.rows((first + r) * e + head * hd, hd) };
                for (o, a) in o.iter_mut().zip(&acc[r * hd..(r + 1) * hd]) {
                    *o = a * inv;
                }
            }
        });
    }
}

/// An element type of repacked keys and values.
pub(crate) trait Element: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;

    /// `count` (at most sixteen) elements at `p` widened to f32, the other lanes zero.
    ///
    /// # Safety
    /// The AVX-512 kernel features; `count` readable elements at `p`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self, count: usize) -> std::arch::x86_64::__m512;

    /// `count` (at most eight) elements at `p` widened to f32, the other lanes zero.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `count` readable elements at `p`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self, count: usize) -> std::arch::x86_64::__m256;
}

impl Element for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self, count: usize) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller's contract.
        unsafe { x86::load_f16(p, count) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self, count: usize) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller's contract.
        unsafe { x86::load8_f16(p, count) }
    }
}

impl Element for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self, count: usize) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller's contract.
        unsafe { x86::load_f32(p, count) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self, count: usize) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller's contract.
        unsafe { x86::load8_f32(p, count) }
    }
}

/// Keys per head as `[block][dim][KEY_BLOCK]` (zeros past the last key) and values per
/// head as `[key][dim]` (zero rows past the last key), both `blocks · KEY_BLOCK · hd` per
/// head.
#[allow(clippy::too_many_arguments)]
fn repack<'s, E: Element + Default>(
    k: &[f32],
    v: &[f32],
    n: usize,
    heads: usize,
    hd: usize,
    keys: &'s mut Vec<E>,
    values: &'s mut Vec<E>,
    convert: impl Fn(f32) -> E + Sync,
) -> (&'s [E], &'s [E]) {
    let e = heads * hd;
    let blocks = n.div_ceil(KEY_BLOCK);
    let per_head = blocks * KEY_BLOCK * hd;
    keys.clear();
    keys.resize(heads * per_head, E::default());
    values.clear();
    values.resize(heads * per_head, E::default());
    keys.par_chunks_mut(KEY_BLOCK * hd)
        .enumerate()
        .for_each(|(i, block)| {
            let (head, b) = (i / blocks, i % blocks);
            for l in 0..KEY_BLOCK.min(n - b * KEY_BLOCK) {
                let row = &k[(b * KEY_BLOCK + l) * e + head * hd..][..hd];
                for (d, &x) in row.iter().enumerate() {
                    block[d * KEY_BLOCK + l] = convert(x);
                }
            }
        });
    values
        .par_chunks_mut(blocks * KEY_BLOCK * hd)
        .enumerate()
        .for_each(|(head, rows)| {
            for (j, row) in rows.chunks_exact_mut(hd).take(n).enumerate() {
                for (o, &x) in row.iter_mut().zip(&v[j * e + head * hd..][..hd]) {
                    *o = convert(x);
                }
            }
        });
    (keys, values)
}

/// One head's block of queries against all its keys.
struct Task<'a, E> {
    /// `QUERY_BLOCK` rows of `hd` (zeros past the real queries).
    queries: &'a [f32],
    /// `[block][dim][KEY_BLOCK]`.
    keys: &'a [E],
    /// `[key][dim]`, whole blocks.
    values: &'a [E],
    n_keys: usize,
    hd: usize,
    scale: f32,
}

/// Runs `task` into `acc` (`QUERY_BLOCK` rows of `hd`, zero on entry) and returns each
/// query's softmax denominator.
fn attend_block<E: Element>(isa: Isa, task: &Task<'_, E>, acc: &mut [f32]) -> [f32; QUERY_BLOCK] {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Vnni {
        // SAFETY: `run_with` checked that the instruction set is available.
        return unsafe { x86::attend_block_512(task, acc) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: as above.
        return unsafe { x86::attend_block_256(task, acc) };
    }
    let _ = isa;
    scalar_attend_block(task, acc)
}

/// The lane sums added pairwise: lanes `i` and `i + 8`, then `+ 4`, `+ 2`, `+ 1`.
fn reduce_lanes(mut lanes: [f32; KEY_BLOCK]) -> f32 {
    let mut width = KEY_BLOCK / 2;
    while width > 0 {
        for i in 0..width {
            lanes[i] += lanes[i + width];
        }
        width /= 2;
    }
    lanes[0]
}

fn scalar_attend_block<E: Element>(task: &Task<'_, E>, acc: &mut [f32]) -> [f32; QUERY_BLOCK] {
    let hd = task.hd;
    let mut max = [f32::NEG_INFINITY; QUERY_BLOCK];
    let mut sums = [[0f32; KEY_BLOCK]; QUERY_BLOCK];
    for b in 0..task.n_keys.div_ceil(KEY_BLOCK) {
        let live = KEY_BLOCK.min(task.n_keys - b * KEY_BLOCK);
        let keys = &task.keys[b * KEY_BLOCK * hd..][..KEY_BLOCK * hd];
        let values = &task.values[b * KEY_BLOCK * hd..][..KEY_BLOCK * hd];
        for g in 0..QUERY_BLOCK {
            let q = &task.queries[g * hd..(g + 1) * hd];
            let mut s = [0f32; KEY_BLOCK];
            for (d, &qd) in q.iter().enumerate() {
                for (l, s) in s.iter_mut().enumerate() {
                    *s = qd.mul_add(keys[d * KEY_BLOCK + l].to_f32(), *s);
                }
            }
            let mut block_max = f32::NEG_INFINITY;
            for s in s.iter_mut().take(live) {
                *s *= task.scale;
                block_max = block_max.max(*s);
            }
            let new_max = max[g].max(block_max);
            let alpha = exp(max[g] - new_max);
            max[g] = new_max;
            let p: [f32; KEY_BLOCK] =
                std::array::from_fn(|l| if l < live { exp(s[l] - new_max) } else { 0.0 });
            for (sum, &p) in sums[g].iter_mut().zip(&p) {
                *sum = sum.mul_add(alpha, p);
            }
            for (d, o) in acc[g * hd..(g + 1) * hd].iter_mut().enumerate() {
                let mut a = *o * alpha;
                for (j, &p) in p.iter().enumerate() {
                    a = p.mul_add(values[j * hd + d].to_f32(), a);
                }
                *o = a;
            }
        }
    }
    std::array::from_fn(|g| reduce_lanes(sums[g]))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::{Element, Task, KEY_BLOCK, QUERY_BLOCK};
    use crate::online_softmax::x86::{exp16, exp8};

    pub(super) fn mask(count: usize) -> u16 {
        if count >= 16 {
            u16::MAX
        } else {
            (1u16 << count) - 1
        }
    }

    /// See [`Element::load16`].
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn load_f16(p: *const f16, count: usize) -> __m512 {
        // SAFETY: the caller's contract; masked lanes are not read.
        unsafe { _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask(count), p.cast())) }
    }

    /// See [`Element::load16`].
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn load_f32(p: *const f32, count: usize) -> __m512 {
        // SAFETY: the caller's contract; masked lanes are not read.
        unsafe { _mm512_maskz_loadu_ps(mask(count), p) }
    }

    /// Eight-lane masks: lane `i` set when `i < count`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn mask8(count: usize) -> __m256i {
        let lanes: [i32; 8] = std::array::from_fn(|i| if i < count { -1 } else { 0 });
        // SAFETY: eight readable values.
        unsafe { _mm256_loadu_si256(lanes.as_ptr().cast()) }
    }

    /// See [`Element::load8`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn load8_f16(p: *const f16, count: usize) -> __m256 {
        if count >= 8 {
            // SAFETY: the caller's contract.
            return unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) };
        }
        let mut lanes = [f16::ZERO; 8];
        // SAFETY: the caller's contract: `count` readable halves.
        unsafe { std::ptr::copy_nonoverlapping(p, lanes.as_mut_ptr(), count) };
        // SAFETY: eight readable halves.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(lanes.as_ptr().cast())) }
    }

    /// See [`Element::load8`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn load8_f32(p: *const f32, count: usize) -> __m256 {
        // SAFETY: the caller's contract; masked lanes are not read.
        unsafe { _mm256_maskload_ps(p, mask8(count)) }
    }

    /// Queries per pass of the AVX2 scores (two registers each).
    const PASS: usize = 4;

    /// [`attend_block_512`] with each block's sixteen lanes in two eight-lane registers,
    /// the running sums in memory.
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn attend_block_256<E: Element>(
        task: &Task<'_, E>,
        acc: &mut [f32],
    ) -> [f32; QUERY_BLOCK] {
        let hd = task.hd;
        assert!(task.queries.len() >= QUERY_BLOCK * hd && acc.len() >= QUERY_BLOCK * hd);
        let blocks = task.n_keys.div_ceil(KEY_BLOCK);
        assert!(
            task.keys.len() >= blocks * KEY_BLOCK * hd
                && task.values.len() >= blocks * KEY_BLOCK * hd
        );
        let mut max = [f32::NEG_INFINITY; QUERY_BLOCK];
        let mut sums = [[0f32; KEY_BLOCK]; QUERY_BLOCK];
        let mut p = [[0f32; KEY_BLOCK]; QUERY_BLOCK];
        let mut alpha = [0f32; QUERY_BLOCK];
        let scale = _mm256_set1_ps(task.scale);
        let q = task.queries.as_ptr();
        for b in 0..blocks {
            let live = KEY_BLOCK.min(task.n_keys - b * KEY_BLOCK);
            let live_masks = [mask8(live), mask8(live.saturating_sub(8))];
            // SAFETY (loads below): the block's keys and values lie inside the slices
            // (asserted above); queries hold QUERY_BLOCK rows of `hd`.
            let keys = unsafe { task.keys.as_ptr().add(b * KEY_BLOCK * hd) };
            let values = unsafe { task.values.as_ptr().add(b * KEY_BLOCK * hd) };
            for g0 in (0..QUERY_BLOCK).step_by(PASS) {
                let mut s = [[_mm256_setzero_ps(); 2]; PASS];
                for d in 0..hd {
                    let k = unsafe {
                        [
                            E::load8(keys.add(d * KEY_BLOCK), 8),
                            E::load8(keys.add(d * KEY_BLOCK + 8), 8),
                        ]
                    };
                    for (g, s) in s.iter_mut().enumerate() {
                        let qd = _mm256_set1_ps(unsafe { *q.add((g0 + g) * hd + d) });
                        s[0] = _mm256_fmadd_ps(qd, k[0], s[0]);
                        s[1] = _mm256_fmadd_ps(qd, k[1], s[1]);
                    }
                }
                for (g, s) in s.iter().enumerate() {
                    let g = g0 + g;
                    let scaled = [_mm256_mul_ps(s[0], scale), _mm256_mul_ps(s[1], scale)];
                    let low = _mm256_set1_ps(f32::NEG_INFINITY);
                    let live_scores = [
                        _mm256_blendv_ps(low, scaled[0], _mm256_castsi256_ps(live_masks[0])),
                        _mm256_blendv_ps(low, scaled[1], _mm256_castsi256_ps(live_masks[1])),
                    ];
                    let mut lanes = [0f32; KEY_BLOCK];
                    // SAFETY: sixteen values.
                    unsafe {
                        _mm256_storeu_ps(lanes.as_mut_ptr(), live_scores[0]);
                        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), live_scores[1]);
                    }
                    let block_max = lanes.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                    let new = max[g].max(block_max);
                    let a = exp8(_mm256_set1_ps(max[g] - new));
                    max[g] = new;
                    let new = _mm256_set1_ps(new);
                    for h in 0..2 {
                        let ph = _mm256_and_ps(
                            exp8(_mm256_sub_ps(scaled[h], new)),
                            _mm256_castsi256_ps(live_masks[h]),
                        );
                        // SAFETY: `sums[g]` and `p[g]` hold sixteen values.
                        unsafe {
                            let sum = sums[g].as_mut_ptr().add(8 * h);
                            _mm256_storeu_ps(sum, _mm256_fmadd_ps(_mm256_loadu_ps(sum), a, ph));
                            _mm256_storeu_ps(p[g].as_mut_ptr().add(8 * h), ph);
                        }
                    }
                    alpha[g] = _mm256_cvtss_f32(a);
                }
            }
            for c in (0..hd).step_by(8) {
                let count = (hd - c).min(8);
                let cmask = mask8(count);
                for half in 0..2 {
                    let v: [__m256; 8] = std::array::from_fn(|j| unsafe {
                        E::load8(values.add((8 * half + j) * hd + c), count)
                    });
                    for g in 0..QUERY_BLOCK {
                        // SAFETY: `acc` holds QUERY_BLOCK rows of `hd`; masked lanes are
                        // neither read nor written.
                        let o = unsafe { acc.as_mut_ptr().add(g * hd + c) };
                        let mut a = unsafe { _mm256_maskload_ps(o, cmask) };
                        if half == 0 {
                            a = _mm256_mul_ps(a, _mm256_set1_ps(alpha[g]));
                        }
                        for (j, v) in v.iter().enumerate() {
                            a = _mm256_fmadd_ps(_mm256_set1_ps(p[g][8 * half + j]), *v, a);
                        }
                        unsafe { _mm256_maskstore_ps(o, cmask, a) };
                    }
                }
            }
        }
        std::array::from_fn(|g| super::reduce_lanes(sums[g]))
    }

    /// [`super::scalar_attend_block`] with the block's scores, softmax and value sums on
    /// sixteen lanes.
    ///
    /// # Safety
    /// The AVX-512 kernel features must be available.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn attend_block_512<E: Element>(
        task: &Task<'_, E>,
        acc: &mut [f32],
    ) -> [f32; QUERY_BLOCK] {
        let hd = task.hd;
        assert!(task.queries.len() >= QUERY_BLOCK * hd && acc.len() >= QUERY_BLOCK * hd);
        let blocks = task.n_keys.div_ceil(KEY_BLOCK);
        assert!(
            task.keys.len() >= blocks * KEY_BLOCK * hd
                && task.values.len() >= blocks * KEY_BLOCK * hd
        );
        let mut max = [_mm512_set1_ps(f32::NEG_INFINITY); QUERY_BLOCK];
        let mut sums = [_mm512_setzero_ps(); QUERY_BLOCK];
        let mut p = [[0f32; KEY_BLOCK]; QUERY_BLOCK];
        let mut alpha = [0f32; QUERY_BLOCK];
        let scale = _mm512_set1_ps(task.scale);
        let q = task.queries.as_ptr();
        for b in 0..blocks {
            let live = KEY_BLOCK.min(task.n_keys - b * KEY_BLOCK);
            let live_mask = mask(live);
            // SAFETY (loads below): the block's keys and values lie inside the slices
            // (asserted above); queries hold QUERY_BLOCK rows of `hd`.
            let keys = unsafe { task.keys.as_ptr().add(b * KEY_BLOCK * hd) };
            let values = unsafe { task.values.as_ptr().add(b * KEY_BLOCK * hd) };
            let mut s = [_mm512_setzero_ps(); QUERY_BLOCK];
            for d in 0..hd {
                let k = unsafe { E::load16(keys.add(d * KEY_BLOCK), KEY_BLOCK) };
                for (g, s) in s.iter_mut().enumerate() {
                    let qd = _mm512_set1_ps(unsafe { *q.add(g * hd + d) });
                    *s = _mm512_fmadd_ps(qd, k, *s);
                }
            }
            for g in 0..QUERY_BLOCK {
                let scaled = _mm512_mul_ps(s[g], scale);
                let block_max = _mm512_mask_reduce_max_ps(live_mask, scaled);
                let old = max[g];
                let new = _mm512_max_ps(old, _mm512_set1_ps(block_max));
                max[g] = new;
                let a = exp16(_mm512_sub_ps(old, new));
                let pg = _mm512_maskz_mov_ps(live_mask, exp16(_mm512_sub_ps(scaled, new)));
                sums[g] = _mm512_fmadd_ps(sums[g], a, pg);
                // SAFETY: `p[g]` holds sixteen values.
                unsafe { _mm512_storeu_ps(p[g].as_mut_ptr(), pg) };
                alpha[g] = _mm512_cvtss_f32(a);
            }
            for c in (0..hd).step_by(16) {
                let count = (hd - c).min(16);
                let cmask = mask(count);
                let v: [__m512; KEY_BLOCK] =
                    std::array::from_fn(|j| unsafe { E::load16(values.add(j * hd + c), count) });
                for g in 0..QUERY_BLOCK {
                    // SAFETY: `acc` holds QUERY_BLOCK rows of `hd`; masked lanes untouched.
                    let o = unsafe { acc.as_mut_ptr().add(g * hd + c) };
                    let mut a = _mm512_mul_ps(
                        unsafe { _mm512_maskz_loadu_ps(cmask, o) },
                        _mm512_set1_ps(alpha[g]),
                    );
                    for (j, v) in v.iter().enumerate() {
                        a = _mm512_fmadd_ps(_mm512_set1_ps(p[g][j]), *v, a);
                    }
                    unsafe { _mm512_mask_storeu_ps(o, cmask, a) };
                }
            }
        }
        std::array::from_fn(|g| {
            let mut lanes = [0f32; KEY_BLOCK];
            // SAFETY: sixteen values.
            unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), sums[g]) };
            super::reduce_lanes(lanes)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u64, spread: f32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * spread
            })
            .collect()
    }

    /// Softmax attention in f64 from the same (rounded) keys and values.
    fn naive(att: &DenseAttention, q: &[f32], k: &[f32], v: &[f32], n: usize) -> Vec<f32> {
        let (heads, hd) = (att.n_head, att.head_dim);
        let e = heads * hd;
        let round = |x: f32| match att.kv {
            KvPrecision::F16 | KvPrecision::F16Accumulated => f16::from_f32(x).to_f32(),
            KvPrecision::F32 => x,
        };
        let mut out = vec![0f32; n * e];
        for h in 0..heads {
            for i in 0..n {
                let s: Vec<f64> = (0..n)
                    .map(|j| {
                        (0..hd)
                            .map(|d| {
                                f64::from(q[i * e + h * hd + d])
                                    * f64::from(round(k[j * e + h * hd + d]))
                            })
                            .sum::<f64>()
                            * f64::from(att.scale)
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let p: Vec<f64> = s.iter().map(|s| (s - m).exp()).collect();
                let l: f64 = p.iter().sum();
                for d in 0..hd {
                    let o: f64 = (0..n)
                        .map(|j| p[j] * f64::from(round(v[j * e + h * hd + d])))
                        .sum();
                    out[i * e + h * hd + d] = (o / l) as f32;
                }
            }
        }
        out
    }

    #[test]
    fn every_instruction_set_gives_the_reference_bits_and_softmax_attention() {
        for kv in [KvPrecision::F16, KvPrecision::F32] {
            // Head sizes with and without a partial sixteen-column chunk, spans with a
            // partial key block and query block, one row.
            for (heads, hd, n) in [
                (2, 72, 37),
                (1, 64, 16),
                (3, 40, 1),
                (2, 16, 50),
                (1, 100, 33),
            ] {
                let e = heads * hd;
                let att = DenseAttention {
                    n_head: heads,
                    head_dim: hd,
                    scale: 1.0 / (hd as f32).sqrt(),
                    kv,
                };
                let (q, k, v) = (
                    values(n * e, 1, 6.0),
                    values(n * e, 2, 6.0),
                    values(n * e, 3, 2.0),
                );
                let mut scratch = DenseScratch::default();
                let mut reference = vec![0f32; n * e];
                att.run_with(Isa::Scalar, &q, &k, &v, n, &mut reference, &mut scratch);
                let want = naive(&att, &q, &k, &v, n);
                for (a, b) in reference.iter().zip(&want) {
                    assert!(
                        (a - b).abs() < 2e-6,
                        "{kv:?} {heads}x{hd} n={n}: {a} vs {b}"
                    );
                }
                for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
                    let mut out = vec![f32::NAN; n * e];
                    att.run_with(isa, &q, &k, &v, n, &mut out, &mut scratch);
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&out),
                        bits(&reference),
                        "{isa:?} {kv:?} {heads}x{hd} n={n}"
                    );
                }
            }
        }
    }

    #[test]
    fn f16_accumulation_rounds_as_ggmls_one_query_kernel() {
        let (heads, hd, n) = (2, 40, 23);
        let e = heads * hd;
        let (q, k, v) = (
            values(n * e, 4, 6.0),
            values(n * e, 5, 6.0),
            values(n * e, 6, 2.0),
        );
        let att = |kv| DenseAttention {
            n_head: heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            kv,
        };
        let mut scratch = DenseScratch::default();
        let mut acc = vec![0f32; n * e];
        att(KvPrecision::F16Accumulated).run(&q, &k, &v, n, &mut acc, &mut scratch);
        let mut tiled = vec![0f32; n * e];
        att(KvPrecision::F16).run(&q, &k, &v, n, &mut tiled, &mut scratch);
        // Softmax attention to within f16 roundings, and not the f32-accumulated result.
        let want = naive(&att(KvPrecision::F16Accumulated), &q, &k, &v, n);
        let (mut worst, mut differ) = (0f32, 0);
        for ((a, w), t) in acc.iter().zip(&want).zip(&tiled) {
            worst = worst.max((a - w).abs());
            differ += usize::from(a != t);
        }
        assert!(worst < 4e-3 && worst > 0.0, "largest difference {worst}");
        assert!(
            differ > n * e / 4,
            "only {differ} outputs differ from f32 accumulation"
        );
        // One key: the output is its value rounded to f16, exactly.
        let mut one = vec![0f32; e];
        att(KvPrecision::F16Accumulated).run(&q[..e], &k[..e], &v[..e], 1, &mut one, &mut scratch);
        for (o, x) in one.iter().zip(&v[..e]) {
            assert_eq!(*o, f16::from_f32(*x).to_f32());
        }
    }
}
