//! Scalar reference dot products of the 256-value formats (Q2_K..Q6_K, IQ4_XS, TQ2_0) with
//! Q8_K activations, following ggml's `_generic` code.
//!
//! Q3_K..Q6_K share ggml's eight-lane shape: lane `l` sums `scale·code·q8` over the values
//! whose index is `l` mod 8, each super-block's lanes are scaled by `d` into eight float
//! sums that run across the whole row, and those are added up only at the end.

use super::ScalarDot;
use crate::quant::bits::{read_f16, read_f32, read_u16, unpack_nibbles};
use crate::quant::iq4::{Iq4Xs, LEVELS, XS_NIBBLES_AT, XS_SCALES_HIGH_AT, XS_SCALES_LOW_AT};
use crate::quant::kquants::q4_q5_k::{self, AffineK};
use crate::quant::kquants::q8_k::{CODES_AT as Q8K_CODES_AT, SUMS_AT as Q8K_SUMS_AT};
use crate::quant::kquants::{
    q2_k, q3_k, q6_k, scale_min_k4, unpack_two_bit_codes, Q2K, Q3K, Q6K, Q8K, QK_K,
};
use crate::quant::ternary::{tq2_code, Tq2_0, TQ2_CODES};
use crate::quant::BlockFormat;

/// A Q8_K activation block: its scale, codes and the sums of each group of 16 codes.
pub(crate) struct Q8KBlock<'a> {
    pub(crate) d: f32,
    pub(crate) codes: &'a [u8],
    bytes: &'a [u8],
}

impl<'a> Q8KBlock<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self {
            d: read_f32(bytes, 0),
            codes: &bytes[Q8K_CODES_AT..Q8K_SUMS_AT],
            bytes,
        }
    }

    pub(crate) fn code(&self, e: usize) -> i32 {
        i32::from(self.codes[e] as i8)
    }

    /// Σ of codes `16g..16g+16`.
    pub(crate) fn group_sum(&self, g: usize) -> i32 {
        i32::from(read_u16(self.bytes, Q8K_SUMS_AT + 2 * g) as i16)
    }
}

/// Walks the super-blocks of a weight row and its activation row.
pub(super) fn super_blocks<'a, W: BlockFormat>(
    w: &'a [u8],
    x: &'a [u8],
) -> impl Iterator<Item = (&'a [u8], Q8KBlock<'a>)> {
    w.chunks_exact(W::BYTES)
        .zip(x.chunks_exact(Q8K::BYTES).map(Q8KBlock::new))
}

/// ggml's eight integer lanes of one super-block: `codes[e]·q8[e]` times the scale of
/// `e`'s sub-block of `sub` values, summed by `e mod 8`.
fn eight_lanes(
    codes: &[i8; QK_K],
    q8: &Q8KBlock,
    sub: usize,
    scale: impl Fn(usize) -> i32,
) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (e, &c) in codes.iter().enumerate() {
        lanes[e % 8] += scale(e / sub) * (i32::from(c) * q8.code(e));
    }
    lanes
}

/// The eight running float lanes shared by Q3_K..Q6_K, plus the separate scalar sum that
/// the formats with minimums subtract into first.
struct LaneSums {
    lanes: [f32; 8],
    sumf: f32,
}

impl LaneSums {
    fn new() -> Self {
        Self {
            lanes: [0.0; 8],
            sumf: 0.0,
        }
    }

    fn add_block(&mut self, d: f32, lanes: [i32; 8]) {
        for (sum, lane) in self.lanes.iter_mut().zip(lanes) {
            *sum += d * lane as f32;
        }
    }

    fn finish(self) -> f32 {
        self.lanes.iter().fold(self.sumf, |s, &l| s + l)
    }
}

impl ScalarDot for Q2K {
    fn dot(w: &[u8], x: &[u8]) -> f32 {
        let mut sumf = 0.0f32;
        for (wb, q8) in super_blocks::<Q2K>(w, x) {
            let scales = &wb[q2_k::SCALES_AT..q2_k::CODES_AT];
            let mut codes = [0u8; QK_K];
            unpack_two_bit_codes(&wb[q2_k::CODES_AT..q2_k::D_AT], &mut codes);
            let summs: i32 = (0..16)
                .map(|j| q8.group_sum(j) * i32::from(scales[j] >> 4))
                .sum();
            let isum: i32 = (0..16)
                .map(|j| {
                    let sub: i32 = (16 * j..16 * j + 16)
                        .map(|e| q8.code(e) * i32::from(codes[e]))
                        .sum();
                    i32::from(scales[j] & 0x0F) * sub
                })
                .sum();
            let dall = q8.d * read_f16(wb, q2_k::D_AT);
            let dmin = q8.d * read_f16(wb, q2_k::DMIN_AT);
            sumf += dall * isum as f32 - dmin * summs as f32;
        }
        sumf
    }
}

