//! AVX2 dot products of IQ1_S and IQ1_M with Q8_K activations, in ggml's AVX2 order.
//!
//! Both sum the ternary grid coordinates times the activations (signs moved onto the
//! activations, `maddubs`), times the odd scales into eight i32 lanes per super-block,
//! and `fma(d, lanes, acc)` them. The ±1/8 shifts are summed apart: IQ1_S from the
//! activations' stored group sums into a scalar `fma` accumulator, IQ1_M from the codes
//! themselves into a second eight-lane accumulator. The result is the main horizontal sum
//! plus 1/8 of the shifts' sum, as ggml adds them.
//!
//! Each weight sub-block is decoded once and then serves all `N` activation rows.

use std::arch::x86_64::*;

use super::avx2_common::{f16_at, hsum_ggml, hsum_i32, load_32};
use crate::quant::grids::IQ1S_GRID;
use crate::quant::iq1::{Iq1M, Iq1S, DELTA, M_HIGH_AT, S_HIGH_AT, S_INDICES_AT};
use crate::quant::kquants::q8_k::{CODES_AT, SUMS_AT};
use crate::quant::kquants::QK_K;
use crate::quant::BlockFormat;

const Q8K_BYTES: usize = SUMS_AT + 32;
/// 32-value sub-blocks per super-block.
const SUBS: usize = QK_K / 32;

/// The four grid points of one sub-block as a vector of 32 coordinates.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn points(indices: [usize; 4]) -> __m256i {
    let p = indices.map(|i| IQ1S_GRID[i] as i64);
    _mm256_set_epi64x(p[3], p[2], p[1], p[0])
}

fn d8(y: &[u8]) -> f32 {
    f32::from_le_bytes(*y.first_chunk().expect("a Q8_K block"))
}

fn check_rows<const N: usize>(w: &[u8], xs: &[&[u8]; N], block_bytes: usize) {
    let blocks = w.len() / block_bytes;
    for x in xs {
        assert_eq!(x.len(), blocks * Q8K_BYTES, "activation row length");
    }
}

/// The shifts' signed scales of a super-block's eight sub-blocks (from their 16-bit words
/// `high`: scale in bits 12..15, minus sign in bit 15), each in the two i16 lanes of its
/// sub-block's two group sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn shift_scales(high: &[u8; 16]) -> __m256i {
    // SAFETY: `high` is 16 readable bytes; `loadu` needs no alignment.
    let h = unsafe { _mm_loadu_si128(high.as_ptr().cast()) };
    // `(h >> 11) | 1` keeps bits 12..15 as 2·scale + 1 once the sign bit is masked off.
    let ls = _mm_or_si128(
        _mm_and_si128(_mm_srli_epi16(h, 11), _mm_set1_epi16(0x0E)),
        _mm_set1_epi16(1),
    );
    let minus = _mm_srai_epi16(h, 15);
    let signed = _mm_sub_epi16(_mm_xor_si128(ls, minus), minus);
    _mm256_set_m128i(
        _mm_unpackhi_epi16(signed, signed),
        _mm_unpacklo_epi16(signed, signed),
    )
}

/// One IQ1_S weight row against `N` Q8_K activation rows; each sub-block is decoded once
/// and serves all `N`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq1_s_dot<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    check_rows(w, &xs, Iq1S::BYTES);
    let mut sums = [_mm256_setzero_ps(); N];
    let mut shifts = [0f32; N];
    for (i, block) in w.chunks_exact(Iq1S::BYTES).enumerate() {
        let mut sumi = [_mm256_setzero_si256(); N];
        for ib in 0..SUBS {
            let high = Iq1S::high(block, ib);
            let low = u32::from_le_bytes(
                *block[S_INDICES_AT + 4 * ib..]
                    .first_chunk()
                    .expect("four index bytes"),
            );
            let q = points(std::array::from_fn(|l| {
                ((low >> (8 * l)) & 0xFF) as usize | (usize::from((high >> (3 * l)) & 7) << 8)
            }));
            let magnitudes = _mm256_sign_epi8(q, q);
            let scales = _mm256_set1_epi16(Iq1S::ls(high) as i16);
            for (s, x) in sumi.iter_mut().zip(&xs) {
                // SAFETY: every activation row holds `blocks` whole Q8_K blocks (checked
                // above), so block `i`'s codes `32ib..32ib + 32` are in bounds; `loadu`
                // has no alignment requirement.
                let q8 = unsafe {
                    _mm256_loadu_si256(x.as_ptr().add(i * Q8K_BYTES + CODES_AT + 32 * ib).cast())
                };
                let dot = _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(q8, q));
                *s = _mm256_add_epi32(*s, _mm256_madd_epi16(dot, scales));
            }
        }
        let shift_scales =
            shift_scales(block[S_HIGH_AT..].first_chunk().expect("eight high words"));
        let dw = f16_at(block, 0);
        for (((sum, shift), s), x) in sums.iter_mut().zip(&mut shifts).zip(sumi).zip(&xs) {
            let y = &x[i * Q8K_BYTES..(i + 1) * Q8K_BYTES];
            // Exact: |group sum·scale| stays far inside i32.
            let group_sums = load_32(&y[SUMS_AT..]);
            let sumi1 = hsum_i32(_mm256_madd_epi16(group_sums, shift_scales));
            let d = d8(y) * dw;
            *sum = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), *sum);
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

