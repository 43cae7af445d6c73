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
    if row_len == 0 {
        // No values (a zero-width feed-forward): nothing to do, and no chunks to make.
        return;
    }
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

    /// Row by row, in the pool or not, as ggml applies its loop and tail to each row (rows
    /// of 9 values: a vector body and a one-value tail each).
    #[test]
    fn gated_rows_are_each_rows_gated_units() {
        for (rows, row_len) in [(3, 9), (8000, 9)] {
            let gate: Vec<f32> = (0..rows * row_len)
                .map(|i| (i % 23) as f32 * 0.37 - 4.0)
                .collect();
            let up: Vec<f32> = (0..rows * row_len)
                .map(|i| (i % 7) as f32 * 0.5 - 1.5)
                .collect();
            for act in [Activation::Silu, Activation::Gelu] {
                let mut want = gate.clone();
                for (g, u) in want.chunks_mut(row_len).zip(up.chunks(row_len)) {
                    gated(act, g, u);
                }
                let mut got = gate.clone();
                gated_rows(act, &mut got, &up, row_len);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{rows} rows, {act:?}");
            }
        }
        // A zero-width feed-forward has nothing to gate.
        gated_rows(Activation::Silu, &mut [], &[], 0);
    }

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
