//! MXFP4 (the OCP microscaling format gpt-oss and DeepSeek-V4 releases ship their experts
//! in): 32 values per block, each a 4-bit E2M1 code, sharing one E8M0 scale (a bare
//! power-of-two exponent). Layout: the exponent byte `e`, then 16 bytes of nibbles (value
//! `j` in the low nibble of byte `j`, value `j + 16` in its high nibble).
//!
//! As in ggml, the codes stand for twice their E2M1 value (integers, so the dot product
//! stays in integers) and the scale is halved to match: value = 2^(e − 128) · level.
//!
//! NVFP4 (NVIDIA's variant): 64 values per block in four sub-blocks of 16, each with its
//! own unsigned E4M3 scale. Layout: the four scale bytes, then four runs of 8 bytes of
//! nibbles (sub-block `s`, value `j` in the low nibble of byte `8s + j`, value `j + 8` in
//! its high nibble).

use super::bits::{pack_nibbles, unpack_nibbles};
use super::{BlockFormat, QuantizeBlock};

/// ggml's `kvalues_mxfp4`: the E2M1 values, doubled.
pub(crate) const LEVELS: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

const QK: usize = 32;

/// Half the E8M0 scale `e`: `2^(e − 128)`, with ggml's patterns for the two exponents
/// whose half is subnormal (`e` 255 gives 2^127, not NaN, as in ggml).
pub(crate) fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

pub(crate) struct Mxfp4;

impl BlockFormat for Mxfp4 {
    const ELEMS: usize = QK;
    const BYTES: usize = 1 + QK / 2;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = e8m0_half(block[0]);
        let mut codes = [0u8; QK];
        unpack_nibbles(&block[1..], &mut codes);
        for (y, &code) in out.iter_mut().zip(&codes) {
            *y = d * f32::from(LEVELS[usize::from(code)]);
        }
    }
}

/// The code whose level times `d` is nearest to `x`, the first on a tie (ggml's
/// `best_index_mxfp4`).
fn nearest_code(x: f32, d: f32) -> u8 {
    let mut best = 0;
    let mut best_err = (f32::from(LEVELS[0]) * d - x).abs();
    for (i, &level) in LEVELS.iter().enumerate().skip(1) {
        let err = (f32::from(level) * d - x).abs();
        if err < best_err {
            best = i;
            best_err = err;
        }
    }
    best as u8
}

impl QuantizeBlock for Mxfp4 {
    /// ggml's `quantize_row_mxfp4_ref`: the exponent puts the largest magnitude in the
    /// top binade of the levels (`floor(log2(amax)) − 2`), then each value takes its
    /// nearest level.
    fn quantize_block(src: &[f32], block: &mut [u8]) {
        let amax = src
            .iter()
            .fold(0.0f32, |m, &v| if m < v.abs() { v.abs() } else { m });
        let e = if amax > 0.0 {
            // ggml's C cast of the float to u8 as x86 compilers emit it: through an i32,
            // keeping the low byte (a block below 2^-125 wraps rather than clamps).
            (amax.log2().floor() - 2.0 + 127.0) as i32 as u8
        } else {
            0
        };
        block[0] = e;
        let d = e8m0_half(e);
        let codes: [u8; QK] = std::array::from_fn(|j| nearest_code(src[j], d));
        pack_nibbles(&codes, &mut block[1..]);
    }
}

const QK_NVFP4: usize = 64;
const NVFP4_SUB: usize = 16;
/// Scale bytes at the start of an NVFP4 block; the nibbles follow.
pub(crate) const NVFP4_SCALES: usize = QK_NVFP4 / NVFP4_SUB;

/// Half the unsigned E4M3 scale `x` (bias 7, subnormals below exponent 1), as ggml reads
/// it: bit 7 is ignored, and 0x7F (E4M3's NaN) reads as zero. Exact in f32. A table: the
/// row kernels read four per 64 values.
#[inline]
pub(crate) fn ue4m3_half(x: u8) -> f32 {
    UE4M3_HALF[usize::from(x)]
}

/// [`ue4m3_half`] of every byte.
static UE4M3_HALF: [f32; 256] = {
    let mut table = [0f32; 256];
    let mut x = 0;
    while x < 256 {
        let (exp, man) = ((x >> 3) & 0xF, (x & 7) as i32);
        table[x] = if x & 0x7F == 0 || x == 0x7F {
            0.0
        } else if exp == 0 {
            // man · 2⁻⁹, halved.
            man as f32 * pow2(-10)
        } else {
            // (1 + man/8) · 2^(exp − 7), halved.
            (8 + man) as f32 * pow2(exp as i32 - 11)
        };
        x += 1;
    }
    table
};

