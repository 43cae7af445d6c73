//! The i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) as small integers:
//! every value of a 256-value super-block is exactly `d · FACTOR · scale · v`, with `d` the
//! block's f16, `scale` an odd integer per 16 values (at most 31) and `v` an integer of at
//! most [`MAX_MAGNITUDE`] (a signed grid coordinate; for IQ1 eight times the ternary
//! coordinate plus the ±1 of its 1/8 shift).
//!
//! This is the one definition the i-quants' dot products are computed from (the scalar
//! reference, the AVX2 kernels and the prompt path, which expands rows to int8 codes once
//! and then runs an int8 matrix product over every token): per super-block the exact
//! integer `Σ scale · v · q8`, then one fused multiply-add by `d · d_x`, and `FACTOR` once
//! at the end, as ggml's generic code orders it. Since `FACTOR` is a power of two, where it
//! is applied does not change a bit.

use super::bits::read_u16;
use super::grids::{IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS};
use super::iq1::{Iq1Groups, Iq1M, Iq1S};
use super::iq2::{Iq2Format, Iq2S, Iq2Xs, Iq2Xxs, D_AT, GROUPS};
use super::iq3::{Iq3S, Iq3Xxs, SUB, S_SIGNS_AT, XXS_INDICES_AT};
use super::kquants::QK_K;
use super::BlockFormat;

/// Values per scale.
pub(crate) const SCALE_VALUES: usize = 16;
/// Scales per super-block.
pub(crate) const SCALES: usize = QK_K / SCALE_VALUES;
/// The largest `|v|` any format gives (IQ3_XXS's largest coordinate): `v + 64` is a byte
/// below 128, whose products with an activation byte never saturate a pair sum of i16.
pub(crate) const MAX_MAGNITUDE: i32 = 62;
/// What a code adds to its value.
pub(crate) const CODE_OFFSET: i32 = 64;

/// One super-block as integers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Int8Block {
    /// The f16 bits of `d`.
    pub(crate) d_bits: u16,
    /// The odd scale of values `16s..16s + 16`.
    pub(crate) scales: [i8; SCALES],
    /// Values `8g..8g + 8` as bytes `v + 64` of word `g`, the first in the low byte: eight
    /// values are made at once in a word's bytes (no byte carries into the next: codes
    /// stay in 2..=126).
    pub(crate) codes: [u64; QK_K / 8],
}

impl Int8Block {
    /// Value `e`.
    pub(crate) fn value(&self, e: usize) -> i32 {
        i32::from((self.codes[e / 8] >> (8 * (e % 8))) as u8) - CODE_OFFSET
    }
}

impl Default for Int8Block {
    fn default() -> Self {
        Self {
            d_bits: 0,
            scales: [0; SCALES],
            codes: [0; QK_K / 8],
        }
    }
}

/// A format whose super-blocks expand to [`Int8Block`]s.
pub(crate) trait Int8Expand: BlockFormat {
    /// The power of two that completes `d · scale · v` to the value (ggml applies it to
    /// the finished sum).
    const FACTOR: f32;
    /// Whether each scale covers 32 values (`scales[2k] == scales[2k + 1]` always): the
    /// products then apply one scale per 32 values.
    const SCALE_PER_32: bool;

    /// Writes `block`'s integers into `out` (every field).
    fn expand(block: &[u8], out: &mut Int8Block);
}

const OFFSETS: u64 = 0x4040_4040_4040_4040;
const _: () = assert!(OFFSETS as u8 as i32 == CODE_OFFSET);

/// Byte `j` all ones where bit `j` of the index is set.
static BYTE_MASKS: [u64; 256] = byte_masks();

const fn byte_masks() -> [u64; 256] {
    let mut masks = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        let mut j = 0;
        while j < 8 {
            if i >> j & 1 == 1 {
                masks[i] |= 0xFF << (8 * j);
            }
            j += 1;
        }
        i += 1;
    }
    masks
}

