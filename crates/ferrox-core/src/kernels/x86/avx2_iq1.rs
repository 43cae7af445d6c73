//! AVX2 dot products of IQ1_S and IQ1_M with Q8_K activations, in ggml's AVX2 order.
//!
//! Both sum the ternary grid coordinates times the activations (signs moved onto the
//! activations, `maddubs`), times the odd scales into eight i32 lanes per super-block,
//! and `fma(d, lanes, acc)` them. The ±1/8 shifts are summed apart: IQ1_S from the
//! activations' stored group sums into a scalar `fma` accumulator, IQ1_M from the codes
//! themselves into a second eight-lane accumulator. The result is the main horizontal sum
//! plus 1/8 of the shifts' sum, as ggml adds them.
//!
//! Each weight super-block is decoded once and then serves all `N` activation rows.

use std::arch::x86_64::*;

use super::avx2_common::{f16_at, hsum_ggml, hsum_i32, load_32};
use crate::quant::grids::IQ1S_GRID;
use crate::quant::iq1::{Iq1M, Iq1S, DELTA, M_HIGH_AT, S_INDICES_AT};
use crate::quant::kquants::q8_k::{CODES_AT, SUMS_AT};
use crate::quant::kquants::QK_K;
use crate::quant::BlockFormat;

const Q8K_BYTES: usize = SUMS_AT + 32;
/// 32-value sub-blocks per super-block.
const SUBS: usize = QK_K / 32;

/// One decoded super-block: per sub-block the grid coordinates' magnitudes and the
/// coordinates themselves (whose signs go onto the activations), and the scales per i16
/// lane (IQ1_M: its two scales, one per 128-bit half).
struct Decoded {
    d: f32,
    magnitudes: [__m256i; SUBS],
    coordinates: [__m256i; SUBS],
    scales: [__m256i; SUBS],
}

/// The four grid points of one sub-block as a vector of 32 coordinates.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn points(indices: [usize; 4]) -> __m256i {
    let p = indices.map(|i| IQ1S_GRID[i] as i64);
    _mm256_set_epi64x(p[3], p[2], p[1], p[0])
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn empty(d: f32) -> Decoded {
    let zero = _mm256_setzero_si256();
    Decoded {
        d,
        magnitudes: [zero; SUBS],
        coordinates: [zero; SUBS],
        scales: [zero; SUBS],
    }
}

/// Sets sub-block `ib`'s coordinates and their magnitudes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn set_points(dec: &mut Decoded, ib: usize, indices: [usize; 4]) {
    let q = points(indices);
    dec.coordinates[ib] = q;
    dec.magnitudes[ib] = _mm256_sign_epi8(q, q);
}

/// Σ `coordinate·q8` per pair of values, as ggml's `mul_add_epi8` (i16 lanes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn grid_products(dec: &Decoded, ib: usize, q8: __m256i) -> __m256i {
    _mm256_maddubs_epi16(
        dec.magnitudes[ib],
        _mm256_sign_epi8(q8, dec.coordinates[ib]),
    )
}

fn d8(y: &[u8]) -> f32 {
    f32::from_le_bytes([y[0], y[1], y[2], y[3]])
}

fn check_rows<const N: usize>(w: &[u8], xs: &[&[u8]; N], block_bytes: usize) {
    let blocks = w.len() / block_bytes;
    for x in xs {
        assert_eq!(x.len(), blocks * Q8K_BYTES, "activation row length");
    }
}

