//! Q8_K: the activation format for K-quant dot products. Layout: f32 d, 256 × i8 codes,
//! 16 × i16 sums of each group of 16 codes (so offset formats can fold in their minimums).

use super::QK_K;
use crate::quant::bits::{nearest_int, read_f32, signed_absmax, write_u16, write_u32};
use crate::quant::{BlockFormat, QuantizeBlock};

pub(crate) struct Q8K;

pub(crate) const D_AT: usize = 0;
pub(crate) const CODES_AT: usize = 4;
pub(crate) const SUMS_AT: usize = CODES_AT + QK_K;

impl BlockFormat for Q8K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = SUMS_AT + 2 * QK_K / 16;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = read_f32(block, D_AT);
        for (y, &code) in out.iter_mut().zip(&block[CODES_AT..SUMS_AT]) {
            *y = d * f32::from(code as i8);
        }
    }
}

impl QuantizeBlock for Q8K {
    fn quantize_block(src: &[f32], block: &mut [u8]) {
        let (amax, max) = signed_absmax(src);
        if amax == 0.0 {
            // ggml leaves the sums of an all-zero block unwritten; zero is their true value.
            block.fill(0);
            return;
        }
        // -127 rather than -128 keeps every code's negation in range (ggml's IQ kernels
        // rely on it).
        let iscale = -127.0 / max;
        for (code, &x) in block[CODES_AT..SUMS_AT].iter_mut().zip(src) {
            *code = nearest_int(iscale * x).min(127) as i8 as u8;
        }
        for group in 0..QK_K / 16 {
            let start = CODES_AT + 16 * group;
            let sum: i32 = block[start..start + 16]
                .iter()
                .map(|&c| i32::from(c as i8))
                .sum();
            write_u16(block, SUMS_AT + 2 * group, sum as i16 as u16);
        }
        write_u32(block, D_AT, (1.0 / iscale).to_bits());
    }
}
