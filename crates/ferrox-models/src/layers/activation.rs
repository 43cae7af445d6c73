//! Feed-forward activations and gated combinations.

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
/// backend, so the input and the result are both rounded to f16.
pub use ferrox_core::glu::gelu;

/// `gate[i] = act(gate[i]) * up[i]`.
pub fn gated(act: Activation, gate: &mut [f32], up: &[f32]) {
    match act {
        Activation::Silu => gate
            .iter_mut()
            .zip(up)
            .for_each(|(g, &u)| *g = silu(*g) * u),
        Activation::Gelu => ferrox_core::glu::geglu(gate, up),
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
