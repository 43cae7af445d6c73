//! IQ3_XXS and IQ3_S: 256-value super-blocks whose values come four at a time from a
//! codebook of unsigned grid points, with per-value signs and one odd scale per sub-block.
//!
//! IQ3_XXS (98 bytes): f16 d, 64 one-byte grid indices, then per 32-value sub-block a u32
//! holding four 7-bit sign patterns (the eighth sign restores even parity) and a 4-bit
//! scale `s` in its top bits; value = d·(0.5 + s)·0.5·point·sign.
//!
//! IQ3_S (110 bytes): f16 d, 64 low index bytes, 8 bytes of ninth index bits (one byte per
//! sub-block), 32 bytes of plain sign bits, 4 bytes of 4-bit scales `s` (two sub-blocks
//! per byte); value = d·(1 + 2s)·point·sign.

use super::bits::{read_f16, read_u32};
use super::grids::{IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS};
use super::kquants::QK_K;
use super::BlockFormat;

/// Values per sub-block (one scale each).
pub(crate) const SUB: usize = 32;

pub(crate) const XXS_INDICES_AT: usize = 2;
pub(crate) const XXS_SCALES_AT: usize = XXS_INDICES_AT + QK_K / 4;

pub(crate) const S_INDICES_AT: usize = 2;
pub(crate) const S_HIGH_AT: usize = S_INDICES_AT + QK_K / 4;
pub(crate) const S_SIGNS_AT: usize = S_HIGH_AT + QK_K / 32;
pub(crate) const S_SCALES_AT: usize = S_SIGNS_AT + QK_K / 8;

/// Grid point `i`'s four coordinates.
fn point(grid: &[u32], i: usize) -> [u8; 4] {
    grid[i].to_le_bytes()
}

/// One sub-block's 32 signed codes (point coordinate times sign) and its 4-bit scale.
pub(crate) trait Iq3SubBlocks {
    fn sub_block(block: &[u8], ib: usize) -> ([i8; SUB], u8);
}

pub(crate) struct Iq3Xxs;

impl Iq3Xxs {
    /// Sub-block `ib`'s word of sign patterns and scale.
    pub(crate) fn signs_and_scale(block: &[u8], ib: usize) -> u32 {
        read_u32(block, XXS_SCALES_AT + 4 * ib)
    }
}

impl Iq3SubBlocks for Iq3Xxs {
    fn sub_block(block: &[u8], ib: usize) -> ([i8; SUB], u8) {
        let aux = Iq3Xxs::signs_and_scale(block, ib);
        let mut codes = [0i8; SUB];
        for (k, out) in codes.chunks_exact_mut(4).enumerate() {
            let p = point(
                &IQ3XXS_GRID,
                usize::from(block[XXS_INDICES_AT + 8 * ib + k]),
            );
            // Pattern `k / 2` covers eight values: this point and its neighbour.
            let signs = KSIGNS_IQ2XS[((aux >> (7 * (k / 2))) & 127) as usize];
            for (j, (o, &c)) in out.iter_mut().zip(&p).enumerate() {
                let negative = signs & (1 << (4 * (k % 2) + j)) != 0;
                *o = if negative { -(c as i8) } else { c as i8 };
            }
        }
        (codes, (aux >> 28) as u8)
    }
}

impl BlockFormat for Iq3Xxs {
    const ELEMS: usize = QK_K;
    const BYTES: usize = XXS_SCALES_AT + QK_K / 8;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = read_f16(block, 0);
        for (ib, ys) in out.chunks_exact_mut(SUB).enumerate() {
            let (codes, s) = Self::sub_block(block, ib);
            let db = d * (0.5 + f32::from(s)) * 0.5;
            // A sign flip is exact, so scaling the signed code rounds as ggml's does.
            for (y, &c) in ys.iter_mut().zip(&codes) {
                *y = db * f32::from(c);
            }
        }
    }
}

pub(crate) struct Iq3S;

impl Iq3S {
    /// Sub-block `ib`'s eight grid indices (nine bits each).
    pub(crate) fn indices(block: &[u8], ib: usize) -> [usize; 8] {
        let high = block[S_HIGH_AT + ib];
        std::array::from_fn(|k| {
            usize::from(block[S_INDICES_AT + 8 * ib + k]) | (usize::from((high >> k) & 1) << 8)
        })
    }

    /// Sub-block `ib`'s 4-bit scale.
    pub(crate) fn scale(block: &[u8], ib: usize) -> u8 {
        (block[S_SCALES_AT + ib / 2] >> (4 * (ib % 2))) & 0x0F
    }
}

impl Iq3SubBlocks for Iq3S {
    fn sub_block(block: &[u8], ib: usize) -> ([i8; SUB], u8) {
        let indices = Self::indices(block, ib);
        let signs = &block[S_SIGNS_AT + 4 * ib..S_SIGNS_AT + 4 * ib + 4];
        let codes = std::array::from_fn(|e| {
            let c = point(&IQ3S_GRID, indices[e / 4])[e % 4] as i8;
            if signs[e / 8] & (1 << (e % 8)) != 0 {
                -c
            } else {
                c
            }
        });
        (codes, Self::scale(block, ib))
    }
}

impl BlockFormat for Iq3S {
    const ELEMS: usize = QK_K;
    const BYTES: usize = S_SCALES_AT + QK_K / 64;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = read_f16(block, 0);
        for (ib, ys) in out.chunks_exact_mut(SUB).enumerate() {
            let (codes, s) = Self::sub_block(block, ib);
            let db = d * f32::from(1 + 2 * s);
            for (y, &c) in ys.iter_mut().zip(&codes) {
                *y = db * f32::from(c);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_have_ggml_sizes() {
        assert_eq!(Iq3Xxs::BYTES, 98);
        assert_eq!(Iq3S::BYTES, 110);
    }

    #[test]
    fn zero_signs_decode_the_grid_points() {
        let mut block = [0u8; Iq3S::BYTES];
        block[..2].copy_from_slice(&half::f16::ONE.to_le_bytes());
        block[S_INDICES_AT] = 5;
        block[S_HIGH_AT] = 1;
        let mut out = [0f32; QK_K];
        Iq3S::dequantize_block(&block, &mut out);
        let want = point(&IQ3S_GRID, 256 + 5).map(f32::from);
        assert_eq!(out[..4], want);
    }
}
