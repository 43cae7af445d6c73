//! Q1_0 and Q2_0: the 1- and 2-bit symmetric formats (binarised and ternary-plus-two
//! weights), one f16 scale `d` per block followed by packed codes, value `j` in bit
//! `j mod 8` of byte `j / 8` (Q1_0, 128 values) or in bit pair `j mod 4` of byte `j / 4`
//! (Q2_0, 64 values).
//!
//! Q1_0 stores signs: a set bit is `+d`, a clear one `−d`, with `d` the mean magnitude.
//! Q2_0 codes 0..3 stand for −1, 0, +1, +2 times `d`, the largest magnitude.

use super::bits::{read_f16, write_f16};
use super::{BlockFormat, QuantizeBlock};

/// Bytes before the codes: the f16 scale.
pub(crate) const CODES_AT: usize = 2;

pub(crate) struct Q1_0;
pub(crate) struct Q2_0;

pub(crate) const QK1_0: usize = 128;
pub(crate) const QK2_0: usize = 64;

/// Value `j`'s Q2_0 code (0..3).
pub(crate) fn q2_code(block: &[u8], j: usize) -> u8 {
    (block[CODES_AT + j / 4] >> (2 * (j % 4))) & 3
}

impl BlockFormat for Q1_0 {
    const ELEMS: usize = QK1_0;
    const BYTES: usize = CODES_AT + QK1_0 / 8;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = read_f16(block, 0);
        for (j, y) in out.iter_mut().enumerate() {
            let set = (block[CODES_AT + j / 8] >> (j % 8)) & 1 != 0;
            *y = if set { d } else { -d };
        }
    }
}

impl QuantizeBlock for Q1_0 {
    /// ggml's `quantize_row_q1_0_ref`: `d` is the mean magnitude (summed in order), each
    /// bit the sign (set for `x >= 0`, so −0 and +0 alike; NaN clear).
    fn quantize_block(src: &[f32], block: &mut [u8]) {
        let sum = src.iter().fold(0.0f32, |s, v| s + v.abs());
        write_f16(block, 0, sum / QK1_0 as f32);
        for (byte, xs) in block[CODES_AT..].iter_mut().zip(src.chunks_exact(8)) {
            *byte = xs
                .iter()
                .enumerate()
                .fold(0u8, |b, (i, &x)| b | (u8::from(x >= 0.0) << i));
        }
    }
}

impl BlockFormat for Q2_0 {
    const ELEMS: usize = QK2_0;
    const BYTES: usize = CODES_AT + QK2_0 / 4;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = read_f16(block, 0);
        for (j, y) in out.iter_mut().enumerate() {
            *y = (i32::from(q2_code(block, j)) - 1) as f32 * d;
        }
    }
}

/// C's `(int)` of a rounded float as x86-64 computes it: `INT_MIN` for NaN and values out
/// of range.
fn c_int(x: f32) -> i32 {
    if (-2_147_483_648.0..2_147_483_648.0).contains(&x) {
        x as i32
    } else {
        i32::MIN
    }
}

impl QuantizeBlock for Q2_0 {
    /// ggml's `quantize_row_q2_0_ref`: `d` is the largest magnitude (unrounded for the
    /// codes), each value `round(x / d)` half away from zero, plus one, clamped to 0..3.
    fn quantize_block(src: &[f32], block: &mut [u8]) {
        let amax = src
            .iter()
            .fold(0.0f32, |m, &v| if v.abs() > m { v.abs() } else { m });
        let id = if amax > 0.0 { 1.0 / amax } else { 0.0 };
        write_f16(block, 0, amax);
        for (byte, xs) in block[CODES_AT..].iter_mut().zip(src.chunks_exact(4)) {
            *byte = xs.iter().enumerate().fold(0u8, |b, (i, &x)| {
                let q = c_int((x * id).round()).wrapping_add(1).clamp(0, 3);
                b | ((q as u8) << (2 * i))
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_grid_values_come_back_exactly() {
        let src: Vec<f32> = (0..QK2_0).map(|j| [-0.5, 0.0, 0.5][j % 3]).collect();
        let mut block = [0u8; <Q2_0 as BlockFormat>::BYTES];
        Q2_0::quantize_block(&src, &mut block);
        let mut out = [0f32; QK2_0];
        Q2_0::dequantize_block(&block, &mut out);
        assert_eq!(out.to_vec(), src);

        let src: Vec<f32> = (0..QK1_0)
            .map(|j| if j % 3 == 0 { -0.25 } else { 0.25 })
            .collect();
        let mut block = [0u8; <Q1_0 as BlockFormat>::BYTES];
        Q1_0::quantize_block(&src, &mut block);
        let mut out = [0f32; QK1_0];
        Q1_0::dequantize_block(&block, &mut out);
        assert_eq!(out.to_vec(), src);
    }
}
