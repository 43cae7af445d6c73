//! IQ4_NL and IQ4_XS: 4-bit codes indexing a fixed non-linear table of 16 levels.
//!
//! IQ4_NL is one 32-value block with an f16 scale (layout: f16 d, 16 bytes of nibbles).
//! IQ4_XS is a 256-value super-block of eight such sub-blocks whose 6-bit scales are
//! quantized against an f16 d (layout: f16 d, u16 of high scale bits, 4 bytes of low
//! scale nibbles, 128 bytes of nibbles), value = d·(ls − 32)·level.
//!
//! Quantization follows ggml's `quantize_iq4_nl` / `quantize_iq4_xs` without an importance
//! matrix, which is what `llama-quantize` writes. ggml's `quantize_row_iq4_nl_ref`, what its
//! CPU backend stores in an iq4_nl KV cache, picks codes in one pass without the search:
//! [`quantize_row_from_float`].

use super::bits::{
    inverse_or_zero, nearest_int, pack_nibbles, read_f16, read_u16, signed_absmax, unpack_nibbles,
    write_f16, write_u16,
};
use super::kquants::QK_K;
use super::{BlockFormat, QuantizeBlock};

/// ggml's `kvalues_iq4nl`.
pub(crate) const LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];
const SUB: usize = 32;
/// The scale search tries inverse scales (−127 ± t)/max for t in −7..=7.
const SCALE_TRIES: i32 = 7;
const GROUP_MAX_EPS: f32 = 1e-15;

fn level(code: u8) -> f32 {
    f32::from(LEVELS[usize::from(code & 0x0F)])
}

/// Decodes one 32-value sub-block of nibbles with the given scale.
fn dequantize_sub_block(scale: f32, nibbles: &[u8], out: &mut [f32]) {
    let mut codes = [0u8; SUB];
    unpack_nibbles(nibbles, &mut codes);
    for (y, &code) in out.iter_mut().zip(&codes) {
        *y = scale * level(code);
    }
}

/// Index of the table level nearest to `x`, preferring the upper one on a tie (ggml's
/// `best_index_int8`).
fn nearest_level(x: f32) -> u8 {
    let last = LEVELS.len() - 1;
    if x <= f32::from(LEVELS[0]) {
        return 0;
    }
    if x >= f32::from(LEVELS[last]) {
        return last as u8;
    }
    let (mut lo, mut hi) = (0, last);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < f32::from(LEVELS[mid]) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - f32::from(LEVELS[hi - 1]) < f32::from(LEVELS[hi]) - x {
        (hi - 1) as u8
    } else {
        hi as u8
    }
}

