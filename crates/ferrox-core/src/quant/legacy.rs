//! The original 32-value formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q8_1.
//!
//! The 4- and 5-bit ones differ only in two switches, so they share one implementation:
//! whether codes are 4 or 5 bits (the fifth bits live in a 32-bit mask), and whether the
//! block stores a minimum (`_1`: value = code·d + m) or is symmetric around the middle
//! code (`_0`: value = (code − 2^(bits−1))·d). Layout, in order: f16 d, [f16 m],
//! [u32 high-bit mask], 16 bytes of nibbles.

use super::bits::{
    inverse_or_zero, pack_nibbles, read_f16, read_u32, signed_absmax, unpack_nibbles, write_f16,
    write_u32,
};
use super::{BlockFormat, QuantizeBlock};

const QK: usize = 32;

pub(crate) struct LowBitBlock<const BITS: u32, const WITH_MIN: bool>;

// ggml's names, so the dispatch table reads like the format list.
#[allow(non_camel_case_types)]
pub(crate) type Q4_0 = LowBitBlock<4, false>;
#[allow(non_camel_case_types)]
pub(crate) type Q4_1 = LowBitBlock<4, true>;
#[allow(non_camel_case_types)]
pub(crate) type Q5_0 = LowBitBlock<5, false>;
#[allow(non_camel_case_types)]
pub(crate) type Q5_1 = LowBitBlock<5, true>;

impl<const BITS: u32, const WITH_MIN: bool> LowBitBlock<BITS, WITH_MIN> {
    pub(crate) const MIN_AT: usize = 2;
    pub(crate) const HIGH_BITS_AT: usize = if WITH_MIN { 4 } else { 2 };
    pub(crate) const NIBBLES_AT: usize = Self::HIGH_BITS_AT + if BITS == 5 { 4 } else { 0 };
    const MAX_CODE: u8 = (1 << BITS) - 1;
    /// The code that decodes to zero in the symmetric (`_0`) variants.
    pub(crate) const MID_CODE: i32 = 1 << (BITS - 1);

    /// The raw codes of one block (0..2^BITS, before any offset).
    pub(crate) fn codes(block: &[u8]) -> [u8; QK] {
        let mut codes = [0u8; QK];
        unpack_nibbles(&block[Self::NIBBLES_AT..], &mut codes);
        if BITS == 5 {
            let high_bits = read_u32(block, Self::HIGH_BITS_AT);
            for (j, code) in codes.iter_mut().enumerate() {
                *code |= (((high_bits >> j) & 1) as u8) << 4;
            }
        }
        codes
    }
}

impl<const BITS: u32, const WITH_MIN: bool> BlockFormat for LowBitBlock<BITS, WITH_MIN> {
    const ELEMS: usize = QK;
    const BYTES: usize = Self::NIBBLES_AT + QK / 2;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = read_f16(block, 0);
        let codes = Self::codes(block);
        if WITH_MIN {
            let m = read_f16(block, Self::MIN_AT);
            for (y, &code) in out.iter_mut().zip(&codes) {
                *y = f32::from(code) * d + m;
            }
        } else {
            for (y, &code) in out.iter_mut().zip(&codes) {
                *y = (i32::from(code) - Self::MID_CODE) as f32 * d;
            }
        }
    }
}

impl<const BITS: u32, const WITH_MIN: bool> QuantizeBlock for LowBitBlock<BITS, WITH_MIN> {
    fn quantize_block(src: &[f32], block: &mut [u8]) {
        // Codes are trunc((x - origin)/d + bias): `_1` maps [min, max] onto [0, MAX_CODE];
        // `_0` gives the largest-magnitude value the extreme code -MID_CODE.
        let (d, origin, bias) = if WITH_MIN {
            let (min, max) = min_max(src);
            ((max - min) / f32::from(Self::MAX_CODE), min, 0.5f32)
        } else {
            let (_, max) = signed_absmax(src);
            (
                max / -(Self::MID_CODE as f32),
                0.0,
                Self::MID_CODE as f32 + 0.5,
            )
        };
        let id = inverse_or_zero(d);

        write_f16(block, 0, d);
        if WITH_MIN {
            write_f16(block, Self::MIN_AT, origin);
        }

        let mut codes = [0u8; QK];
        for (code, &x) in codes.iter_mut().zip(src) {
            // ggml truncates through int8_t and clamps only from above. The value lies in
            // [0, MAX_CODE + 1] here, where Rust's float-to-int cast truncates just like C's.
            let truncated = ((x - origin) * id + bias) as i8;
            *code = truncated.min(Self::MAX_CODE as i8) as u8;
        }
        pack_nibbles(&codes, &mut block[Self::NIBBLES_AT..]);
        if BITS == 5 {
            let high_bits = codes.iter().enumerate().fold(0u32, |mask, (j, &code)| {
                mask | (u32::from(code >> 4) & 1) << j
            });
            write_u32(block, Self::HIGH_BITS_AT, high_bits);
        }
    }
}

