//! Scalar helpers shared by every block format: little-endian field access at arbitrary
//! byte offsets (blocks come from an mmap with no alignment guarantee), half-precision
//! conversions with ggml's exact rounding, ggml's `nearest_int`, and nibble packing.
//!
//! Callers index within a block whose length the row drivers in `quant/mod.rs` have
//! already checked, so the offsets used here are always in bounds.

use half::f16;

// One bounds check and one load each: read byte by byte, with a check per byte, the
// compiler can leave four loads and their shifts in a kernel's inner loop.
pub(crate) fn read_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(*bytes[at..].first_chunk().expect("two bytes"))
}

pub(crate) fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(*bytes[at..].first_chunk().expect("four bytes"))
}

pub(crate) fn read_f32(bytes: &[u8], at: usize) -> f32 {
    f32::from_bits(read_u32(bytes, at))
}

pub(crate) fn write_u16(bytes: &mut [u8], at: usize, value: u16) {
    bytes[at..at + 2].copy_from_slice(&value.to_le_bytes());
}

pub(crate) fn write_u32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

/// An IEEE half read as f32 (exact: every f16 is representable in f32).
pub(crate) fn read_f16(bytes: &[u8], at: usize) -> f32 {
    f16_bits_to_f32(read_u16(bytes, at))
}

/// Stores `value` rounded to f16 the way ggml does, and returns the stored value as f32,
/// since the quantizers continue with the rounded scale.
pub(crate) fn write_f16(bytes: &mut [u8], at: usize, value: f32) -> f32 {
    let bits = f32_to_f16_bits(value);
    write_u16(bytes, at, bits);
    f16_bits_to_f32(bits)
}

pub(crate) fn f16_bits_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// f32 -> f16 with round-to-nearest-even and overflow to infinity, like
/// `GGML_FP32_TO_FP16`. ggml turns every NaN into the canonical quiet NaN (keeping the sign),
/// whereas `half` keeps payload bits, so NaN is handled here.
pub(crate) fn f32_to_f16_bits(value: f32) -> u16 {
    if value.is_nan() {
        let sign = ((value.to_bits() >> 16) & 0x8000) as u16;
        return sign | 0x7E00;
    }
    f16::from_f32(value).to_bits()
}

pub(crate) fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// f32 -> bf16 like ggml's `ggml_compute_fp32_to_bf16`: NaN is forced quiet, everything
/// else rounds to nearest even (overflowing to infinity).
pub(crate) fn f32_to_bf16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    if bits & 0x7fff_ffff > 0x7f80_0000 {
        return ((bits >> 16) | 0x40) as u16;
    }
    let rounding_bias = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding_bias) >> 16) as u16
}

/// ggml's `nearest_int`: round half to even by adding 1.5 * 2^23, so the FPU's own
/// rounding does the work. Valid for |value| <= 4194303; like ggml's release builds we
/// do not check, and return the same (meaningless) value outside that range.
pub(crate) fn nearest_int(value: f32) -> i32 {
    let shifted = value + 12_582_912.0;
    ((shifted.to_bits() & 0x007f_ffff) as i32) - 0x0040_0000
}

/// `1/d`, or 0 for a zero scale (the "all zero" block convention used by every format).
pub(crate) fn inverse_or_zero(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// The largest magnitude in `values` and the signed value that has it (the first one on
/// ties), which the symmetric formats use to pick the sign of their scale.
pub(crate) fn signed_absmax(values: &[f32]) -> (f32, f32) {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in values {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

/// The 32-value nibble layout of Q4_0, IQ4_NL and friends: byte `j` holds value `j` in
/// its low nibble and value `j + 16` in its high nibble.
pub(crate) fn unpack_nibbles(packed: &[u8], codes: &mut [u8; 32]) {
    for (j, &byte) in packed[..16].iter().enumerate() {
        codes[j] = byte & 0x0F;
        codes[j + 16] = byte >> 4;
    }
}

/// Inverse of [`unpack_nibbles`]; only the low four bits of each code are kept.
pub(crate) fn pack_nibbles(codes: &[u8; 32], packed: &mut [u8]) {
    for (j, byte) in packed[..16].iter_mut().enumerate() {
        *byte = (codes[j] & 0x0F) | ((codes[j + 16] & 0x0F) << 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-2.6), -3);
        assert_eq!(nearest_int(4_194_303.0), 4_194_303);
        assert_eq!(nearest_int(-4_194_303.0), -4_194_303);
    }

    #[test]
    fn f16_rounding_matches_ggml() {
        assert_eq!(f32_to_f16_bits(1.0), 0x3C00);
        assert_eq!(f32_to_f16_bits(65504.0), 0x7BFF);
        assert_eq!(f32_to_f16_bits(65520.0), 0x7C00); // halfway to 2^16 rounds to inf
        assert_eq!(f32_to_f16_bits(-1e9), 0xFC00);
        assert_eq!(f32_to_f16_bits(f32::NAN), 0x7E00);
        assert_eq!(f32_to_f16_bits(-f32::NAN), 0xFE00);
        // 1 + 2^-11 is halfway between 1 and the next f16: ties go to even (1.0).
        assert_eq!(f32_to_f16_bits(1.0 + 2f32.powi(-11)), 0x3C00);
        assert_eq!(f32_to_f16_bits(2f32.powi(-24)), 0x0001);
        assert_eq!(f32_to_f16_bits(-0.0), 0x8000);
    }

    #[test]
    fn bf16_rounding_matches_ggml() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3F80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F80_8000)), 0x3F80); // tie to even
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F81_8000)), 0x3F82); // tie to even
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x7F80_0001)), 0x7FC0); // NaN made quiet
        assert_eq!(f32_to_bf16_bits(f32::MAX), 0x7F80);
        assert_eq!(bf16_bits_to_f32(0xC000), -2.0);
    }

    #[test]
    fn nibbles_round_trip() {
        let codes: [u8; 32] = std::array::from_fn(|i| (i % 16) as u8);
        let mut packed = [0u8; 16];
        pack_nibbles(&codes, &mut packed);
        let mut back = [0u8; 32];
        unpack_nibbles(&packed, &mut back);
        assert_eq!(codes, back);
    }
}
