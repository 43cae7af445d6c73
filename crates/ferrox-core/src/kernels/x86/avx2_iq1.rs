//! AVX2 dot products of IQ1_S and IQ1_M with Q8_K activations, with the scalar reference's
//! results bit for bit (see [`super::avx2_iq`] for the shared kernel).
//!
//! A value is `d·ls·(c + δ/8)` with a ternary grid coordinate `c` and a shift sign `δ`
//! (per 32 values in IQ1_S, per 8 in IQ1_M), so a sub-block's weights are the integers
//! `8c + δ` (grid and shift parts in one product) and the final factor is ⅛. The odd
//! scale `ls` covers 32 values in IQ1_S and 16 in IQ1_M.

use std::arch::x86_64::*;

use super::avx2_common::load_16;
use super::avx2_iq::{iq_dot, odd, IqAvx2};
use crate::quant::grids::{IQ1S_GRID, IQ1S_GRID_PLUS_1};
use crate::quant::int8::Int8Expand;
use crate::quant::iq1::{Iq1M, Iq1S, DELTA, M_HIGH_AT, M_SCALES_AT, S_HIGH_AT, S_INDICES_AT};
use crate::quant::BlockFormat;

/// The largest |8c + δ|.
const BIAS: i8 = 9;

/// The four grid points of one sub-block as a vector of 32 coordinates.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn points(indices: [usize; 4]) -> __m256i {
    let p = indices.map(|i| IQ1S_GRID[i] as i64);
    _mm256_set_epi64x(p[3], p[2], p[1], p[0])
}

/// `8c + δ + BIAS` from the coordinates `c` (−1, 0, 1) and `δ + BIAS` per value.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn biased(coordinates: __m256i, delta_plus_bias: __m256i) -> __m256i {
    _mm256_add_epi8(
        _mm256_sign_epi8(_mm256_set1_epi8(8), coordinates),
        delta_plus_bias,
    )
}

/// IQ1_S as its ternary grid plus one (0, 1, 2: unsigned, no signs to apply): a value
/// `8c + δ` is `8·(c + 1) + (δ − 8)`, so the products take the scales times 8 and the
/// activations' group sums the factor `ls·(δ − 8)`.
pub(super) struct S;

impl IqAvx2 for S {
    const BYTES: usize = Iq1S::BYTES;
    /// Bounds `c + 1`; the offset itself is `group_factors`'s.
    const BIAS: i8 = 2;
    const FACTOR: Option<f32> = Some(DELTA);
    const SCALE_PER_32: bool = <Iq1S as Int8Expand>::SCALE_PER_32;

    type Shared = ();

    unsafe fn shared(_block: &[u8]) {}

