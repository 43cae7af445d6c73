//! The ternary formats: weights −1, 0, +1 times one f16 scale per 256 values, as
//! BitNet-style models and `llama-quantize ... TQ1_0 / TQ2_0` store them.
//!
//! TQ2_0: 64 bytes of 2-bit codes, then the f16 `d`. Byte `32j + m` holds, in bit pair
//! `l`, the code of value `128j + 32l + m`; a code `c` (0, 1 or 2) stands for `c − 1`.
//!
//! TQ1_0 packs five codes per byte as a base-3 fraction (byte ≈ 256·Σ cₙ·3⁻⁽ⁿ⁺¹⁾, rounded
//! up), so code `n` is the top trit of `byte·3ⁿ mod 256`, read as `(that·3) >> 8`. Layout:
//! 48 bytes of five codes (byte `m` < 32 holds values `32n + m`; byte `32 + m` holds values
//! `160 + 16n + m`), 4 bytes of four codes (byte `j` holds values `240 + 4n + j`), then
//! the f16 `d`.

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
                    let code = lround(x * id).wrapping_add(1) & 3;
                    q | ((code as u8) << (2 * l))
                });
            }
        }
    }
}

/// Bytes of five-code groups in a TQ1_0 block.
pub(crate) const TQ1_QS: usize = (QK_K - 4 * QK_K / 64) / 5;
/// Bytes of four-code groups, after the five-code ones.
pub(crate) const TQ1_QH: usize = QK_K / 64;
/// Where TQ1_0's f16 scale sits.
pub(crate) const TQ1_D_AT: usize = TQ1_QS + TQ1_QH;

/// `3ⁿ`, as the 8-bit multipliers that bring trit `n` of a packed byte to the top.
pub(crate) const POW3: [u8; 5] = [1, 3, 9, 27, 81];

pub(crate) struct Tq1_0;

/// Trit `n` (0 = most significant) of a TQ1_0 byte: its code 0, 1 or 2.
pub(crate) fn tq1_trit(byte: u8, n: usize) -> u8 {
    let q = byte.wrapping_mul(POW3[n]);
    ((u16::from(q) * 3) >> 8) as u8
}

/// The 256 codes of a TQ1_0 block, in value order.
pub(crate) fn tq1_codes(block: &[u8]) -> [u8; QK_K] {
    let mut codes = [0u8; QK_K];
    for n in 0..5 {
        for m in 0..32 {
            codes[32 * n + m] = tq1_trit(block[m], n);
        }
        for m in 0..16 {
            codes[160 + 16 * n + m] = tq1_trit(block[32 + m], n);
        }
    }
    for n in 0..4 {
        for j in 0..TQ1_QH {
            codes[240 + 4 * n + j] = tq1_trit(block[TQ1_QS + j], n);
        }
    }
    codes
}

/// C's `lroundf` as x86-64 glibc computes it: half away from zero, and `LONG_MIN` for NaN
/// or values out of range (which the callers then wrap, as ggml's byte arithmetic does).
pub(crate) fn lround(x: f32) -> i64 {
    if x.abs() < 9.0e18 {
        x.round() as i64
    } else {
        i64::MIN
    }
}

impl BlockFormat for Tq1_0 {
    const ELEMS: usize = QK_K;
    const BYTES: usize = TQ1_D_AT + 2;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = read_f16(block, TQ1_D_AT);
        for (y, code) in out.iter_mut().zip(tq1_codes(block)) {
            *y = f32::from(code as i8 - 1) * d;
        }
    }
}

impl QuantizeBlock for Tq1_0 {
    /// ggml's `quantize_row_tq1_0_ref`: as TQ2_0 for the codes (with C's `MAX`, so a NaN
    /// is dropped by the next value), then each group of codes packed as base-3 digits,
    /// the first the most significant, and scaled to a byte by a ceiling division by 243.
    fn quantize_block(src: &[f32], block: &mut [u8]) {
        let d = src
            .iter()
            .fold(0.0f32, |m, &v| if m > v.abs() { m } else { v.abs() });
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        write_f16(block, TQ1_D_AT, d);
        let code = |x: f32| (lround(x * id) as u8).wrapping_add(1);
        let pack = |codes: &mut dyn Iterator<Item = u8>, extra_shift: bool| {
            let mut q = codes.fold(0u8, |q, c| q.wrapping_mul(3).wrapping_add(c));
            if extra_shift {
                q = q.wrapping_mul(3);
            }
            (u16::from(q) * 256).div_ceil(243) as u8
        };
        for m in 0..32 {
            block[m] = pack(&mut (0..5).map(|n| code(src[32 * n + m])), false);
        }
        for m in 0..16 {
            block[32 + m] = pack(&mut (0..5).map(|n| code(src[160 + 16 * n + m])), false);
        }
        for j in 0..TQ1_QH {
            let codes = &mut (0..4).map(|n| code(src[240 + 4 * n + j]));
            block[TQ1_QS + j] = pack(codes, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tq1_ternary_values_come_back_exactly() {
        let src: Vec<f32> = (0..QK_K).map(|e| [0.5, 0.0, -0.5][e * 7 % 3]).collect();
        let mut block = [0u8; Tq1_0::BYTES];
        Tq1_0::quantize_block(&src, &mut block);
        let mut out = [0f32; QK_K];
        Tq1_0::dequantize_block(&block, &mut out);
        assert_eq!(out.to_vec(), src);
    }

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
