//! AVX2 dot product of TQ2_0 with Q8_K activations, in ggml's AVX2 order: per super-block,
//! the unsigned codes (0..2) times the activations summed in i16 lanes, the activations'
//! group sums subtracted (so each code counts as `code − 1`), widened to eight i32 lanes,
//! then `sum = fma(lanes, d, sum)` in float, added up with ggml's horizontal sum at the end.

use std::arch::x86_64::*;

use super::avx2_common::hsum_ggml;
use crate::quant::kquants::q8_k::{CODES_AT, SUMS_AT};
use crate::quant::ternary::TQ2_CODES;

const BLOCK_BYTES: usize = TQ2_CODES + 2;
const Q8K_BYTES: usize = SUMS_AT + 32;

/// One TQ2_0 weight row against `N` Q8_K activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn tq2_0_dot<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
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