    fn d_bits(block: &[u8]) -> u16 {
        u16::from_le_bytes([block[0], block[1]])
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(block: &[u8]) -> __m256i {
        // Sub-block ib's word: its scale in bits 12..15 (the sign bit masked off).
        let high = load_16(&block[S_HIGH_AT..]);
        let ls = _mm_or_si128(
            _mm_and_si128(_mm_srli_epi16::<11>(high), _mm_set1_epi16(0x0E)),
            _mm_set1_epi16(1),
        );
        _mm256_set_m128i(_mm_unpackhi_epi16(ls, ls), _mm_unpacklo_epi16(ls, ls))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn product_scales(scales: __m256i) -> __m256i {
        _mm256_slli_epi16::<3>(scales)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group_factors(block: &[u8], scales: __m256i) -> __m256i {
        // Sub-block ib's shift sign is bit 15 of its word: δ − 8 = −7 + 2·(0 or −1).
        let minus = _mm_srai_epi16::<15>(load_16(&block[S_HIGH_AT..]));
        let shift = _mm_add_epi16(_mm_set1_epi16(-7), _mm_add_epi16(minus, minus));
        let per_16 = _mm256_set_m128i(
            _mm_unpackhi_epi16(shift, shift),
            _mm_unpacklo_epi16(shift, shift),
        );
        _mm256_mullo_epi16(scales, per_16)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn biased(block: &[u8], _shared: &(), ib: usize) -> __m256i {
        let high = Iq1S::high(block, ib);
        let low = u32::from_le_bytes(
            *block[S_INDICES_AT + 4 * ib..]
                .first_chunk()
                .expect("four index bytes"),
        );
        let indices: [usize; 4] = std::array::from_fn(|l| {
            ((low >> (8 * l)) & 0xFF) as usize | (usize::from((high >> (3 * l)) & 7) << 8)
        });
        let p = indices.map(|i| IQ1S_GRID_PLUS_1[i] as i64);
        _mm256_set_epi64x(p[3], p[2], p[1], p[0])
    }

    /// `8c + δ + 64` as `8·(c + 1) + 56 + δ`, δ −1 where bit 15 of sub-block `ib`'s word
    /// is set (bytes of at most 16 after the shift: nothing crosses into the next).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn int8_codes(block: &[u8], biased: __m256i, ib: usize) -> __m256i {
        let base = if Iq1S::high(block, ib) & 0x8000 != 0 {
            55
        } else {
            57
        };
        _mm256_add_epi8(_mm256_slli_epi16::<3>(biased), _mm256_set1_epi8(base))
    }
}

pub(super) struct M;

/// IQ1_M sub-block `ib`'s 16-bit word of high index bits and shift signs.
#[inline]
fn m_high(block: &[u8], ib: usize) -> u32 {
    u32::from(u16::from_le_bytes(
        *block[M_HIGH_AT + 2 * ib..]
            .first_chunk()
            .expect("two high bytes"),
    ))
}

/// IQ1_M sub-block `ib`'s `δ + BIAS` per value: each group of eight has its own shift sign.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn m_delta_plus_bias(block: &[u8], ib: usize) -> __m256i {
    let high = m_high(block, ib);
    // Each group's shift sign: bit 3 of its nibble (bits 3 and 7 of the two bytes).
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(high as i32),
        _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, //
            1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
        ),
    );
    let bit = _mm256_setr_epi64x(
        0x0808_0808_0808_0808,
        0x8080_8080_8080_8080u64 as i64,
        0x0808_0808_0808_0808,
        0x8080_8080_8080_8080u64 as i64,
    );
    let minus = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    // δ + 9: 8 where the shift is negative, 10 elsewhere.
    _mm256_blendv_epi8(_mm256_set1_epi8(10), _mm256_set1_epi8(8), minus)
}

impl IqAvx2 for M {
    const BYTES: usize = Iq1M::BYTES;
    const BIAS: i8 = BIAS;
    const FACTOR: Option<f32> = Some(DELTA);
    const SCALE_PER_32: bool = <Iq1M as Int8Expand>::SCALE_PER_32;

    type Shared = ();

    unsafe fn shared(_block: &[u8]) {}

    fn d_bits(block: &[u8]) -> u16 {
        Iq1M::d_bits(block)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(block: &[u8]) -> __m256i {
        let words = u64::from_le_bytes(*block[M_SCALES_AT..].first_chunk().expect("scales"));
        // Lane g takes word g / 4, whose bits 3k..3k + 3 (k = g % 4) hold its scale: a
        // multiply by 2^(13 − 3k) moves them to the top, where a shift picks them.
        let word = _mm256_shuffle_epi8(
            _mm256_set1_epi64x(words as i64),
            _mm256_setr_epi8(
                0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, //
                4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7,
            ),
        );
        let up = _mm256_set1_epi64x(0x0010_0080_0400_2000);
        odd(_mm256_srli_epi16::<13>(_mm256_mullo_epi16(word, up)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn biased(block: &[u8], _shared: &(), ib: usize) -> __m256i {
        let high = m_high(block, ib);
        let low = u32::from_le_bytes(*block[4 * ib..].first_chunk().expect("four index bytes"));
        // Group l: index bits 8..11 and shift sign in nibble l of `high`.
        let c = points(std::array::from_fn(|l| {
            ((low >> (8 * l)) & 0xFF) as usize | (((high >> (4 * l)) & 7) << 8) as usize
        }));
        biased(c, m_delta_plus_bias(block, ib))
    }
}

/// One IQ1_S weight row against `N` Q8_K activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq1_s_dot<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    iq_dot::<S, N>(w, xs)
}

/// One IQ1_M weight row against `N` Q8_K activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq1_m_dot<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    iq_dot::<M, N>(w, xs)
}
