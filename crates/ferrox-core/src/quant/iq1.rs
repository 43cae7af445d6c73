//! IQ1_S and IQ1_M: 256-value super-blocks of 8-value groups, each group a point of a
//! ternary codebook (coordinates −1, 0, 1) shifted by ±1/8 and scaled by an odd 3-bit
//! scale `ls` (1..15): value = d·ls·(coordinate ± 1/8).
//!
//! IQ1_S (50 bytes): f16 d, 32 low index bytes, then per 32-value sub-block a u16 with
//! three high index bits per group, the scale in bits 12..15 and the shift's sign in bit
//! 15 (shared by the sub-block's four groups).
//!
//! IQ1_M (56 bytes): 32 low index bytes, 16 bytes with, per group, a nibble of three high
//! index bits and the shift's sign, then four u16 words holding two 3-bit scales per
//! sub-block (one per 16 values) in their low twelve bits; their top nibbles together
//! form the f16 `d`.

use super::bits::{f16_bits_to_f32, read_f16, read_u16};
use super::grids::{coordinate, IQ1S_GRID};
use super::kquants::QK_K;
use super::BlockFormat;

/// The size of the shift, as ggml's `IQ1S_DELTA` / `IQ1M_DELTA`.
pub(crate) const DELTA: f32 = 0.125;
/// Values per group (one grid point).
pub(crate) const GROUP: usize = 8;

pub(crate) const S_INDICES_AT: usize = 2;
pub(crate) const S_HIGH_AT: usize = S_INDICES_AT + QK_K / 8;

pub(crate) const M_HIGH_AT: usize = QK_K / 8;
pub(crate) const M_SCALES_AT: usize = M_HIGH_AT + QK_K / 16;

/// One 8-value group: its grid point, whether the shift is −1/8, and its odd scale.
#[derive(Clone, Copy)]
pub(crate) struct Group {
    pub(crate) point: u64,
    pub(crate) minus: bool,
    pub(crate) ls: i32,
}

impl Group {
    /// Coordinate `j` of the grid point (−1, 0 or 1).
    pub(crate) fn coordinate(&self, j: usize) -> i8 {
        coordinate(self.point, j) as i8
    }
}

/// The two formats seen group by group.
pub(crate) trait Iq1Groups {
    /// The super-block scale.
    fn d(block: &[u8]) -> f32;
    /// Group `g` (values `8g..8g + 8`).
    fn group(block: &[u8], g: usize) -> Group;
}

fn decode<F: Iq1Groups>(block: &[u8], out: &mut [f32]) {
    let d = F::d(block);
    for (g, ys) in out.chunks_exact_mut(GROUP).enumerate() {
        let group = F::group(block, g);
        let dl = d * group.ls as f32;
        let delta = if group.minus { -DELTA } else { DELTA };
        for (j, y) in ys.iter_mut().enumerate() {
            *y = dl * (f32::from(group.coordinate(j)) + delta);
        }
    }
}

pub(crate) struct Iq1S;

impl Iq1S {
    /// Sub-block `ib`'s word of high index bits, scale and shift sign.
    pub(crate) fn high(block: &[u8], ib: usize) -> u16 {
        read_u16(block, S_HIGH_AT + 2 * ib)
    }

    /// The odd scale of a sub-block's word.
    pub(crate) fn ls(high: u16) -> i32 {
        2 * i32::from((high >> 12) & 7) + 1
    }
}

impl Iq1Groups for Iq1S {
    fn d(block: &[u8]) -> f32 {
        read_f16(block, 0)
    }

    #[inline]
    fn group(block: &[u8], g: usize) -> Group {
        let (ib, l) = (g / 4, g % 4);
        let high = Self::high(block, ib);
        let index =
            usize::from(block[S_INDICES_AT + g]) | (usize::from((high >> (3 * l)) & 7) << 8);
        Group {
            point: IQ1S_GRID[index],
            minus: high & 0x8000 != 0,
            ls: Self::ls(high),
        }
    }
}

impl BlockFormat for Iq1S {
    const ELEMS: usize = QK_K;
    const BYTES: usize = S_HIGH_AT + QK_K / 16;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        decode::<Self>(block, out);
    }
}

pub(crate) struct Iq1M;

impl Iq1M {
    /// The f16 bits of `d`, one nibble from the top of each scale word.
    pub(crate) fn d_bits(block: &[u8]) -> u16 {
        let sc = |k: usize| read_u16(block, M_SCALES_AT + 2 * k);
        (sc(0) >> 12) | ((sc(1) >> 8) & 0x00F0) | ((sc(2) >> 4) & 0x0F00) | (sc(3) & 0xF000)
    }

    /// The odd scale of values `16h..16h + 16` (`h` < 16).
    pub(crate) fn ls(block: &[u8], h: usize) -> i32 {
        let (ib, second) = (h / 2, h % 2);
        let word = read_u16(block, M_SCALES_AT + 2 * (ib / 2));
        2 * i32::from((word >> (6 * (ib % 2) + 3 * second)) & 7) + 1
    }
}

impl Iq1Groups for Iq1M {
    fn d(block: &[u8]) -> f32 {
        f16_bits_to_f32(Self::d_bits(block))
    }

    #[inline]
    fn group(block: &[u8], g: usize) -> Group {
        let nibble = (block[M_HIGH_AT + g / 2] >> (4 * (g % 2))) & 0x0F;
        let index = usize::from(block[g]) | (usize::from(nibble & 7) << 8);
        Group {
            point: IQ1S_GRID[index],
            minus: nibble & 8 != 0,
            ls: Self::ls(block, g / 2),
        }
    }
}

impl BlockFormat for Iq1M {
    const ELEMS: usize = QK_K;
    const BYTES: usize = M_SCALES_AT + QK_K / 32;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        decode::<Self>(block, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_have_ggml_sizes() {
        assert_eq!(Iq1S::BYTES, 50);
        assert_eq!(Iq1M::BYTES, 56);
    }

    #[test]
    fn iq1_m_scale_is_gathered_from_the_top_nibbles() {
        let mut block = [0u8; Iq1M::BYTES];
        let bits = half::f16::from_f32(-0.75).to_bits();
        for k in 0..4 {
            let word = ((bits >> (4 * k)) & 0xF) << 12 | 0x0ABC;
            block[M_SCALES_AT + 2 * k..][..2].copy_from_slice(&word.to_le_bytes());
        }
        assert_eq!(Iq1M::d(&block), -0.75);
        // 0xABC: scales 4 (bits 0..3), 7, 2, 5 → 9, 15, 5, 11.
        assert_eq!([0, 1, 2, 3].map(|h| Iq1M::ls(&block, h)), [9, 15, 5, 11]);
    }
}
