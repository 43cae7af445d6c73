//! AVX2 dot products of IQ3_XXS and IQ3_S with Q8_K activations, in ggml's AVX2 order:
//! per 32-value sub-block, the unsigned grid coordinates times the activations with the
//! weights' signs moved onto them (`maddubs`), times the odd scale into eight i32 lanes;
//! per super-block `sum = fma(d, lanes, sum)`, added up with ggml's horizontal sum.
//!
//! Each weight sub-block is decoded once (grid points, signs, scale) and then
//! serves all `N` activation rows.

use std::arch::x86_64::*;

use super::avx2_common::{bits_to_byte_mask, even_signs_and_scale, f16_at, f32_at, hsum_ggml};
use crate::quant::grids::{IQ3S_GRID, IQ3XXS_GRID};
use crate::quant::iq3::{Iq3S, Iq3Xxs, SUB, S_HIGH_AT, S_INDICES_AT, S_SIGNS_AT, XXS_INDICES_AT};
use crate::quant::kquants::q8_k::{CODES_AT, SUMS_AT};
use crate::quant::kquants::QK_K;
use crate::quant::BlockFormat;

const Q8K_BYTES: usize = SUMS_AT + 32;
const SUBS: usize = QK_K / SUB;

/// One decoded 32-value sub-block.
struct SubBlock {
    /// The eight groups' grid points: 32 unsigned coordinates.
    grid: __m256i,
    /// −1 where a value is negative, +1 elsewhere.
    signs: __m256i,
    /// The scale `2s + 1` in every i16 lane.
    scales: __m256i,
}

/// A 256-value i-quant with 3-bit grids, as its AVX2 kernel sees it.
trait Iq3Avx2 {
    const BYTES: usize;
    /// The final factor ggml applies to the horizontal sum (IQ3_XXS's ¼).
    const FINAL_SCALE: Option<f32>;

    /// Sub-block `ib` (values `32ib..32ib + 32`) of `block`.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    unsafe fn sub_block(block: &[u8], ib: usize) -> SubBlock;
}

/// Eight grid points, the first in the low 32 bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn points(p: [u32; 8]) -> __m256i {
    let p = p.map(|p| p as i32);
    _mm256_setr_epi32(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7])
}

/// The eight bytes at `block[at..at + 8]` as one little-endian word.
#[inline]
fn u64_at(block: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(*block[at..].first_chunk().expect("eight index bytes"))
}

struct Xxs;

impl Iq3Avx2 for Xxs {
    const BYTES: usize = Iq3Xxs::BYTES;
    const FINAL_SCALE: Option<f32> = Some(0.25);

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sub_block(block: &[u8], ib: usize) -> SubBlock {
        let q = u64_at(block, XXS_INDICES_AT + 8 * ib);
        let (signs, scales) = even_signs_and_scale(Iq3Xxs::signs_and_scale(block, ib));
        SubBlock {
            grid: points(std::array::from_fn(|k| {
                IQ3XXS_GRID[((q >> (8 * k)) & 0xFF) as usize]
            })),
            signs,
            scales,
        }
    }
}

struct S;

impl Iq3Avx2 for S {
    const BYTES: usize = Iq3S::BYTES;
    const FINAL_SCALE: Option<f32> = None;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sub_block(block: &[u8], ib: usize) -> SubBlock {
        let q = u64_at(block, S_INDICES_AT + 8 * ib);
        let high = u64::from(block[S_HIGH_AT + ib]);
        let at = S_SIGNS_AT + 4 * ib;
        let bits = u32::from_le_bytes(*block[at..].first_chunk().expect("four sign bytes"));
        SubBlock {
            // Index k: its low byte, and bit k of `high` as bit 8.
            grid: points(std::array::from_fn(|k| {
                IQ3S_GRID[(((q >> (8 * k)) & 0xFF) | ((high << (8 - k)) & 0x100)) as usize]
            })),
            // ±1 for `sign_epi8`: the same bits as ggml's negation `(q ^ m) − m`, wrapping
            // alike, with one instruction per activation row instead of two.
            signs: _mm256_or_si256(bits_to_byte_mask(bits), _mm256_set1_epi8(1)),
            scales: _mm256_set1_epi16(2 * i16::from(Iq3S::scale(block, ib)) + 1),
        }
    }
}

/// One weight row against `N` Q8_K activation rows; each sub-block is decoded once and
/// serves all `N`.
#[target_feature(enable = "avx2,fma,f16c")]
fn iq3_dot<F: Iq3Avx2, const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    let blocks = w.len() / F::BYTES;
    for x in &xs {
        assert_eq!(x.len(), blocks * Q8K_BYTES, "activation row length");
    }
    let mut sums = [_mm256_setzero_ps(); N];
    for (i, block) in w.chunks_exact(F::BYTES).enumerate() {
        let mut sumi = [_mm256_setzero_si256(); N];
        for ib in 0..SUBS {
            // SAFETY: this function's features are the ones `sub_block` needs.
            let sub = unsafe { F::sub_block(block, ib) };
            for (s, x) in sumi.iter_mut().zip(&xs) {
                // SAFETY: every activation row holds `blocks` whole Q8_K blocks (checked
                // above), so block `i`'s codes `32ib..32ib + 32` are in bounds; `loadu`
                // has no alignment requirement.
                let q8 = unsafe {
                    _mm256_loadu_si256(x.as_ptr().add(i * Q8K_BYTES + CODES_AT + SUB * ib).cast())
                };
                let dot = _mm256_maddubs_epi16(sub.grid, _mm256_sign_epi8(q8, sub.signs));
                *s = _mm256_add_epi32(*s, _mm256_madd_epi16(dot, sub.scales));
            }
        }
        let dw = f16_at(block, 0);
        for ((sum, s), x) in sums.iter_mut().zip(sumi).zip(&xs) {
            let d = _mm256_set1_ps(dw * f32_at(x, i * Q8K_BYTES));
            *sum = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), *sum);
        }
    }
    sums.map(|s| match F::FINAL_SCALE {
        Some(f) => f * hsum_ggml(s),
        None => hsum_ggml(s),
    })
}

/// IQ3_XXS against `N` activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq3_xxs_dot<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    iq3_dot::<Xxs, N>(w, xs)
}

/// IQ3_S against `N` activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq3_s_dot<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    iq3_dot::<S, N>(w, xs)
}
