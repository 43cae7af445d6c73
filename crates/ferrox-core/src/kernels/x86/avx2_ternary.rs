//! AVX2 dot products of TQ1_0 and TQ2_0 with Q8_K activations, in ggml's AVX2 order: per
//! super-block, the unsigned codes (0..2) times the activations summed in i16 lanes, the
//! activations' group sums subtracted (so each code counts as `code − 1`), widened to eight
//! i32 lanes, then `sum = fma(lanes, d, sum)` in float, added up with ggml's horizontal sum
//! at the end. Which values land in which lane decides the float result, so TQ1_0's codes
//! are laid out as ggml's kernel lays them out.

use std::arch::x86_64::*;

use super::avx2_common::{f16_at, f32_at, hsum_ggml, load_16, load_32};
use crate::quant::kquants::q8_k::{CODES_AT, SUMS_AT};
use crate::quant::ternary::{TQ1_D_AT, TQ1_QS, TQ2_CODES};

const BLOCK_BYTES: usize = TQ2_CODES + 2;
const Q8K_BYTES: usize = SUMS_AT + 32;

/// One TQ2_0 weight row against `N` Q8_K activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn tq2_0_dot<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    crate::kernels::x86::align_frame!();
    let blocks = w.len() / BLOCK_BYTES;
    for x in &xs {
        assert_eq!(x.len(), blocks * Q8K_BYTES, "activation row length");
    }
    let mut sums = [_mm256_setzero_ps(); N];
    for (i, block) in w.chunks_exact(BLOCK_BYTES).enumerate() {
        // SAFETY: `block` holds 64 code bytes and the f16 scale; each activation row holds
        // `blocks` whole Q8_K blocks (checked above).
        unsafe {
            let halves = u32::from(u16::from_le_bytes([block[TQ2_CODES], block[TQ2_CODES + 1]]));
            let dw = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(halves as i32)));
            let three = _mm256_set1_epi8(3);
            let mut codes = [_mm256_setzero_si256(); 8];
            for (j, pair) in codes.chunks_exact_mut(4).enumerate() {
                let q = _mm256_loadu_si256(block.as_ptr().add(32 * j).cast());
                pair[0] = _mm256_and_si256(q, three);
                pair[1] = _mm256_and_si256(_mm256_srli_epi16::<2>(q), three);
                pair[2] = _mm256_and_si256(_mm256_srli_epi16::<4>(q), three);
                pair[3] = _mm256_and_si256(_mm256_srli_epi16::<6>(q), three);
            }
            for (sum, x) in sums.iter_mut().zip(&xs) {
                let y = x.as_ptr().add(i * Q8K_BYTES);
                let yq = y.add(CODES_AT);
                let (mut sumi0, mut sumi1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for (j, c) in codes.chunks_exact(4).enumerate() {
                    let at = |l: usize| _mm256_loadu_si256(yq.add(128 * j + 32 * l).cast());
                    let p0 = _mm256_maddubs_epi16(c[0], at(0));
                    let p1 = _mm256_maddubs_epi16(c[1], at(1));
                    let p2 = _mm256_maddubs_epi16(c[2], at(2));
                    let p3 = _mm256_maddubs_epi16(c[3], at(3));
                    sumi0 = _mm256_add_epi16(sumi0, _mm256_add_epi16(p0, p1));
                    sumi1 = _mm256_add_epi16(sumi1, _mm256_add_epi16(p2, p3));
                }
                let ysum = _mm256_loadu_si256(y.add(SUMS_AT).cast());
                let dy = y.cast::<f32>().read_unaligned();
                let d = _mm256_set1_ps(dy * dw);
                let sumi = _mm256_sub_epi16(_mm256_add_epi16(sumi0, sumi1), ysum);
                let sumi = _mm256_madd_epi16(sumi, _mm256_set1_epi16(1));
                // ggml writes a multiply and an add; its build fuses them.
                *sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), d, *sum);
            }
        }
    }
    sums.map(|s| hsum_ggml(s))
}

const TQ1_BYTES: usize = TQ1_D_AT + 2;

/// `q·9` in each byte (mod 256): a shift by three within 16-bit lanes, masked to bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn times9(q: __m256i) -> __m256i {
    _mm256_add_epi8(
        _mm256_and_si256(_mm256_slli_epi16::<3>(q), _mm256_set1_epi8(-8)),
        q,
    )
}