/// Eight codes from unsigned magnitudes (bytes of `point`, at most [`MAX_MAGNITUDE`]) and
/// sign bits: `64 + m` or `64 − m` per byte, neither carrying nor borrowing.
#[inline]
fn signed_codes(point: u64, signs: u8) -> u64 {
    let negative = BYTE_MASKS[usize::from(signs)];
    (OFFSETS.wrapping_add(point) & !negative) | (OFFSETS.wrapping_sub(point) & negative)
}

/// The IQ2 formats: `(0.5 + s)/4 = (2s + 1)/8`.
fn expand_iq2<F: Iq2Format>(block: &[u8], out: &mut Int8Block) {
    out.d_bits = read_u16(block, D_AT);
    for g in 0..GROUPS {
        let group = F::group(block, g);
        // Groups are 8 values: two per scale (a scale covers 16 or 32 values).
        out.scales[g / 2] = 2 * group.scale as i8 + 1;
        out.codes[g] = signed_codes(group.point, group.signs);
    }
}

/// The IQ3 formats: one odd scale per 32 values (IQ3_XXS's `(0.5 + s)/2 = (2s + 1)/4`);
/// a grid point is four values, a sign byte eight.
fn expand_iq3(
    block: &[u8],
    out: &mut Int8Block,
    sub_block: impl Fn(usize) -> ([u32; 8], [u8; 4], u8),
) {
    out.d_bits = read_u16(block, 0);
    for ib in 0..QK_K / SUB {
        let (points, signs, s) = sub_block(ib);
        let scale = 2 * s as i8 + 1;
        out.scales[2 * ib] = scale;
        out.scales[2 * ib + 1] = scale;
        for k in 0..4 {
            let point = u64::from(points[2 * k]) | u64::from(points[2 * k + 1]) << 32;
            out.codes[4 * ib + k] = signed_codes(point, signs[k]);
        }
    }
}

/// The IQ1 formats: `ls · (c ± 1/8) = ls · (8c ± 1) / 8`.
fn expand_iq1<F: Iq1Groups>(block: &[u8], d_bits: u16, out: &mut Int8Block) {
    const ONES: u64 = 0x0101_0101_0101_0101;
    out.d_bits = d_bits;
    for g in 0..QK_K / 8 {
        let group = F::group(block, g);
        out.scales[g / 2] = group.ls as i8;
        // Coordinates −1, 0, 1 are bytes 0xFF, 0, 1: `c + 1` per byte without carries
        // (0xFF → 0x7F + 1 = 0x80, masked to 0), then `8(c + 1) + 56 ± 1`.
        let c_plus_one = ((group.point & 0x7F7F_7F7F_7F7F_7F7F) + ONES) & 0x0303_0303_0303_0303;
        let base = if group.minus { 55 * ONES } else { 57 * ONES };
        out.codes[g] = (c_plus_one << 3) + base;
    }
}

impl Int8Expand for Iq2Xxs {
    const FACTOR: f32 = 0.125;
    const SCALE_PER_32: bool = true;
    fn expand(block: &[u8], out: &mut Int8Block) {
        expand_iq2::<Self>(block, out);
    }
}

impl Int8Expand for Iq2Xs {
    const FACTOR: f32 = 0.125;
    const SCALE_PER_32: bool = false;
    fn expand(block: &[u8], out: &mut Int8Block) {
        expand_iq2::<Self>(block, out);
    }
}

impl Int8Expand for Iq2S {
    const FACTOR: f32 = 0.125;
    const SCALE_PER_32: bool = false;
    fn expand(block: &[u8], out: &mut Int8Block) {
        expand_iq2::<Self>(block, out);
    }
}

impl Int8Expand for Iq3Xxs {
    const FACTOR: f32 = 0.25;
    const SCALE_PER_32: bool = true;
    fn expand(block: &[u8], out: &mut Int8Block) {
        expand_iq3(block, out, |ib| {
            let aux = Iq3Xxs::signs_and_scale(block, ib);
            let points = std::array::from_fn(|k| {
                IQ3XXS_GRID[usize::from(block[XXS_INDICES_AT + 8 * ib + k])]
            });
            let signs = std::array::from_fn(|k| KSIGNS_IQ2XS[((aux >> (7 * k)) & 127) as usize]);
            (points, signs, (aux >> 28) as u8)
        });
    }
}

