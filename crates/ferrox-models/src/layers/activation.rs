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
/// backend, so the input and the result are both rounded to f16. Reproduced for parity,
/// through a table of our own (built once): the result depends only on the f16 input.
pub fn gelu(x: f32) -> f32 {
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x;
    }
    let table = GELU_TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| gelu_of_f16(f16::from_bits(bits)))
            .collect()
    });
    f16::from_bits(table[f16::from_f32(x).to_bits() as usize]).to_f32()
}

static GELU_TABLE: std::sync::OnceLock<Vec<u16>> = std::sync::OnceLock::new();

/// The table entry: the tanh-approximated GELU of an f16 input, rounded to f16.
fn gelu_of_f16(x: f16) -> u16 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    let xh = x.to_f32();
    let y = 0.5 * xh * (1.0 + (SQRT_2_OVER_PI * xh * (1.0 + COEF_A * xh * xh)).tanh());
    f16::from_f32(y).to_bits()
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
    fn gelu_table_equals_the_formula_on_f16_inputs() {
        for i in 0..20_000 {
            let x = (i as f32 - 10_000.0) / 1000.0;
            let direct = if x <= -10.0 {
                0.0
            } else if x >= 10.0 {
                x
            } else {
                f16::from_bits(gelu_of_f16(f16::from_f32(x))).to_f32()
            };
            assert_eq!(gelu(x).to_bits(), direct.to_bits(), "x = {x}");
        }
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
