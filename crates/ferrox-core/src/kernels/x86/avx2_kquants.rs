//! AVX2 dot products of the 256-value formats (Q2_K..Q6_K, IQ4_XS) with Q8_K activations.
//!
//! Each weight super-block is decoded once into eight 32-value code vectors plus a scale
//! per 16 values; then, for each activation row, products are summed four adjacent bytes
//! per i32 lane (times their sub-block scale) over the whole super-block, and the eight
//! lanes are scaled into float accumulators. The way each format folds in its minimums
//! and the final horizontal sums follow ggml's AVX2 kernels, so results match theirs bit
//! for bit.

use std::arch::x86_64::*;

use super::avx2_common::{
    f16_at, f32_at, hsum4_ggml, hsum_ggml, load_32, pair_sums_signed, pair_sums_unsigned,
    scaled_quads, split_nibbles, zeros,
};
use super::avx2_legacy::iq4_levels;
use crate::kernels::dot_kquants::iq4_xs_scale;
use crate::quant::iq4::XS_NIBBLES_AT;
use crate::quant::kquants::{q2_k, q3_k, q4_q5_k, q6_k, q8_k};

const Q8K_BYTES: usize = 292;

/// A decoded weight super-block: codes in value order, one scale per 16 values.
pub(super) struct SuperBlock {
    codes: [__m256i; 8],
    scales: [i16; 16],
    /// Q2_K: one minimum per 16 values; Q4_K/Q5_K: one per 32 in `mins[..8]`.
    mins: [i16; 16],
    d: f32,
    dmin: f32,
}

/// How ggml's AVX2 kernel for a format folds the activation group sums into the result.
#[derive(PartialEq, Eq)]
pub(super) enum GroupSumTerm {
    None,
    /// Q2_K: per-16 minimums times group sums, eight lanes, FMA'd into the main
    /// accumulator (scaled by −d₈·dmin) before the block's codes.
    MinsIntoAccumulator,
    /// Q4_K: per-32 minimums, four lanes, in a separate four-lane accumulator.
    MinsIntoSideLanes,
    /// Q5_K: per-32 minimums summed to one integer, in a scalar FMA accumulator.
    MinsIntoScalar,
    /// Q6_K: codes are stored +32; subtract 32·scale·group sum per lane pair.
    Offset32,
}

/// A 256-value weight format, as its AVX2 kernel sees it.
pub(super) trait SuperBlockAvx2 {
    const BYTES: usize;
    /// Whether the decoded codes are signed (otherwise unsigned, below 64).
    const SIGNED: bool;
    const GROUP_SUMS: GroupSumTerm;

    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    unsafe fn decode(block: &[u8]) -> SuperBlock;
}

pub(super) struct Q2KAvx2;
pub(super) struct Q3KAvx2;
pub(super) struct Q4KAvx2;
pub(super) struct Q5KAvx2;
pub(super) struct Q6KAvx2;
pub(super) struct Iq4XsAvx2;

/// Bits `shift..shift+width` of every byte.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn byte_field(v: __m256i, shift: i32, mask: i8) -> __m256i {
    let shifted = _mm256_srl_epi16(v, _mm_cvtsi32_si128(shift));
    _mm256_and_si256(shifted, _mm256_set1_epi8(mask))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn empty_block() -> SuperBlock {
    SuperBlock {
        codes: [_mm256_setzero_si256(); 8],
        scales: [0; 16],
        mins: [0; 16],
        d: 0.0,
        dmin: 0.0,
    }
}

/// Q2_K and Q3_K keep 2-bit codes four to a byte: chunk `4j + k` (values `128j + 32k..`)
/// is bits `2k..2k+2` of bytes `32j..32j+32`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn two_bit_codes(packed: &[u8], codes: &mut [__m256i; 8]) {
    for half in 0..2 {
        let bits = load_32(&packed[32 * half..]);
        for k in 0..4 {
            codes[4 * half + k] = byte_field(bits, 2 * k as i32, 3);
        }
    }
}

