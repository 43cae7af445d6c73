//! AVX2 dot products of IQ2_XXS, IQ2_XS and IQ2_S with Q8_K activations, with ggml's AVX2
//! kernels' results bit for bit.
//!
//! Per 32-value sub-block: the grid coordinates (unsigned) times the activation codes
//! with the weights' signs moved onto them (`sign_epi8`, wrapping as ggml's does), summed
//! in pairs of i16 lanes, times the scale `2s + 1` of each lane's 16 values, into eight i32
//! lanes (lane `m` always holding values `4m..4m + 4` of each sub-block, as in ggml). Per
//! super-block `acc = fma(d_w·d_x, lanes, acc)`; at the end `0.125·hsum(acc)` with ggml's
//! horizontal sum. Each sub-block's grid points, signs and scales are decoded once and
//! then used for all `N` activation rows.

use std::arch::x86_64::*;

use super::avx2_common::{
    bits_to_byte_mask, even_signs_and_scale, even_signs_high7, f16_at, f32_at, hsum_ggml,
};
use crate::quant::grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};
use crate::quant::iq2::{
    s_index, xxs_aux, Iq2S, Iq2Xs, Iq2Xxs, D_AT, QS_AT, S_SCALES_AT, S_SIGNS_AT, XS_SCALES_AT,
};
use crate::quant::kquants::q8_k::{CODES_AT, SUMS_AT};
use crate::quant::kquants::QK_K;
use crate::quant::BlockFormat;

const Q8K_BYTES: usize = SUMS_AT + 2 * QK_K / 16;

/// One decoded 32-value sub-block.
pub(super) struct SubBlock {
    /// The four groups' grid points: 32 unsigned coordinates.
    grid: __m256i,
    /// −1 where a value is negative, +1 elsewhere.
    signs: __m256i,
    /// The scale `2s + 1` in each of the 16 i16 lanes (lanes 0..8 cover values 0..16).
    scales: __m256i,
}

/// An IQ2 format as its AVX2 kernel sees it.
pub(super) trait Iq2Avx2 {
    const BYTES: usize;

    /// Sub-block `ib` (values `32ib..32ib + 32`) of `block`.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    unsafe fn sub_block(block: &[u8], ib: usize) -> SubBlock;
}

pub(super) struct Iq2XxsAvx2;
pub(super) struct Iq2XsAvx2;
pub(super) struct Iq2SAvx2;

/// Four grid points (or sign patterns) as one vector, the first in the low 64 bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn points(p: [u64; 4]) -> __m256i {
    _mm256_set_epi64x(p[3] as i64, p[2] as i64, p[1] as i64, p[0] as i64)
}

/// ±1 per value from four sign bytes (byte `l` for group `l`, bit `j` for value `j`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn sign_vector(bytes: [u8; 4]) -> __m256i {
    let negative = bits_to_byte_mask(u32::from_le_bytes(bytes));
    _mm256_or_si256(negative, _mm256_set1_epi8(1))
}

/// The scales of values 0..16 and 16..32 (`2s + 1` from the low and high nibble).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibble_scales(byte: u8) -> __m256i {
    let low = _mm_set1_epi16(2 * i16::from(byte & 0x0F) + 1);
    let high = _mm_set1_epi16(2 * i16::from(byte >> 4) + 1);
    _mm256_set_m128i(high, low)
}

impl Iq2Avx2 for Iq2XxsAvx2 {
    const BYTES: usize = Iq2Xxs::BYTES;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sub_block(block: &[u8], ib: usize) -> SubBlock {
        let at = QS_AT + 8 * ib;
        let (signs, scales) = even_signs_and_scale(xxs_aux(block, ib));
        SubBlock {
            grid: points(std::array::from_fn(|l| {
                IQ2XXS_GRID[usize::from(block[at + l])]
            })),
            signs,
            scales,
        }
    }
}

impl Iq2Avx2 for Iq2XsAvx2 {
    const BYTES: usize = Iq2Xs::BYTES;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sub_block(block: &[u8], ib: usize) -> SubBlock {
        let words = u64::from_le_bytes(
            *block[QS_AT + 8 * ib..]
                .first_chunk()
                .expect("four index words"),
        );
        SubBlock {
            grid: points(std::array::from_fn(|l| {
                IQ2XS_GRID[((words >> (16 * l)) & 511) as usize]
            })),
            signs: even_signs_high7(words),
            scales: nibble_scales(block[XS_SCALES_AT + ib]),
        }
    }
}

impl Iq2Avx2 for Iq2SAvx2 {
    const BYTES: usize = Iq2S::BYTES;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sub_block(block: &[u8], ib: usize) -> SubBlock {
        let signs: &[u8; 4] = block[S_SIGNS_AT + 4 * ib..]
            .first_chunk()
            .expect("four sign bytes");
        SubBlock {
            grid: points(std::array::from_fn(|l| {
                IQ2S_GRID[s_index(block, 4 * ib + l)]
            })),
            signs: sign_vector(*signs),
            scales: nibble_scales(block[S_SCALES_AT + ib]),
        }
    }
}

/// One weight row of format `F` against `N` Q8_K activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq2_dot<F: Iq2Avx2, const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    let blocks = w.len() / F::BYTES;
    for x in &xs {
        assert_eq!(x.len(), blocks * Q8K_BYTES, "activation row length");
    }
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, block) in w.chunks_exact(F::BYTES).enumerate() {
        let mut sumi = [_mm256_setzero_si256(); N];
        for ib in 0..QK_K / 32 {
            // SAFETY: this function's features are the ones `sub_block` needs.
            let sub = unsafe { F::sub_block(block, ib) };
            for (s, x) in sumi.iter_mut().zip(&xs) {
                // SAFETY: every activation row holds `blocks` whole Q8_K blocks (checked
                // above), so block `i`'s codes `32ib..32ib + 32` are in bounds; `loadu`
                // has no alignment requirement.
                let q8 = unsafe {
                    _mm256_loadu_si256(x.as_ptr().add(i * Q8K_BYTES + CODES_AT + 32 * ib).cast())
                };
                let pairs = _mm256_maddubs_epi16(sub.grid, _mm256_sign_epi8(q8, sub.signs));
                *s = _mm256_add_epi32(*s, _mm256_madd_epi16(pairs, sub.scales));
            }
        }
        let dw = f16_at(block, D_AT);
        for ((a, s), x) in acc.iter_mut().zip(sumi).zip(&xs) {
            let d = _mm256_set1_ps(dw * f32_at(x, i * Q8K_BYTES));
            *a = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), *a);
        }
    }
    acc.map(|a| 0.125 * hsum_ggml(a))
}
