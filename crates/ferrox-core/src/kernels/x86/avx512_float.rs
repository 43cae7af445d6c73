//! AVX-512 dot products of F32, F16 and BF16 rows with activations of the same type, with
//! the AVX2 kernels' bits: each sixteen-lane accumulator holds two of the AVX2 kernel's
//! eight-lane ones (`[a0 | a1]`, `[a2 | a3]`), split back into them for the same
//! reduction. Twice the lanes per instruction, and the accumulators for four activation
//! rows fit the registers (the AVX2 kernel spills them).

use std::arch::x86_64::*;

use super::avx2_float::{Bf16Lanes, F16Lanes, F32Lanes, FloatLanes};
use crate::kernels::{row_kernel_entry, DotKernel, RowKernel};

/// An element type as its AVX-512 kernel loads it.
pub(super) trait Lanes16: FloatLanes {
    /// Sixteen values from the start of `bytes`, widened to f32.
    ///
    /// # Safety
    /// The CPU must support the AVX-512 kernel features.
    unsafe fn load16(bytes: &[u8]) -> __m512;
}

impl Lanes16 for F32Lanes {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn load16(bytes: &[u8]) -> __m512 {
        let chunk: &[u8; 64] = bytes.first_chunk().expect("sixteen f32 values");
        // SAFETY: `chunk` is 64 readable bytes; `loadu` has no alignment requirement.
        unsafe { _mm512_loadu_ps(chunk.as_ptr().cast()) }
    }
}

/// Sixteen 16-bit values.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
fn load_32_bytes(bytes: &[u8]) -> __m256i {
    let chunk: &[u8; 32] = bytes.first_chunk().expect("sixteen 16-bit values");
    // SAFETY: `chunk` is 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_si256(chunk.as_ptr().cast()) }
}

impl Lanes16 for F16Lanes {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn load16(bytes: &[u8]) -> __m512 {
        _mm512_cvtph_ps(load_32_bytes(bytes))
    }
}

impl Lanes16 for Bf16Lanes {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn load16(bytes: &[u8]) -> __m512 {
        // bf16 is the top half of an f32.
        let widened = _mm512_cvtepu16_epi32(load_32_bytes(bytes));
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(widened))
    }
}

const STEP: usize = 32;

/// One weight row of element type `E` against `N` activation rows of the same type: the
/// AVX2 kernel's [`float_dot`](super::avx2_float::float_dot) bits.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) fn float_dot_512<E: Lanes16, const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    for x in &xs {
        assert_eq!(x.len(), w.len(), "activation row length");
    }
    let step_bytes = STEP * E::BYTES;
    let full = w.len() / step_bytes * step_bytes;
    let half = 16 * E::BYTES;
    let mut acc = [[_mm512_setzero_ps(); 2]; N];
    for at in (0..full).step_by(step_bytes) {
        // SAFETY: this function runs with the AVX-512 kernel features; the row holds
        // `full` bytes.
        let weights = unsafe { [E::load16(&w[at..]), E::load16(&w[at + half..])] };
        for (acc, x) in acc.iter_mut().zip(&xs) {
            for (h, (slot, a)) in acc.iter_mut().zip(weights).enumerate() {
                // SAFETY: as above.
                let b = unsafe { E::load16(&x[at + h * half..]) };
                *slot = if E::FUSED {
                    _mm512_fmadd_ps(a, b, *slot)
                } else {
                    _mm512_add_ps(_mm512_mul_ps(a, b), *slot)
                };
            }
        }
    }
    std::array::from_fn(|t| {
        let leftovers = w[full..]
            .chunks_exact(E::BYTES)
            .zip(xs[t][full..].chunks_exact(E::BYTES))
            .map(|(a, b)| (E::scalar(a), E::scalar(b)));
        // Split back into the AVX2 kernel's four accumulators for its reduction.
        let [lo, hi] = acc[t];
        let split = [
            _mm512_castps512_ps256(lo),
            _mm512_extractf32x8_ps::<1>(lo),
            _mm512_castps512_ps256(hi),
            _mm512_extractf32x8_ps::<1>(hi),
        ];
        // SAFETY: the AVX2 features are part of this function's.
        unsafe { E::finish(split, leftovers) }
    })
}

/// The safe entries of element type `E`'s kernel, panels built row by row.
pub(super) fn entry<E: Lanes16>() -> DotKernel {
    struct Rows<E>(std::marker::PhantomData<E>);
    impl<E: Lanes16> RowKernel for Rows<E> {
        fn dot<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
            // SAFETY: handed out only by `avx512_vnni_kernel`, after detecting the features.
            unsafe { float_dot_512::<E, N>(w, xs) }
        }
    }
    row_kernel_entry::<Rows<E>>()
}

#[cfg(test)]
mod tests {
    use super::super::avx2_float::float_dot;
    use super::*;

    fn rows(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 56) as u8
            })
            .collect()
    }

    fn check<E: Lanes16>(sanitize: impl Fn(&mut [u8])) {
        if !(super::super::avx2_detected() && super::super::avx512_vnni_detected()) {
            return;
        }
        for len in [1usize, 7, 32, 33, 72, 588, 1152, 4304] {
            let bytes = len * E::BYTES;
            let mut w = rows(bytes, len as u64);
            sanitize(&mut w);
            let mut xs: Vec<Vec<u8>> = (0..4).map(|t| rows(bytes, 100 + t)).collect();
            xs.iter_mut().for_each(|x| sanitize(x));
            let xs4: [&[u8]; 4] = std::array::from_fn(|t| xs[t].as_slice());
            // SAFETY: the features were detected above.
            let (a, b) = unsafe { (float_dot::<E, 4>(&w, xs4), float_dot_512::<E, 4>(&w, xs4)) };
            let bits = |v: [f32; 4]| v.map(f32::to_bits);
            assert_eq!(bits(a), bits(b), "{} values", len);
            // SAFETY: as above.
            let (a, b) = unsafe {
                (
                    float_dot::<E, 1>(&w, [xs4[0]]),
                    float_dot_512::<E, 1>(&w, [xs4[0]]),
                )
            };
            assert_eq!(a[0].to_bits(), b[0].to_bits(), "{} values, one row", len);
        }
    }

    /// Finite values only: NaN payloads are not part of the contract.
    fn finite_f16(b: &mut [u8]) {
        for v in b.chunks_exact_mut(2) {
            v[1] &= 0x3b; // exponent below all-ones
        }
    }

    #[test]
    fn avx512_float_dots_give_the_avx2_bits() {
        check::<F16Lanes>(finite_f16);
        check::<Bf16Lanes>(|b| {
            for v in b.chunks_exact_mut(2) {
                v[1] &= 0x3f;
            }
        });
        check::<F32Lanes>(|b| {
            for v in b.chunks_exact_mut(4) {
                v[3] &= 0x3f;
            }
        });
    }
}
