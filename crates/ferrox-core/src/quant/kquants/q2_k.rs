//! Q2_K: 16 sub-blocks of 16 values, 2-bit codes, value = d·sc·q − dmin·m with 4-bit `sc`
//! and `m` per sub-block. Layout: 16 bytes of (m << 4 | sc), 64 bytes of 2-bit codes,
//! f16 d, f16 dmin.

use super::fit::{fit_affine, AffineSearch};
use super::{pack_two_bit_codes, unpack_two_bit_codes, QK_K};
use crate::quant::bits::{nearest_int, read_f16, write_f16};
use crate::quant::{BlockFormat, QuantizeBlock};

pub(crate) struct Q2K;

pub(crate) const SCALES_AT: usize = 0;
pub(crate) const CODES_AT: usize = 16;
pub(crate) const D_AT: usize = 80;
pub(crate) const DMIN_AT: usize = 82;
const SUB: usize = 16;

impl BlockFormat for Q2K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 84;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = read_f16(block, D_AT);
        let dmin = read_f16(block, DMIN_AT);
        let mut codes = [0u8; QK_K];
        unpack_two_bit_codes(&block[CODES_AT..D_AT], &mut codes);
        for ((ys, qs), &packed) in out
            .chunks_exact_mut(SUB)
            .zip(codes.chunks_exact(SUB))
            .zip(&block[SCALES_AT..CODES_AT])
        {
            let dl = d * f32::from(packed & 0x0F);
            let ml = dmin * f32::from(packed >> 4);
            for (y, &q) in ys.iter_mut().zip(qs) {
                *y = dl * f32::from(q) - ml;
            }
        }
    }
}

/// Both 4-bit fields of the scale byte are quantized against the largest value.
const SCALE_LEVELS: f32 = 15.0;

impl QuantizeBlock for Q2K {
    fn quantize_block(src: &[f32], block: &mut [u8]) {
        let search = AffineSearch {
            nmax: 3,
            rmin: -0.5,
            rdelta: 0.1,
            nstep: 15,
            use_mad: true,
        };
        let mut levels = [0u8; QK_K];
        let mut scales = [0f32; QK_K / SUB];
        let mut mins = [0f32; QK_K / SUB];
        for (j, (x, l)) in src
            .chunks_exact(SUB)
            .zip(levels.chunks_exact_mut(SUB))
            .enumerate()
        {
            let weights: [f32; SUB] = std::array::from_fn(|i| x[i].abs());
            (scales[j], mins[j]) = fit_affine(x, &weights, &search, l);
        }
        let max_scale = scales
            .iter()
            .fold(0.0f32, |m, &s| if s > m { s } else { m });
        let max_min = mins.iter().fold(0.0f32, |m, &s| if s > m { s } else { m });

        let packed = &mut block[SCALES_AT..CODES_AT];
        let d = if max_scale > 0.0 {
            let iscale = SCALE_LEVELS / max_scale;
            for (byte, &s) in packed.iter_mut().zip(&scales) {
                *byte = nearest_int(iscale * s) as u8;
            }
            write_f16(block, D_AT, max_scale / SCALE_LEVELS)
        } else {
            packed.fill(0);
            write_f16(block, D_AT, 0.0)
        };
        let packed = &mut block[SCALES_AT..CODES_AT];
        let dmin = if max_min > 0.0 {
            let iscale = SCALE_LEVELS / max_min;
            for (byte, &m) in packed.iter_mut().zip(&mins) {
                *byte |= (nearest_int(iscale * m) << 4) as u8;
            }
            write_f16(block, DMIN_AT, max_min / SCALE_LEVELS)
        } else {
            write_f16(block, DMIN_AT, 0.0)
        };

        // Re-pick codes against the rounded scales; a sub-block whose scale rounded to zero
        // keeps the levels from its fit.
        for ((x, l), &packed) in src
            .chunks_exact(SUB)
            .zip(levels.chunks_exact_mut(SUB))
            .zip(&block[SCALES_AT..CODES_AT])
        {
            let dl = d * f32::from(packed & 0x0F);
            if dl == 0.0 {
                continue;
            }
            let ml = dmin * f32::from(packed >> 4);
            for (level, &v) in l.iter_mut().zip(x) {
                *level = nearest_int((v + ml) / dl).clamp(0, 3) as u8;
            }
        }
        pack_two_bit_codes(&levels, &mut block[CODES_AT..D_AT]);
    }
}
