//! Attention's inner loop over caches of llama.cpp's other types: bf16, the quantized
//! types, or keys and values of different types. It computes what ggml's CPU flash
//! attention computes for them (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`, the only
//! path ggml has for these caches), for each query:
//!
//! * the query is rounded once to the keys' vec-dot type (Q8_0, Q8_1, f16, ...) exactly as
//!   ggml-cpu's `from_float` rounds it, and every score is the keys' own dot-product kernel
//!   ([`crate::kernels::RowDot`]), bit-identical to ggml's;
//! * `s = score·scale` (`cap·tanh(s)` with a soft cap), then the online softmax: on a new
//!   maximum the accumulator is scaled by `exp(old − new)`, otherwise the key weighs
//!   `exp(s − max)` ([`crate::online_softmax`]: every query of the group stepped at once,
//!   with an exponential within a few ulp of `expf`);
//! * each value row is decoded to f32 and added as `acc = v·w + acc` with fused
//!   multiply-adds (`ggml_vec_mad_f32`), per element, so every instruction set gives the
//!   same bits; f16 values (a quantized K with the default V) are accumulated in f16 as ggml
//!   does (`VKQ16`: every scaling and every fused multiply-add rounded to f16).
//!
//! The queries of a group sharing one KV head go together, key by key, so each key and value
//! row is read and decoded once for all of them.

use crate::flash_attn::GroupShape;
use crate::kernels::{best_isa, quantize_activation, Isa, RowDot};
use crate::online_softmax::{KeyBlock, RunningSoftmax, Steps, BLOCK_KEYS, MAX_GROUP};
use crate::quant::QuantError;
use crate::KvType;

/// Largest head size.
pub const MAX_HEAD_DIM: usize = crate::flash_attn::MAX_HEAD_DIM;
/// Bytes of the largest quantized query (an f32 row of `MAX_HEAD_DIM`).
const MAX_QUERY_BYTES: usize = 4 * MAX_HEAD_DIM;

/// A run of consecutive cached positions of one KV head, as bytes of its types.
#[derive(Clone, Copy, Debug)]
pub struct TypedRun<'a> {
    /// Key `j` is `head_dim_k` values of the keys' type at `keys[j * key_stride..]`.
    pub keys: &'a [u8],
    pub key_stride: usize,
    /// Value `j` is `head_dim_v` values of the values' type at `values[j * value_stride..]`.
    pub values: &'a [u8],
    pub value_stride: usize,
    pub len: usize,
}

/// The running softmax of every query of a group sharing one KV head, over a typed cache:
/// each key and value row is read (and the value decoded) once for the whole group, while
/// each query's arithmetic is exactly the one-query-at-a-time loop's. Large: keep one per
/// thread and [`start`](Self::start) it for each group.
pub struct TypedGroup {
    dot: Option<RowDot>,
    values: KvType,
    shape: GroupShape,
    value_bytes: usize,
    query_bytes: usize,
    /// The queries, rounded to the keys' vec-dot type, `query_bytes` each.
    queries: Box<[u8]>,
    /// With f16 keys scored by [`x86::f16_key_scores_512`]: the rounded queries widened to
    /// f32 (exactly), `head_dim_k` each.
    f16_key_queries: Option<Box<[f32]>>,
    /// Whether this group's keys are scored from `f16_key_queries`.
    f16_keys_widened: bool,
    softmax: RunningSoftmax,
    /// Accumulators, `head_dim_v` per query.
    acc: Box<[f32]>,
    /// A block's value rows, decoded.
    rows: Box<[f32]>,
    isa: Isa,
}

impl Default for TypedGroup {
    fn default() -> Self {
        TypedGroup {
            dot: None,
            values: KvType::F32,
            shape: GroupShape {
                n_queries: 0,
                head_dim_k: 0,
                head_dim_v: 0,
                scale: 1.0,
                softcap: None,
            },
            value_bytes: 0,
            query_bytes: 0,
            queries: vec![0; MAX_GROUP * MAX_QUERY_BYTES].into_boxed_slice(),
            f16_key_queries: None,
            f16_keys_widened: false,
            softmax: RunningSoftmax::default(),
            acc: vec![0.0; MAX_GROUP * MAX_HEAD_DIM].into_boxed_slice(),
            rows: vec![0.0; BLOCK_KEYS * MAX_HEAD_DIM].into_boxed_slice(),
            isa: Isa::Scalar,
        }
    }
}

impl TypedGroup {
    /// Starts a group over keys of type `keys` and values of type `values`: `queries` holds
    /// `shape.n_queries` rows of `head_dim_k` values.
    pub fn start(
        &mut self,
        (keys, values): (KvType, KvType),
        shape: GroupShape,
        queries: &[f32],
    ) -> Result<(), QuantError> {
        self.start_with(best_isa(), (keys, values), shape, queries)
    }

    /// [`start`](Self::start) on a given instruction set (scalar code where it is not
    /// available), for comparing kernels.
    pub fn start_with(
        &mut self,
        isa: Isa,
        (keys, values): (KvType, KvType),
        shape: GroupShape,
        queries: &[f32],
    ) -> Result<(), QuantError> {
        let (n, dk, dv) = (shape.n_queries, shape.head_dim_k, shape.head_dim_v);
        assert!(n <= MAX_GROUP && dk <= MAX_HEAD_DIM && dv <= MAX_HEAD_DIM);
        self.isa = if isa.is_available() { isa } else { Isa::Scalar };
        let dot = RowDot::with_isa(self.isa, keys.ggml(), dk)?;
        self.query_bytes = dot.activation_bytes();
        for (q, out) in queries
            .chunks_exact(dk)
            .zip(self.queries.chunks_exact_mut(self.query_bytes))
            .take(n)
        {
            quantize_activation(dot.vec_dot_type(), q, out)?;
        }
        // f16 keys on AVX2 or AVX-512, whole steps of 32: every key against the whole group
        // at once, the queries widened once (the row kernel's panel widens them for every
        // key and reduces each query's sum on its own).
        let widened = cfg!(target_arch = "x86_64")
            && keys == KvType::F16
            && self.isa.has_avx2()
            && dk.is_multiple_of(32)
            && n > 0;
        if widened {
            let buf = self
                .f16_key_queries
                .get_or_insert_with(|| vec![0.0; MAX_GROUP * MAX_HEAD_DIM].into_boxed_slice());
            for (q, out) in self.queries[..n * self.query_bytes]
                .chunks_exact(2)
                .zip(buf.iter_mut())
            {
                *out = half::f16::from_le_bytes([q[0], q[1]]).to_f32();
            }
        }
        self.f16_keys_widened = widened;
        self.dot = Some(dot);
        self.values = values;
        self.shape = shape;
        self.value_bytes = values.bytes(dv);
        self.softmax = RunningSoftmax::default();
        self.acc[..n * dv].fill(0.0);
        Ok(())
    }

