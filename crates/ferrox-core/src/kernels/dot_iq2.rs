//! Scalar reference dot products of IQ2_XXS, IQ2_XS and IQ2_S with Q8_K activations,
//! following ggml's `_generic` code: an exact integer sum per super-block of
//! `(2s + 1)·coordinate·±q8` over its groups, then `sumf += (d_w·d_x)·sum` in float, and
//! the `0.25·0.5` of the formats' scale applied once at the end as `0.125·sumf`.

use super::dot_kquants::super_blocks;
use super::ScalarDot;
use crate::quant::bits::read_f16;
use crate::quant::grids::coordinate;
use crate::quant::iq2::{Iq2Format, Iq2S, Iq2Xs, Iq2Xxs, D_AT, GROUPS};

fn iq2_dot<F: Iq2Format>(w: &[u8], x: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (wb, q8) in super_blocks::<F>(w, x) {
        let d = read_f16(wb, D_AT) * q8.d;
        let bsum: i32 = (0..GROUPS)
            .map(|g| {
                let group = F::group(wb, g);
                let sumi: i32 = (0..8)
                    .map(|j| {
                        let v = i32::from(coordinate(group.point, j)) * q8.code(8 * g + j);
                        if group.signs >> j & 1 == 1 {
                            -v
                        } else {
                            v
                        }
                    })
                    .sum();
                (2 * i32::from(group.scale) + 1) * sumi
            })
            .sum();
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}

impl ScalarDot for Iq2Xxs {
    fn dot(w: &[u8], x: &[u8]) -> f32 {
        iq2_dot::<Self>(w, x)
    }
}

impl ScalarDot for Iq2Xs {
    fn dot(w: &[u8], x: &[u8]) -> f32 {
        iq2_dot::<Self>(w, x)
    }
}

impl ScalarDot for Iq2S {
    fn dot(w: &[u8], x: &[u8]) -> f32 {
        iq2_dot::<Self>(w, x)
    }
}
