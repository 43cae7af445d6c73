//! AVX2 dot products of IQ2_XXS, IQ2_XS and IQ2_S with Q8_K activations, with the scalar
//! reference's results bit for bit (see [`super::avx2_iq`] for the shared kernel).
//!
//! A sub-block's 32 weights are its four grid points' coordinates (8, 25 or 43) with their
//! signs; the scale `2s + 1` covers 32 values in IQ2_XXS and 16 in IQ2_XS and IQ2_S; at the
//! end the formats' `¼·½`.

use std::arch::x86_64::*;

use super::avx2_common::{
    bits_to_byte_mask, even_signs_high7, even_signs_paired, sign_words_with_parities,
};
use super::avx2_iq::{inline_expansion, iq_dot, nibbles16, odd, opaque_load_32, IqAvx2};
use crate::quant::grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ2_LARGEST};
use crate::quant::int8::Int8Expand;
use crate::quant::iq2::{
    s_index, Iq2S, Iq2Xs, Iq2Xxs, D_AT, QS_AT, S_SCALES_AT, S_SIGNS_AT, XS_SCALES_AT,
};
use crate::quant::BlockFormat;

/// The largest grid coordinate.
const BIAS: i8 = IQ2_LARGEST as i8;

pub(super) struct Iq2XxsAvx2;
pub(super) struct Iq2XsAvx2;
pub(super) struct Iq2SAvx2;

/// Four grid points as one vector, the first in the low 64 bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn points(p: [u64; 4]) -> __m256i {
    _mm256_set_epi64x(p[3] as i64, p[2] as i64, p[1] as i64, p[0] as i64)
}

/// The grid points `grid` with signs `signs` (±1 per value), plus the bias.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn biased(grid: __m256i, signs: __m256i) -> __m256i {
    _mm256_add_epi8(_mm256_sign_epi8(grid, signs), _mm256_set1_epi8(BIAS))
}

/// The eight bytes at `block[at..at + 8]` as one little-endian word.
#[inline]
fn u64_at(block: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(*block[at..].first_chunk().expect("eight bytes"))
}

impl IqAvx2 for Iq2XxsAvx2 {
    const BYTES: usize = Iq2Xxs::BYTES;
    const BIAS: i8 = BIAS;
    const FACTOR: Option<f32> = Some(0.125);
    const SCALE_PER_32: bool = <Iq2Xxs as Int8Expand>::SCALE_PER_32;

    /// Each sub-block's sign word beside its parities.
    type Shared = [u64; 8];

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn shared(block: &[u8]) -> [u64; 8] {
        // The sign words are the odd 32-bit words of the sub-blocks' 64 bytes.
        let low = _mm256_castsi256_ps(opaque_load_32(&block[QS_AT..]));
        let high = _mm256_castsi256_ps(opaque_load_32(&block[QS_AT + 32..]));
        let words = _mm256_castps_si256(_mm256_shuffle_ps::<0b11_01_11_01>(low, high));
        sign_words_with_parities(words)
    }

    fn d_bits(block: &[u8]) -> u16 {
        u16::from_le_bytes([block[D_AT], block[D_AT + 1]])
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(block: &[u8]) -> __m256i {
        // Sub-block l's eight bytes as 64-bit lane l: its scale is the top nibble, and
        // `(top five bits) | 1` is 2s + 1.
        let low = _mm256_srli_epi64::<59>(opaque_load_32(&block[QS_AT..]));
        let high = _mm256_srli_epi64::<59>(opaque_load_32(&block[QS_AT + 32..]));
        // i16 lanes 0, 2, 4, 6 of each half: s0, s1, s4, s5 | s2, s3, s6, s7.
        let packed = _mm256_packus_epi32(low, high);
        let pairs = _mm256_or_si256(packed, _mm256_slli_epi32::<16>(packed));
        let ordered = _mm256_permute4x64_epi64::<0b11_01_10_00>(pairs);
        _mm256_or_si256(ordered, _mm256_set1_epi16(1))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn biased(block: &[u8], sign_words: &[u64; 8], ib: usize) -> __m256i {
        // SAFETY: the caller's contract; the features are this function's.
        unsafe { xxs_biased(block, sign_words, ib) }
    }
}

/// IQ2_XXS's [`IqAvx2::biased`], inlined always (not a target-feature function) for its
/// int8 expansion (see `inline_expansion!`; marking the method itself so slowed the row
/// kernels at 4 and 8 tokens by 4-10%).
#[inline(always)]
unsafe fn xxs_biased(block: &[u8], sign_words: &[u64; 8], ib: usize) -> __m256i {
    let at = QS_AT + 8 * ib;
    // SAFETY: callers enable AVX2 (every caller is a target-feature function).
    unsafe {
        let grid = points(std::array::from_fn(|l| {
            IQ2XXS_GRID[usize::from(block[at + l])]
        }));
        biased(grid, even_signs_paired(sign_words[ib]))
    }
}

inline_expansion!(expand_int8_xxs, Iq2XxsAvx2, xxs_biased);

impl IqAvx2 for Iq2XsAvx2 {
    const BYTES: usize = Iq2Xs::BYTES;
    const BIAS: i8 = BIAS;
    const FACTOR: Option<f32> = Some(0.125);
    const SCALE_PER_32: bool = <Iq2Xs as Int8Expand>::SCALE_PER_32;

    type Shared = ();

    unsafe fn shared(_block: &[u8]) {}

    fn d_bits(block: &[u8]) -> u16 {
        u16::from_le_bytes([block[D_AT], block[D_AT + 1]])
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(block: &[u8]) -> __m256i {
        odd(nibbles16(u64_at(block, XS_SCALES_AT)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn biased(block: &[u8], _shared: &(), ib: usize) -> __m256i {
        let words = u64_at(block, QS_AT + 8 * ib);
        let grid = points(std::array::from_fn(|l| {
            IQ2XS_GRID[((words >> (16 * l)) & 511) as usize]
        }));
        biased(grid, even_signs_high7(words))
    }
}

impl IqAvx2 for Iq2SAvx2 {
    const BYTES: usize = Iq2S::BYTES;
    const BIAS: i8 = BIAS;
    const FACTOR: Option<f32> = Some(0.125);
    const SCALE_PER_32: bool = <Iq2S as Int8Expand>::SCALE_PER_32;

    type Shared = ();

    unsafe fn shared(_block: &[u8]) {}

    fn d_bits(block: &[u8]) -> u16 {
        u16::from_le_bytes([block[D_AT], block[D_AT + 1]])
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(block: &[u8]) -> __m256i {
        odd(nibbles16(u64_at(block, S_SCALES_AT)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn biased(block: &[u8], _shared: &(), ib: usize) -> __m256i {
        let at = S_SIGNS_AT + 4 * ib;
        let bits = u32::from_le_bytes(*block[at..].first_chunk().expect("four sign bytes"));
        let signs = _mm256_or_si256(bits_to_byte_mask(bits), _mm256_set1_epi8(1));
        let grid = points(std::array::from_fn(|l| {
            IQ2S_GRID[s_index(block, 4 * ib + l)]
        }));
        biased(grid, signs)
    }
}

/// One weight row of format `F` against `N` Q8_K activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq2_dot<F: IqAvx2, const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    iq_dot::<F, N>(w, xs)
}
