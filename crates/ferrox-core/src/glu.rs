//! GELU and the gated unit `gelu(gate) * up` (GeGLU) as ggml's CPU backend evaluates them:
//! the tanh-approximated GELU through a table indexed by the f16 input and holding f16
//! results, 0 at or below -10 and the identity at or above 10. A scalar version and
//! AVX2 / AVX-512 versions (table lookups by gather) give the same bits.

use std::sync::OnceLock;

use half::f16;

use crate::kernels::{best_isa, Isa};

/// The table, with one spare entry so that a 32-bit gather at the last index stays inside.
fn table() -> &'static [u16] {
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t: Vec<u16> = (0..=u16::MAX)
            .map(|bits| gelu_of_f16(f16::from_bits(bits)))
            .collect();
        t.push(0);
        t
    })
}

/// The table entry: the tanh-approximated GELU of an f16 input, rounded to f16.
fn gelu_of_f16(x: f16) -> u16 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    let xh = x.to_f32();
    let y = 0.5 * xh * (1.0 + (SQRT_2_OVER_PI * xh * (1.0 + COEF_A * xh * xh)).tanh());
    f16::from_f32(y).to_bits()
}

/// ggml's GELU of one value.
pub fn gelu(x: f32) -> f32 {
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x;
    }
    f16::from_bits(table()[f16::from_f32(x).to_bits() as usize]).to_f32()
}

/// `gate[i] = gelu(gate[i]) * up[i]` (ggml's `geglu`: `x * up` at or above 10).
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    geglu_with(best_isa(), gate, up)
}

/// [`geglu`] on a given instruction set (scalar code where it is not available).
pub fn geglu_with(isa: Isa, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "geglu: gate and up lengths differ");
    let table = table();
    #[cfg(target_arch = "x86_64")]
    {
        if isa == Isa::Avx512Vnni && isa.is_available() {
            // SAFETY: the AVX-512 kernel features are available; equal lengths checked.
            let done = unsafe { x86::geglu_512(gate, up, table) };
            return geglu_scalar(&mut gate[done..], &up[done..]);
        }
        if isa.has_avx2() && isa.is_available() {
            // SAFETY: AVX2, FMA and F16C are available; equal lengths checked.
            let done = unsafe { x86::geglu_256(gate, up, table) };
            return geglu_scalar(&mut gate[done..], &up[done..]);
        }
    }
    let _ = (isa, table);
    geglu_scalar(gate, up)
}

fn geglu_scalar(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = if x >= 10.0 { x * u } else { gelu(x) * u };
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Whole vectors of sixteen; returns how many values were done.
    ///
    /// SAFETY: needs the AVX-512 kernel features; `gate` and `up` have the same length and
    /// `table` holds 65,537 entries.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn geglu_512(gate: &mut [f32], up: &[f32], table: &[u16]) -> usize {
        let whole = gate.len() / 16 * 16;
        let (lo, hi) = (_mm512_set1_ps(-10.0), _mm512_set1_ps(10.0));
        let low16 = _mm512_set1_epi32(0xffff);
        let mut i = 0;
        while i < whole {
            // SAFETY: `i + 16 <= len`; gathered indices are f16 bit patterns (< 65,536)
            // reading four bytes of a 65,537-entry u16 table.
            unsafe {
                let x = _mm512_loadu_ps(gate.as_ptr().add(i));
                let u = _mm512_loadu_ps(up.as_ptr().add(i));
                let bits = _mm512_cvtepu16_epi32(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
                let raw = _mm512_i32gather_epi32::<2>(bits, table.as_ptr() as *const i32);
                let y = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_and_si512(raw, low16)));
                // At or below -10: 0 (NaN stays NaN); at or above 10: x.
                let y = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_NLE_UQ>(x, lo), y);
                let y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, hi), x);
                _mm512_storeu_ps(gate.as_mut_ptr().add(i), _mm512_mul_ps(y, u));
            }
            i += 16;
        }
        whole
    }

    /// Whole vectors of eight; returns how many values were done.
    ///
    /// SAFETY: needs AVX2, FMA and F16C; as [`geglu_512`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn geglu_256(gate: &mut [f32], up: &[f32], table: &[u16]) -> usize {
        let whole = gate.len() / 8 * 8;
        let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
        let low16 = _mm256_set1_epi32(0xffff);
        let mut i = 0;
        while i < whole {
            // SAFETY: as in the AVX-512 version.
            unsafe {
                let x = _mm256_loadu_ps(gate.as_ptr().add(i));
                let u = _mm256_loadu_ps(up.as_ptr().add(i));
                let bits = _mm256_cvtepu16_epi32(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
                let raw = _mm256_i32gather_epi32::<2>(table.as_ptr() as *const i32, bits);
                let halves = _mm256_and_si256(raw, low16);
                // Pack the eight low 16-bit halves together, then widen.
                let packed = _mm256_packus_epi32(halves, halves);
                let packed = _mm256_permute4x64_epi64::<0b1000>(packed);
                let y = _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
                let y = _mm256_and_ps(y, _mm256_cmp_ps::<_CMP_NLE_UQ>(x, lo));
                let y = _mm256_blendv_ps(y, x, _mm256_cmp_ps::<_CMP_GE_OQ>(x, hi));
                _mm256_storeu_ps(gate.as_mut_ptr().add(i), _mm256_mul_ps(y, u));
            }
            i += 8;
        }
        whole
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_isa_gives_the_scalar_bits() {
        // Every f16 value, the thresholds, their neighbours, and specials.
        let mut gate: Vec<f32> = (0..=u16::MAX).map(|b| f16::from_bits(b).to_f32()).collect();
        gate.extend([
            -10.0,
            10.0,
            -10.000001,
            9.999999,
            1e30,
            -1e30,
            0.1234567,
            f32::NAN,
        ]);
        let up: Vec<f32> = (0..gate.len())
            .map(|i| (i % 7) as f32 * 0.5 - 1.5)
            .collect();
        let mut want = gate.clone();
        geglu_with(Isa::Scalar, &mut want, &up);
        for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
            let mut got = gate.clone();
            geglu_with(isa, &mut got, &up);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "{isa:?} at {i} (x = {}): {a} vs {b}",
                    gate[i]
                );
            }
        }
    }

    #[test]
    fn gelu_has_its_shape() {
        assert_eq!(gelu(0.0), 0.0);
        assert!((gelu(1.0) - 0.8412).abs() < 1e-3);
        assert_eq!(gelu(-20.0), 0.0);
        assert_eq!(gelu(20.0), 20.0);
    }
}
