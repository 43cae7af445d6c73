//! ggml's element-wise routines, reproduced bit for bit as the x86-64 AVX2+FMA build of
//! ggml-cpu computes them (the build Ferrox's quantized kernels match).
//!
//! Where ggml vectorises a loop eight lanes at a time and finishes the tail with scalar
//! code, so do these functions: lanes go through [`v_expf`] (a lane-wise port of the AVX2
//! `ggml_v_expf`, using fused multiply-adds), tails through the C library's `expf` (Rust's
//! `f32::exp`). Builds of ggml for AVX-512 (16 lanes) or NEON (4 lanes) round differently
//! in the last bit of some softmax outputs. The gated units and the exponential live in
//! [`ferrox_core::glu`], shared with the dense decoder.

pub use ferrox_core::glu::{geglu, gelu, silu, swiglu, v_expf, v_silu, LANES};

/// ggml's sigmoid op: `1 / (1 + expf(-x))`, scalar.
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// ggml's softplus op: `x` above 20, else `logf(1 + expf(x))`.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// ggml's `swiglu_clamp` (DeepSeek-V4's experts): `silu(min(g, limit)) * clamp(u, -limit,
/// limit)`, scalar, in place over `gate`.
pub fn swiglu_clamped(gate: &mut [f32], up: &[f32], limit: f32) {
    assert_eq!(gate.len(), up.len(), "swiglu: gate and up lengths differ");
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = g.min(limit);
        *g = x / (1.0 + (-x).exp()) * u.clamp(-limit, limit);
    }
}

/// Kimi-K3's SiTU as llama.cpp composes it from ggml ops: `β·tanh(g·(1/β))·sigmoid(g)`
/// times `λ·tanh(u·(1/λ))` (or `u` when `λ ≤ 0`), scalar, in place over `gate`.
pub fn situ(gate: &mut [f32], up: &[f32], beta: f32, linear_beta: f32) {
    assert_eq!(gate.len(), up.len(), "situ: gate and up lengths differ");
    let (inv_beta, inv_linear) = (1.0 / beta, 1.0 / linear_beta);
    for (g, &u) in gate.iter_mut().zip(up) {
        let act = (*g * inv_beta).tanh() * beta * sigmoid(*g);
        let u = match linear_beta > 0.0 {
            true => (u * inv_linear).tanh() * linear_beta,
            false => u,
        };
        *g = act * u;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
