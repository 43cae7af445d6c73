//! Feed-forward activations and gated combinations.

use half::f16;

/// How the gate projection's output is activated before multiplying the up projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: silu(gate) * up (llama, qwen, phi3).
    Silu,
    /// GeGLU with the tanh approximation (gemma).
    Gelu,
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// ggml's GELU: the tanh approximation, evaluated through an f16 lookup table on the CPU
/// backend, so the input and the result are both rounded to f16. Reproduced for parity.
pub fn gelu(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x;
    }
    let xh = f16::from_f32(x).to_f32();
    let y = 0.5 * xh * (1.0 + (SQRT_2_OVER_PI * xh * (1.0 + COEF_A * xh * xh)).tanh());
    f16::from_f32(y).to_f32()
}

/// `gate[i] = act(gate[i]) * up[i]`.
pub fn gated(act: Activation, gate: &mut [f32], up: &[f32]) {
    match act {
        Activation::Silu => gate
            .iter_mut()
            .zip(up)
            .for_each(|(g, &u)| *g = silu(*g) * u),
        Activation::Gelu => gate
            .iter_mut()
            .zip(up)
            .for_each(|(g, &u)| *g = gelu(*g) * u),
    }
}

/// Gemma-2 style soft capping: `cap * tanh(x / cap)`.
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x {
        *v = cap * (*v / cap).tanh();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations_have_their_shape() {
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(10.0) - 10.0).abs() < 1e-3);
        assert_eq!(gelu(0.0), 0.0);
        assert!((gelu(1.0) - 0.8412).abs() < 1e-3);
        assert_eq!(gelu(-20.0), 0.0);
        let mut x = [100.0f32, -100.0, 0.5];
        softcap(&mut x, 30.0);
        assert!(x[0] < 30.0 && x[1] > -30.0 && (x[2] - 0.5).abs() < 1e-3);
    }
}
