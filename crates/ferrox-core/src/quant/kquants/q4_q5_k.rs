//! Q4_K and Q5_K: 8 sub-blocks of 32 values, value = d·sc·q − dmin·m with 6-bit `sc` and
//! `m` per sub-block and 4- or 5-bit codes. Layout: f16 d, f16 dmin, 12 bytes of packed
//! scales/mins, [Q5_K: 32 bytes of fifth bits, bit `j / 32` of byte `j % 32`], 128 bytes
//! of nibbles (sub-blocks 2k and 2k+1 share bytes 32k.., low and high nibble).

use super::fit::{fit_affine, AffineSearch};
use super::{pack_scale_min_k4, scale_min_k4, QK_K};
use crate::quant::bits::{nearest_int, read_f16, write_f16};
use crate::quant::{BlockFormat, QuantizeBlock};

pub(crate) struct AffineK<const BITS: u32>;

pub(crate) type Q4K = AffineK<4>;
pub(crate) type Q5K = AffineK<5>;

pub(crate) const D_AT: usize = 0;
pub(crate) const DMIN_AT: usize = 2;
pub(crate) const SCALES_AT: usize = 4;
pub(crate) const HIGH_BITS_AT: usize = 16;
const SUB: usize = 32;
const SUBS: usize = QK_K / SUB;
/// Sub-block scales and mins are 6-bit.
const SCALE_LEVELS: f32 = 63.0;

impl<const BITS: u32> AffineK<BITS> {
    pub(crate) const NIBBLES_AT: usize = HIGH_BITS_AT + if BITS == 5 { QK_K / 8 } else { 0 };
    const MAX_CODE: i32 = (1 << BITS) - 1;
    /// ggml's scale search for this width (`quantize_row_q{4,5}_K_ref`).
    const SEARCH: AffineSearch = AffineSearch {
        nmax: Self::MAX_CODE,
        rmin: if BITS == 5 { -0.5 } else { -1.0 },
        rdelta: 0.1,
        nstep: if BITS == 5 { 15 } else { 20 },
        use_mad: false,
    };

    pub(crate) fn codes(block: &[u8]) -> [u8; QK_K] {
        let nibbles = &block[Self::NIBBLES_AT..];
        std::array::from_fn(|e| {
            let (sub, l) = (e / SUB, e % SUB);
            let byte = nibbles[(sub / 2) * SUB + l];
            let low = if sub % 2 == 0 { byte & 0x0F } else { byte >> 4 };
            if BITS == 5 {
                low | (((block[HIGH_BITS_AT + l] >> sub) & 1) << 4)
            } else {
                low
            }
        })
    }

    fn store_codes(codes: &[u8; QK_K], block: &mut [u8]) {
        if BITS == 5 {
            block[HIGH_BITS_AT..Self::NIBBLES_AT].fill(0);
        }
        for (pair, chunk) in codes.chunks_exact(2 * SUB).enumerate() {
            for l in 0..SUB {
                let (low, high) = (chunk[l], chunk[l + SUB]);
                block[Self::NIBBLES_AT + pair * SUB + l] = (low & 0x0F) | ((high & 0x0F) << 4);
                if BITS == 5 {
                    let fifth_bits = ((low >> 4) << (2 * pair)) | ((high >> 4) << (2 * pair + 1));
                    block[HIGH_BITS_AT + l] |= fifth_bits;
                }
            }
        }
    }
}

impl<const BITS: u32> BlockFormat for AffineK<BITS> {
    const ELEMS: usize = QK_K;
    const BYTES: usize = Self::NIBBLES_AT + QK_K / 2;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = read_f16(block, D_AT);
        let dmin = read_f16(block, DMIN_AT);
        let scales = &block[SCALES_AT..HIGH_BITS_AT];
        let codes = Self::codes(block);
        for (j, (ys, qs)) in out
            .chunks_exact_mut(SUB)
            .zip(codes.chunks_exact(SUB))
            .enumerate()
        {
            let (sc, m) = scale_min_k4(j, scales);
            let dl = d * f32::from(sc);
            let ml = dmin * f32::from(m);
            for (y, &q) in ys.iter_mut().zip(qs) {
                *y = dl * f32::from(q) - ml;
            }
        }
    }
}

impl<const BITS: u32> QuantizeBlock for AffineK<BITS> {
    fn quantize_block(src: &[f32], block: &mut [u8]) {
        let mut levels = [0u8; QK_K];
        let mut scales = [0f32; SUBS];
        let mut mins = [0f32; SUBS];
        for (j, (x, l)) in src
            .chunks_exact(SUB)
            .zip(levels.chunks_exact_mut(SUB))
            .enumerate()
        {
            // Weight each value by the sub-block's RMS plus its own magnitude.
            let sum_x2 = x.iter().fold(0.0f32, |s, &v| s + v * v);
            let rms = (sum_x2 / SUB as f32).sqrt();
            let weights: [f32; SUB] = std::array::from_fn(|i| rms + x[i].abs());
            (scales[j], mins[j]) = fit_affine(x, &weights, &Self::SEARCH, l);
        }
        let max_scale = scales
            .iter()
            .fold(0.0f32, |m, &s| if s > m { s } else { m });
        let max_min = mins.iter().fold(0.0f32, |m, &s| if s > m { s } else { m });

        let inv_scale = if max_scale > 0.0 {
            SCALE_LEVELS / max_scale
        } else {
            0.0
        };
        let inv_min = if max_min > 0.0 {
            SCALE_LEVELS / max_min
        } else {
            0.0
        };
        // ggml narrows to uint8 before capping at 63.
        let to_six_bits = |v: f32| (nearest_int(v) as u8).min(63);
        let packed_scales: [u8; SUBS] = std::array::from_fn(|j| to_six_bits(inv_scale * scales[j]));
        let packed_mins: [u8; SUBS] = std::array::from_fn(|j| to_six_bits(inv_min * mins[j]));
        pack_scale_min_k4(
            &packed_scales,
            &packed_mins,
            &mut block[SCALES_AT..HIGH_BITS_AT],
        );
        let d = write_f16(block, D_AT, max_scale / SCALE_LEVELS);
        let dmin = write_f16(block, DMIN_AT, max_min / SCALE_LEVELS);

        // Re-pick codes against the rounded scales; a sub-block whose scale rounded to zero
        // keeps the levels from its fit.
        for (j, (x, l)) in src
            .chunks_exact(SUB)
            .zip(levels.chunks_exact_mut(SUB))
            .enumerate()
        {
            let (sc, m) = scale_min_k4(j, &block[SCALES_AT..HIGH_BITS_AT]);
            let dl = d * f32::from(sc);
            if dl == 0.0 {
                continue;
            }
            let ml = dmin * f32::from(m);
            for (level, &v) in l.iter_mut().zip(x) {
                *level = nearest_int((v + ml) / dl).clamp(0, Self::MAX_CODE) as u8;
            }
        }
        Self::store_codes(&levels, block);
    }
}