    /// Adds `run`'s positions (following everything added so far) to every query's softmax,
    /// a block of keys at a time: their scores for every query, the softmax steps, then each
    /// value row decoded once and added into every query's accumulator.
    pub fn attend_run(&mut self, run: &TypedRun<'_>) {
        let dot = self.dot.expect("a started group");
        let shape = self.shape;
        let (n, dv) = (shape.n_queries, shape.head_dim_v);
        let mut scores: KeyBlock = [[0.0; MAX_GROUP]; BLOCK_KEYS];
        let mut ms: KeyBlock = [[1.0; MAX_GROUP]; BLOCK_KEYS];
        let mut vs: KeyBlock = [[0.0; MAX_GROUP]; BLOCK_KEYS];
        let mut start = 0;
        while start < run.len {
            let nb = (run.len - start).min(BLOCK_KEYS);
            // The rest of the run, not just this block: the panels ask ahead for the lines
            // of the keys that follow (measured faster than cutting to the block).
            let keys = (&run.keys[start * run.key_stride..], run.key_stride);
            #[cfg(target_arch = "x86_64")]
            if let (true, Some(queries)) = (self.f16_keys_widened, &self.f16_key_queries) {
                let keys = (keys.0, keys.1, nb);
                let dk = shape.head_dim_k;
                let wide = self.isa == Isa::Avx512Vnni;
                macro_rules! widened {
                    ($($g:literal)*) => {
                        // SAFETY: set for f16 keys of whole steps of 32 on an available
                        // AVX2 or AVX-512 (`start_with`); `nb` keys lie in the run.
                        match (n, wide) {
                            $(($g, true) => unsafe {
                                x86::f16_key_scores_512::<$g>(keys, (queries, dk), &mut scores)
                            },)*
                            $(($g, false) => unsafe {
                                x86::f16_key_scores_256::<$g>(keys, (queries, dk), &mut scores)
                            },)*
                            _ => unreachable!("one to eight queries"),
                        }
                    };
                }
                widened!(1 2 3 4 5 6 7 8);
            } else {
                score_block(
                    &dot,
                    (keys, nb),
                    (&self.queries, self.query_bytes, n),
                    &mut scores,
                );
            }
            #[cfg(not(target_arch = "x86_64"))]
            score_block(
                &dot,
                (keys, nb),
                (&self.queries, self.query_bytes, n),
                &mut scores,
            );
            let rescaled = self.softmax.step(
                self.isa,
                (shape.scale, shape.softcap),
                (n, nb),
                &mut scores,
                &mut ms,
                &mut vs,
            );
            #[cfg(target_arch = "x86_64")]
            // (Q8_0 rows are whole 32-value blocks: a head of them is too.)
            if self.isa.has_avx2() && self.values == KvType::Q8_0 {
                let wide = self.isa == Isa::Avx512Vnni;
                let per_pass = if wide {
                    MAX_GROUP
                } else {
                    AVX2_QUERIES_PER_PASS
                };
                let last = (start + nb - 1) * run.value_stride + self.value_bytes;
                let values = &run.values[start * run.value_stride..last];
                for g0 in (0..n).step_by(per_pass) {
                    let group = (n - g0).min(per_pass);
                    let acc = &mut self.acc[g0 * dv..(g0 + group) * dv];
                    let rows = (values, run.value_stride, nb);
                    let steps = (Steps::new(&ms[..nb], &vs[..nb], rescaled), g0);
                    macro_rules! pass {
                        ($($g:literal)*; $($g2:literal)*) => {
                            // SAFETY: the group started on this (available) instruction set;
                            // the rows are whole Q8_0 blocks of `dv` values.
                            match (group, wide) {
                                $(($g, true) => unsafe {
                                    x86::accumulate_q8_0_512::<$g>(acc, dv, rows, steps)
                                },)*
                                $(($g2, false) => unsafe {
                                    x86::accumulate_q8_0_256::<$g2>(acc, dv, rows, steps)
                                },)*
                                _ => unreachable!("at most {per_pass} queries per pass"),
                            }
                        };
                    }
                    pass!(1 2 3 4 5 6 7 8; 1 2 3 4);
                }
                start += nb;
                continue;
            }
            for j in 0..nb {
                let value = &run.values[(start + j) * run.value_stride..][..self.value_bytes];
                decode_row(self.isa, self.values, value, &mut self.rows[j * dv..][..dv]);
            }
            let in_f16 = self.values == KvType::F16;
            accumulate(
                self.isa,
                (&mut self.acc[..n * dv], dv, in_f16),
                &self.rows[..nb * dv],
                Steps::new(&ms[..nb], &vs[..nb], rescaled),
            );
            start += nb;
        }
    }

    /// Writes each query's normalised output (`head_dim_v` per query) to `out`.
    pub fn finish(&self, out: &mut [f32]) {
        self.write_out(&self.softmax.sum, None, out);
    }

    /// [`finish`](Self::finish) with a sink logit per query (`sinks[g]`) in each softmax's
    /// denominator, as ggml adds it after the last key: a sink above the running maximum
    /// scales the accumulator down to it, otherwise it adds `exp(sink − max)` to the sum.
    pub fn finish_with_sinks(&self, sinks: &[f32], out: &mut [f32]) {
        let n = self.shape.n_queries;
        let mut sums = [0f32; MAX_GROUP];
        let mut scales = [1f32; MAX_GROUP];
        for g in 0..n {
            let (m, s) = (self.softmax.max[g], sinks[g]);
            let (ms, vs) = match s > m {
                true => (crate::online_softmax::exp(m - s), 1.0),
                false => (1.0, crate::online_softmax::exp(s - m)),
            };
            scales[g] = ms;
            sums[g] = self.softmax.sum[g] * ms + vs;
        }
        self.write_out(&sums, Some(&scales), out);
    }

    fn write_out(
        &self,
        sums: &[f32; MAX_GROUP],
        scales: Option<&[f32; MAX_GROUP]>,
        out: &mut [f32],
    ) {
        let dv = self.shape.head_dim_v;
        for g in 0..self.shape.n_queries {
            let sum = sums[g];
            let scale = scales.map_or(1.0, |s| s[g]);
            let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
            for (o, a) in out[g * dv..(g + 1) * dv]
                .iter_mut()
                .zip(&self.acc[g * dv..])
            {
                *o = a * scale * inv;
            }
        }
    }
}

