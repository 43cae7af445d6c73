//! The K-quants: 256-value super-blocks split into sub-blocks of 16 or 32 values, each with
//! its own scale (and for Q2_K/Q4_K/Q5_K a minimum) quantized against one or two f16
//! super-block scales. Q8_K is the activation format the K-quant dot products pair with.

mod fit;
pub(crate) mod q2_k;
pub(crate) mod q3_k;
pub(crate) mod q4_q5_k;
pub(crate) mod q6_k;
pub(crate) mod q8_k;

pub(crate) use q2_k::Q2K;
pub(crate) use q3_k::Q3K;
pub(crate) use q4_q5_k::{Q4K, Q5K};
pub(crate) use q6_k::Q6K;
pub(crate) use q8_k::Q8K;

/// Values per super-block.
pub(crate) const QK_K: usize = 256;

/// Q2_K and Q3_K keep 2-bit codes in 64 bytes: within each 128-value half, byte `l` holds
/// values `l`, `l+32`, `l+64`, `l+96` in bits 0-1, 2-3, 4-5, 6-7.
pub(crate) fn unpack_two_bit_codes(packed: &[u8], codes: &mut [u8; QK_K]) {
    for (e, code) in codes.iter_mut().enumerate() {
        let byte = packed[(e / 128) * 32 + e % 32];
        let shift = 2 * ((e % 128) / 32);
        *code = (byte >> shift) & 3;
    }
}

/// Inverse of [`unpack_two_bit_codes`]; codes must be below 4.
pub(crate) fn pack_two_bit_codes(codes: &[u8; QK_K], packed: &mut [u8]) {
    for (half, out) in codes.chunks_exact(128).zip(packed.chunks_exact_mut(32)) {
        for (l, byte) in out.iter_mut().enumerate() {
            *byte = half[l] | (half[l + 32] << 2) | (half[l + 64] << 4) | (half[l + 96] << 6);
        }
    }
}

/// Q4_K/Q5_K's 12 bytes of eight 6-bit scales and eight 6-bit mins (ggml's
/// `get_scale_min_k4`): sub-blocks 0-3 use the low six bits of bytes 0-3 (scales) and 4-7
/// (mins); sub-blocks 4-7 put their low four bits in bytes 8-11 and their top two bits in
/// the spare high bits of bytes 0-7.
pub(crate) fn scale_min_k4(j: usize, packed: &[u8]) -> (u8, u8) {
    if j < 4 {
        (packed[j] & 63, packed[j + 4] & 63)
    } else {
        let scale = (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4);
        let min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
        (scale, min)
    }
}

/// Inverse of [`scale_min_k4`] for all eight sub-blocks; values must be below 64.
pub(crate) fn pack_scale_min_k4(scales: &[u8; 8], mins: &[u8; 8], packed: &mut [u8]) {
    for j in 0..4 {
        packed[j] = scales[j] | ((scales[j + 4] >> 4) << 6);
        packed[j + 4] = mins[j] | ((mins[j + 4] >> 4) << 6);
        packed[j + 8] = (scales[j + 4] & 0x0F) | ((mins[j + 4] & 0x0F) << 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn six_bit_scales_round_trip() {
        let scales: [u8; 8] = [0, 63, 17, 42, 63, 1, 32, 5];
        let mins: [u8; 8] = [63, 0, 9, 33, 48, 62, 15, 16];
        let mut packed = [0u8; 12];
        pack_scale_min_k4(&scales, &mins, &mut packed);
        for j in 0..8 {
            assert_eq!(
                scale_min_k4(j, &packed),
                (scales[j], mins[j]),
                "sub-block {j}"
            );
        }
    }

    #[test]
    fn two_bit_codes_round_trip() {
        let codes: [u8; QK_K] = std::array::from_fn(|e| ((e * 7 + e / 5) % 4) as u8);
        let mut packed = [0u8; 64];
        pack_two_bit_codes(&codes, &mut packed);
        let mut back = [0u8; QK_K];
        unpack_two_bit_codes(&packed, &mut back);
        assert_eq!(codes, back);
    }
}
