//! AVX2 dot products of IQ3_XXS and IQ3_S with Q8_K activations, with the scalar
//! reference's results bit for bit (see [`super::avx2_iq`] for the shared kernel).
//!
//! A sub-block's 32 weights are its eight grid points' coordinates with their signs
//! (IQ3_XXS: 4..=62, signs from parity-completed 7-bit patterns; IQ3_S: 1..=15, every sign
//! stored); one scale `2s + 1` per sub-block; at the end IQ3_XXS's factor ¼.
//!
//! `GATHER` picks how a sub-block's eight grid points are loaded (see [`super::gather`]):
//! the same points, so the same bits.

use std::arch::x86_64::*;

use super::avx2_common::{bits_to_byte_mask, even_signs_paired, sign_words_with_parities};
use super::avx2_iq::{inline_expansion, iq_dot, nibble_bytes, odd, opaque_load_32, IqAvx2};
use super::gather::{gathered, inserted};
use crate::quant::grids::{IQ3S_GRID, IQ3S_LARGEST, IQ3XXS_GRID, IQ3XXS_LARGEST};
use crate::quant::int8::Int8Expand;
use crate::quant::iq3::{
    Iq3S, Iq3Xxs, S_HIGH_AT, S_INDICES_AT, S_SCALES_AT, S_SIGNS_AT, XXS_INDICES_AT, XXS_SCALES_AT,
};
use crate::quant::BlockFormat;

/// The eight bytes at `block[at..at + 8]` as one little-endian word.
#[inline]
fn u64_at(block: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(*block[at..].first_chunk().expect("eight index bytes"))
}

/// IQ3_XXS, its grid points gathered where `GATHER`.
pub(super) struct Xxs<const GATHER: bool = false>;

impl<const GATHER: bool> IqAvx2 for Xxs<GATHER> {
    const BYTES: usize = Iq3Xxs::BYTES;
    /// The largest grid coordinate.
    const BIAS: i8 = IQ3XXS_LARGEST as i8;
    const FACTOR: Option<f32> = Some(0.25);
    const SCALE_PER_32: bool = <Iq3Xxs as Int8Expand>::SCALE_PER_32;

    /// Each sub-block's sign word beside its parities.
    type Shared = [u64; 8];

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn shared(block: &[u8]) -> [u64; 8] {
        let words = opaque_load_32(&block[XXS_SCALES_AT..]);
        sign_words_with_parities(_mm256_permute4x64_epi64::<0b11_01_10_00>(words))
    }

    fn d_bits(block: &[u8]) -> u16 {
        u16::from_le_bytes([block[0], block[1]])
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(block: &[u8]) -> __m256i {
        // The top nibble of each sub-block's word of signs and scale, in both i16 halves
        // of its i32 lane: `(top five bits) | 1` is 2s + 1.
        let s = _mm256_srli_epi32::<27>(opaque_load_32(&block[XXS_SCALES_AT..]));
        let pairs = _mm256_or_si256(s, _mm256_slli_epi32::<16>(s));
        _mm256_or_si256(pairs, _mm256_set1_epi16(1))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn biased(block: &[u8], sign_words: &[u64; 8], ib: usize) -> __m256i {
        // Index bytes loaded one by one, not shifted out of a word: loads take the load
        // ports, shifts the ports the vector instructions need.
        let at = XXS_INDICES_AT + 8 * ib;
        let grid = if GATHER {
            let indices = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(u64_at(block, at) as i64));
            // SAFETY: byte indices into the 256 points; AVX2 is this function's.
            unsafe { gathered(&IQ3XXS_GRID, indices) }
        } else {
            inserted(
                &IQ3XXS_GRID,
                std::array::from_fn(|k| usize::from(block[at + k])),
            )
        };
        let signs = even_signs_paired(sign_words[ib]);
        _mm256_add_epi8(_mm256_sign_epi8(grid, signs), _mm256_set1_epi8(Self::BIAS))
    }
}

/// IQ3_S, its grid points gathered where `GATHER`.
pub(super) struct S<const GATHER: bool = false>;

impl<const GATHER: bool> IqAvx2 for S<GATHER> {
    const BYTES: usize = Iq3S::BYTES;
    /// The largest grid coordinate.
    const BIAS: i8 = IQ3S_LARGEST as i8;
    const FACTOR: Option<f32> = None;
    const SCALE_PER_32: bool = <Iq3S as Int8Expand>::SCALE_PER_32;