/// `scores[j][g]`: key `j` of the `n_keys` at `keys` (rows `stride` bytes apart) against
/// query `g` of the `n` rounded queries, every key through one panel call for the whole
/// group (four or eight queries, the last repeated to fill it), read where it lies, each
/// score the bits the keys' dot kernel gives for that pair alone.
fn score_block(
    dot: &RowDot,
    (keys, n_keys): ((&[u8], usize), usize),
    (queries, query_bytes, n): (&[u8], usize, usize),
    scores: &mut KeyBlock,
) {
    let Some(last) = n.checked_sub(1) else {
        return;
    };
    let query = |g: usize| &queries[g.min(last) * query_bytes..][..query_bytes];
    let mut out = [0f32; BLOCK_KEYS * MAX_GROUP];
    let width = if n <= 4 { 4 } else { 8 };
    let out = &mut out[..n_keys * width];
    if width == 4 {
        dot.panel4(keys, std::array::from_fn(query), out);
    } else {
        dot.panel8(keys, std::array::from_fn(query), out);
    }
    for (key_scores, scores) in out.chunks_exact(width).zip(scores.iter_mut()) {
        scores[..n].copy_from_slice(&key_scores[..n]);
    }
}

/// Decodes one cached row of `ty` into `out` (as [`crate::quant::dequantize_row`], whose bits
/// the SIMD decodings of Q4_0 and f16 give: each value one exact conversion and at most one
/// rounding, the same). Q8_0 rows on AVX2 and AVX-512 are never decoded: their values are
/// added straight from their blocks (`accumulate_q8_0_*`).
fn decode_row(isa: Isa, ty: KvType, bytes: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() && matches!(ty, KvType::Q4_0 | KvType::F16) {
        assert_eq!(bytes.len(), ty.bytes(out.len()), "whole blocks of {ty:?}");
        // SAFETY: `isa` is available and has AVX2 and F16C; the lengths pair up (checked).
        unsafe {
            match ty {
                KvType::Q4_0 => x86::decode_q4_0(bytes, out),
                _ => x86::decode_f16(bytes, out),
            }
        };
        return;
    }
    let _ = isa;
    crate::quant::dequantize_row(ty.ggml(), bytes, out).expect("a row is whole blocks of its type");
}

/// `x` rounded to f16 (to nearest, ties to even) and back: an f16 accumulator's value.
fn through_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// Queries per pass of AVX2's Q8_0 value accumulation: their accumulators for sixteen
/// columns (eight registers) beside the decoded codes fill its sixteen registers.
#[cfg(target_arch = "x86_64")]
const AVX2_QUERIES_PER_PASS: usize = 4;
// `attend_run`'s passes instantiate the AVX2 accumulation for one to four queries.
#[cfg(target_arch = "x86_64")]
const _: () = assert!(AVX2_QUERIES_PER_PASS == 4);