/// One IQ1_M weight row against `N` Q8_K activation rows; each sub-block is decoded once
/// and serves all `N`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq1_m_dot<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    check_rows(w, &xs, Iq1M::BYTES);
    let mut sums = [_mm256_setzero_ps(); N];
    let mut shifts = [_mm256_setzero_ps(); N];
    let ones = _mm256_set1_epi8(1);
    for (i, block) in w.chunks_exact(Iq1M::BYTES).enumerate() {
        let mut sumi1 = [_mm256_setzero_si256(); N];
        let mut sumi2 = [_mm256_setzero_si256(); N];
        for ib in 0..SUBS {
            let high = u32::from(u16::from_le_bytes(
                *block[M_HIGH_AT + 2 * ib..]
                    .first_chunk()
                    .expect("two high bytes"),
            ));
            let low = u32::from_le_bytes(*block[4 * ib..].first_chunk().expect("four index bytes"));
            // Group l: index bits 8..11 and shift sign in nibble l of `high`.
            let q = points(std::array::from_fn(|l| {
                ((low >> (8 * l)) & 0xFF) as usize | (((high >> (4 * l)) & 7) << 8) as usize
            }));
            let magnitudes = _mm256_sign_epi8(q, q);
            // ±1 per group: bit 3 of its nibble (bits 3 and 7 of the two high bytes).
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
            let shift_signs =
                _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), ones);
            // The first 16 values' scale in the low half, the other 16's in the high.
            let (ls1, ls2) = (Iq1M::ls(block, 2 * ib), Iq1M::ls(block, 2 * ib + 1));
            let scales = _mm256_set_m128i(_mm_set1_epi16(ls2 as i16), _mm_set1_epi16(ls1 as i16));
            for ((s1, s2), x) in sumi1.iter_mut().zip(&mut sumi2).zip(&xs) {
                // SAFETY: every activation row holds `blocks` whole Q8_K blocks (checked
                // above), so block `i`'s codes `32ib..32ib + 32` are in bounds; `loadu`
                // has no alignment requirement.
                let q8 = unsafe {
                    _mm256_loadu_si256(x.as_ptr().add(i * Q8K_BYTES + CODES_AT + 32 * ib).cast())
                };
                let dot = _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(q8, q));
                let shifted = _mm256_maddubs_epi16(ones, _mm256_sign_epi8(q8, shift_signs));
                *s1 = _mm256_add_epi32(*s1, _mm256_madd_epi16(dot, scales));
                *s2 = _mm256_add_epi32(*s2, _mm256_madd_epi16(shifted, scales));
            }
        }
        let dw = f16_at(&Iq1M::d_bits(block).to_le_bytes(), 0);
        for ((((sum, shift), s1), s2), x) in sums
            .iter_mut()
            .zip(&mut shifts)
            .zip(sumi1)
            .zip(sumi2)
            .zip(&xs)
        {
            let d = _mm256_set1_ps(d8(&x[i * Q8K_BYTES..]) * dw);
            *sum = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s1), *sum);
            *shift = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s2), *shift);
        }
    }
    let mut out = [0f32; N];
    for ((o, sum), shift) in out.iter_mut().zip(sums).zip(shifts) {
        *o = hsum_ggml(sum) + DELTA * hsum_ggml(shift);
    }
    out
}
