//! The online softmax of attention's inner loops, and the exponential it runs on.
//!
//! A group of queries sharing one KV head walks the keys in blocks of [`BLOCK_KEYS`]; for
//! each query, key by key in order: `s = score·scale` (`cap·tanh(s)` with a soft cap); on a
//! new maximum the accumulator is to be scaled by `ms = exp(old − s)` and the key weighs 1,
//! otherwise `ms = 1` and the key weighs `vs = exp(s − max)`; the sum becomes
//! `sum·ms + vs`. One query's steps depend only on its own keys in order, so a run split
//! anywhere or queries grouped any way give the same bits. [`RunningSoftmax::step`] takes
//! the queries of a group as lanes (every query's step for one key at once), with
//! [`exp`]'s polynomial, which the scalar and vector forms evaluate identically.

use crate::kernels::Isa;

/// Keys scored before their values are added.
pub const BLOCK_KEYS: usize = 16;
/// Most queries per group.
pub const MAX_GROUP: usize = 8;

/// One value per key of a block and query of a group, key-major: `block[j][g]`.
pub type KeyBlock = [[f32; MAX_GROUP]; BLOCK_KEYS];

/// A block's softmax steps as the value kernels take them: key `j`'s factors `ms[j]` and
/// `vs[j]` (query `g` in lane `g`), and `rescaled`, bit `j` set where some query's `ms[j]`
/// may differ from 1 (clear only where all are 1). Past the first keys a new maximum is
/// rare: the kernels test one bit per key, not each query's factor.
#[derive(Clone, Copy, Debug)]
pub struct Steps<'a> {
    pub ms: &'a [[f32; MAX_GROUP]],
    pub vs: &'a [[f32; MAX_GROUP]],
    pub rescaled: u32,
}

impl<'a> Steps<'a> {
    /// The steps of `ms.len()` keys (at most [`BLOCK_KEYS`]) with [`RunningSoftmax::step`]'s
    /// `rescaled`.
    pub fn new(ms: &'a [[f32; MAX_GROUP]], vs: &'a [[f32; MAX_GROUP]], rescaled: u32) -> Self {
        assert!(ms.len() <= BLOCK_KEYS && vs.len() == ms.len());
        Steps { ms, vs, rescaled }
    }

    /// Steps whose rescaled keys are found by looking at every lane of `ms` (for tests of
    /// the value kernels with made-up factors).
    #[cfg(test)]
    pub(crate) fn scanned(ms: &'a [[f32; MAX_GROUP]], vs: &'a [[f32; MAX_GROUP]]) -> Self {
        let rescaled = ms
            .iter()
            .enumerate()
            .filter(|(_, m)| m.iter().any(|&m| m != 1.0))
            .fold(0, |bits, (j, _)| bits | 1 << j);
        Steps::new(ms, vs, rescaled)
    }

    /// Keys in the block.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.ms.len()
    }

    /// Whether some query may rescale its accumulators at key `j`.
    #[inline(always)]
    pub fn rescales(&self, j: usize) -> bool {
        self.rescaled >> j & 1 != 0
    }
}

/// Inputs below this give `exp(x)` of this (about 1.8e-35): a weight no sum can see.
pub(crate) const EXP_FLOOR: f32 = -80.0;
pub(crate) const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in two for an exact product with the exponent (Cephes).
pub(crate) const LN2_HI: f32 = 0.693_359_4;
pub(crate) const LN2_LO: f32 = -2.121_944_4e-4;
/// Cephes `expf`'s polynomial, highest power first.
pub(crate) const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// `e^x` for `x <= 0` (what softmax needs), within a few ulp: `x = n·ln 2 + r`, Cephes'
/// polynomial in `r` by fused multiply-adds, `2^n` added to the exponent bits. Inputs
/// below [`EXP_FLOOR`] (and NaN) are raised to it; `-inf` gives `exp(EXP_FLOOR)`, not zero.
#[inline]
pub fn exp(x: f32) -> f32 {
    let x = x.max(EXP_FLOOR);
    let n = (x * LOG2_E).round_ties_even();
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = EXP_POLY[0];
    for c in &EXP_POLY[1..] {
        p = p.mul_add(r, *c);
    }
    let z = r * r;
    let y = p.mul_add(z, r) + 1.0;
    f32::from_bits((y.to_bits() as i32).wrapping_add((n as i32) << 23) as u32)
}

