//! Vector operations on f16/f32 rows used by attention, computed as ggml's CPU backend
//! computes them: f16 values widen to f32, products accumulate in f32, and an f16
//! accumulator is rounded back to f16 after every fused multiply-add. A scalar reference
//! and an AVX2+FMA+F16C version (chosen at run time) of each, and an AVX-512 version that
//! gives the AVX2 version's bits (the same lanes, fused multiply-adds and reduction order,
//! sixteen lanes per instruction).

use half::f16;

use crate::kernels::{best_isa, Isa};

/// Σ a[i]·b[i] over f16 rows, accumulated in f32.
#[inline]
pub fn dot_f16(a: &[f16], b: &[f16]) -> f32 {
    dot_f16_with(best_isa(), a, b)
}

/// `acc[i] = f16(v[i]·s + acc[i])`, the multiply-add fused before the rounding.
#[inline]
pub fn mad_f16(acc: &mut [f16], v: &[f16], s: f32) {
    mad_f16_with(best_isa(), acc, v, s)
}

/// `acc[i] = f16(acc[i]·s)`.
#[inline]
pub fn scale_f16(acc: &mut [f16], s: f32) {
    scale_f16_with(best_isa(), acc, s)
}

/// Widens f16 to f32.
pub fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    src.convert_to_f32_slice(dst);
}

/// Rounds f32 to f16 (to nearest, ties to even).
pub fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    use half::slice::HalfFloatSliceExt;
    dst.convert_from_f32_slice(src);
}

pub fn dot_f16_with(isa: Isa, a: &[f16], b: &[f16]) -> f32 {
    let n = a.len().min(b.len());
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `is_available` confirmed the features of each level.
        Isa::Avx512Vnni if isa.is_available() => unsafe { x86::dot_f16_512(&a[..n], &b[..n]) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `is_available` confirmed AVX2, FMA and F16C for the AVX2 levels.
        _ if isa.has_avx2() && isa.is_available() => unsafe { x86::dot_f16(&a[..n], &b[..n]) },
        _ => scalar::dot_f16(&a[..n], &b[..n]),
    }
}

pub fn mad_f16_with(isa: Isa, acc: &mut [f16], v: &[f16], s: f32) {
    let n = acc.len().min(v.len());
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx512Vnni if isa.is_available() => unsafe {
            x86::mad_f16_512(&mut acc[..n], &v[..n], s)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        _ if isa.has_avx2() && isa.is_available() => unsafe {
            x86::mad_f16(&mut acc[..n], &v[..n], s)
        },
        _ => scalar::mad_f16(&mut acc[..n], &v[..n], s),
    }
}

pub fn scale_f16_with(isa: Isa, acc: &mut [f16], s: f32) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx512Vnni if isa.is_available() => unsafe { x86::scale_f16_512(acc, s) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        _ if isa.has_avx2() && isa.is_available() => unsafe { x86::scale_f16(acc, s) },
        _ => scalar::scale_f16(acc, s),
    }
}

mod scalar {
    use half::f16;

    pub fn dot_f16(a: &[f16], b: &[f16]) -> f32 {
        // f16 x f16 products are exact in f32.
        a.iter().zip(b).map(|(x, y)| x.to_f32() * y.to_f32()).sum()
    }

    pub fn mad_f16(acc: &mut [f16], v: &[f16], s: f32) {
        for (a, x) in acc.iter_mut().zip(v) {
            *a = f16::from_f32(x.to_f32().mul_add(s, a.to_f32()));
        }
    }