/// 2^e for a normal f32 exponent.
const fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// ggml's `ggml_fp32_to_ue4m3`: the nearest E4M3 scale for a positive `x`, rounding the
/// mantissa half up (by the first dropped bit), saturating at 448 (0x7E); zero, negatives
/// and NaN give 0.
pub(crate) fn to_ue4m3(x: f32) -> u8 {
    if x.is_nan() || x <= 0.0 {
        return 0;
    }
    let x = if x > 448.0 { 448.0 } else { x };
    let bits = x.to_bits();
    let exp = ((bits >> 23) & 0xFF) as i32 - 127 + 7;
    if exp <= 0 {
        // Subnormal: x·2⁹ rounded half up (truncating after adding a half, as C's cast).
        let man = (x * 512.0 + 0.5) as i32;
        return if man < 1 { 0 } else { man.min(7) as u8 };
    }
    let man = ((bits >> 20) & 7) + ((bits >> 19) & 1);
    let (exp, man) = if man > 7 { (exp + 1, 0) } else { (exp, man) };
    if exp >= 15 {
        return 0x7E;
    }
    ((exp as u32) << 3 | man) as u8
}

pub(crate) struct Nvfp4;

impl BlockFormat for Nvfp4 {
    const ELEMS: usize = QK_NVFP4;
    const BYTES: usize = NVFP4_SCALES + QK_NVFP4 / 2;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let nibbles = &block[NVFP4_SCALES..];
        for (s, values) in out.chunks_exact_mut(NVFP4_SUB).enumerate() {
            let d = ue4m3_half(block[s]);
            for (j, &byte) in nibbles[8 * s..8 * s + 8].iter().enumerate() {
                values[j] = f32::from(LEVELS[usize::from(byte & 0x0F)]) * d;
                values[j + 8] = f32::from(LEVELS[usize::from(byte >> 4)]) * d;
            }
        }
    }
}

impl QuantizeBlock for Nvfp4 {
    /// ggml's `quantize_row_nvfp4_ref`: per sub-block, the scale that maps the largest
    /// magnitude to the top level (amax / 6, to E4M3), then each value its nearest level
    /// under the rounded scale.
    fn quantize_block(src: &[f32], block: &mut [u8]) {
        let (scales, nibbles) = block.split_at_mut(NVFP4_SCALES);
        for (s, xs) in src.chunks_exact(NVFP4_SUB).enumerate() {
            let amax = xs
                .iter()
                .fold(0.0f32, |m, &v| if m < v.abs() { v.abs() } else { m });
            scales[s] = to_ue4m3(amax / 6.0);
            let d = ue4m3_half(scales[s]);
            for (j, byte) in nibbles[8 * s..8 * s + 8].iter_mut().enumerate() {
                *byte = nearest_code(xs[j], d) | (nearest_code(xs[j + 8], d) << 4);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table holds E4M3's definition, halved, for every byte.
    #[test]
    fn ue4m3_table_follows_the_definition() {
        for x in 0..=255u8 {
            let (exp, man) = (i32::from((x >> 3) & 0xF), f32::from(x & 7));
            let raw = if x == 0x7F {
                0.0
            } else if exp == 0 {
                man * 2f32.powi(-9)
            } else {
                (1.0 + man / 8.0) * 2f32.powi(exp - 7)
            };
            assert_eq!(ue4m3_half(x).to_bits(), (raw * 0.5).to_bits(), "{x:#x}");
        }
    }

    #[test]
    fn ue4m3_scales_round_trip() {
        assert_eq!(ue4m3_half(0x38), 0.5); // 1.0, halved
        assert_eq!(ue4m3_half(0x7E), 224.0);
        assert_eq!(ue4m3_half(0x7F), 0.0);
        assert_eq!(ue4m3_half(1), 2f32.powi(-10));
        // Exponent 15 saturates to 0x7E: ggml never writes 0x78..=0x7D.
        for x in 1..0x78u8 {
            assert_eq!(to_ue4m3(2.0 * ue4m3_half(x)), x, "{x:#x}");
        }
        assert_eq!(to_ue4m3(1e9), 0x7E);
        assert_eq!(to_ue4m3(f32::NAN), 0);
        assert_eq!(to_ue4m3(-1.0), 0);
    }

    #[test]
    fn half_scales_are_powers_of_two() {
        assert_eq!(e8m0_half(128), 1.0);
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(130), 4.0);
        assert_eq!(e8m0_half(1), 2f32.powi(-127));
        // Not `powi(-128)`: that may be computed as 1 / 2^128, which overflows to zero.
        assert_eq!(e8m0_half(0), 2f32.powi(-64) * 2f32.powi(-64));
        assert_eq!(e8m0_half(255), 2f32.powi(127));
    }

    #[test]
    fn round_trip_keeps_the_levels() {
        // Values on the grid come back exactly.
        let src: Vec<f32> = (0..QK).map(|j| f32::from(LEVELS[j % 16]) * 0.25).collect();
        let mut block = [0u8; Mxfp4::BYTES];
        Mxfp4::quantize_block(&src, &mut block);
        let mut out = [0f32; QK];
        Mxfp4::dequantize_block(&block, &mut out);
        assert_eq!(out.to_vec(), src);
        // An all-zero block has exponent 0 and decodes to zeros.
        Mxfp4::quantize_block(&[0.0; QK], &mut block);
        assert_eq!(block[0], 0);
        Mxfp4::dequantize_block(&block, &mut out);
        assert!(out.iter().all(|&v| v == 0.0));
    }
}
