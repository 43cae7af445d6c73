//! AVX2 dot products of F32, F16 and BF16 rows with activations of the same type, in
//! ggml's AVX2 order: 32 values per step into four 8-lane accumulators, reduced with
//! ggml's pattern for the type, then the leftover values one at a time.

use std::arch::x86_64::*;

use super::avx2_common::{hsum_ggml, load_16};

/// An element type as its AVX2 kernel sees it.
pub(super) trait FloatLanes {
    const BYTES: usize;
    /// Whether ggml accumulates with FMA (F32, F16) or a separate multiply and add (BF16).
    const FUSED: bool;

    /// Eight values from the start of `bytes`, widened to f32.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    unsafe fn load8(bytes: &[u8]) -> __m256;

    /// One value, for the leftovers.
    fn scalar(bytes: &[u8]) -> f32;

    /// What the leftover products are added to.
    type Sum: LeftoverSum;

    /// ggml's reduction of the four accumulators to one value, the start of the sum the
    /// leftovers add to.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    unsafe fn reduce(acc: [__m256; 4]) -> Self::Sum;

    /// ggml's reduction of the four accumulators to one value, with the leftover value
    /// pairs multiplied and added to it.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline(always)]
    unsafe fn finish(acc: [__m256; 4], leftovers: impl Iterator<Item = (f32, f32)>) -> f32 {
        // SAFETY: the caller's contract.
        let start = unsafe { Self::reduce(acc) };
        leftovers.fold(start, |sum, (a, b)| sum.add(a, b)).end()
    }
}

/// A dot product's running sum as ggml adds the leftover values to it.
pub(super) trait LeftoverSum: Copy {
    /// The sum with the leftover pair `a·b` added.
    fn add(self, a: f32, b: f32) -> Self;
    /// The dot product.
    fn end(self) -> f32;
}

/// F32 rows: the sum stays f32 and the C compiler fuses ggml's multiply-adds.
impl LeftoverSum for f32 {
    #[inline(always)]
    fn add(self, a: f32, b: f32) -> f32 {
        a.mul_add(b, self)
    }

    #[inline(always)]
    fn end(self) -> f32 {
        self
    }
}

/// F16 and BF16 rows: ggml sums the leftovers in f64.
impl LeftoverSum for f64 {
    #[inline(always)]
    fn add(self, a: f32, b: f32) -> f64 {
        self + f64::from(a * b)
    }

    #[inline(always)]
    fn end(self) -> f32 {
        self as f32
    }
}

pub(super) struct F32Lanes;
pub(super) struct F16Lanes;
pub(super) struct Bf16Lanes;

/// `GGML_F32x8_REDUCE`: pairwise adds of the accumulators, then two `hadd`s.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce_f32x8(acc: [__m256; 4]) -> f32 {
    let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
    let q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let q = _mm_hadd_ps(q, q);
    _mm_cvtss_f32(_mm_hadd_ps(q, q))
}

impl FloatLanes for F32Lanes {
    const BYTES: usize = 4;
    const FUSED: bool = true;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(bytes: &[u8]) -> __m256 {
        let chunk: &[u8; 32] = bytes.first_chunk().expect("eight f32 values");
        // SAFETY: `chunk` is 32 readable bytes; `loadu` has no alignment requirement.
        unsafe { _mm256_loadu_ps(chunk.as_ptr().cast()) }
    }

    fn scalar(bytes: &[u8]) -> f32 {
        f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    }

    // ggml keeps the F32 sum in f32, and the C compiler fuses its multiply-adds.
    type Sum = f32;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn reduce(acc: [__m256; 4]) -> f32 {
        reduce_f32x8(acc)
    }
}

impl FloatLanes for F16Lanes {
    const BYTES: usize = 2;
    const FUSED: bool = true;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(bytes: &[u8]) -> __m256 {
        _mm256_cvtph_ps(load_16(bytes))
    }

    fn scalar(bytes: &[u8]) -> f32 {
        half::f16::from_le_bytes([bytes[0], bytes[1]]).to_f32()
    }

    // ggml sums the F16 leftovers in f64.
    type Sum = f64;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn reduce(acc: [__m256; 4]) -> f64 {
        f64::from(reduce_f32x8(acc))
    }
}

impl FloatLanes for Bf16Lanes {
    const BYTES: usize = 2;
    const FUSED: bool = false;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(bytes: &[u8]) -> __m256 {
        // bf16 is the top half of an f32.
        let widened = _mm256_cvtepu16_epi32(load_16(bytes));
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(widened))
    }

    fn scalar(bytes: &[u8]) -> f32 {
        f32::from_bits(u32::from(u16::from_le_bytes([bytes[0], bytes[1]])) << 16)
    }

    type Sum = f64;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn reduce(acc: [__m256; 4]) -> f64 {
        let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
        f64::from(hsum_ggml(v))
    }
}

const STEP: usize = 32;

/// One weight row of element type `E` against `N` activation rows of the same type.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn float_dot<E: FloatLanes, const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    for x in &xs {
        assert_eq!(x.len(), w.len(), "activation row length");
    }
    let step_bytes = STEP * E::BYTES;
    let full = w.len() / step_bytes * step_bytes;
    let mut acc = [[_mm256_setzero_ps(); 4]; N];
    for at in (0..full).step_by(step_bytes) {
        let lane_at = |j: usize| at + 8 * j * E::BYTES;
        // SAFETY: this function runs with AVX2, FMA and F16C enabled.
        let weights: [__m256; 4] = std::array::from_fn(|j| unsafe { E::load8(&w[lane_at(j)..]) });
        for (acc, x) in acc.iter_mut().zip(&xs) {
            for (j, (slot, a)) in acc.iter_mut().zip(weights).enumerate() {
                // SAFETY: as above.
                let b = unsafe { E::load8(&x[lane_at(j)..]) };
                *slot = if E::FUSED {
                    _mm256_fmadd_ps(a, b, *slot)
                } else {
                    _mm256_add_ps(_mm256_mul_ps(a, b), *slot)
                };
            }
        }
    }
    std::array::from_fn(|t| {
        let leftovers = w[full..]
            .chunks_exact(E::BYTES)
            .zip(xs[t][full..].chunks_exact(E::BYTES))
            .map(|(a, b)| (E::scalar(a), E::scalar(b)));
        // SAFETY: this function runs with AVX2, FMA and F16C enabled.
        unsafe { E::finish(acc[t], leftovers) }
    })
}