impl SuperBlockAvx2 for Q2KAvx2 {
    const BYTES: usize = 84;
    const SIGNED: bool = false;
    const GROUP_SUMS: GroupSumTerm = GroupSumTerm::MinsIntoAccumulator;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(block: &[u8]) -> SuperBlock {
        let mut sb = empty_block();
        two_bit_codes(&block[q2_k::CODES_AT..], &mut sb.codes);
        for (j, &packed) in block[q2_k::SCALES_AT..q2_k::CODES_AT].iter().enumerate() {
            sb.scales[j] = i16::from(packed & 0x0F);
            sb.mins[j] = i16::from(packed >> 4);
        }
        sb.d = f16_at(block, q2_k::D_AT);
        sb.dmin = f16_at(block, q2_k::DMIN_AT);
        sb
    }
}

impl SuperBlockAvx2 for Q3KAvx2 {
    const BYTES: usize = 110;
    const SIGNED: bool = true;
    const GROUP_SUMS: GroupSumTerm = GroupSumTerm::None;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(block: &[u8]) -> SuperBlock {
        let mut sb = empty_block();
        two_bit_codes(&block[q3_k::CODES_AT..], &mut sb.codes);
        // Chunk c's high bits are bit c of the 32 mask bytes; a clear bit means −4.
        let hmask = load_32(&block[q3_k::HMASK_AT..]);
        for (c, code) in sb.codes.iter_mut().enumerate() {
            let high = _mm256_slli_epi16::<2>(byte_field(hmask, c as i32, 1));
            *code = _mm256_sub_epi8(_mm256_or_si256(*code, high), _mm256_set1_epi8(4));
        }
        let packed = &block[q3_k::SCALES_AT..q3_k::D_AT];
        for (s, code) in sb.scales.iter_mut().zip(q3k_offset_scales(packed)) {
            *s = i16::from(code) - 32;
        }
        sb.d = f16_at(block, q3_k::D_AT);
        sb
    }
}

/// Q3_K's sixteen 6-bit scales (still offset by 32), unpacked four at a time: the low
/// nibbles of bytes 0..8 hold scales 0..8, their high nibbles scales 8..16, and bytes
/// 8..12 the top two bits, scale `j` at bits `2·(j / 4)` of byte `8 + j % 4`.
fn q3k_offset_scales(packed: &[u8]) -> [u8; 16] {
    let word =
        |i: usize| u32::from_le_bytes([packed[i], packed[i + 1], packed[i + 2], packed[i + 3]]);
    let (low, mid, top) = (word(0), word(4), word(8));
    let quad = |nibbles: u32, top_shift: u32| {
        ((nibbles & 0x0F0F_0F0F) | (((top >> top_shift) & 0x0303_0303) << 4)).to_le_bytes()
    };
    let quads = [
        quad(low, 0),
        quad(mid, 2),
        quad(low >> 4, 4),
        quad(mid >> 4, 6),
    ];
    std::array::from_fn(|j| quads[j / 4][j % 4])
}

/// Q4_K/Q5_K: eight 6-bit scales and minimums, one per 32 values, unpacked as ggml does:
/// all eight at once in three 32-bit words (the values of [`scale_min_k4`]), which keeps
/// this small enough to inline.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn affine_k_header(block: &[u8]) -> SuperBlock {
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const LOW2: u32 = 0x0303_0303;
    let mut sb = empty_block();
    let word = |i: usize| {
        let at = q4_q5_k::SCALES_AT + 4 * i;
        u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]])
    };
    let (u0, u1, u2) = (word(0), word(1), word(2));
    // Sub-blocks 0-3 keep their low six bits in bytes 0-3 (scales) and 4-7 (minimums);
    // 4-7 take their low four bits from bytes 8-11 and their top two from bits 6-7 of 0-7.
    let scales = u64::from(u0 & LOW6) | (u64::from((u2 & LOW4) | (((u0 >> 6) & LOW2) << 4)) << 32);
    let mins =
        u64::from(u1 & LOW6) | (u64::from(((u2 >> 4) & LOW4) | (((u1 >> 6) & LOW2) << 4)) << 32);
    for j in 0..8 {
        let scale = ((scales >> (8 * j)) & 0xFF) as i16;
        sb.scales[2 * j] = scale;
        sb.scales[2 * j + 1] = scale;
        sb.mins[j] = ((mins >> (8 * j)) & 0xFF) as i16;
    }
    sb.d = f16_at(block, q4_q5_k::D_AT);
    sb.dmin = f16_at(block, q4_q5_k::DMIN_AT);
    sb
}

