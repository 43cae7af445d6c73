//! Scalar reference dot products of the i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
//! IQ3_XXS, IQ3_S) with Q8_K activations, from their integer form ([`Int8Expand`]): per
//! super-block the exact `Σ scale·v·q8`, then `sumf = fma(d_w·d_x, Σ, sumf)`, and the
//! format's power-of-two factor once at the end, as ggml's generic code orders it.
//!
//! Every other path (the AVX2 kernels, the int8 prompt path of [`crate::packed`]) computes
//! these same integers and float operations, so an i-quant product has one result whatever
//! the instruction set, the batch or the path. (ggml's AVX2 kernels differ in the last bits:
//! they keep eight float lanes, and their sign trick wraps an activation code of −128.)

use super::dot_kquants::super_blocks;
use super::ScalarDot;
use crate::quant::bits::f16_bits_to_f32;
use crate::quant::int8::{Int8Block, Int8Expand, SCALE_VALUES};
use crate::quant::iq1::{Iq1M, Iq1S};
use crate::quant::iq2::{Iq2S, Iq2Xs, Iq2Xxs};
use crate::quant::iq3::{Iq3S, Iq3Xxs};

fn int8_dot<F: Int8Expand>(w: &[u8], x: &[u8]) -> f32 {
    let mut block = Int8Block::default();
    let mut sumf = 0f32;
    for (wb, q8) in super_blocks::<F>(w, x) {
        F::expand(wb, &mut block);
        let isum: i32 = block
            .scales
            .iter()
            .enumerate()
            .map(|(s, &scale)| {
                let values = SCALE_VALUES * s..SCALE_VALUES * (s + 1);
                let sum: i32 = values.map(|e| block.value(e) * q8.code(e)).sum();
                i32::from(scale) * sum
            })
            .sum();
        sumf = (f16_bits_to_f32(block.d_bits) * q8.d).mul_add(isum as f32, sumf);
    }
    F::FACTOR * sumf
}

macro_rules! int8_dots {
    ($($format:ty),*) => {$(
        impl ScalarDot for $format {
            fn dot(w: &[u8], x: &[u8]) -> f32 {
                int8_dot::<Self>(w, x)
            }
        }
    )*};
}

int8_dots!(Iq1S, Iq1M, Iq2Xxs, Iq2Xs, Iq2S, Iq3Xxs, Iq3S);