impl ScalarDot for Q3K {
    fn dot(w: &[u8], x: &[u8]) -> f32 {
        let mut sums = LaneSums::new();
        for (wb, q8) in super_blocks::<Q3K>(w, x) {
            let mut low = [0u8; QK_K];
            unpack_two_bit_codes(&wb[q3_k::CODES_AT..q3_k::SCALES_AT], &mut low);
            let hmask = &wb[q3_k::HMASK_AT..q3_k::CODES_AT];
            let codes: [i8; QK_K] = std::array::from_fn(|e| {
                let offset = if q3_k::high_bit_set(hmask, e) { 0 } else { 4 };
                low[e] as i8 - offset
            });
            let scales = &wb[q3_k::SCALES_AT..q3_k::D_AT];
            let lanes = eight_lanes(&codes, &q8, 16, |j| q3_k::sub_block_scale(scales, j));
            sums.add_block(read_f16(wb, q3_k::D_AT) * q8.d, lanes);
        }
        sums.finish()
    }
}

impl<const BITS: u32> ScalarDot for AffineK<BITS> {
    fn dot(w: &[u8], x: &[u8]) -> f32 {
        let mut sums = LaneSums::new();
        for (wb, q8) in super_blocks::<Self>(w, x) {
            let packed = &wb[q4_q5_k::SCALES_AT..q4_q5_k::HIGH_BITS_AT];
            let codes = Self::codes(wb).map(|c| c as i8);
            let lanes = eight_lanes(&codes, &q8, 32, |j| i32::from(scale_min_k4(j, packed).0));
            let sumi: i32 = (0..16)
                .map(|g| q8.group_sum(g) * i32::from(scale_min_k4(g / 2, packed).1))
                .sum();
            sums.add_block(read_f16(wb, q4_q5_k::D_AT) * q8.d, lanes);
            let dmin = read_f16(wb, q4_q5_k::DMIN_AT) * q8.d;
            sums.sumf -= dmin * sumi as f32;
        }
        sums.finish()
    }
}

impl ScalarDot for Q6K {
    fn dot(w: &[u8], x: &[u8]) -> f32 {
        let mut sums = LaneSums::new();
        for (wb, q8) in super_blocks::<Q6K>(w, x) {
            let codes: [i8; QK_K] = std::array::from_fn(|e| {
                let (low_byte, low_shift, high_byte, high_shift) = q6_k::code_position(e);
                let low = (wb[low_byte] >> low_shift) & 0x0F;
                let high = (wb[high_byte] >> high_shift) & 3;
                (low | (high << 4)) as i8 - 32
            });
            let scales = &wb[q6_k::SCALES_AT..q6_k::D_AT];
            let lanes = eight_lanes(&codes, &q8, 16, |j| i32::from(scales[j] as i8));
            sums.add_block(read_f16(wb, q6_k::D_AT) * q8.d, lanes);
        }
        sums.finish()
    }
}

/// IQ4_XS sub-block `ib`'s 6-bit scale, minus its offset of 32.
pub(crate) fn iq4_xs_scale(block: &[u8], ib: usize) -> i32 {
    let low = (block[XS_SCALES_LOW_AT + ib / 2] >> (4 * (ib % 2))) & 0x0F;
    let high = (read_u16(block, XS_SCALES_HIGH_AT) >> (2 * ib)) & 3;
    i32::from(low | ((high as u8) << 4)) - 32
}

impl ScalarDot for Iq4Xs {
    fn dot(w: &[u8], x: &[u8]) -> f32 {
        let mut sumf = 0.0f32;
        for (wb, q8) in super_blocks::<Iq4Xs>(w, x) {
            let d4d8 = read_f16(wb, 0) * q8.d;
            for ib in 0..QK_K / 32 {
                let mut codes = [0u8; 32];
                unpack_nibbles(&wb[XS_NIBBLES_AT + 16 * ib..], &mut codes);
                let sumi: i32 = codes
                    .iter()
                    .enumerate()
                    .map(|(j, &c)| q8.code(32 * ib + j) * i32::from(LEVELS[usize::from(c)]))
                    .sum();
                let dl = d4d8 * iq4_xs_scale(wb, ib) as f32;
                sumf += dl * sumi as f32;
            }
        }
        sumf
    }
}

impl ScalarDot for Tq2_0 {
    /// One exact integer sum of `(code − 1)·q8` per super-block, then
    /// `sumf += sumi · (d_x · d_w)`.
    fn dot(w: &[u8], x: &[u8]) -> f32 {
        super_blocks::<Tq2_0>(w, x).fold(0.0f32, |sumf, (wb, q8)| {
            let sumi: i32 = (0..QK_K)
                .map(|e| q8.code(e) * (i32::from(tq2_code(wb, e)) - 1))
                .sum();
            sumf + sumi as f32 * (q8.d * read_f16(wb, TQ2_CODES))
        })
    }
}
