//! Q6_K: 16 sub-blocks of 16 values, symmetric 6-bit codes, value = d·sc·(q − 32) with a
//! signed 8-bit `sc` per sub-block. Layout: 128 bytes of low nibbles, 64 bytes of high
//! 2-bit pairs, 16 × i8 scales, f16 d. Within each 128-value half, quarter `k` of the values
//! takes nibble `k / 2` of low byte `l + 32·(k % 2)` and bits `2k..2k+2` of high byte `l`.

use super::fit::{fit_symmetric, GROUP_MAX_EPS};
use super::QK_K;
use crate::quant::bits::{nearest_int, read_f16, signed_absmax, write_f16};
use crate::quant::{BlockFormat, QuantizeBlock};

pub(crate) struct Q6K;

pub(crate) const LOW_AT: usize = 0;
pub(crate) const HIGH_AT: usize = 128;
pub(crate) const SCALES_AT: usize = 192;
pub(crate) const D_AT: usize = 208;
const SUB: usize = 16;
const SUBS: usize = QK_K / SUB;

/// (low byte index, low nibble shift, high byte index, high bits shift) of value `e`.
pub(crate) fn code_position(e: usize) -> (usize, u32, usize, u32) {
    let (half, quarter, l) = (e / 128, (e % 128) / 32, e % 32);
    let low_byte = LOW_AT + 64 * half + l + 32 * (quarter % 2);
    let high_byte = HIGH_AT + 32 * half + l;
    (
        low_byte,
        4 * (quarter / 2) as u32,
        high_byte,
        2 * quarter as u32,
    )
}

impl BlockFormat for Q6K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 210;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = read_f16(block, D_AT);
        for (e, y) in out.iter_mut().enumerate() {
            let (low_byte, low_shift, high_byte, high_shift) = code_position(e);
            let low = (block[low_byte] >> low_shift) & 0x0F;
            let high = (block[high_byte] >> high_shift) & 3;
            let q = i32::from(low | (high << 4)) - 32;
            let scale = block[SCALES_AT + e / SUB] as i8;
            *y = d * f32::from(scale) * q as f32;
        }
    }
}

impl QuantizeBlock for Q6K {
    fn quantize_block(src: &[f32], block: &mut [u8]) {
        let mut levels = [0u8; QK_K];
        let mut scales = [0f32; SUBS];
        for ((x, l), scale) in src
            .chunks_exact(SUB)
            .zip(levels.chunks_exact_mut(SUB))
            .zip(scales.iter_mut())
        {
            *scale = fit_symmetric(x, 32, l);
        }
        let (max_abs_scale, max_scale) = signed_absmax(&scales);
        if max_abs_scale < GROUP_MAX_EPS {
            block.fill(0);
            return;
        }

        let iscale = -128.0 / max_scale;
        let d = write_f16(block, D_AT, 1.0 / iscale);
        for (byte, &s) in block[SCALES_AT..D_AT].iter_mut().zip(&scales) {
            *byte = nearest_int(iscale * s).min(127) as i8 as u8;
        }

        // Re-pick codes against the rounded scales; a sub-block whose scale rounded to zero
        // keeps the levels from its fit.
        for (j, (x, l)) in src
            .chunks_exact(SUB)
            .zip(levels.chunks_exact_mut(SUB))
            .enumerate()
        {
            let dl = d * f32::from(block[SCALES_AT + j] as i8);
            if dl == 0.0 {
                continue;
            }
            for (level, &v) in l.iter_mut().zip(x) {
                *level = (nearest_int(v / dl).clamp(-32, 31) + 32) as u8;
            }
        }

        block[LOW_AT..SCALES_AT].fill(0);
        for (e, &level) in levels.iter().enumerate() {
            let (low_byte, low_shift, high_byte, high_shift) = code_position(e);
            block[low_byte] |= (level & 0x0F) << low_shift;
            block[high_byte] |= (level >> 4) << high_shift;
        }
    }
}