/// The sub-block scale minimizing the x²-weighted squared error, over the max-magnitude
/// guess and the `2·SCALE_TRIES + 1` grid around it; 0 for an all-zero sub-block.
fn fit_sub_block_scale(x: &[f32]) -> f32 {
    let (amax, max) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    // Weighted sums Σw·q·x and Σw·q² when every value takes its nearest level at `id`.
    let sums_for = |id: f32| {
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for &v in x {
            let q = level(nearest_level(id * v));
            let w = v * v;
            sumqx += w * q * v;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let first_level = f32::from(LEVELS[0]);
    let (sumqx, sumq2) = sums_for(1.0 / (-max / first_level));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for t in -SCALE_TRIES..=SCALE_TRIES {
        let id = (t + i32::from(LEVELS[0])) as f32 / max;
        let (sumqx, sumq2) = sums_for(id);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Nearest-level codes for a sub-block at inverse scale `id`, packed into 16 bytes.
fn quantize_sub_block(id: f32, x: &[f32], nibbles: &mut [u8]) {
    let codes: [u8; SUB] = std::array::from_fn(|j| nearest_level(id * x[j]));
    pack_nibbles(&codes, nibbles);
}

pub(crate) struct Iq4Nl;

impl BlockFormat for Iq4Nl {
    const ELEMS: usize = SUB;
    const BYTES: usize = 2 + SUB / 2;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        dequantize_sub_block(read_f16(block, 0), &block[2..], out);
    }
}

impl QuantizeBlock for Iq4Nl {
    fn quantize_block(src: &[f32], block: &mut [u8]) {
        let d = fit_sub_block_scale(src);
        write_f16(block, 0, d);
        // Codes are picked with the unrounded scale, as in ggml.
        quantize_sub_block(inverse_or_zero(d), src, &mut block[2..]);
    }
}

/// IQ4_NL as ggml-cpu's `from_float` writes it (`quantize_row_iq4_nl_ref`, what llama.cpp
/// stores in an iq4_nl KV cache): codes picked once at the inverse scale −127/max, no search,
/// then the x²-weighted least-squares scale for those codes. An all-zero block gets scale 0
/// (ggml leaves its codes uninitialized; any codes decode to zero there).
pub(crate) fn quantize_row_from_float(src: &[f32], out: &mut [u8]) {
    for (x, block) in src
        .chunks_exact(SUB)
        .zip(out.chunks_exact_mut(Iq4Nl::BYTES))
    {
        let (amax, max) = signed_absmax(x);
        if amax < GROUP_MAX_EPS {
            block.fill(0);
            continue;
        }
        let id = 1.0 / (max / f32::from(LEVELS[0]));
        let codes: [u8; SUB] = std::array::from_fn(|j| nearest_level(id * x[j]));
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for (&v, &code) in x.iter().zip(&codes) {
            let (q, w) = (level(code), v * v);
            sumqx += w * q * v;
            sumq2 += w * q * q;
        }
        write_f16(block, 0, if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 });
        pack_nibbles(&codes, &mut block[2..]);
    }
}

pub(crate) struct Iq4Xs;

pub(crate) const XS_SCALES_HIGH_AT: usize = 2;
pub(crate) const XS_SCALES_LOW_AT: usize = 4;
pub(crate) const XS_NIBBLES_AT: usize = 8;
const XS_SUBS: usize = QK_K / SUB;

impl Iq4Xs {
    /// Sub-block `ib`'s signed 6-bit scale (`−32..=31`).
    pub(crate) fn scale(block: &[u8], ib: usize) -> i32 {
        let low = (block[XS_SCALES_LOW_AT + ib / 2] >> (4 * (ib % 2))) & 0x0F;
        let high = ((read_u16(block, XS_SCALES_HIGH_AT) >> (2 * ib)) & 3) as u8;
        i32::from(low | (high << 4)) - 32
    }
}

impl BlockFormat for Iq4Xs {
    const ELEMS: usize = QK_K;
    const BYTES: usize = XS_NIBBLES_AT + QK_K / 2;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = read_f16(block, 0);
        for (ib, ys) in out.chunks_exact_mut(SUB).enumerate() {
            let ls = Self::scale(block, ib);
            let nibbles = &block[XS_NIBBLES_AT + ib * SUB / 2..];
            dequantize_sub_block(d * ls as f32, nibbles, ys);
        }
    }
}

impl QuantizeBlock for Iq4Xs {
    fn quantize_block(src: &[f32], block: &mut [u8]) {
        let scales: [f32; XS_SUBS] =
            std::array::from_fn(|ib| fit_sub_block_scale(&src[ib * SUB..(ib + 1) * SUB]));
        let (_, max_scale) = signed_absmax(&scales);
        // The super-block scale is negative when the largest sub-block scale is positive, so
        // that sub-block gets the extreme 6-bit scale −32. Codes use the unrounded d.
        let d = -max_scale / 32.0;
        write_f16(block, 0, d);
        let id = inverse_or_zero(d);

        let mut scales_high = 0u16;
        block[XS_SCALES_LOW_AT..XS_NIBBLES_AT].fill(0);
        for (ib, (x, &scale)) in src.chunks_exact(SUB).zip(&scales).enumerate() {
            let l = nearest_int(id * scale).clamp(-32, 31);
            let sub_scale = d * l as f32;
            let nibbles = &mut block[XS_NIBBLES_AT + ib * SUB / 2..];
            quantize_sub_block(inverse_or_zero(sub_scale), x, nibbles);

            let offset_scale = (l + 32) as u8;
            block[XS_SCALES_LOW_AT + ib / 2] |= (offset_scale & 0x0F) << (4 * (ib % 2));
            scales_high |= u16::from(offset_scale >> 4) << (2 * ib);
        }
        write_u16(block, XS_SCALES_HIGH_AT, scales_high);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_level_picks_the_closest_table_entry() {
        for code in 0..16u8 {
            assert_eq!(nearest_level(level(code)), code);
        }
        assert_eq!(nearest_level(-1000.0), 0);
        assert_eq!(nearest_level(1000.0), 15);
        assert_eq!(nearest_level(0.0), 8); // 1 is closer than -10
        assert_eq!(nearest_level(-4.5), 8); // tie between -10 and 1 goes up
        assert_eq!(nearest_level(-5.0), 7);
    }

    #[test]
    fn round_trip_error_is_bounded() {
        let src: Vec<f32> = (0..QK_K)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01)
            .collect();
        for (bytes, quantize, dequantize) in [
            (
                Iq4Xs::BYTES,
                Iq4Xs::quantize_block as fn(&[f32], &mut [u8]),
                Iq4Xs::dequantize_block as fn(&[u8], &mut [f32]),
            ),
            (Iq4Nl::BYTES, Iq4Nl::quantize_block, Iq4Nl::dequantize_block),
        ] {
            let elems = if bytes == Iq4Nl::BYTES { SUB } else { QK_K };
            let mut block = vec![0u8; bytes];
            quantize(&src[..elems], &mut block);
            let mut out = vec![0f32; elems];
            dequantize(&block, &mut out);
            for (a, b) in src.iter().zip(&out) {
                // The widest gap in the table is 24/127 of the range; half of it plus slack.
                assert!(
                    (a - b).abs() <= 0.5 * 0.5 * 24.0 / 113.0 + 0.01,
                    "{a} vs {b}"
                );
            }
        }
    }
}
