//! Scalar reference dot products of IQ3_XXS, IQ3_S, IQ1_S and IQ1_M with Q8_K
//! activations, following ggml's `_generic` code: exact integer sums per super-block, then
//! one float multiply-add per super-block in ggml's order.

use super::dot_kquants::{super_blocks, Q8KBlock};
use super::ScalarDot;
use crate::quant::bits::read_f16;
use crate::quant::iq1::{self, Iq1Groups, Iq1M, Iq1S, DELTA, GROUP};
use crate::quant::iq3::{Iq3S, Iq3SubBlocks, Iq3Xxs, SUB};
use crate::quant::kquants::QK_K;

/// Σ over sub-blocks of `(2s + 1)·Σ code·q8`, exact.
fn iq3_block_sum<F: Iq3SubBlocks>(wb: &[u8], q8: &Q8KBlock) -> i32 {
    (0..QK_K / SUB)
        .map(|ib| {
            let (codes, s) = F::sub_block(wb, ib);
            let sumi: i32 = codes
                .iter()
                .enumerate()
                .map(|(j, &c)| i32::from(c) * q8.code(SUB * ib + j))
                .sum();
            sumi * (2 * i32::from(s) + 1)
        })
        .sum()
}

impl ScalarDot for Iq3Xxs {
    /// `sumf += (d_w·d_x)·bsum` per super-block; the scale's factor ¼ applied at the end.
    fn dot(w: &[u8], x: &[u8]) -> f32 {
        let sumf = super_blocks::<Iq3Xxs>(w, x).fold(0.0f32, |sumf, (wb, q8)| {
            let d = read_f16(wb, 0) * q8.d;
            sumf + d * iq3_block_sum::<Iq3Xxs>(wb, &q8) as f32
        });
        0.25 * sumf
    }
}

impl ScalarDot for Iq3S {
    fn dot(w: &[u8], x: &[u8]) -> f32 {
        super_blocks::<Iq3S>(w, x).fold(0.0f32, |sumf, (wb, q8)| {
            let d = read_f16(wb, 0) * q8.d;
            sumf + d * iq3_block_sum::<Iq3S>(wb, &q8) as f32
        })
    }
}

/// Σ `ls·Σ coordinate·q8` over a block's groups, exact.
fn iq1_grid_sum<F: Iq1Groups>(wb: &[u8], q8: &Q8KBlock) -> i32 {
    iq1::groups::<F>(wb)
        .iter()
        .enumerate()
        .map(|(g, group)| {
            let lsum: i32 = (0..GROUP)
                .map(|j| q8.code(GROUP * g + j) * i32::from(group.coordinate(j)))
                .sum();
            group.ls * lsum
        })
        .sum()
}

impl ScalarDot for Iq1S {
    /// The shifts' part comes from the activations' stored group sums (the shift sign and
    /// scale are per 32 values, two sums of 16).
    fn dot(w: &[u8], x: &[u8]) -> f32 {
        super_blocks::<Iq1S>(w, x).fold(0.0f32, |sumf, (wb, q8)| {
            let sumi = iq1_grid_sum::<Iq1S>(wb, &q8);
            let sumi1: i32 = (0..QK_K / 32)
                .map(|ib| {
                    let high = Iq1S::high(wb, ib);
                    let delta = if high & 0x8000 != 0 { -1 } else { 1 };
                    Iq1S::ls(high) * delta * (q8.group_sum(2 * ib) + q8.group_sum(2 * ib + 1))
                })
                .sum();
            sumf + read_f16(wb, 0) * q8.d * (sumi as f32 + DELTA * sumi1 as f32)
        })
    }
}

impl ScalarDot for Iq1M {
    /// The shift sign is per 8 values here, so its part sums the activation codes.
    fn dot(w: &[u8], x: &[u8]) -> f32 {
        super_blocks::<Iq1M>(w, x).fold(0.0f32, |sumf, (wb, q8)| {
            let sumi1 = iq1_grid_sum::<Iq1M>(wb, &q8);
            let sumi2: i32 = iq1::groups::<Iq1M>(wb)
                .iter()
                .enumerate()
                .map(|(g, group)| {
                    let sum: i32 = (0..GROUP).map(|j| q8.code(GROUP * g + j)).sum();
                    let delta = if group.minus { -1 } else { 1 };
                    group.ls * delta * sum
                })
                .sum();
            sumf + Iq1M::d(wb) * q8.d * (sumi1 as f32 + DELTA * sumi2 as f32)
        })
    }
}
