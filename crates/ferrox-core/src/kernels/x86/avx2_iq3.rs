//! AVX2 dot products of IQ3_XXS and IQ3_S with Q8_K activations, in ggml's AVX2 order:
//! per 32-value sub-block, the unsigned grid coordinates times the activations with the
//! weights' signs moved onto them (`maddubs`), times the odd scale into eight i32 lanes;
//! per super-block `sum = fma(d, lanes, sum)`, added up with ggml's horizontal sum.
//!
//! Each weight super-block is decoded once (grid points, sign masks, scales) and then
//! serves all `N` activation rows.

use std::arch::x86_64::*;

use super::avx2_common::{bits_to_byte_mask, f16_at, hsum_ggml, load_32};
use crate::quant::grids::{IQ3S_GRID, IQ3XXS_GRID, SIGN_BYTES};
use crate::quant::iq3::{Iq3S, Iq3Xxs, SUB, S_SIGNS_AT, XXS_INDICES_AT};
use crate::quant::kquants::q8_k::{CODES_AT, SUMS_AT};
use crate::quant::kquants::QK_K;
use crate::quant::BlockFormat;

const Q8K_BYTES: usize = SUMS_AT + 32;
const SUBS: usize = QK_K / SUB;

/// One decoded super-block: per sub-block the grid coordinates, the signs to put on the
/// activations, and the scale `2s + 1` in every i16 lane.
struct Decoded {
    d: f32,
    grid: [__m256i; SUBS],
    signs: [__m256i; SUBS],
    scales: [__m256i; SUBS],
}

/// A 256-value i-quant with 3-bit grids, as its AVX2 kernel sees it.
trait Iq3Avx2 {
    const BYTES: usize;
    /// The final factor ggml applies to the horizontal sum (IQ3_XXS's ¼).
    const FINAL_SCALE: Option<f32>;

    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    unsafe fn decode(block: &[u8]) -> Decoded;

    /// The activation codes with the weights' signs put on them.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    unsafe fn apply_signs(q8: __m256i, signs: __m256i) -> __m256i;
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn empty(d: f32) -> Decoded {
    let zero = _mm256_setzero_si256();
    Decoded {
        d,
        grid: [zero; SUBS],
        signs: [zero; SUBS],
        scales: [zero; SUBS],
    }
}

struct Xxs;

impl Iq3Avx2 for Xxs {
    const BYTES: usize = Iq3Xxs::BYTES;
    const FINAL_SCALE: Option<f32> = Some(0.25);

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(block: &[u8]) -> Decoded {
        let mut dec = empty(f16_at(block, 0));
        for ib in 0..SUBS {
            let idx = &block[XXS_INDICES_AT + 8 * ib..XXS_INDICES_AT + 8 * ib + 8];
            let g: [i32; 8] = std::array::from_fn(|k| IQ3XXS_GRID[usize::from(idx[k])] as i32);
            dec.grid[ib] = _mm256_setr_epi32(g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]);
            let aux = Iq3Xxs::signs_and_scale(block, ib);
            let s: [i64; 4] =
                std::array::from_fn(|l| SIGN_BYTES[((aux >> (7 * l)) & 127) as usize] as i64);
            dec.signs[ib] = _mm256_set_epi64x(s[3], s[2], s[1], s[0]);
            dec.scales[ib] = _mm256_set1_epi16(2 * (aux >> 28) as i16 + 1);
        }
        dec
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn apply_signs(q8: __m256i, signs: __m256i) -> __m256i {
        _mm256_sign_epi8(q8, signs)
    }
}

struct S;

impl Iq3Avx2 for S {
    const BYTES: usize = Iq3S::BYTES;
    const FINAL_SCALE: Option<f32> = None;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(block: &[u8]) -> Decoded {
        let mut dec = empty(f16_at(block, 0));
        for ib in 0..SUBS {
            let idx = Iq3S::indices(block, ib);
            let g: [i32; 8] = std::array::from_fn(|k| IQ3S_GRID[idx[k]] as i32);
            dec.grid[ib] = _mm256_setr_epi32(g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]);
            let at = S_SIGNS_AT + 4 * ib;
            let bits = u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]);
            dec.signs[ib] = bits_to_byte_mask(bits);
            dec.scales[ib] = _mm256_set1_epi16(2 * i16::from(Iq3S::scale(block, ib)) + 1);
        }
        dec
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn apply_signs(q8: __m256i, mask: __m256i) -> __m256i {
        // Negation where the mask is all ones: (q ^ m) − m, as ggml writes it.
        _mm256_sub_epi8(_mm256_xor_si256(mask, q8), mask)
    }
}

/// One weight row against `N` Q8_K activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
fn iq3_dot<F: Iq3Avx2, const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    let blocks = w.len() / F::BYTES;
    for x in &xs {
        assert_eq!(x.len(), blocks * Q8K_BYTES, "activation row length");
    }
    let mut sums = [_mm256_setzero_ps(); N];
    for (i, block) in w.chunks_exact(F::BYTES).enumerate() {
        // SAFETY: this function's features are enabled, as `decode` requires.
        let dec = unsafe { F::decode(block) };
        for (sum, x) in sums.iter_mut().zip(&xs) {
            let y = &x[i * Q8K_BYTES..(i + 1) * Q8K_BYTES];
            let q8 = &y[CODES_AT..SUMS_AT];
            let mut sumi = _mm256_setzero_si256();
            for ib in 0..SUBS {
                // SAFETY: this function's features are enabled, as `apply_signs` requires.
                let q = unsafe { F::apply_signs(load_32(&q8[SUB * ib..]), dec.signs[ib]) };
                let dot = _mm256_maddubs_epi16(dec.grid[ib], q);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(dot, dec.scales[ib]));
            }
            let d = dec.d * f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
            *sum = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), *sum);
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
