//! Q3_K: 16 sub-blocks of 16 values, symmetric 3-bit codes, value = d·(sc − 32)·(q − 4)
//! with a 6-bit `sc` per sub-block. Layout: 32 bytes of high-bit masks (bit `e / 32` of
//! byte `e % 32`, set meaning "no −4"), 64 bytes of low 2-bit codes, 12 bytes of packed
//! 6-bit scales, f16 d.

use super::fit::fit_symmetric_greedy;
use super::{pack_two_bit_codes, unpack_two_bit_codes, QK_K};
use crate::quant::bits::{nearest_int, read_f16, signed_absmax, write_f16};
use crate::quant::{BlockFormat, QuantizeBlock};

pub(crate) struct Q3K;

pub(crate) const HMASK_AT: usize = 0;
pub(crate) const CODES_AT: usize = 32;
pub(crate) const SCALES_AT: usize = 96;
pub(crate) const D_AT: usize = 108;
const SUB: usize = 16;

/// Sub-block `j`'s scale from the 12 packed bytes: low four bits in the low (j < 8) or high
/// nibble of byte `j % 8`, top two bits in byte `8 + j % 4` at bit `2·(j / 4)`. Returns the
/// signed scale (stored with an offset of 32).
pub(crate) fn sub_block_scale(packed: &[u8], j: usize) -> i32 {
    let low = if j < 8 {
        packed[j] & 0x0F
    } else {
        packed[j - 8] >> 4
    };
    let high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    i32::from(low | (high << 4)) - 32
}

/// Inverse of [`sub_block_scale`] for an offset scale in `0..64`; `packed` starts zeroed.
fn set_sub_block_scale(packed: &mut [u8], j: usize, offset_scale: u8) {
    let low = offset_scale & 0x0F;
    if j < 8 {
        packed[j] |= low;
    } else {
        packed[j - 8] |= low << 4;
    }
    packed[8 + j % 4] |= (offset_scale >> 4) << (2 * (j / 4));
}

pub(crate) fn high_bit_set(hmask: &[u8], e: usize) -> bool {
    hmask[e % 32] & (1 << (e / 32)) != 0
}

impl BlockFormat for Q3K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 110;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = read_f16(block, D_AT);
        let hmask = &block[HMASK_AT..CODES_AT];
        let scales = &block[SCALES_AT..D_AT];
        let mut codes = [0u8; QK_K];
        unpack_two_bit_codes(&block[CODES_AT..SCALES_AT], &mut codes);
        for (j, ys) in out.chunks_exact_mut(SUB).enumerate() {
            let dl = d * sub_block_scale(scales, j) as f32;
            for (i, y) in ys.iter_mut().enumerate() {
                let e = j * SUB + i;
                let offset = if high_bit_set(hmask, e) { 0 } else { 4 };
                *y = dl * (i32::from(codes[e]) - offset) as f32;
            }
        }
    }
}

impl QuantizeBlock for Q3K {
    fn quantize_block(src: &[f32], block: &mut [u8]) {
        let mut levels = [0u8; QK_K];
        let mut scales = [0f32; QK_K / SUB];
        for ((x, l), scale) in src
            .chunks_exact(SUB)
            .zip(levels.chunks_exact_mut(SUB))
            .zip(scales.iter_mut())
        {
            *scale = fit_symmetric_greedy(x, 4, l);
        }
        let (_, max_scale) = signed_absmax(&scales);

        block[SCALES_AT..D_AT].fill(0);
        let d = if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for (j, &s) in scales.iter().enumerate() {
                // ggml narrows to int8 before clamping.
                let l = i32::from(nearest_int(iscale * s) as i8).clamp(-32, 31) + 32;
                set_sub_block_scale(&mut block[SCALES_AT..D_AT], j, l as u8);
            }
            write_f16(block, D_AT, 1.0 / iscale)
        } else {
            write_f16(block, D_AT, 0.0)
        };

        // Re-pick codes against the rounded scales; a sub-block whose scale rounded to zero
        // keeps the levels from its fit.
        for (j, (x, l)) in src
            .chunks_exact(SUB)
            .zip(levels.chunks_exact_mut(SUB))
            .enumerate()
        {
            let dl = d * sub_block_scale(&block[SCALES_AT..D_AT], j) as f32;
            if dl == 0.0 {
                continue;
            }
            for (level, &v) in l.iter_mut().zip(x) {
                *level = (nearest_int(v / dl).clamp(-4, 3) + 4) as u8;
            }
        }

        let hmask = &mut block[HMASK_AT..CODES_AT];
        hmask.fill(0);
        for (e, level) in levels.iter_mut().enumerate() {
            if *level > 3 {
                hmask[e % 32] |= 1 << (e / 32);
                *level -= 4;
            }
        }
        pack_two_bit_codes(&levels, &mut block[CODES_AT..SCALES_AT]);
    }
}
