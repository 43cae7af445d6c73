//! IQ2_XXS, IQ2_XS and IQ2_S: "2-bit" i-quants. Each 256-value block is an f16 `d` and
//! eight 32-value sub-blocks of four groups of eight values; a group is a point of a fixed
//! grid (coordinates 8, 25 or 43), eight sign bits and a 4-bit scale `s` shared by two or
//! four groups, decoding to `d·(0.5 + s)/4 · coordinate · ±1`.
//!
//! - IQ2_XXS (66 bytes): per sub-block two u32s: four 8-bit grid indices (256-point
//!   grid), then four 7-bit sign patterns and the sub-block's scale in the top 4 bits.
//! - IQ2_XS (74 bytes): per group a u16 of a 9-bit index (512 points) and a 7-bit sign
//!   pattern; then one byte per sub-block of two scales (low nibble: groups 0, 1).
//! - IQ2_S (82 bytes): 32 low index bytes, 32 sign bytes (all eight signs stored),
//!   8 bytes of the indices' high bits (two per group), 8 scale bytes as IQ2_XS.
//!
//! The 7-bit sign patterns of IQ2_XXS/IQ2_XS get their eighth sign from parity
//! ([`KSIGNS_IQ2XS`]). ggml has no reference quantizer for these formats (they need an
//! importance matrix), so only decoding is offered.

use super::bits::{read_f16, read_u16};
use super::grids::{coordinate, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KSIGNS_IQ2XS};
use super::kquants::QK_K;
use super::BlockFormat;

/// Eight-value groups per block.
pub(crate) const GROUPS: usize = QK_K / 8;

/// One decoded group of eight values: a grid point (byte `j` the magnitude of value `j`),
/// its sign bits (bit `j` set: value `j` is negative) and its 4-bit scale.
#[derive(Clone, Copy)]
pub(crate) struct Group {
    pub(crate) point: u64,
    pub(crate) signs: u8,
    pub(crate) scale: u8,
}

/// The shared shape of the three formats: everything but how a group is stored.
pub(crate) trait Iq2Format: BlockFormat {
    /// Group `g` (values `8g..8g + 8`) of `block`.
    fn group(block: &[u8], g: usize) -> Group;
}

pub(crate) struct Iq2Xxs;
pub(crate) struct Iq2Xs;
pub(crate) struct Iq2S;

/// Where the f16 `d` lives, in all three formats.
pub(crate) const D_AT: usize = 0;
/// Start of the grid indices (and, for IQ2_XXS, everything else).
pub(crate) const QS_AT: usize = 2;
/// IQ2_XS: the scale bytes.
pub(crate) const XS_SCALES_AT: usize = QS_AT + 2 * GROUPS;
/// IQ2_S: the sign bytes, the high index bits and the scale bytes.
pub(crate) const S_SIGNS_AT: usize = QS_AT + GROUPS;
pub(crate) const S_QH_AT: usize = S_SIGNS_AT + GROUPS;
pub(crate) const S_SCALES_AT: usize = S_QH_AT + QK_K / 32;

/// IQ2_XXS sub-block `ib`'s second word: four 7-bit sign patterns, then the scale.
#[inline]
pub(crate) fn xxs_aux(block: &[u8], ib: usize) -> u32 {
    let at = QS_AT + 8 * ib + 4;
    crate::quant::bits::read_u32(block, at)
}

/// IQ2_S group `g`'s 10-bit grid index.
#[inline]
pub(crate) fn s_index(block: &[u8], g: usize) -> usize {
    let (ib, l) = (g / 4, g % 4);
    let high = (usize::from(block[S_QH_AT + ib]) >> (2 * l)) & 3;
    usize::from(block[QS_AT + g]) | (high << 8)
}

/// The scale nibble of group `g` in the IQ2_XS/IQ2_S layout (two per sub-block byte).
#[inline]
fn nibble_scale(scales: u8, g: usize) -> u8 {
    if g % 4 < 2 {
        scales & 0x0F
    } else {
        scales >> 4
    }
}