/// `q·3` in each byte (mod 256).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn times3(q: __m256i) -> __m256i {
    _mm256_add_epi8(q, _mm256_add_epi8(q, q))
}

/// The top trit of each byte, `(q·3) >> 8`, as ggml computes it with byte averages.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn top_trit(q: __m256i) -> __m256i {
    let q = _mm256_subs_epu8(q, _mm256_set1_epi8(1));
    let q = _mm256_avg_epu8(q, _mm256_avg_epu8(q, _mm256_setzero_si256()));
    _mm256_and_si256(_mm256_srli_epi16::<6>(q), _mm256_set1_epi8(3))
}

/// A TQ1_0 block's codes in eight vectors, vector `c` pairing with activation codes
/// `32c..32c + 32` (the value order of the format, as in ggml's kernel).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tq1_0_codes(block: &[u8]) -> [__m256i; 8] {
    let qx0 = load_32(block);
    let qx1 = times3(qx0);
    let qx2 = times9(qx0);
    let qx3 = times9(qx1);
    let qx4 = times9(qx2);
    // The last 16 five-code bytes, in both lanes so the 256-bit helpers apply.
    let rest = load_16(&block[32..]);
    let r0 = _mm256_set_m128i(rest, rest);
    let r1 = times3(r0);
    let r2 = times9(r0);
    let r3 = times9(r1);
    let r4 = times9(r2);
    // The four-code bytes: byte j times 3ⁿ in lane 4n + j, in 16-bit lanes (AVX2 has no
    // byte multiply), truncated back to bytes.
    let qh = i32::from_le_bytes([
        block[TQ1_QS],
        block[TQ1_QS + 1],
        block[TQ1_QS + 2],
        block[TQ1_QS + 3],
    ]);
    let wide = _mm256_cvtepu8_epi16(_mm_set1_epi32(qh));
    let pow3 = _mm256_set_epi16(27, 27, 27, 27, 9, 9, 9, 9, 3, 3, 3, 3, 1, 1, 1, 1);
    let wide = _mm256_and_si256(_mm256_mullo_epi16(wide, pow3), _mm256_set1_epi16(0xFF));
    let qx5 = _mm_packus_epi16(
        _mm256_castsi256_si128(wide),
        _mm256_extracti128_si256::<1>(wide),
    );
    let low = |v: __m256i| _mm256_castsi256_si128(v);
    let qx01 = _mm256_set_m128i(low(r1), low(r0));
    let qx23 = _mm256_set_m128i(low(r3), low(r2));
    let qx45 = _mm256_set_m128i(qx5, low(r4));
    [qx0, qx1, qx2, qx3, qx4, qx01, qx23, qx45].map(|q| top_trit(q))
}

/// One TQ1_0 weight row against `N` Q8_K activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn tq1_0_dot<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    crate::kernels::x86::align_frame!();
    let blocks = w.len() / TQ1_BYTES;
    for x in &xs {
        assert_eq!(x.len(), blocks * Q8K_BYTES, "activation row length");
    }
    let mut sums = [_mm256_setzero_ps(); N];
    for (i, block) in w.chunks_exact(TQ1_BYTES).enumerate() {
        let codes = tq1_0_codes(block);
        let dw = f16_at(block, TQ1_D_AT);
        for (sum, x) in sums.iter_mut().zip(&xs) {
            let y = &x[i * Q8K_BYTES..(i + 1) * Q8K_BYTES];
            // i16 lanes wrap alike in any order of additions; ggml's order is kept anyway.
            let p: [__m256i; 8] = std::array::from_fn(|c| {
                _mm256_maddubs_epi16(codes[c], load_32(&y[CODES_AT + 32 * c..]))
            });
            let sumi0 = _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), p[5]);
            let sumi1 = _mm256_add_epi16(_mm256_add_epi16(p[2], p[3]), p[6]);
            let sumi2 = _mm256_add_epi16(p[4], p[7]);
            let ysum = load_32(&y[SUMS_AT..]);
            let d = _mm256_set1_ps(f32_at(y, 0) * dw);
            let sumi = _mm256_sub_epi16(sumi0, ysum);
            let sumi = _mm256_add_epi16(sumi, _mm256_add_epi16(sumi1, sumi2));
            let sumi = _mm256_madd_epi16(sumi, _mm256_set1_epi16(1));
            // ggml writes a multiply and an add; its build fuses them.
            *sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), d, *sum);
        }
    }
    sums.map(|s| hsum_ggml(s))
}