/// ggml's min/max scan (starting from ±FLT_MAX, so an all-NaN block stays at the extremes).
fn min_max(values: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in values {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// Q8_0 (f16 d, 32 × i8) and Q8_1, which adds f16 s = d·Σq after d for integer dot
/// products against offset formats. Dequantizing ignores s.
pub(crate) struct Q8Block<const WITH_SUM: bool>;

#[allow(non_camel_case_types)]
pub(crate) type Q8_0 = Q8Block<false>;
#[allow(non_camel_case_types)]
pub(crate) type Q8_1 = Q8Block<true>;

impl<const WITH_SUM: bool> Q8Block<WITH_SUM> {
    pub(crate) const SUM_AT: usize = 2;
    pub(crate) const CODES_AT: usize = if WITH_SUM { 4 } else { 2 };
}

impl<const WITH_SUM: bool> BlockFormat for Q8Block<WITH_SUM> {
    const ELEMS: usize = QK;
    const BYTES: usize = Self::CODES_AT + QK;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = read_f16(block, 0);
        for (y, &code) in out.iter_mut().zip(&block[Self::CODES_AT..]) {
            *y = f32::from(code as i8) * d;
        }
    }
}

impl<const WITH_SUM: bool> QuantizeBlock for Q8Block<WITH_SUM> {
    fn quantize_block(src: &[f32], block: &mut [u8]) {
        let amax = src
            .iter()
            .fold(0.0f32, |m, &x| if m > x.abs() { m } else { x.abs() });
        let d = amax / 127.0;
        let id = inverse_or_zero(d);
        write_f16(block, 0, d);

        let mut sum = 0i32;
        for (code, &x) in block[Self::CODES_AT..].iter_mut().zip(src) {
            let q = (x * id).round() as i8; // roundf: halves away from zero
            sum += i32::from(q);
            *code = q as u8;
        }
        if WITH_SUM {
            write_f16(block, Self::SUM_AT, sum as f32 * d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<B: QuantizeBlock>(src: &[f32]) -> Vec<f32> {
        let mut block = vec![0u8; B::BYTES];
        B::quantize_block(src, &mut block);
        let mut out = vec![0f32; B::ELEMS];
        B::dequantize_block(&block, &mut out);
        out
    }

    fn ramp() -> Vec<f32> {
        (0..QK).map(|i| (i as f32 - 13.0) * 0.37).collect()
    }

    /// Each format reproduces a ramp to within half a quantization step (plus f16 error).
    #[test]
    fn round_trip_error_is_within_half_a_step() {
        let src = ramp();
        let (lo, hi) = min_max(&src);
        let amax = lo.abs().max(hi.abs());
        let cases: [(Vec<f32>, f32); 6] = [
            (round_trip::<Q4_0>(&src), amax / 8.0),
            (round_trip::<Q4_1>(&src), (hi - lo) / 15.0),
            (round_trip::<Q5_0>(&src), amax / 16.0),
            (round_trip::<Q5_1>(&src), (hi - lo) / 31.0),
            (round_trip::<Q8_0>(&src), amax / 127.0),
            (round_trip::<Q8_1>(&src), amax / 127.0),
        ];
        for (i, (out, step)) in cases.iter().enumerate() {
            for (a, b) in src.iter().zip(out) {
                assert!(
                    (a - b).abs() <= 0.5 * step * 1.01 + 1e-3,
                    "case {i}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn q8_1_stores_the_scaled_code_sum() {
        let src = ramp();
        let mut block = [0u8; 36];
        Q8_1::quantize_block(&src, &mut block);
        let d = read_f16(&block, 0);
        let sum: i32 = block[4..].iter().map(|&b| i32::from(b as i8)).sum();
        let s = read_f16(&block, 2);
        assert!((s - sum as f32 * d).abs() <= (sum as f32 * d).abs() * 1e-3);
    }

    #[test]
    fn zero_block_encodes_to_zero_scale() {
        let mut block = [0xAAu8; 22];
        Q5_0::quantize_block(&[0.0; QK], &mut block);
        assert_eq!(read_f16(&block, 0), 0.0); // -0.0 in fact, as in ggml (0 / -16)
        let mut out = [1f32; QK];
        Q5_0::dequantize_block(&block, &mut out);
        assert!(out.iter().all(|&y| y == 0.0));
    }
}
