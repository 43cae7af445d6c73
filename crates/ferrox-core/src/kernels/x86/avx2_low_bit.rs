//! AVX2 dot products of the formats whose blocks span several Q8_0 activation blocks:
//! Q1_0 (128 values, four Q8_0 blocks), Q2_0 and NVFP4 (64 values, two).
//!
//! Q1_0 and NVFP4 follow ggml's AVX2 kernels. ggml has no x86 kernel for Q2_0, so its
//! generic C runs there; ours computes the integer sums with AVX2 and then that code's
//! scalar float steps in its order (unfused), so its bits are the generic ones.

use std::arch::x86_64::*;

use super::avx2_common::{bits_to_byte_mask, check_rows, zeros};
use super::avx2_common::{f16_at, hsum_ggml, hsum_i32, load_16, load_32, pair_sums_signed, quads};
use crate::quant::fp4::{ue4m3_half, LEVELS, NVFP4_SCALES};
use crate::quant::low_bit::CODES_AT;

const Q8_0_BYTES: usize = 34;
const Q8_0_CODES_AT: usize = 2;
const Q1_0_BYTES: usize = 18;
const Q2_0_BYTES: usize = 18;
const NVFP4_BYTES: usize = 36;

/// One Q1_0 weight row against `N` Q8_0 activation rows, in ggml's AVX2 order: per
/// weight block, `acc_b = d₀·s₀`, then `acc_b = fma(d_k, s_k, acc_b)` for the other three
/// activation blocks (`s_k` the signed codes' sums, four per lane), then
/// `acc = fma(d_w, acc_b, acc)`; ggml's horizontal sum at the end.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q1_0_dot<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    const ACT: usize = 4 * Q8_0_BYTES;
    check_rows(w, Q1_0_BYTES, ACT, &xs);
    let mut acc = zeros::<N>();
    let (ones8, ones16) = (_mm256_set1_epi8(1), _mm256_set1_epi16(1));
    for (ib, wb) in w.chunks_exact(Q1_0_BYTES).enumerate() {
        let dw = _mm256_set1_ps(f16_at(wb, 0));
        // 0xFF where a bit is clear: those activation codes enter negated (as in ggml,
        // by xor and subtract, so −128 stays −128).
        let negate: [__m256i; 4] = std::array::from_fn(|k| {
            let at = CODES_AT + 4 * k;
            let bits = u32::from_le_bytes([wb[at], wb[at + 1], wb[at + 2], wb[at + 3]]);
            _mm256_xor_si256(bits_to_byte_mask(bits), _mm256_set1_epi8(-1))
        });
        for (acc, x) in acc.iter_mut().zip(&xs) {
            let xb = &x[ib * ACT..(ib + 1) * ACT];
            let mut block = _mm256_setzero_ps();
            for (k, yb) in xb.chunks_exact(Q8_0_BYTES).enumerate() {
                let qy = load_32(&yb[Q8_0_CODES_AT..]);
                let signed = _mm256_sub_epi8(_mm256_xor_si256(qy, negate[k]), negate[k]);
                let sums = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, signed), ones16);
                let (dy, sums) = (_mm256_set1_ps(f16_at(yb, 0)), _mm256_cvtepi32_ps(sums));
                block = if k == 0 {
                    _mm256_mul_ps(dy, sums)
                } else {
                    _mm256_fmadd_ps(dy, sums, block)
                };
            }
            *acc = _mm256_fmadd_ps(dw, block, *acc);
        }
    }
    std::array::from_fn(|t| hsum_ggml(acc[t]))
}

/// The 64 codes (0..3) of a Q2_0 block, value `j` in byte `j` of the pair.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q2_0_codes(block: &[u8]) -> [__m256i; 2] {
    let q = load_16(&block[CODES_AT..]);
    let three = _mm_set1_epi8(3);
    let c0 = _mm_and_si128(q, three);
    let c1 = _mm_and_si128(_mm_srli_epi16::<2>(q), three);
    let c2 = _mm_and_si128(_mm_srli_epi16::<4>(q), three);
    let c3 = _mm_and_si128(_mm_srli_epi16::<6>(q), three);
    // Interleave the four bit pairs of each byte back into value order.
    let (lo01, lo23) = (_mm_unpacklo_epi8(c0, c1), _mm_unpacklo_epi8(c2, c3));
    let (hi01, hi23) = (_mm_unpackhi_epi8(c0, c1), _mm_unpackhi_epi8(c2, c3));
    [
        _mm256_set_m128i(
            _mm_unpackhi_epi16(lo01, lo23),
            _mm_unpacklo_epi16(lo01, lo23),
        ),
        _mm256_set_m128i(
            _mm_unpackhi_epi16(hi01, hi23),
            _mm_unpacklo_epi16(hi01, hi23),
        ),
    ]
}

