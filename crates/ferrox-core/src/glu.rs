//! The gated units of feed-forward layers, as ggml's CPU backend evaluates them (its
//! x86-64 AVX2+FMA build, which Ferrox's kernels match):
//!
//! - GeGLU, `gelu(gate) * up`: the tanh-approximated GELU through a table indexed by the
//!   f16 input and holding f16 results, 0 at or below -10, `x * up` at or above 10. A
//!   scalar version and AVX2 / AVX-512 versions (table lookups by gather) give the same
//!   bits.
//! - SwiGLU, `silu(gate) * up`: eight lanes at a time through [`v_expf`] (a lane-wise port
//!   of the AVX2 `ggml_v_expf`, with fused multiply-adds), the tail through the C library's
//!   `expf` (Rust's `f32::exp`). Builds of ggml for AVX-512 (16 lanes) or NEON (4 lanes)
//!   round differently in the last bit of some outputs.

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

/// ggml's quick GELU of one value, `x * sigmoid(1.702 x)`, through its table as GELU's: the
/// f16 input indexes f16 results (no clamping at the ends).
pub fn gelu_quick(x: f32) -> f32 {
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| {
                let x = f16::from_bits(bits).to_f32();
                f16::from_f32(x * (1.0 / (1.0 + (-1.702f32 * x).exp()))).to_bits()
            })
            .collect()
    });
    f16::from_bits(table[f16::from_f32(x).to_bits() as usize]).to_f32()
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
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            gelu(x) * u
        };
    }
}

/// Lanes per vector in ggml's AVX2 loops.
pub const LANES: usize = 8;

