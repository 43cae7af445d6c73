//! TQ2_0: ternary weights (−1, 0, +1 times one f16 scale per 256 values), as BitNet-style
//! models and `llama-quantize ... TQ2_0` store them. Layout: 64 bytes of 2-bit codes, then
//! the f16 `d`. Byte `32j + m` holds, in bit pair `l`, the code of value `128j + 32l + m`;
//! a code `c` (0, 1 or 2) stands for `c − 1`.

use super::bits::{read_f16, write_f16};
use super::kquants::QK_K;
use super::{BlockFormat, QuantizeBlock};

/// Bytes of codes in a block; the f16 scale follows them.
pub(crate) const TQ2_CODES: usize = QK_K / 4;

pub(crate) struct Tq2_0;

/// Value `e`'s code in a TQ2_0 block (0, 1 or 2; 3 does not occur in files ggml writes,
/// and stands for +2 as in ggml's kernels).
pub(crate) fn tq2_code(block: &[u8], e: usize) -> u8 {
    let (j, l, m) = (e / 128, (e % 128) / 32, e % 32);
    (block[32 * j + m] >> (2 * l)) & 3
}

impl BlockFormat for Tq2_0 {
    const ELEMS: usize = QK_K;
    const BYTES: usize = TQ2_CODES + 2;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = read_f16(block, TQ2_CODES);
        for (e, y) in out.iter_mut().enumerate() {
            *y = f32::from(tq2_code(block, e) as i8 - 1) * d;
        }
    }
}

impl QuantizeBlock for Tq2_0 {
    /// ggml's `quantize_row_tq2_0_ref`: `d` is the largest magnitude, each value rounds
    /// (half away from zero) to the nearest of −d, 0, d, computed with the unrounded `d`.
    fn quantize_block(src: &[f32], block: &mut [u8]) {
        let d = src.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        write_f16(block, TQ2_CODES, d);
        for (j, bytes) in block[..TQ2_CODES].chunks_exact_mut(32).enumerate() {
            for (m, byte) in bytes.iter_mut().enumerate() {
                *byte = (0..4).fold(0u8, |q, l| {
                    let x = src[128 * j + 32 * l + m];
                    let code = ((x * id).round() as i32 + 1) & 3;
                    q | ((code as u8) << (2 * l))
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ternary_values_come_back_exactly() {
        let src: Vec<f32> = (0..QK_K).map(|e| [0.5, 0.0, -0.5][e * 7 % 3]).collect();
        let mut block = [0u8; Tq2_0::BYTES];
        Tq2_0::quantize_block(&src, &mut block);
        let mut out = [0f32; QK_K];
        Tq2_0::dequantize_block(&block, &mut out);
        assert_eq!(out.to_vec(), src);
        assert!((0..QK_K).all(|e| tq2_code(&block, e) < 3));
    }
}