impl Iq2Format for Iq2Xxs {
    #[inline]
    fn group(block: &[u8], g: usize) -> Group {
        let (ib, l) = (g / 4, g % 4);
        let aux = xxs_aux(block, ib);
        Group {
            point: IQ2XXS_GRID[usize::from(block[QS_AT + 8 * ib + l])],
            signs: KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize],
            scale: (aux >> 28) as u8,
        }
    }
}

impl Iq2Format for Iq2Xs {
    #[inline]
    fn group(block: &[u8], g: usize) -> Group {
        let q = read_u16(block, QS_AT + 2 * g);
        Group {
            point: IQ2XS_GRID[usize::from(q & 511)],
            signs: KSIGNS_IQ2XS[usize::from(q >> 9)],
            scale: nibble_scale(block[XS_SCALES_AT + g / 4], g),
        }
    }
}

impl Iq2Format for Iq2S {
    #[inline]
    fn group(block: &[u8], g: usize) -> Group {
        Group {
            point: IQ2S_GRID[s_index(block, g)],
            signs: block[S_SIGNS_AT + g],
            scale: nibble_scale(block[S_SCALES_AT + g / 4], g),
        }
    }
}

/// ggml's decoding: `db = d·(0.5 + s)·0.25` in that order, then `db·coordinate`, negated
/// where the sign bit is set.
fn dequantize_groups<F: Iq2Format>(block: &[u8], out: &mut [f32]) {
    let d = read_f16(block, D_AT);
    for (g, values) in out.chunks_exact_mut(8).enumerate() {
        let group = F::group(block, g);
        let db = d * (0.5 + f32::from(group.scale)) * 0.25;
        for (j, y) in values.iter_mut().enumerate() {
            let v = db * f32::from(coordinate(group.point, j));
            *y = if group.signs >> j & 1 == 1 { -v } else { v };
        }
    }
}

impl BlockFormat for Iq2Xxs {
    const ELEMS: usize = QK_K;
    const BYTES: usize = QS_AT + 2 * GROUPS;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        dequantize_groups::<Self>(block, out);
    }
}

impl BlockFormat for Iq2Xs {
    const ELEMS: usize = QK_K;
    const BYTES: usize = XS_SCALES_AT + QK_K / 32;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        dequantize_groups::<Self>(block, out);
    }
}

impl BlockFormat for Iq2S {
    const ELEMS: usize = QK_K;
    const BYTES: usize = S_SCALES_AT + QK_K / 32;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        dequantize_groups::<Self>(block, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_follow_ggml() {
        assert_eq!(Iq2Xxs::BYTES, 66);
        assert_eq!(Iq2Xs::BYTES, 74);
        assert_eq!(Iq2S::BYTES, 82);
    }

    /// A hand-built IQ2_S block: index 0x2AB of group 5 (qh bits 2..4 of byte 1), all
    /// signs negative, scale nibble 3, d = 1: each value is −(3.5/4)·coordinate.
    #[test]
    fn iq2_s_group_decodes_by_hand() {
        let mut block = [0u8; Iq2S::BYTES];
        block[..2].copy_from_slice(&half::f16::ONE.to_le_bytes());
        block[QS_AT + 5] = 0xAB;
        block[S_QH_AT + 1] = 0b10 << 2;
        block[S_SIGNS_AT + 5] = 0xFF;
        block[S_SCALES_AT + 1] = 0x03;
        let mut out = [0f32; QK_K];
        Iq2S::dequantize_block(&block, &mut out);
        let point = IQ2S_GRID[0x2AB];
        for j in 0..8 {
            let want = -(0.875 * f32::from(coordinate(point, j)));
            assert_eq!(out[40 + j], want, "value {j}");
        }
        assert_eq!(s_index(&block, 5), 0x2AB);
    }
}
