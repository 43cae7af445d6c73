//! ggml's element-wise routines, reproduced bit for bit as the x86-64 AVX2+FMA build of
//! ggml-cpu computes them (the build Ferrox's quantized kernels match).
//!
//! Where ggml vectorises a loop eight lanes at a time and finishes the tail with scalar
//! code, so do these functions: lanes go through [`v_expf`] (a lane-wise port of the AVX2
//! `ggml_v_expf`, using fused multiply-adds), tails through the C library's `expf` (Rust's
//! `f32::exp`). Builds of ggml for AVX-512 (16 lanes) or NEON (4 lanes) round differently
//! in the last bit of some softmax outputs.

use half::f16;

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

/// ggml's sigmoid op: `1 / (1 + expf(-x))`, scalar.
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// ggml's GELU (tanh approximation) as the CPU backend evaluates it: through a table
/// indexed by the f16 input, holding f16 results.
pub fn gelu(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    let xh = f16::from_f32(x).to_f32();
    let y = 0.5 * xh * (1.0 + (SQRT_2_OVER_PI * xh * (1.0 + COEF_A * xh * xh)).tanh());
    f16::from_f32(y).to_f32()
}

/// `ggml_vec_max_f32`: a running `MAX(max, x)` from -inf, where `MAX(a, b) = a > b ? a : b`
/// (so a NaN is kept only until a later value replaces it).
pub fn max_f32(x: &[f32]) -> f32 {
    x.iter()
        .fold(f32::NEG_INFINITY, |m, &v| if m > v { m } else { v })
}

/// `ggml_vec_sum_f32`: accumulated in f64, rounded once to f32.
pub fn sum_f32(x: &[f32]) -> f32 {
    x.iter().map(|&v| v as f64).sum::<f64>() as f32
}

/// `ggml_soft_max` on one row (no mask, scale 1): max subtraction, exponentials eight
/// lanes at a time with each chunk's horizontal sum added to an f64 total, scalar tail,
/// then every value multiplied by `(float)(1.0 / sum)`.
pub fn softmax(x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "softmax: input and output lengths differ");
    let max = max_f32(x);
    let mut sum = 0f64;
    let mut i = 0;
    while i + LANES <= x.len() {
        let mut v = [0f32; LANES];
        for l in 0..LANES {
            v[l] = v_expf(x[i + l] - max);
            y[i + l] = v[l];
        }
        // _mm256 hi+lo, then movehl, then movehdup: the AVX2 horizontal add's order.
        let a = [v[4] + v[0], v[5] + v[1], v[6] + v[2], v[7] + v[3]];
        let b0 = a[0] + a[2];
        let b1 = a[1] + a[3];
        sum += (b0 + b1) as f64;
        i += LANES;
    }
    while i < x.len() {
        let v = (x[i] - max).exp();
        sum += v as f64;
        y[i] = v;
        i += 1;
    }
    let scale = (1.0 / sum) as f32;
    y.iter_mut().for_each(|v| *v *= scale);
}

/// `ggml_vec_swiglu_f32` on one row: `silu(gate) * up`, AVX2 lanes then scalar tail,
/// written over `gate`.
///
/// `f32::mul_add` is exact either way; on x86-64 CPUs with FMA the loop is compiled to use
/// the instruction instead of the C library's `fmaf`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu: gate and up lengths differ");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports FMA, checked just above.
        return unsafe { swiglu_fma(gate, up) };
    }
    swiglu_body(gate, up)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn swiglu_fma(gate: &mut [f32], up: &[f32]) {
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

/// `ggml_vec_geglu_f32` (the f16-table build): 0 at or below -10, `x * up` at or above 10,
/// otherwise `gelu(x) * up`, written over `gate`.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "geglu: gate and up lengths differ");
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn softmax_sums_to_one_and_orders_like_input() {
        let x: Vec<f32> = (0..37)
            .map(|i| ((i * 7919) % 23) as f32 * 0.31 - 3.0)
            .collect();
        let mut y = vec![0.0; x.len()];
        softmax(&x, &mut y);
        let s: f64 = y.iter().map(|&v| v as f64).sum();
        assert!((s - 1.0).abs() < 1e-6);
        for i in 0..x.len() {
            for j in 0..x.len() {
                if x[i] > x[j] {
                    assert!(y[i] >= y[j]);
                }
            }
        }
    }

    #[test]
    fn max_follows_ggml_macro_with_nan() {
        assert_eq!(max_f32(&[1.0, 3.0, 2.0]), 3.0);
        assert!(max_f32(&[1.0, f32::NAN]).is_nan());
        assert_eq!(max_f32(&[f32::NAN, 1.0]), 1.0);
        assert_eq!(max_f32(&[]), f32::NEG_INFINITY);
    }

    #[test]
    fn swiglu_dispatch_matches_portable_path() {
        let g: Vec<f32> = (0..1003).map(|i| (i as f32 * 0.37).sin() * 12.0).collect();
        let u: Vec<f32> = (0..1003).map(|i| (i as f32 * 0.11).cos()).collect();
        let (mut a, mut b) = (g.clone(), g);
        swiglu(&mut a, &u);
        swiglu_body(&mut b, &u);
        assert_eq!(
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn gated_activations() {
        let mut g = [0.0f32, 1.0, -20.0, 20.0, 0.5, -0.5, 2.0, 3.0, 1.0];
        let up = [1.0f32; 9];
        let mut s = g;
        swiglu(&mut s, &up);
        assert_eq!(s[0], 0.0);
        assert!((s[1] - 0.731_058_6).abs() < 1e-6);
        assert!((s[8] - 0.731_058_6).abs() < 1e-6);
        geglu(&mut g, &up);
        assert_eq!(g[0], 0.0);
        assert_eq!(g[2], 0.0);
        assert_eq!(g[3], 20.0);
        assert!((g[1] - 0.8412).abs() < 1e-3);
    }
}