/// One lane of the AVX2 `ggml_v_expf`: exp(x) within 1.5 ulp, with ggml's exact rounding.
#[inline(always)]
pub fn v_expf(x: f32) -> f32 {
    let f = f32::from_bits;
    let r = f(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f(0x3fb8_aa3b), r); // log2(e)
    let n = z - r;
    let b = (-n).mul_add(f(0x35bf_be8e), (-n).mul_add(f(0x3f31_7200), x));
    let e = z.to_bits().wrapping_shl(23);
    let k = f(e.wrapping_add(1f32.to_bits()));
    let c = n.abs() > 126.0;
    let u = b * b;
    let j = f(0x3c07_2010)
        .mul_add(b, f(0x3d2b_9f17))
        .mul_add(u, f(0x3e2a_af33).mul_add(b, f(0x3eff_fedb)))
        .mul_add(u, f(0x3f7f_fff6) * b);
    if !c {
        return k.mul_add(j, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f(g.wrapping_add(0x7f00_0000));
    let s2 = f(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

/// `ggml_silu_f32`: `x / (1 + expf(-x))`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// One lane of the AVX2 `ggml_v_silu`.
#[inline(always)]
pub fn v_silu(x: f32) -> f32 {
    x / (1.0 + v_expf(0.0 - x))
}

/// `ggml_vec_swiglu_f32` on one row: `silu(gate) * up`, AVX2 lanes then scalar tail,
/// written over `gate`.
///
/// `f32::mul_add` is exact either way; on x86-64 CPUs with FMA the loop is compiled to use
/// the instruction instead of the C library's `fmaf`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    swiglu_with(best_isa(), gate, up)
}

/// [`swiglu`] compiled for a given instruction set (the portable code where it is not
/// available): the same operations lane by lane, so the same bits on each.
pub fn swiglu_with(isa: Isa, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu: gate and up lengths differ");
    #[cfg(target_arch = "x86_64")]
    {
        if isa == Isa::Avx512Vnni && isa.is_available() {
            // SAFETY: the AVX-512 level's features are available (checked just above).
            return unsafe { swiglu_512(gate, up) };
        }
        if isa.has_avx2() && isa.is_available() {
            // SAFETY: the AVX2 levels include FMA (checked when the level was detected).
            return unsafe { swiglu_fma(gate, up) };
        }
    }
    let _ = isa;
    swiglu_body(gate, up)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu_fma(gate: &mut [f32], up: &[f32]) {
    swiglu_body(gate, up)
}

/// Sixteen lanes per instruction: half the instructions of the AVX2 build for the same
/// lane-wise operations (a prompt's gated units are a few percent of its time).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
unsafe fn swiglu_512(gate: &mut [f32], up: &[f32]) {
    swiglu_body(gate, up)
}

#[inline(always)]
fn swiglu_body(gate: &mut [f32], up: &[f32]) {
    let body = gate.len() / LANES * LANES;
    let (head, tail) = gate.split_at_mut(body);
    for (g, &u) in head.iter_mut().zip(&up[..body]) {
        *g = v_silu(*g) * u;
    }
    for (g, &u) in tail.iter_mut().zip(&up[body..]) {
        *g = silu(*g) * u;
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
                // At or above 10: x * up; at or below -10: +0 (NaN stays NaN).
                let y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, hi), x);
                let r = _mm512_mul_ps(y, u);
                let r = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_NLE_UQ>(x, lo), r);
                _mm512_storeu_ps(gate.as_mut_ptr().add(i), r);
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
                let y = _mm256_blendv_ps(y, x, _mm256_cmp_ps::<_CMP_GE_OQ>(x, hi));
                let r = _mm256_mul_ps(y, u);
                let r = _mm256_and_ps(r, _mm256_cmp_ps::<_CMP_NLE_UQ>(x, lo));
                _mm256_storeu_ps(gate.as_mut_ptr().add(i), r);
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
        assert_every_isa_gives(&want, &gate, &up, geglu_with);
    }

    /// `unit` on every available instruction set gives `want`'s bits (any NaN for a NaN).
    fn assert_every_isa_gives(
        want: &[f32],
        gate: &[f32],
        up: &[f32],
        unit: fn(Isa, &mut [f32], &[f32]),
    ) {
        for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
            let mut got = gate.to_vec();
            unit(isa, &mut got, up);
            for (i, (a, b)) in got.iter().zip(want).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "{isa:?} at {i} (x = {}): {a} vs {b}",
                    gate[i]
                );
            }
        }
    }

    #[test]
    fn v_expf_is_close_to_exp_and_handles_extremes() {
        let mut x = -87.0f32; // normal results only
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = v_expf(x) as f64;
            assert!(((got - want) / want).abs() < 4e-7, "x={x}: {got} vs {want}");
            x += 0.173;
        }
        assert_eq!(v_expf(0.0), 1.0);
        assert_eq!(v_expf(-200.0), 0.0);
        assert_eq!(v_expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(v_expf(200.0), f32::INFINITY);
        assert!(v_expf(f32::NAN).is_nan());
    }

    #[test]
    fn every_isa_gives_the_portable_swiglu_bits() {
        // Both sides of exp's range limits (|x| 126 and 192 after the log2(e) scaling),
        // specials, and a length that leaves a tail after whole vectors of 8 and 16.
        let mut gate: Vec<f32> = (0..4099)
            .map(|i| ((i as f32) * 0.731).sin() * 160.0)
            .collect();
        gate.extend([87.3, -87.3, 88.8, -88.8, 133.0, -133.0, f32::INFINITY]);
        gate.extend([f32::NEG_INFINITY, f32::NAN, 0.0, -0.0, 1e-40, 3.5]);
        let up: Vec<f32> = (0..gate.len())
            .map(|i| (i % 5) as f32 * 0.5 - 1.0)
            .collect();
        let mut want = gate.clone();
        swiglu_body(&mut want, &up);
        assert_every_isa_gives(&want, &gate, &up, swiglu_with);
    }

    #[test]
    fn swiglu_dispatch_matches_portable_path_and_has_its_shape() {
        let g: Vec<f32> = (0..1003).map(|i| (i as f32 * 0.37).sin() * 12.0).collect();
        let u: Vec<f32> = (0..1003).map(|i| (i as f32 * 0.11).cos()).collect();
        let (mut a, mut b) = (g.clone(), g);
        swiglu(&mut a, &u);
        swiglu_body(&mut b, &u);
        assert_eq!(
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        let mut s = [0.0f32, 1.0, -20.0, 20.0, 0.5, -0.5, 2.0, 3.0, 1.0];
        swiglu(&mut s, &[1.0; 9]);
        assert_eq!(s[0], 0.0);
        assert!((s[1] - 0.731_058_6).abs() < 1e-6);
        assert!((s[8] - 0.731_058_6).abs() < 1e-6);
    }

    #[test]
    fn gelu_has_its_shape() {
        assert_eq!(gelu(0.0), 0.0);
        assert!((gelu(1.0) - 0.8412).abs() < 1e-3);
        assert_eq!(gelu(-20.0), 0.0);
        assert_eq!(gelu(20.0), 20.0);
        // ggml writes +0 at or below -10, whatever `up`'s sign.
        let mut g = [-20.0f32; 17];
        geglu(&mut g, &[-1.0; 17]);
        assert!(g.iter().all(|v| v.to_bits() == 0));
    }
}
