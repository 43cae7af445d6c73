//! Feed-forward activations and gated combinations.

/// How the gate projection's output is activated before multiplying the up projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: silu(gate) * up (llama, qwen, phi3).
    Silu,
    /// GeGLU with the tanh approximation (gemma).
    Gelu,
}

/// ggml's GELU (through its f16 table) and SiLU, one value at a time.
pub use ferrox_core::glu::{gelu, gelu_quick, silu};

/// `gate[i] = act(gate[i]) * up[i]`, with ggml's arithmetic ([`ferrox_core::glu`]).
pub fn gated(act: Activation, gate: &mut [f32], up: &[f32]) {
    match act {
        Activation::Silu => ferrox_core::glu::swiglu(gate, up),
        Activation::Gelu => ferrox_core::glu::geglu(gate, up),
    }
}

/// [`gated`] on each row of `row_len` values (one token's), rows in parallel: ggml applies
/// its vector loop and scalar tail per row, and a prompt's gated rows are too large to stay
/// cached, so one thread alone waits on memory.
pub fn gated_rows(act: Activation, gate: &mut [f32], up: &[f32], row_len: usize) {
    use rayon::prelude::*;
    if gate.len() < PARALLEL_GATED_VALUES {
        // A decode step's few rows: handing them to the pool would cost more than they do.
        gate.chunks_mut(row_len)
            .zip(up.chunks(row_len))
            .for_each(|(g, u)| gated(act, g, u));
        return;
    }
    gate.par_chunks_mut(row_len)
        .zip(up.par_chunks(row_len))
        .for_each(|(g, u)| gated(act, g, u));
}

/// Fewest values [`gated_rows`] spreads over the pool: 256 KiB of them, more than a core's
/// share of the cache, where one thread starts to wait on memory.
const PARALLEL_GATED_VALUES: usize = 1 << 16;

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