/// One IQ1_S weight row against `N` Q8_K activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq1_s_dot<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    check_rows(w, &xs, Iq1S::BYTES);
    let mut sums = [_mm256_setzero_ps(); N];
    let mut shifts = [0f32; N];
    for (i, block) in w.chunks_exact(Iq1S::BYTES).enumerate() {
        let mut dec = empty(f16_at(block, 0));
        // The shifts' signed scales, each in the two i16 lanes of its sub-block's two
        // group sums.
        let mut shift_scales = [0i16; 16];
        for ib in 0..SUBS {
            let high = Iq1S::high(block, ib);
            let low = &block[S_INDICES_AT + 4 * ib..];
            let indices: [usize; 4] = std::array::from_fn(|l| {
                usize::from(low[l]) | (usize::from((high >> (3 * l)) & 7) << 8)
            });
            set_points(&mut dec, ib, indices);
            let ls = Iq1S::ls(high) as i16;
            dec.scales[ib] = _mm256_set1_epi16(ls);
            let signed = if high & 0x8000 != 0 { -ls } else { ls };
            shift_scales[2 * ib] = signed;
            shift_scales[2 * ib + 1] = signed;
        }
        // SAFETY: `shift_scales` is 32 readable bytes; `loadu` needs no alignment.
        let shift_scales = unsafe { _mm256_loadu_si256(shift_scales.as_ptr().cast()) };
        for ((sum, shift), x) in sums.iter_mut().zip(&mut shifts).zip(&xs) {
            let y = &x[i * Q8K_BYTES..(i + 1) * Q8K_BYTES];
            let q8 = &y[CODES_AT..SUMS_AT];
            let mut sumi = _mm256_setzero_si256();
            for ib in 0..SUBS {
                let dot = grid_products(&dec, ib, load_32(&q8[32 * ib..]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(dot, dec.scales[ib]));
            }
            // Exact: |group sum·scale| stays far inside i32.
            let group_sums = load_32(&y[SUMS_AT..]);
            let sumi1 = hsum_i32(_mm256_madd_epi16(group_sums, shift_scales));
            let d = d8(y) * dec.d;
            *sum = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), *sum);
            // ggml writes a multiply and an add; its build fuses them.
            *shift = d.mul_add(sumi1 as f32, *shift);
        }
    }
    let mut out = [0f32; N];
    for ((o, sum), shift) in out.iter_mut().zip(sums).zip(shifts) {
        *o = hsum_ggml(sum) + DELTA * shift;
    }
    out
}

/// One IQ1_M weight row against `N` Q8_K activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq1_m_dot<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    check_rows(w, &xs, Iq1M::BYTES);
    let mut sums = [_mm256_setzero_ps(); N];
    let mut shifts = [_mm256_setzero_ps(); N];
    let ones = _mm256_set1_epi8(1);
    for (i, block) in w.chunks_exact(Iq1M::BYTES).enumerate() {
        let mut dec = empty(f16_at(&Iq1M::d_bits(block).to_le_bytes(), 0));
        // Per sub-block, +1 or −1 in every byte of each group: the shifts' signs.
        let mut shift_signs = [_mm256_setzero_si256(); SUBS];
        for (ib, signs) in shift_signs.iter_mut().enumerate() {
            let high = &block[M_HIGH_AT + 2 * ib..M_HIGH_AT + 2 * ib + 2];
            let nibble = |l: usize| (high[l / 2] >> (4 * (l % 2))) & 0x0F;
            let indices: [usize; 4] = std::array::from_fn(|l| {
                usize::from(block[4 * ib + l]) | (usize::from(nibble(l) & 7) << 8)
            });
            set_points(&mut dec, ib, indices);
            let sign = |l: usize| {
                if nibble(l) & 8 != 0 {
                    -1i64
                } else {
                    0x0101_0101_0101_0101
                }
            };
            *signs = _mm256_set_epi64x(sign(3), sign(2), sign(1), sign(0));
            // The first 16 values' scale in the low half, the other 16's in the high.
            let (ls1, ls2) = (Iq1M::ls(block, 2 * ib), Iq1M::ls(block, 2 * ib + 1));
            dec.scales[ib] =
                _mm256_set_m128i(_mm_set1_epi16(ls2 as i16), _mm_set1_epi16(ls1 as i16));
        }
        for ((sum, shift), x) in sums.iter_mut().zip(&mut shifts).zip(&xs) {
            let y = &x[i * Q8K_BYTES..(i + 1) * Q8K_BYTES];
            let q8 = &y[CODES_AT..SUMS_AT];
            let (mut sumi1, mut sumi2) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            for ib in 0..SUBS {
                let q = load_32(&q8[32 * ib..]);
                let dot = grid_products(&dec, ib, q);
                let shifted = _mm256_maddubs_epi16(ones, _mm256_sign_epi8(q, shift_signs[ib]));
                sumi1 = _mm256_add_epi32(sumi1, _mm256_madd_epi16(dot, dec.scales[ib]));
                sumi2 = _mm256_add_epi32(sumi2, _mm256_madd_epi16(shifted, dec.scales[ib]));
            }
            let d = _mm256_set1_ps(d8(y) * dec.d);
            *sum = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi1), *sum);
            *shift = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi2), *shift);
        }
    }
    let mut out = [0f32; N];
    for ((o, sum), shift) in out.iter_mut().zip(sums).zip(shifts) {
        *o = hsum_ggml(sum) + DELTA * hsum_ggml(shift);
    }
    out
}