    type Shared = ();

    unsafe fn shared(_block: &[u8]) {}

    fn d_bits(block: &[u8]) -> u16 {
        u16::from_le_bytes([block[0], block[1]])
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(block: &[u8]) -> __m256i {
        let packed = u32::from_le_bytes(*block[S_SCALES_AT..].first_chunk().expect("scales"));
        // Sub-block ib's scale is nibble ib (low first); each one twice.
        let s = nibble_bytes(_mm_cvtsi32_si128(packed as i32));
        odd(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(s, s)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn biased(block: &[u8], _shared: &(), ib: usize) -> __m256i {
        // SAFETY: the caller's contract; the features are this function's.
        unsafe { s_biased::<GATHER>(block, &(), ib) }
    }
}

/// IQ3_S's [`IqAvx2::biased`], inlined always (not a target-feature function) for its
/// int8 expansion (see `inline_expansion!`).
#[inline(always)]
unsafe fn s_biased<const GATHER: bool>(block: &[u8], _shared: &(), ib: usize) -> __m256i {
    let q = u64_at(block, S_INDICES_AT + 8 * ib);
    let high = u64::from(block[S_HIGH_AT + ib]);
    let at = S_SIGNS_AT + 4 * ib;
    let bits = u32::from_le_bytes(*block[at..].first_chunk().expect("four sign bytes"));
    // SAFETY: callers enable AVX2 (every caller is a target-feature function).
    unsafe {
        // Index k: its low byte, and bit k of `high` as bit 8.
        let grid = if GATHER {
            let low = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(q as i64));
            let ninth = _mm256_sllv_epi32(
                _mm256_set1_epi32(high as i32),
                _mm256_setr_epi32(8, 7, 6, 5, 4, 3, 2, 1),
            );
            let indices = _mm256_or_si256(low, _mm256_and_si256(ninth, _mm256_set1_epi32(0x100)));
            // SAFETY: nine-bit indices into the 512 points.
            gathered(&IQ3S_GRID, indices)
        } else {
            inserted(
                &IQ3S_GRID,
                std::array::from_fn(|k| {
                    (((q >> (8 * k)) & 0xFF) | ((high << (8 - k)) & 0x100)) as usize
                }),
            )
        };
        // Negated where the sign bit is set: `(g ^ m) − m`.
        let negative = bits_to_byte_mask(bits);
        let signed = _mm256_sub_epi8(_mm256_xor_si256(grid, negative), negative);
        _mm256_add_epi8(signed, _mm256_set1_epi8(S::<GATHER>::BIAS))
    }
}

/// [`s_biased`] with the points inserted and gathered, for `inline_expansion!`.
#[inline(always)]
unsafe fn s_biased_inserted(block: &[u8], shared: &(), ib: usize) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe { s_biased::<false>(block, shared, ib) }
}
#[inline(always)]
unsafe fn s_biased_gathered(block: &[u8], shared: &(), ib: usize) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe { s_biased::<true>(block, shared, ib) }
}

inline_expansion!(expand_int8_s, S, s_biased_inserted);
inline_expansion!(expand_int8_s_gathered, S<true>, s_biased_gathered);

/// IQ3_XXS against `N` activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq3_xxs_dot<const GATHER: bool, const N: usize>(
    w: &[u8],
    xs: [&[u8]; N],
) -> [f32; N] {
    iq_dot::<Xxs<GATHER>, N>(w, xs)
}

/// IQ3_S against `N` activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq3_s_dot<const GATHER: bool, const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    iq_dot::<S<GATHER>, N>(w, xs)
}