/// Q4_K/Q5_K's low four bits: chunks `2j` and `2j+1` are the low and high nibbles of
/// bytes `32j..32j+32`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibble_codes(nibbles: &[u8], codes: &mut [__m256i; 8]) {
    for j in 0..4 {
        let bytes = load_32(&nibbles[32 * j..]);
        codes[2 * j] = byte_field(bytes, 0, 0x0F);
        codes[2 * j + 1] = byte_field(bytes, 4, 0x0F);
    }
}

impl SuperBlockAvx2 for Q4KAvx2 {
    const BYTES: usize = 144;
    const SIGNED: bool = false;
    const GROUP_SUMS: GroupSumTerm = GroupSumTerm::MinsIntoSideLanes;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(block: &[u8]) -> SuperBlock {
        let mut sb = affine_k_header(block);
        nibble_codes(&block[q4_q5_k::HIGH_BITS_AT..], &mut sb.codes);
        sb
    }
}

impl SuperBlockAvx2 for Q5KAvx2 {
    const BYTES: usize = 176;
    const SIGNED: bool = false;
    const GROUP_SUMS: GroupSumTerm = GroupSumTerm::MinsIntoScalar;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(block: &[u8]) -> SuperBlock {
        let mut sb = affine_k_header(block);
        nibble_codes(&block[q4_q5_k::HIGH_BITS_AT + 32..], &mut sb.codes);
        // Chunk c's fifth bits are bit c of the 32 high-bit bytes.
        let high_bits = load_32(&block[q4_q5_k::HIGH_BITS_AT..]);
        for (c, code) in sb.codes.iter_mut().enumerate() {
            let fifth = _mm256_slli_epi16::<4>(byte_field(high_bits, c as i32, 1));
            *code = _mm256_or_si256(*code, fifth);
        }
        sb
    }
}

impl SuperBlockAvx2 for Q6KAvx2 {
    const BYTES: usize = 210;
    const SIGNED: bool = false;
    const GROUP_SUMS: GroupSumTerm = GroupSumTerm::Offset32;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(block: &[u8]) -> SuperBlock {
        let mut sb = empty_block();
        // Half h: quarter k takes nibble k/2 of low bytes 64h + 32(k%2).. and bits 2k..2k+2
        // of high bytes 32h.. (see `quant::kquants::q6_k`).
        for half in 0..2 {
            let low = [
                load_32(&block[q6_k::LOW_AT + 64 * half..]),
                load_32(&block[q6_k::LOW_AT + 64 * half + 32..]),
            ];
            let high = load_32(&block[q6_k::HIGH_AT + 32 * half..]);
            for k in 0..4 {
                let low4 = byte_field(low[k % 2], 4 * (k / 2) as i32, 0x0F);
                let high2 = _mm256_slli_epi16::<4>(byte_field(high, 2 * k as i32, 3));
                sb.codes[4 * half + k] = _mm256_or_si256(low4, high2);
            }
        }
        for (s, &b) in sb
            .scales
            .iter_mut()
            .zip(&block[q6_k::SCALES_AT..q6_k::D_AT])
        {
            *s = i16::from(b as i8);
        }
        sb.d = f16_at(block, q6_k::D_AT);
        sb
    }
}

impl SuperBlockAvx2 for Iq4XsAvx2 {
    const BYTES: usize = 136;
    const SIGNED: bool = true;
    const GROUP_SUMS: GroupSumTerm = GroupSumTerm::None;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(block: &[u8]) -> SuperBlock {
        let mut sb = empty_block();
        for (ib, code) in sb.codes.iter_mut().enumerate() {
            *code = iq4_levels(split_nibbles(&block[XS_NIBBLES_AT + 16 * ib..]));
            let scale = iq4_xs_scale(block, ib) as i16;
            sb.scales[2 * ib] = scale;
            sb.scales[2 * ib + 1] = scale;
        }
        sb.d = f16_at(block, 0);
        sb
    }
}

/// For each 32-value chunk `c`, its two 16-value scales as 16 x i16: `scales[2c]` in the
/// low half, `scales[2c + 1]` in the high half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn chunk_scales(scales: &[i16; 16]) -> [__m256i; 8] {
    // Broadcast the pair as one i32, then pick its first i16 in the low half and its second
    // in the high half.
    let pick = _mm256_setr_epi8(
        0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, //
        2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
    );
    std::array::from_fn(|c| {
        let pair = (scales[2 * c] as u16 as u32) | ((scales[2 * c + 1] as u16 as u32) << 16);
        _mm256_shuffle_epi8(_mm256_set1_epi32(pair as i32), pick)
    })
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn i16x16(v: &[i16; 16]) -> __m256i {
    _mm256_setr_epi16(
        v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11], v[12], v[13],
        v[14], v[15],
    )
}