impl Int8Expand for Iq3S {
    const FACTOR: f32 = 1.0;
    const SCALE_PER_32: bool = true;
    fn expand(block: &[u8], out: &mut Int8Block) {
        expand_iq3(block, out, |ib| {
            let indices = Iq3S::indices(block, ib);
            let signs = *block[S_SIGNS_AT + 4 * ib..]
                .first_chunk()
                .expect("four sign bytes");
            (indices.map(|i| IQ3S_GRID[i]), signs, Iq3S::scale(block, ib))
        });
    }
}

impl Int8Expand for Iq1S {
    const FACTOR: f32 = 0.125;
    const SCALE_PER_32: bool = true;
    fn expand(block: &[u8], out: &mut Int8Block) {
        expand_iq1::<Self>(block, read_u16(block, 0), out);
    }
}

impl Int8Expand for Iq1M {
    const FACTOR: f32 = 0.125;
    const SCALE_PER_32: bool = false;
    fn expand(block: &[u8], out: &mut Int8Block) {
        expand_iq1::<Self>(block, Iq1M::d_bits(block), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::bits::f16_bits_to_f32;
    use rand::{Rng, SeedableRng};

    /// Random bytes are valid blocks (indices are masked to their grids); the f16 scale is
    /// set finite, from tiny subnormals to the largest half: at byte 0, or for IQ1_M
    /// (`spread`) as the top nibbles of its four scale words.
    fn random_block<F: Int8Expand>(
        rng: &mut rand::rngs::StdRng,
        i: usize,
        spread: bool,
    ) -> Vec<u8> {
        let mut block: Vec<u8> = (0..F::BYTES).map(|_| rng.random()).collect();
        let d = [0x0001u16, 0x03FF, 0x3C00, 0x7BFF, 0x2E66][i % 5] ^ (rng.random::<u16>() & 0x8000);
        if spread {
            let at = crate::quant::iq1::M_SCALES_AT;
            for k in 0..4 {
                let word = read_u16(&block, at + 2 * k) & 0x0FFF | ((d >> (4 * k)) & 0xF) << 12;
                block[at + 2 * k..at + 2 * k + 2].copy_from_slice(&word.to_le_bytes());
            }
        } else {
            block[..2].copy_from_slice(&d.to_le_bytes());
        }
        block
    }

    fn check<F: Int8Expand>(spread: bool) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x1A78);
        let mut values = [0f32; QK_K];
        let mut expanded = Int8Block::default();
        let mut pairs_differ = false;
        for i in 0..300 {
            let block = random_block::<F>(&mut rng, i, spread);
            F::dequantize_block(&block, &mut values);
            F::expand(&block, &mut expanded);
            let pairs = expanded.scales.chunks_exact(2);
            pairs_differ |= pairs.clone().any(|pair| pair[0] != pair[1]);
            if F::SCALE_PER_32 {
                assert!(
                    pairs.into_iter().all(|pair| pair[0] == pair[1]),
                    "block {i}"
                );
            }
            let d = f64::from(f16_bits_to_f32(expanded.d_bits));
            for (e, &y) in values.iter().enumerate() {
                let v = expanded.value(e);
                let scale = expanded.scales[e / SCALE_VALUES];
                assert!(v.abs() <= MAX_MAGNITUDE, "value {v}");
                assert!(scale > 0 && scale % 2 == 1 && scale <= 31, "scale {scale}");
                let want = d * f64::from(F::FACTOR) * f64::from(scale) * f64::from(v);
                assert_eq!(f64::from(y), want, "block {i} value {e}");
            }
        }
        // A format whose scales are per 16 says so (its products are the general ones).
        assert_eq!(pairs_differ, !F::SCALE_PER_32);
    }

    #[test]
    fn integers_reproduce_the_dequantized_values_exactly() {
        check::<Iq2Xxs>(false);
        check::<Iq2Xs>(false);
        check::<Iq2S>(false);
        check::<Iq3Xxs>(false);
        check::<Iq3S>(false);
        check::<Iq1S>(false);
        check::<Iq1M>(true);
    }
}