/// For each query `g` (`dv` accumulators in `acc` each) and value row `j` of `rows` in
/// order: `acc = acc·ms[j][g]` where `ms[j][g] != 1`, then `acc[i] = row[i]·vs[j][g] +
/// acc[i]`, fused, element by element; with `in_f16`, each result rounded to f16 (ggml's
/// f16 accumulator for f16 values: `ggml_vec_scale_f16`, `ggml_vec_mad_f16`). The SIMD code
/// keeps up to four queries' accumulators in registers, each row loaded once for them.
fn accumulate(
    isa: Isa,
    (acc, dv, in_f16): (&mut [f32], usize, bool),
    rows: &[f32],
    steps: Steps<'_>,
) {
    let n_queries = acc.len() / dv.max(1);
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() {
        let wide = isa == Isa::Avx512Vnni;
        // AVX2 has sixteen registers: two queries (eight accumulators) per pass.
        let per_pass = if wide { 4 } else { 2 };
        for g0 in (0..n_queries).step_by(per_pass) {
            let group = (g0 + per_pass).min(n_queries) - g0;
            let acc = &mut acc[g0 * dv..(g0 + group) * dv];
            let steps = (steps, g0);
            macro_rules! pass {
                ($($g:literal)*) => {
                    // SAFETY: `isa` is available (checked when the group started): AVX2, FMA
                    // and F16C, and AVX-512F where wide; `acc` holds the pass's queries.
                    unsafe {
                        match (group, in_f16, wide) {
                            $(($g, true, true) => x86::accumulate_512::<true, $g>(acc, dv, rows, steps),
                            ($g, false, true) => x86::accumulate_512::<false, $g>(acc, dv, rows, steps),
                            ($g, true, false) => x86::accumulate::<true, $g>(acc, dv, rows, steps, 0),
                            ($g, false, false) => x86::accumulate::<false, $g>(acc, dv, rows, steps, 0),)*
                            _ => unreachable!("one to four queries per pass"),
                        }
                    }
                };
            }
            pass!(1 2 3 4);
        }
        return;
    }
    let _ = isa;
    let round = |x: f32| if in_f16 { through_f16(x) } else { x };
    for (g, acc) in acc.chunks_exact_mut(dv).enumerate() {
        for ((row, m), v) in rows.chunks_exact(dv).zip(steps.ms).zip(steps.vs) {
            let (m, v) = (m[g], v[g]);
            if m != 1.0 {
                acc.iter_mut().for_each(|a| *a = round(*a * m));
            }
            acc.iter_mut()
                .zip(row)
                .for_each(|(a, &x)| *a = round(x.mul_add(v, *a)));
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::kernels::x86::avx2_common::f16_at;
    use crate::online_softmax::{Steps, MAX_GROUP};

    /// Q4_0 blocks (an f16 scale, 16 bytes of two codes each: values `j` and `j + 16` in
    /// byte `j`) to f32: each code less 8, times the scale.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn decode_q4_0(bytes: &[u8], out: &mut [f32]) {
        let (mask, mid) = (_mm_set1_epi8(0x0F), _mm256_set1_epi32(8));
        for (block, out) in bytes.chunks_exact(18).zip(out.chunks_exact_mut(32)) {
            let d = _mm256_set1_ps(f16_at(block, 0));
            // SAFETY: the block holds 16 bytes of codes after its scale.
            let packed = unsafe { _mm_loadu_si128(block.as_ptr().add(2).cast()) };
            let halves = [
                _mm_and_si128(packed, mask),
                _mm_and_si128(_mm_srli_epi16::<4>(packed), mask),
            ];
            for (k, codes) in halves.into_iter().enumerate() {
                for (h, codes) in [codes, _mm_srli_si128::<8>(codes)].into_iter().enumerate() {
                    let ints = _mm256_sub_epi32(_mm256_cvtepu8_epi32(codes), mid);
                    let values = _mm256_mul_ps(_mm256_cvtepi32_ps(ints), d);
                    // SAFETY: `out` holds the block's 32 values.
                    unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(16 * k + 8 * h), values) };
                }
            }
        }
    }

    /// f16 values to f32, eight at a time (the tail one by one; every conversion exact).
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn decode_f16(bytes: &[u8], out: &mut [f32]) {
        let whole = out.len() / 8 * 8;
        for i in (0..whole).step_by(8) {
            // SAFETY: `bytes` holds two bytes per value of `out` (the caller's contract).
            unsafe {
                let halves = _mm_loadu_si128(bytes.as_ptr().add(2 * i).cast());
                _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_cvtph_ps(halves));
            }
        }
        for (i, out) in out.iter_mut().enumerate().skip(whole) {
            *out = f16_at(bytes, 2 * i);
        }
    }

    /// Defines `$name::<G>(acc, dv, (values, stride, n), (steps, g0))`:
    /// [`super::accumulate`] of `G` queries (`g0..g0 + G` of the steps) straight from `n`
    /// Q8_0 value rows at `stride` in `values`, `$vecs` vectors of `$lanes` columns at a
    /// time: each row's codes there decoded once for every query as `dequantize_row` decodes
    /// them (code times scale, one rounding), then added with the same operations per
    /// element, so every width gives the decoded rows' bits.
    macro_rules! accumulate_q8_0 {
        ($name:ident, $features:literal, $lanes:literal x $vecs:literal, $vec:ty, $codes:expr,
         $set1:path, $load:path, $store:path, $mul:path, $fma:path) => {
            #[target_feature(enable = $features)]
            pub unsafe fn $name<const G: usize>(
                acc: &mut [f32],
                dv: usize,
                (values, stride, n): (&[u8], usize, usize),
                (steps, g0): (Steps<'_>, usize),
            ) {
                let (ms, vs) = (steps.ms, steps.vs);
                let blocks = dv / 32;
                assert!(dv.is_multiple_of(32) && acc.len() >= G * dv && g0 + G <= MAX_GROUP);
                assert!(n <= ms.len() && n <= vs.len());
                assert!(n == 0 || values.len() >= (n - 1) * stride + blocks * 34);
                for c in (0..dv).step_by($vecs * $lanes) {
                    // Block `c / 32` of a row; its codes for columns `c..` start here.
                    let (block_at, codes_at) = (34 * (c / 32), 2 + c % 32);
                    // SAFETY: the chunk's columns lie in block `c / 32` of each of the `n`
                    // rows inside `values` (asserted), and inside each query's `acc`.
                    unsafe {
                        let mut a: [[$vec; $vecs]; G] = std::array::from_fn(|g| {
                            let p = acc.as_ptr().add(g * dv + c);
                            std::array::from_fn(|k| $load(p.add($lanes * k)))
                        });
                        for j in 0..n {
                            let block = values.as_ptr().add(j * stride + block_at);
                            let scale = block.cast::<u16>().read_unaligned();
                            let d =
                                _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(scale))));
                            let d = $set1(d);
                            let x: [$vec; $vecs] = std::array::from_fn(|k| {
                                $mul($codes(block.add(codes_at + $lanes * k)), d)
                            });
                            if steps.rescales(j) {
                                for (g, a) in a.iter_mut().enumerate() {
                                    let m = ms[j][g0 + g];
                                    if m != 1.0 {
                                        let m = $set1(m);
                                        for a in a.iter_mut() {
                                            *a = $mul(*a, m);
                                        }
                                    }
                                }
                            }
                            for (g, a) in a.iter_mut().enumerate() {
                                let v = $set1(vs[j][g0 + g]);
                                for (a, x) in a.iter_mut().zip(&x) {
                                    *a = $fma(*x, v, *a);
                                }
                            }
                        }
                        for (g, a) in a.iter().enumerate() {
                            let p = acc.as_mut_ptr().add(g * dv + c);
                            for (k, a) in a.iter().enumerate() {
                                $store(p.add($lanes * k), *a);
                            }
                        }
                    }
                }
            }
        };
    }

    accumulate_q8_0!(
        accumulate_q8_0_512,
        "avx512f,avx2,fma,f16c",
        16 x 2,
        __m512,
        // (Expanded inside the chunk's `unsafe` block: `p` points at the lanes' codes.)
        |p: *const u8| _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast()))),
        _mm512_set1_ps,
        _mm512_loadu_ps,
        _mm512_storeu_ps,
        _mm512_mul_ps,
        _mm512_fmadd_ps
    );

    // Sixteen columns at a time, four queries per pass (`AVX2_QUERIES_PER_PASS`): eight
    // columns with all eight queries in one pass measured slower at four queries and one.
    accumulate_q8_0!(
        accumulate_q8_0_256,
        "avx2,fma,f16c",
        8 x 2,
        __m256,
        |p: *const u8| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast()))),
        _mm256_set1_ps,
        _mm256_loadu_ps,
        _mm256_storeu_ps,
        _mm256_mul_ps,
        _mm256_fmadd_ps
    );

    /// `scores[j][g]` for the `n` f16 keys at `keys` (rows `stride` bytes apart, `dk` values
    /// each, `dk` a multiple of 32) and the `G` queries in `queries` (`dk` f32 values each,
    /// f16 ones widened): for each pair the bits of the F16 row kernel
    /// (`float_dot_512::<F16Lanes, _>`: two sixteen-lane accumulators over steps of 32, then
    /// ggml's AVX2 reduction of them), with every query's reduction made for the group at once.
    ///
    /// # Safety
    /// The CPU must support AVX-512F/DQ, AVX2, FMA and F16C; the keys lie in `keys`.
    #[target_feature(enable = "avx512f,avx512dq,avx2,fma,f16c")]
    pub unsafe fn f16_key_scores_512<const G: usize>(
        (keys, stride, n): (&[u8], usize, usize),
        (queries, dk): (&[f32], usize),
        scores: &mut crate::online_softmax::KeyBlock,
    ) {
        check_grouped_scores::<G>((keys, stride, n), (queries, dk), scores);
        for (j, scores) in scores.iter_mut().enumerate().take(n) {
            // SAFETY: key `j`'s `dk` values lie in `keys`, each query's in `queries`
            // (asserted).
            unsafe {
                let key = keys.as_ptr().add(j * stride);
                let mut acc = [[_mm512_setzero_ps(); 2]; G];
                for at in (0..dk).step_by(32) {
                    let k = [
                        _mm512_cvtph_ps(_mm256_loadu_si256(key.add(2 * at).cast())),
                        _mm512_cvtph_ps(_mm256_loadu_si256(key.add(2 * at + 32).cast())),
                    ];
                    for (g, acc) in acc.iter_mut().enumerate() {
                        let q = queries.as_ptr().add(g * dk + at);
                        acc[0] = _mm512_fmadd_ps(k[0], _mm512_loadu_ps(q), acc[0]);
                        acc[1] = _mm512_fmadd_ps(k[1], _mm512_loadu_ps(q.add(16)), acc[1]);
                    }
                }
                // The row kernel's accumulators are `[a0 | a1]`, `[a2 | a3]`, reduced as
                // `((a0 + a2) + (a1 + a3))`, its halves added, then two horizontal adds:
                // the same additions here, the last two for four queries at once.
                let mut quarters = [_mm_setzero_ps(); 8];
                for (quarter, [lo, hi]) in quarters.iter_mut().zip(acc) {
                    let s = _mm512_add_ps(lo, hi);
                    let v =
                        _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps::<1>(s));
                    *quarter = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                }
                reduce_quarters::<G>(&quarters, scores);
            }
        }
    }

    /// The grouped f16 key scores' contract: whole steps of 32, every query's and key's
    /// values in place, at most a block of keys.
    fn check_grouped_scores<const G: usize>(
        (keys, stride, n): (&[u8], usize, usize),
        (queries, dk): (&[f32], usize),
        scores: &crate::online_softmax::KeyBlock,
    ) {
        assert!(dk.is_multiple_of(32) && queries.len() >= G * dk && G <= MAX_GROUP);
        assert!(n <= scores.len() && (n == 0 || keys.len() >= (n - 1) * stride + 2 * dk));
    }

    /// `scores[..G]`: each query's last 128 bits of the row kernel's reduction (`quarters`)
    /// summed by its two horizontal adds, made for four queries at once (the same sums:
    /// `hadd` adds the same pairs in the same order for each).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn reduce_quarters<const G: usize>(quarters: &[__m128; 8], scores: &mut [f32; MAX_GROUP]) {
        for (four, out) in quarters
            .chunks_exact(4)
            .zip(scores.chunks_mut(4))
            .take(G.div_ceil(4))
        {
            let sums = _mm_hadd_ps(_mm_hadd_ps(four[0], four[1]), _mm_hadd_ps(four[2], four[3]));
            let mut lanes = [0f32; 4];
            // SAFETY: four writable f32; `storeu` has no alignment requirement.
            unsafe { _mm_storeu_ps(lanes.as_mut_ptr(), sums) };
            out.copy_from_slice(&lanes[..out.len()]);
        }
    }

    /// [`f16_key_scores_512`] on AVX2: for each pair the bits of the AVX2 F16 row kernel
    /// (`float_dot::<F16Lanes, _>`: four eight-lane accumulators over steps of 32, reduced as
    /// `GGML_F32x8_REDUCE`), the last two horizontal adds made for four queries at once. The
    /// queries go two at a time over each key (eight accumulators and the key's four
    /// vectors fit the sixteen registers; the row kernel's panels of four and eight queries
    /// keep 16 and 32 accumulators, spilled), the key re-read from the first-level cache.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; the keys lie in `keys`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_key_scores_256<const G: usize>(
        (keys, stride, n): (&[u8], usize, usize),
        (queries, dk): (&[f32], usize),
        scores: &mut crate::online_softmax::KeyBlock,
    ) {
        check_grouped_scores::<G>((keys, stride, n), (queries, dk), scores);
        for (j, scores) in scores.iter_mut().enumerate().take(n) {
            let mut quarters = [_mm_setzero_ps(); 8];
            // SAFETY: key `j`'s `dk` values lie in `keys`, each query's in `queries`
            // (asserted).
            unsafe {
                let key = keys.as_ptr().add(j * stride);
                for g0 in (0..G).step_by(2) {
                    let q = queries.as_ptr().add(g0 * dk);
                    if g0 + 1 < G {
                        let [a, b] = f16_key_quarters::<2>(key, q, dk);
                        [quarters[g0], quarters[g0 + 1]] = [a, b];
                    } else {
                        [quarters[g0]] = f16_key_quarters::<1>(key, q, dk);
                    }
                }
            }
            reduce_quarters::<G>(&quarters, scores);
        }
    }

    /// One f16 key at `key` against the `P` queries from `q` (`dk` values apart): each
    /// query's four accumulators reduced as the row kernel does, up to the last 128 bits.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `dk` values at `key` (f16) and `P · dk` at
    /// `q` are readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn f16_key_quarters<const P: usize>(
        key: *const u8,
        q: *const f32,
        dk: usize,
    ) -> [__m128; P] {
        let mut acc = [[_mm256_setzero_ps(); 4]; P];
        for at in (0..dk).step_by(32) {
            // SAFETY: the caller's contract.
            unsafe {
                let k: [__m256; 4] = std::array::from_fn(|i| {
                    _mm256_cvtph_ps(_mm_loadu_si128(key.add(2 * (at + 8 * i)).cast()))
                });
                for (p, acc) in acc.iter_mut().enumerate() {
                    let q = q.add(p * dk + at);
                    for (i, acc) in acc.iter_mut().enumerate() {
                        *acc = _mm256_fmadd_ps(k[i], _mm256_loadu_ps(q.add(8 * i)), *acc);
                    }
                }
            }
        }
        acc.map(|a| {
            let v = _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]));
            _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v))
        })
    }

    /// [`super::through_f16`] of eight values.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn through_f16x8(x: __m256) -> __m256 {
        _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
    }

    /// [`super::through_f16`] of sixteen values.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    fn through_f16x16(x: __m512) -> __m512 {
        _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
    }

    /// Accumulators `from..to` of `G` queries (whole chunks of four registers of `$lanes`
    /// values per query), each row `j` loaded once, then for each query `g` scaling them by
    /// `ms[j][g0 + g]` where it is not 1 and adding `row·vs[j][g0 + g]` fused, every result
    /// passed through `$round`: the same operations per element at any width.
    macro_rules! accumulate_chunks {
        (($acc:ident, $dv:ident, $rows:ident, $steps:ident, $g0:ident, $n:ident), $G:ident,
         $from:expr, $to:expr, $lanes:literal, $vec:ty, $load:path, $store:path, $set1:path,
         $mul:path, $fma:path, $round:expr) => {{
            for i in ($from..$to).step_by(4 * $lanes) {
                // SAFETY: `i + 4·lanes <= to <= dv`: every access is inside query `g`'s
                // accumulators in `acc` and inside row `j` of `rows`.
                unsafe {
                    let mut a: [[$vec; 4]; $G] = std::array::from_fn(|g| {
                        let p = $acc.as_ptr().add(g * $dv + i);
                        std::array::from_fn(|k| $load(p.add($lanes * k)))
                    });
                    for j in 0..$n {
                        let r = $rows.as_ptr().add(j * $dv + i);
                        let x: [$vec; 4] = std::array::from_fn(|k| $load(r.add($lanes * k)));
                        if $steps.rescales(j) {
                            for (g, a) in a.iter_mut().enumerate() {
                                let m = $steps.ms[j][$g0 + g];
                                if m != 1.0 {
                                    let m = $set1(m);
                                    for a in a.iter_mut() {
                                        *a = $round($mul(*a, m));
                                    }
                                }
                            }
                        }
                        for (g, a) in a.iter_mut().enumerate() {
                            let v = $set1($steps.vs[j][$g0 + g]);
                            for (a, x) in a.iter_mut().zip(&x) {
                                *a = $round($fma(*x, v, *a));
                            }
                        }
                    }
                    for (g, a) in a.iter().enumerate() {
                        let p = $acc.as_mut_ptr().add(g * $dv + i);
                        for (k, a) in a.iter().enumerate() {
                            $store(p.add($lanes * k), *a);
                        }
                    }
                }
            }
        }};
    }

    /// [`accumulate`] with 64 accumulators per query at a time in four 512-bit registers (a
    /// head of 64 in one pass over the rows), the rest by [`accumulate`].
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub unsafe fn accumulate_512<const F16: bool, const G: usize>(
        acc: &mut [f32],
        dv: usize,
        rows: &[f32],
        (steps, g0): (Steps<'_>, usize),
    ) {
        crate::kernels::x86::align_frame!();
        let round = |x: __m512| if F16 { through_f16x16(x) } else { x };
        assert!(acc.len() >= G * dv && g0 + G <= MAX_GROUP);
        let n = steps.len().min(rows.len() / dv.max(1));
        let whole = dv / 64 * 64;
        accumulate_chunks!(
            (acc, dv, rows, steps, g0, n),
            G,
            0,
            whole,
            16,
            __m512,
            _mm512_loadu_ps,
            _mm512_storeu_ps,
            _mm512_set1_ps,
            _mm512_mul_ps,
            _mm512_fmadd_ps,
            round
        );
        // SAFETY: this function's features include `accumulate`'s.
        unsafe { accumulate::<F16, G>(acc, dv, rows, (steps, g0), whole) };
    }

    /// [`super::accumulate`] of `G` queries' accumulators from `from` on, with 32 per query
    /// at a time in registers (the same operations per element); `F16` rounds each result
    /// to f16.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn accumulate<const F16: bool, const G: usize>(
        acc: &mut [f32],
        dv: usize,
        rows: &[f32],
        (steps, g0): (Steps<'_>, usize),
        from: usize,
    ) {
        crate::kernels::x86::align_frame!();
        let round = |x: __m256| if F16 { through_f16x8(x) } else { x };
        let round1 = |x: f32| if F16 { super::through_f16(x) } else { x };
        assert!(acc.len() >= G * dv && g0 + G <= MAX_GROUP);
        let n = steps.len().min(rows.len() / dv.max(1));
        let whole = from + (dv - from) / 32 * 32;
        accumulate_chunks!(
            (acc, dv, rows, steps, g0, n),
            G,
            from,
            whole,
            8,
            __m256,
            _mm256_loadu_ps,
            _mm256_storeu_ps,
            _mm256_set1_ps,
            _mm256_mul_ps,
            _mm256_fmadd_ps,
            round
        );
        for g in 0..G {
            for d in whole..dv {
                let mut a = acc[g * dv + d];
                for j in 0..n {
                    let m = steps.ms[j][g0 + g];
                    if m != 1.0 {
                        a = round1(a * m);
                    }
                    a = round1(rows[j * dv + d].mul_add(steps.vs[j][g0 + g], a));
                }
                acc[g * dv + d] = a;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::quantize_row;

    #[test]
    fn decoding_is_the_same_on_every_isa() {
        for ty in KvType::ALL {
            let x = values(128, 4);
            let mut bytes = vec![0u8; ty.bytes(128)];
            quantize_row(ty.ggml(), &x, &mut bytes).unwrap();
            let mut reference = vec![0f32; 128];
            crate::dequantize_row(ty.ggml(), &bytes, &mut reference).unwrap();
            for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
                let mut out = vec![0f32; 128];
                decode_row(isa, ty, &bytes, &mut out);
                assert!(out
                    .iter()
                    .zip(&reference)
                    .all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
    }

    #[test]
    fn accumulation_is_the_same_on_every_isa() {
        for (dv, in_f16) in [64, 77, 128]
            .into_iter()
            .flat_map(|d| [(d, false), (d, true)])
        {
            let rows = values(5 * dv, 9);
            // An f16 accumulator holds f16 values.
            let start: Vec<f32> = values(dv, 10)
                .into_iter()
                .map(|x| if in_f16 { through_f16(x) } else { x })
                .collect();
            // Six queries' steps, each its own (a rescale for some, at different keys).
            let ms: [[f32; MAX_GROUP]; 5] = std::array::from_fn(|j| {
                std::array::from_fn(|g| {
                    if (j + g) % 3 == 0 {
                        0.5 / (g + 1) as f32
                    } else {
                        1.0
                    }
                })
            });
            let vs: [[f32; MAX_GROUP]; 5] =
                std::array::from_fn(|j| std::array::from_fn(|g| 0.1 + 0.07 * (j * 8 + g) as f32));
            let steps = Steps::scanned(&ms, &vs);
            let start: Vec<f32> = (0..6)
                .flat_map(|g| start.iter().map(move |x| x * (g + 1) as f32))
                .map(|x| if in_f16 { through_f16(x) } else { x })
                .collect();
            let mut reference = start.clone();
            accumulate(Isa::Scalar, (&mut reference, dv, in_f16), &rows, steps);
            // Every value is an f16 one when accumulating in f16, and not otherwise.
            let representable = reference.iter().all(|&a| through_f16(a) == a);
            assert_eq!(representable, in_f16, "head {dv}");
            for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
                let mut acc = start.clone();
                accumulate(isa, (&mut acc, dv, in_f16), &rows, steps);
                assert!(acc
                    .iter()
                    .zip(&reference)
                    .all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
    }

    /// Q8_0 value rows added straight from their blocks (strided, any number of queries)
    /// give the bits of decoding them and adding the decoded rows.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn q8_0_values_from_their_blocks_give_the_decoded_bits() {
        if !Isa::Avx2.is_available() {
            eprintln!("no AVX2 here: Q8_0 values are decoded, then added (tested above)");
            return;
        }
        let (dv, n) = (96, 11);
        let stride = KvType::Q8_0.bytes(2 * dv);
        let mut bytes = vec![0u8; n * stride];
        quantize_row(KvType::Q8_0.ggml(), &values(n * 2 * dv, 5), &mut bytes).unwrap();
        let mut decoded = vec![0f32; n * dv];
        for (j, row) in decoded.chunks_exact_mut(dv).enumerate() {
            decode_row(
                Isa::Scalar,
                KvType::Q8_0,
                &bytes[j * stride..][..KvType::Q8_0.bytes(dv)],
                row,
            );
        }
        let ms: [[f32; MAX_GROUP]; 11] = std::array::from_fn(|j| {
            std::array::from_fn(|g| {
                if (j + 2 * g) % 4 == 0 {
                    0.25 + 0.01 * g as f32
                } else {
                    1.0
                }
            })
        });
        let vs: [[f32; MAX_GROUP]; 11] =
            std::array::from_fn(|j| std::array::from_fn(|g| 0.2 + 0.03 * (j * 8 + g) as f32));
        let steps = Steps::scanned(&ms, &vs);
        let start = values(MAX_GROUP * dv, 6);
        let mut want = start.clone();
        accumulate(Isa::Scalar, (&mut want, dv, false), &decoded, steps);
        macro_rules! check {
            ($($g:literal)*) => {$(
                let mut got = start[..$g * dv].to_vec();
                // SAFETY: AVX2 is available; `n` rows of whole blocks at `stride`.
                unsafe {
                    x86::accumulate_q8_0_256::<$g>(&mut got, dv, (&bytes, stride, n), (steps, 0))
                };
                assert!(
                    got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "AVX2, {} queries", $g
                );
                if Isa::Avx512Vnni.is_available() {
                    let mut got = start[..$g * dv].to_vec();
                    // SAFETY: AVX-512 is available; rows as above.
                    unsafe {
                        x86::accumulate_q8_0_512::<$g>(
                            &mut got, dv, (&bytes, stride, n), (steps, 0),
                        )
                    };
                    assert!(
                        got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "AVX-512, {} queries", $g
                    );
                }
            )*};
        }
        check!(1 2 3 4 5 6 7 8);
    }

    /// f16 keys scored for the whole group at once on AVX2 and AVX-512 give the row
    /// kernel's bits for every key and query (any head of whole steps of 32, keys at any
    /// stride).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn f16_keys_scored_together_give_the_row_kernel_bits() {
        assert!(Isa::Avx2.is_available(), "the x86 test machines have AVX2");
        for isa in [Isa::Avx2, Isa::Avx512Vnni] {
            if isa.is_available() {
                f16_keys_scored_together_on(isa);
            } else {
                eprintln!("no {isa:?} here: its f16 key scores are not tested");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn f16_keys_scored_together_on(isa: Isa) {
        for (dk, n_keys) in [(32, 3), (64, BLOCK_KEYS), (128, 13), (256, 5)] {
            let stride = KvType::F16.bytes(3 * dk);
            let mut keys = vec![0u8; n_keys * stride];
            quantize_row(KvType::F16.ggml(), &values(n_keys * 3 * dk, 7), &mut keys).unwrap();
            let dot = RowDot::with_isa(isa, KvType::F16.ggml(), dk).unwrap();
            let query_bytes = dot.activation_bytes();
            let raw = values(MAX_GROUP * dk, 8);
            let mut rounded = vec![0u8; MAX_GROUP * query_bytes];
            for (q, out) in raw
                .chunks_exact(dk)
                .zip(rounded.chunks_exact_mut(query_bytes))
            {
                quantize_activation(dot.vec_dot_type(), q, out).unwrap();
            }
            let widened: Vec<f32> = rounded
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect();
            macro_rules! check {
                ($($g:literal)*) => {$(
                    let mut want: KeyBlock = [[0.0; MAX_GROUP]; BLOCK_KEYS];
                    score_block(&dot, ((&keys, stride), n_keys), (&rounded, query_bytes, $g), &mut want);
                    let mut got: KeyBlock = [[0.0; MAX_GROUP]; BLOCK_KEYS];
                    // SAFETY: `isa` is available; `n_keys` keys of `dk` at `stride`.
                    unsafe {
                        if isa == Isa::Avx512Vnni {
                            x86::f16_key_scores_512::<$g>((&keys, stride, n_keys), (&widened, dk), &mut got)
                        } else {
                            x86::f16_key_scores_256::<$g>((&keys, stride, n_keys), (&widened, dk), &mut got)
                        }
                    };
                    for j in 0..n_keys {
                        for g in 0..$g {
                            assert_eq!(got[j][g].to_bits(), want[j][g].to_bits(), "{isa:?}: head {dk}, key {j}, query {g} of {}", $g);
                        }
                    }
                )*};
            }
            check!(1 2 3 4 5 6 7 8);
        }
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32 ^ seed).wrapping_mul(2_654_435_761).rotate_left(7);
                (h % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// On each instruction set, the same run in one piece or split anywhere, and a query
    /// alone or in a group, give the same bits (the scores are each set's dot kernel: ggml's
    /// generic and AVX2 code round differently); and the result is a softmax-weighted mean
    /// of the decoded values, as a two-pass computation over the decoded keys finds it (up
    /// to the query's rounding).
    #[test]
    fn any_split_gives_the_same_bits() {
        let (dk, dv, n) = (64, 96, 37);
        for (keys, vals) in [
            (KvType::Q8_0, KvType::Q8_0),
            (KvType::Q4_0, KvType::Q4_1),
            (KvType::Q5_1, KvType::Iq4Nl),
            (KvType::F16, KvType::Q5_0),
            (KvType::Bf16, KvType::Bf16),
            (KvType::F32, KvType::Q8_0),
        ] {
            let (kf, vf) = (values(n * dk, 1), values(n * dv, 2));
            let mut kb = vec![0u8; keys.bytes(n * dk)];
            let mut vb = vec![0u8; vals.bytes(n * dv)];
            quantize_row(keys.ggml(), &kf, &mut kb).unwrap();
            quantize_row(vals.ggml(), &vf, &mut vb).unwrap();
            // Seven queries; the first ones alone or in smaller groups must give the bits
            // they give in the whole group.
            let qs = values(7 * dk, 3);
            let q = &qs[..dk];
            // The same keys as a cache holding two heads stores them: another head's key
            // after each.
            let key_bytes = keys.bytes(dk);
            let interleaved: Vec<u8> = kb
                .chunks_exact(key_bytes)
                .flat_map(|k| k.iter().chain(k.iter().rev()).copied())
                .collect();
            let run = |lo: usize, hi: usize, strided: bool| TypedRun {
                keys: match strided {
                    false => &kb[lo * key_bytes..],
                    true => &interleaved[2 * lo * key_bytes..],
                },
                key_stride: if strided { 2 * key_bytes } else { key_bytes },
                values: &vb[vals.bytes(lo * dv)..],
                value_stride: vals.bytes(dv),
                len: hi - lo,
            };
            let attend = |isa: Isa, split: usize, n_queries: usize, strided: bool| {
                let shape = GroupShape {
                    n_queries,
                    head_dim_k: dk,
                    head_dim_v: dv,
                    scale: 0.3,
                    softcap: Some(5.0),
                };
                let mut group = TypedGroup::default();
                group.start_with(isa, (keys, vals), shape, &qs).unwrap();
                group.attend_run(&run(0, split, strided));
                group.attend_run(&run(split, n, strided));
                let mut out = vec![0f32; n_queries * dv];
                group.finish(&mut out);
                out
            };
            let mut results = Vec::new();
            for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
                let whole = attend(isa, n, 7, false);
                // Splits, strided keys, and the first queries alone or in smaller groups.
                for (split, n_queries, strided) in [
                    (0, 7, false),
                    (1, 7, true),
                    (16, 7, false),
                    (n, 7, true),
                    (n, 1, false),
                    (7, 1, true),
                    (n, 3, false),
                    (20, 4, true),
                    (n, 5, false),
                ] {
                    let got = attend(isa, split, n_queries, strided);
                    let same = got
                        .iter()
                        .zip(&whole)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{keys:?}/{vals:?} {isa:?} split {split} of {n_queries} (strided: {strided})"
                    );
                }
                results.push(whole[..dv].to_vec());
            }
            // Two passes over the decoded rows.
            let mut kd = vec![0f32; n * dk];
            let mut vd = vec![0f32; n * dv];
            crate::dequantize_row(keys.ggml(), &kb, &mut kd).unwrap();
            crate::dequantize_row(vals.ggml(), &vb, &mut vd).unwrap();
            let scores: Vec<f32> = kd
                .chunks_exact(dk)
                .map(|k| {
                    5.0 * (k.iter().zip(q).map(|(a, b)| a * b).sum::<f32>() * 0.3 / 5.0).tanh()
                })
                .collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let w: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f32 = w.iter().sum();
            for (d, r) in results.iter().flat_map(|r| r.iter().enumerate()) {
                let expect: f32 = (0..n).map(|j| w[j] * vd[j * dv + d]).sum::<f32>() / total;
                assert!(
                    (r - expect).abs() < 2e-2,
                    "{keys:?}/{vals:?} dim {d}: {r} vs {expect}"
                );
            }
        }
    }

    /// A sink logit joins each query's softmax denominator: below every score it only adds
    /// to the sum, above them it also scales the accumulator down to its maximum; either way
    /// the result is a two-pass softmax over the scores and the sink (which carries no
    /// value), and a sink far below changes no bit of [`TypedGroup::finish`]'s output.
    #[test]
    fn sinks_join_the_denominator() {
        let (dk, n) = (64, 19);
        let ty = KvType::Q8_0;
        let kf = values(n * dk, 5);
        let mut kb = vec![0u8; ty.bytes(n * dk)];
        quantize_row(ty.ggml(), &kf, &mut kb).unwrap();
        let mut kd = vec![0f32; n * dk];
        crate::dequantize_row(ty.ggml(), &kb, &mut kd).unwrap();
        let qs = values(3 * dk, 6);
        let shape = GroupShape {
            n_queries: 3,
            head_dim_k: dk,
            head_dim_v: dk,
            scale: 0.5,
            softcap: None,
        };
        let mut group = TypedGroup::default();
        group.start((ty, ty), shape, &qs).unwrap();
        group.attend_run(&TypedRun {
            keys: &kb,
            key_stride: ty.bytes(dk),
            values: &kb,
            value_stride: ty.bytes(dk),
            len: n,
        });
        let mut plain = vec![0f32; 3 * dk];
        group.finish(&mut plain);
        let mut far = vec![0f32; 3 * dk];
        group.finish_with_sinks(&[-200.0; 3], &mut far);
        assert!(plain
            .iter()
            .zip(&far)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        // A low, a middling and a dominant sink.
        let sinks = [-3.0, 0.5, 40.0];
        let mut got = vec![0f32; 3 * dk];
        group.finish_with_sinks(&sinks, &mut got);
        for g in 0..3 {
            // The query as the keys' dot kernel sees it: rounded to Q8_0.
            let mut qb = vec![0u8; ty.bytes(dk)];
            quantize_row(ty.ggml(), &qs[g * dk..(g + 1) * dk], &mut qb).unwrap();
            let mut q = vec![0f32; dk];
            crate::dequantize_row(ty.ggml(), &qb, &mut q).unwrap();
            let scores: Vec<f64> = kd
                .chunks_exact(dk)
                .map(|k| 0.5 * k.iter().zip(&q).map(|(a, b)| (a * b) as f64).sum::<f64>())
                .collect();
            let max = scores.iter().copied().fold(sinks[g] as f64, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total = w.iter().sum::<f64>() + (sinks[g] as f64 - max).exp();
            for d in 0..dk {
                let expect = (0..n).map(|j| w[j] * kd[j * dk + d] as f64).sum::<f64>() / total;
                let tol = 1e-4 * expect.abs().max(1e-2);
                assert!(
                    (got[g * dk + d] as f64 - expect).abs() <= tol,
                    "query {g} dim {d}: {} vs {expect}",
                    got[g * dk + d]
                );
            }
        }
        // The dominant sink leaves almost nothing.
        assert!(got[2 * dk..].iter().all(|v| v.abs() < 1e-6));
    }
}