/// Four i32 lanes `mins[2k]·(g[4k]+g[4k+1]) + mins[2k+1]·(g[4k+2]+g[4k+3])` from the 16
/// group sums `g` and the eight per-32 minimums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn per_32_min_lanes(mins: &[i16; 16], group_sums: __m256i) -> __m128i {
    let pair_sums = _mm_hadd_epi16(
        _mm256_castsi256_si128(group_sums),
        _mm256_extracti128_si256::<1>(group_sums),
    );
    let mins = _mm_setr_epi16(
        mins[0], mins[1], mins[2], mins[3], mins[4], mins[5], mins[6], mins[7],
    );
    _mm_madd_epi16(mins, pair_sums)
}

/// One weight row of format `S` against `N` Q8_K activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn super_block_dot<S: SuperBlockAvx2, const N: usize>(
    w: &[u8],
    xs: [&[u8]; N],
) -> [f32; N] {
    crate::kernels::x86::align_frame!();
    let blocks = w.len() / S::BYTES;
    for x in &xs {
        assert_eq!(x.len(), blocks * Q8K_BYTES, "activation row length");
    }
    let mut acc = zeros::<N>();
    let mut side = [_mm_setzero_ps(); N];
    let mut scalar = [0.0f32; N];
    for (ib, wb) in w.chunks_exact(S::BYTES).enumerate() {
        // SAFETY: this function runs with AVX2, FMA and F16C enabled.
        let sb = unsafe { S::decode(wb) };
        let scale_vectors = chunk_scales(&sb.scales);
        for t in 0..N {
            let q8 = &xs[t][ib * Q8K_BYTES..(ib + 1) * Q8K_BYTES];
            let d8 = f32_at(q8, q8_k::D_AT);
            let mut sums = _mm256_setzero_si256();
            for (c, &codes) in sb.codes.iter().enumerate() {
                let act = load_32(&q8[q8_k::CODES_AT + 32 * c..]);
                let pairs = if S::SIGNED {
                    pair_sums_signed(codes, act)
                } else {
                    pair_sums_unsigned(codes, act)
                };
                sums = _mm256_add_epi32(sums, scaled_quads(pairs, scale_vectors[c]));
            }
            let group_sums = load_32(&q8[q8_k::SUMS_AT..]);
            match S::GROUP_SUMS {
                GroupSumTerm::None => {}
                GroupSumTerm::MinsIntoAccumulator => {
                    let lanes = scaled_quads(i16x16(&sb.mins), group_sums);
                    let dmin = _mm256_set1_ps(-d8 * sb.dmin);
                    acc[t] = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(lanes), acc[t]);
                }
                GroupSumTerm::MinsIntoSideLanes => {
                    let lanes = per_32_min_lanes(&sb.mins, group_sums);
                    let dmin = _mm_set1_ps(-d8 * sb.dmin);
                    side[t] = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(lanes), side[t]);
                }
                GroupSumTerm::MinsIntoScalar => {
                    let lanes = per_32_min_lanes(&sb.mins, group_sums);
                    let total = _mm_cvtsi128_si32(_mm_hadd_epi32(
                        _mm_hadd_epi32(lanes, _mm_setzero_si128()),
                        _mm_setzero_si128(),
                    ));
                    scalar[t] = (-d8 * sb.dmin).mul_add(total as f32, scalar[t]);
                }
                GroupSumTerm::Offset32 => {
                    let offset = scaled_quads(group_sums, i16x16(&sb.scales));
                    sums = _mm256_sub_epi32(sums, _mm256_slli_epi32::<5>(offset));
                }
            }
            let d = _mm256_set1_ps(d8 * sb.d);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sums), acc[t]);
        }
    }
    std::array::from_fn(|t| {
        let sum = hsum_ggml(acc[t]);
        match S::GROUP_SUMS {
            GroupSumTerm::MinsIntoSideLanes => sum + hsum4_ggml(side[t]),
            GroupSumTerm::MinsIntoScalar => sum + scalar[t],
            _ => sum,
        }
    })
}