    pub fn scale_f16(acc: &mut [f16], s: f32) {
        for a in acc {
            *a = f16::from_f32(a.to_f32() * s);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    const LANES: usize = 8;

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(p: &[f16]) -> __m256 {
        // SAFETY: the caller passes at least LANES values.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.as_ptr() as *const __m128i)) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store(p: &mut [f16], x: __m256) {
        // SAFETY: the caller passes room for LANES values.
        unsafe {
            _mm_storeu_si128(
                p.as_mut_ptr() as *mut __m128i,
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x),
            )
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum(x: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(x);
        let hi = _mm256_extractf128_ps::<1>(x);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_hadd_ps(s, s);
        _mm_cvtss_f32(_mm_hadd_ps(s, s))
    }

    /// SAFETY: needs AVX2, FMA and F16C; `a` and `b` have the same length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16(a: &[f16], b: &[f16]) -> f32 {
        let n = a.len();
        let whole = n - n % (4 * LANES);
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        // SAFETY: every load stays below `whole` <= n.
        unsafe {
            while i < whole {
                for (j, sum) in acc.iter_mut().enumerate() {
                    let at = i + j * LANES;
                    *sum = _mm256_fmadd_ps(load(&a[at..]), load(&b[at..]), *sum);
                }
                i += 4 * LANES;
            }
            let total = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
            let mut sum = hsum(total);
            for k in whole..n {
                sum += a[k].to_f32() * b[k].to_f32();
            }
            sum
        }
    }

    /// Sixteen f16 from `p` as f32.
    ///
    /// SAFETY: needs AVX-512F; `p` holds at least sixteen values.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn load16(p: &[f16]) -> __m512 {
        // SAFETY: the caller passes sixteen values.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.as_ptr() as *const __m256i)) }
    }

    /// SAFETY: needs AVX-512F; `p` has room for sixteen values.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn store16(p: &mut [f16], x: __m512) {
        // SAFETY: the caller passes room for sixteen values.
        unsafe {
            _mm256_storeu_si256(
                p.as_mut_ptr() as *mut __m256i,
                _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x),
            )
        }
    }

    /// [`dot_f16`] sixteen lanes at a time: the register pairs `[acc0 | acc1]` and
    /// `[acc2 | acc3]` of the AVX2 loop, the same reduction `(acc0 + acc2) + (acc1 + acc3)`,
    /// so the same bits.
    ///
    /// SAFETY: needs the AVX-512 kernel features; `a` and `b` have the same length.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn dot_f16_512(a: &[f16], b: &[f16]) -> f32 {
        let n = a.len();
        let whole = n - n % (4 * LANES);
        let mut acc = [_mm512_setzero_ps(); 2];
        let mut i = 0;
        // SAFETY: every load stays below `whole` <= n.
        unsafe {
            while i < whole {
                for (j, sum) in acc.iter_mut().enumerate() {
                    let at = i + j * 2 * LANES;
                    *sum = _mm512_fmadd_ps(load16(&a[at..]), load16(&b[at..]), *sum);
                }
                i += 4 * LANES;
            }
        }
        let pairs = _mm512_add_ps(acc[0], acc[1]);
        let total = _mm256_add_ps(
            _mm512_castps512_ps256(pairs),
            _mm512_extractf32x8_ps::<1>(pairs),
        );
        // SAFETY: AVX2 is part of the AVX-512 kernel features.
        let mut sum = unsafe { hsum(total) };
        for k in whole..n {
            sum += a[k].to_f32() * b[k].to_f32();
        }
        sum
    }

    /// [`mad_f16`] sixteen values at a time (element-wise: the same bits).
    ///
    /// SAFETY: needs the AVX-512 kernel features; `acc` and `v` have the same length.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn mad_f16_512(acc: &mut [f16], v: &[f16], s: f32) {
        let n = acc.len();
        let whole = n - n % (2 * LANES);
        let vs = _mm512_set1_ps(s);
        let mut i = 0;
        // SAFETY: every access stays below `whole` <= n.
        unsafe {
            while i < whole {
                let y = _mm512_fmadd_ps(load16(&v[i..]), vs, load16(&acc[i..]));
                store16(&mut acc[i..], y);
                i += 2 * LANES;
            }
        }
        if whole < n {
            super::scalar::mad_f16(&mut acc[whole..], &v[whole..], s);
        }
    }

    /// [`scale_f16`] sixteen values at a time (element-wise: the same bits).
    ///
    /// SAFETY: needs the AVX-512 kernel features.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn scale_f16_512(acc: &mut [f16], s: f32) {
        let n = acc.len();
        let whole = n - n % (2 * LANES);
        let vs = _mm512_set1_ps(s);
        let mut i = 0;
        // SAFETY: every access stays below `whole` <= n.
        unsafe {
            while i < whole {
                let y = _mm512_mul_ps(load16(&acc[i..]), vs);
                store16(&mut acc[i..], y);
                i += 2 * LANES;
            }
        }
        if whole < n {
            super::scalar::scale_f16(&mut acc[whole..], s);
        }
    }

    /// SAFETY: needs AVX2, FMA and F16C; `acc` and `v` have the same length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn mad_f16(acc: &mut [f16], v: &[f16], s: f32) {
        let n = acc.len();
        let whole = n - n % LANES;
        let vs = _mm256_set1_ps(s);
        let mut i = 0;
        // SAFETY: every access stays below `whole` <= n.
        unsafe {
            while i < whole {
                let y = _mm256_fmadd_ps(load(&v[i..]), vs, load(&acc[i..]));
                store(&mut acc[i..], y);
                i += LANES;
            }
        }
        super::scalar::mad_f16(&mut acc[whole..], &v[whole..], s);
    }

    /// SAFETY: needs AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scale_f16(acc: &mut [f16], s: f32) {
        let n = acc.len();
        let whole = n - n % LANES;
        let vs = _mm256_set1_ps(s);
        let mut i = 0;
        // SAFETY: every access stays below `whole` <= n.
        unsafe {
            while i < whole {
                let y = _mm256_mul_ps(load(&acc[i..]), vs);
                store(&mut acc[i..], y);
                i += LANES;
            }
        }
        super::scalar::scale_f16(&mut acc[whole..], s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(n: usize, seed: u32) -> Vec<f16> {
        (0..n)
            .map(|i| f16::from_f32((((i as u32 * 2654435761) ^ seed) % 2001) as f32 / 500.0 - 2.0))
            .collect()
    }

    #[test]
    fn simd_matches_scalar() {
        let isa = best_isa();
        for n in [0, 1, 7, 8, 31, 32, 33, 64, 100, 256, 257] {
            let (a, b) = (row(n, 1), row(n, 2));
            let (s, v) = (dot_f16_with(Isa::Scalar, &a, &b), dot_f16_with(isa, &a, &b));
            // Same products, different summation order: relative to the sum of |products|.
            let mag: f32 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x.to_f32() * y.to_f32()).abs())
                .sum();
            assert!((s - v).abs() <= 1e-6 * mag.max(1.0), "n={n}: {s} vs {v}");

            // Element-wise ops round identically: bit-exact.
            let (mut x, mut y) = (a.clone(), a.clone());
            mad_f16_with(Isa::Scalar, &mut x, &b, 0.37);
            mad_f16_with(isa, &mut y, &b, 0.37);
            assert_eq!(x, y, "mad n={n}");
            scale_f16_with(Isa::Scalar, &mut x, 0.81);
            scale_f16_with(isa, &mut y, 0.81);
            assert_eq!(x, y, "scale n={n}");
        }
    }

    /// The AVX-512 versions give the AVX2 versions' bits, the dot product included.
    #[test]
    fn avx512_matches_avx2_bit_for_bit() {
        if !Isa::Avx512Vnni.is_available() {
            return;
        }
        for n in [
            0, 1, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 100, 256, 257, 1000,
        ] {
            for seed in 0..4 {
                let (a, b) = (row(n, 1 + seed), row(n, 7 * seed + 2));
                let wide = dot_f16_with(Isa::Avx512Vnni, &a, &b);
                let narrow = dot_f16_with(Isa::Avx2, &a, &b);
                assert_eq!(wide.to_bits(), narrow.to_bits(), "dot n={n}");
                let (mut x, mut y) = (a.clone(), a.clone());
                mad_f16_with(Isa::Avx512Vnni, &mut x, &b, -0.73);
                mad_f16_with(Isa::Avx2, &mut y, &b, -0.73);
                assert_eq!(x, y, "mad n={n}");
                scale_f16_with(Isa::Avx512Vnni, &mut x, 1.37);
                scale_f16_with(Isa::Avx2, &mut y, 1.37);
                assert_eq!(x, y, "scale n={n}");
            }
        }
    }

    #[test]
    fn conversions_round_trip() {
        let src = [0.1f32, -3.5, 65504.0, 1e-8];
        let mut h = [f16::ZERO; 4];
        f32_to_f16(&src, &mut h);
        let mut back = [0.0f32; 4];
        f16_to_f32(&h, &mut back);
        for (x, y) in src.iter().zip(back) {
            assert_eq!(f16::from_f32(*x).to_f32(), y);
        }
    }
}