/// One Q2_0 weight row against `N` Q8_0 activation rows, with ggml's generic float steps:
/// `sumi = 0 + d₀·s₀ + d₁·s₁`, `sumf += d_w·sumi`, each rounded.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q2_0_dot<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    const ACT: usize = 2 * Q8_0_BYTES;
    check_rows(w, Q2_0_BYTES, ACT, &xs);
    let mut sumf = [0f32; N];
    let (ones8, ones16) = (_mm256_set1_epi8(1), _mm256_set1_epi16(1));
    for (ib, wb) in w.chunks_exact(Q2_0_BYTES).enumerate() {
        let dw = f16_at(wb, 0);
        let codes = q2_0_codes(wb);
        for (sumf, x) in sumf.iter_mut().zip(&xs) {
            let xb = &x[ib * ACT..(ib + 1) * ACT];
            let mut sumi = 0.0f32;
            for (codes, yb) in codes.iter().zip(xb.chunks_exact(Q8_0_BYTES)) {
                let qy = load_32(&yb[Q8_0_CODES_AT..]);
                // Σ(code − 1)·q as Σ code·q − Σ q: exact, whatever the codes.
                let products = _mm256_madd_epi16(_mm256_maddubs_epi16(*codes, qy), ones16);
                let plain = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, qy), ones16);
                let sum = hsum_i32(_mm256_sub_epi32(products, plain));
                sumi += f16_at(yb, 0) * sum as f32;
            }
            *sumf += dw * sumi;
        }
    }
    sumf
}

/// Two NVFP4 sub-blocks' 16 levels each (from 16 bytes of nibbles), in value order: the
/// first sub-block in the low lane, matching one Q8_0 block's 32 codes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nvfp4_pair(nibbles: &[u8]) -> __m256i {
    let table: &[u8; 16] = &LEVELS.map(|l| l as u8);
    // SAFETY: `table` is 16 readable bytes; `loadu` has no alignment requirement.
    let table = unsafe { _mm_loadu_si128(table.as_ptr().cast()) };
    let q = load_16(nibbles);
    let low = _mm_set1_epi8(0x0F);
    let lo = _mm_shuffle_epi8(table, _mm_and_si128(q, low));
    let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(q), low));
    _mm256_set_m128i(_mm_unpackhi_epi64(lo, hi), _mm_unpacklo_epi64(lo, hi))
}

/// One NVFP4 weight row against `N` Q8_0 activation rows, in ggml's AVX2 order: per
/// block, the sub-block pairs' lane sums (four per sub-block) scaled by
/// `[d_s·d_x]` and added by two FMAs; ggml's horizontal sum at the end.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn nvfp4_dot<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    crate::kernels::x86::align_frame!();
    const ACT: usize = 2 * Q8_0_BYTES;
    check_rows(w, NVFP4_BYTES, ACT, &xs);
    let mut acc = zeros::<N>();
    for (ib, wb) in w.chunks_exact(NVFP4_BYTES).enumerate() {
        let codes01 = nvfp4_pair(&wb[NVFP4_SCALES..]);
        let codes23 = nvfp4_pair(&wb[NVFP4_SCALES + 16..]);
        let d: [f32; 4] = std::array::from_fn(|s| ue4m3_half(wb[s]));
        for (acc, x) in acc.iter_mut().zip(&xs) {
            let xb = &x[ib * ACT..(ib + 1) * ACT];
            let (y0, y1) = xb.split_at(Q8_0_BYTES);
            let p01 = quads(pair_sums_signed(codes01, load_32(&y0[Q8_0_CODES_AT..])));
            let p23 = quads(pair_sums_signed(codes23, load_32(&y1[Q8_0_CODES_AT..])));
            let (dy0, dy1) = (f16_at(y0, 0), f16_at(y1, 0));
            let scales01 = _mm256_set_m128(_mm_set1_ps(d[1] * dy0), _mm_set1_ps(d[0] * dy0));
            let scales23 = _mm256_set_m128(_mm_set1_ps(d[3] * dy1), _mm_set1_ps(d[2] * dy1));
            *acc = _mm256_fmadd_ps(scales01, _mm256_cvtepi32_ps(p01), *acc);
            *acc = _mm256_fmadd_ps(scales23, _mm256_cvtepi32_ps(p23), *acc);
        }
    }
    std::array::from_fn(|t| hsum_ggml(acc[t]))
}