/// Each query's running maximum and sum over the keys seen so far.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunningSoftmax {
    pub max: [f32; MAX_GROUP],
    pub sum: [f32; MAX_GROUP],
}

impl Default for RunningSoftmax {
    fn default() -> Self {
        RunningSoftmax {
            max: [f32::NEG_INFINITY; MAX_GROUP],
            sum: [0.0; MAX_GROUP],
        }
    }
}

impl RunningSoftmax {
    /// The steps of the first `n_keys` keys of a block for the first `n_queries` queries:
    /// from their raw scores (`scores[j][g]`, overwritten) the rescale `ms[j][g]` and weight
    /// `vs[j][g]` of each key, the maxima and sums moved past them. Other lanes hold
    /// nothing meaningful afterwards. Returns the keys (bit `j`) at which some query's
    /// maximum rose: the only ones whose `ms` can differ from 1 ([`Steps::rescaled`]).
    #[allow(clippy::too_many_arguments)]
    #[must_use]
    pub fn step(
        &mut self,
        isa: Isa,
        (scale, softcap): (f32, Option<f32>),
        (n_queries, n_keys): (usize, usize),
        scores: &mut KeyBlock,
        ms: &mut KeyBlock,
        vs: &mut KeyBlock,
    ) -> u32 {
        assert!(n_queries <= MAX_GROUP && n_keys <= BLOCK_KEYS);
        let scale = match softcap {
            Some(cap) => {
                // tanh per score: the same scalar code on every instruction set, leaving
                // scores that only need scaling by one.
                for row in scores.iter_mut().take(n_keys) {
                    for s in row.iter_mut().take(n_queries) {
                        *s = cap * (*s * (scale / cap)).tanh();
                    }
                }
                1.0
            }
            None => scale,
        };
        #[cfg(target_arch = "x86_64")]
        if isa.has_avx2() && isa.is_available() {
            // SAFETY: AVX2 (with FMA, part of every such instruction set here) is available.
            return unsafe { x86::step_256(self, scale, (n_queries, n_keys), scores, ms, vs) };
        }
        let _ = isa;
        let mut rescaled = 0;
        for g in 0..n_queries {
            let (mut max, mut sum) = (self.max[g], self.sum[g]);
            for j in 0..n_keys {
                let s = scores[j][g] * scale;
                let (m, v) = if s > max {
                    let m = exp(max - s);
                    max = s;
                    rescaled |= 1 << j;
                    (m, 1.0)
                } else {
                    (1.0, exp(s - max))
                };
                sum = sum * m + v;
                ms[j][g] = m;
                vs[j][g] = v;
            }
            self.max[g] = max;
            self.sum[g] = sum;
        }
        rescaled
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    use super::{KeyBlock, RunningSoftmax, EXP_FLOOR, EXP_POLY, LN2_HI, LN2_LO, LOG2_E};

    /// [`super::exp`] on eight lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn exp8(x: __m256) -> __m256 {
        let x = _mm256_max_ps(x, _mm256_set1_ps(EXP_FLOOR));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(LOG2_E)),
        );
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
        let mut p = _mm256_set1_ps(EXP_POLY[0]);
        for c in &EXP_POLY[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
        }
        let z = _mm256_mul_ps(r, r);
        let y = _mm256_add_ps(_mm256_fmadd_ps(p, z, r), _mm256_set1_ps(1.0));
        let bits = _mm256_add_epi32(
            _mm256_castps_si256(y),
            _mm256_slli_epi32::<23>(_mm256_cvtps_epi32(n)),
        );
        _mm256_castsi256_ps(bits)
    }

    /// [`super::exp`] on sixteen lanes.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub fn exp16(x: __m512) -> __m512 {
        let x = _mm512_max_ps(x, _mm512_set1_ps(EXP_FLOOR));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(LOG2_E)),
        );
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), x);
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
        let mut p = _mm512_set1_ps(EXP_POLY[0]);
        for c in &EXP_POLY[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(*c));
        }
        let z = _mm512_mul_ps(r, r);
        let y = _mm512_add_ps(_mm512_fmadd_ps(p, z, r), _mm512_set1_ps(1.0));
        let bits = _mm512_add_epi32(
            _mm512_castps_si512(y),
            _mm512_slli_epi32::<23>(_mm512_cvtps_epi32(n)),
        );
        _mm512_castsi512_ps(bits)
    }

    /// [`RunningSoftmax::step`] with the group's queries as eight lanes, key by key: the
    /// comparison, both differences, one [`exp8`] and blends give each lane the scalar
    /// code's operations (`s > max` is false for NaN, as the ordered comparison is).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn step_256(
        state: &mut RunningSoftmax,
        scale: f32,
        (n_queries, n_keys): (usize, usize),
        scores: &KeyBlock,
        ms: &mut KeyBlock,
        vs: &mut KeyBlock,
    ) -> u32 {
        let lanes = (1u32 << n_queries) - 1;
        let mut rescaled = 0;
        let one = _mm256_set1_ps(1.0);
        let scale = _mm256_set1_ps(scale);
        // SAFETY: every row and both state arrays hold eight values.
        unsafe {
            let mut max = _mm256_loadu_ps(state.max.as_ptr());
            let mut sum = _mm256_loadu_ps(state.sum.as_ptr());
            for j in 0..n_keys {
                let s = _mm256_mul_ps(_mm256_loadu_ps(scores[j].as_ptr()), scale);
                let new = _mm256_cmp_ps::<_CMP_GT_OQ>(s, max);
                let e = exp8(_mm256_blendv_ps(
                    _mm256_sub_ps(s, max),
                    _mm256_sub_ps(max, s),
                    new,
                ));
                let m = _mm256_blendv_ps(one, e, new);
                let v = _mm256_blendv_ps(e, one, new);
                let rose = _mm256_movemask_ps(new) as u32 & lanes;
                rescaled |= u32::from(rose != 0) << j;
                max = _mm256_blendv_ps(max, s, new);
                sum = _mm256_add_ps(_mm256_mul_ps(sum, m), v);
                _mm256_storeu_ps(ms[j].as_mut_ptr(), m);
                _mm256_storeu_ps(vs[j].as_mut_ptr(), v);
            }
            _mm256_storeu_ps(state.max.as_mut_ptr(), max);
            _mm256_storeu_ps(state.sum.as_mut_ptr(), sum);
        }
        rescaled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_a_few_ulp_and_exact_at_zero() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
        let floor = exp(EXP_FLOOR);
        assert!(floor > 0.0 && floor < 1e-34);
        assert_eq!(exp(f32::NEG_INFINITY), floor);
        let mut x = -79.9f32;
        while x <= 0.0 {
            let want = f64::from(x).exp();
            let got = f64::from(exp(x));
            assert!(
                ((got - want) / want).abs() < 4e-7,
                "exp({x}) = {got}, want {want}"
            );
            x += 0.0137;
        }
    }

    /// Every f32 from 0 down past the floor, through the vector forms, gives the scalar
    /// bits.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_exp_gives_the_scalar_bits_everywhere() {
        use std::arch::x86_64::*;
        let mut inputs: Vec<f32> = (0..=(-90f32).to_bits() - (-0f32).to_bits())
            .step_by(7)
            .map(|i| f32::from_bits((-0f32).to_bits() + i))
            .collect();
        inputs.extend([f32::NEG_INFINITY, f32::NAN, 0.0, -1e-45, -88.0]);
        inputs.resize(inputs.len().div_ceil(16) * 16, -1.0);
        let want: Vec<u32> = inputs.iter().map(|&x| exp(x).to_bits()).collect();
        if Isa::Avx2.is_available() {
            for (x, want) in inputs.chunks_exact(8).zip(want.chunks_exact(8)) {
                let mut got = [0f32; 8];
                // SAFETY: AVX2 and FMA are available; eight values each.
                unsafe {
                    _mm256_storeu_ps(got.as_mut_ptr(), x86::exp8(_mm256_loadu_ps(x.as_ptr())))
                };
                assert!(
                    got.iter().zip(want).all(|(g, w)| g.to_bits() == *w),
                    "{x:?}"
                );
            }
        }
        if Isa::Avx512Vnni.is_available() {
            for (x, want) in inputs.chunks_exact(16).zip(want.chunks_exact(16)) {
                let mut got = [0f32; 16];
                // SAFETY: AVX-512F is available; sixteen values each.
                unsafe {
                    _mm512_storeu_ps(got.as_mut_ptr(), x86::exp16(_mm512_loadu_ps(x.as_ptr())))
                };
                assert!(
                    got.iter().zip(want).all(|(g, w)| g.to_bits() == *w),
                    "{x:?}"
                );
            }
        }
    }

    fn scores(seed: u32, spread: f32) -> KeyBlock {
        let mut x = seed.wrapping_mul(2_654_435_761) | 1;
        std::array::from_fn(|_| {
            std::array::from_fn(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                ((x % 4001) as f32 / 2000.0 - 1.0) * spread
            })
        })
    }

    /// Blocks of rising, falling and mixed scores (new maxima at any key), with and without
    /// a soft cap, a partial last block, on every instruction set: the scalar steps' bits,
    /// and the sums a direct two-pass softmax finds.
    #[test]
    fn every_isa_steps_like_the_scalar_code() {
        for (softcap, spread) in [(None, 3.0), (Some(5.0), 20.0), (None, 60.0)] {
            let blocks: Vec<KeyBlock> = (0..5)
                .map(|b| {
                    let mut s = scores(b + 1, spread);
                    if b == 1 {
                        // Rising: a new maximum at every key.
                        for (j, row) in s.iter_mut().enumerate() {
                            row.iter_mut().for_each(|x| *x = j as f32 * 0.37);
                        }
                    }
                    s
                })
                .collect();
            let n_queries = 7;
            let run = |isa: Isa| {
                let mut state = RunningSoftmax::default();
                let mut out = Vec::new();
                for (b, block) in blocks.iter().enumerate() {
                    let n_keys = if b == 4 { 5 } else { BLOCK_KEYS };
                    let (mut s, mut ms, mut vs) = (*block, [[0.0; 8]; 16], [[0.0; 8]; 16]);
                    let rescaled = state.step(
                        isa,
                        (0.7, softcap),
                        (n_queries, n_keys),
                        &mut s,
                        &mut ms,
                        &mut vs,
                    );
                    for j in 0..n_keys {
                        out.extend_from_slice(&ms[j][..n_queries]);
                        out.extend_from_slice(&vs[j][..n_queries]);
                        // A key whose factor is not 1 for some query is marked.
                        let rescales = ms[j][..n_queries].iter().any(|&m| m != 1.0);
                        assert!(!rescales || rescaled >> j & 1 != 0, "{isa:?} key {j}");
                    }
                    assert_eq!(rescaled >> n_keys, 0, "{isa:?}: keys past the block");
                    out.push(f32::from_bits(rescaled));
                }
                out.extend_from_slice(&state.max[..n_queries]);
                out.extend_from_slice(&state.sum[..n_queries]);
                out
            };
            let reference = run(Isa::Scalar);
            for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
                let got = run(isa);
                assert!(
                    got.iter()
                        .zip(&reference)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{isa:?} {softcap:?}"
                );
            }
            // The sum, relative to the final maximum, is Σ exp(s − max).
            let sums = &reference[reference.len() - n_queries..];
            let maxes = &reference[reference.len() - 2 * n_queries..][..n_queries];
            for g in 0..n_queries {
                let mut want = 0f64;
                for (b, block) in blocks.iter().enumerate() {
                    let n_keys = if b == 4 { 5 } else { BLOCK_KEYS };
                    for row in &block[..n_keys] {
                        let s = match softcap {
                            Some(cap) => cap * (row[g] * (0.7 / cap)).tanh(),
                            None => row[g] * 0.7,
                        };
                        want += (f64::from(s) - f64::from(maxes[g])).exp();
                    }
                }
                let got = f64::from(sums[g]);
                assert!(
                    (got - want).abs() < 1e-5 * want,
                    "query {g}: {got} vs {want}"
                );
            }
        }
    }
}
