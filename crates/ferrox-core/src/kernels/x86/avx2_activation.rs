//! AVX2 activation quantizers, bit-identical to the scalar ones in `kernels::activation`
//! (which follow ggml-cpu's x86 `from_float`) for every input, NaN and infinities
//! included: the same maxima, the same float multiplies and roundings, the same integer
//! conversions, saturations and truncations.

use std::arch::x86_64::*;

use crate::quant::bits::write_f16;
use crate::quant::kquants::q8_k;

/// `max(|v|, m)` that keeps `m` when `|v|` is NaN, like the scalar `if |v| > m` fold.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn abs_max(v: __m256, m: __m256) -> __m256 {
    let abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0), v);
    // MAXPS returns its second operand unless the first is greater.
    _mm256_max_ps(abs, m)
}

/// The largest of eight lanes (none NaN).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hmax(v: __m256) -> f32 {
    let q = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let q = _mm_max_ps(q, _mm_movehl_ps(q, q));
    _mm_cvtss_f32(_mm_max_ss(q, _mm_movehdup_ps(q)))
}

/// Loads eight f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load8(v: &[f32]) -> __m256 {
    let chunk: &[f32; 8] = v.first_chunk().expect("eight values");
    // SAFETY: `chunk` is 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_ps(chunk.as_ptr()) }
}

/// Quantizes 32 values to a Q8_0 (`codes_at` = 2) or Q8_1 (`codes_at` = 4, with the scaled
/// code sum at 2) block, as `activation::quantize_q8_block` does.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn quantize_q8_block(src: &[f32], block: &mut [u8], with_sum: bool) {
    let v: [__m256; 4] = std::array::from_fn(|k| load8(&src[8 * k..]));
    let mut m = _mm256_setzero_ps();
    for &v in &v {
        m = abs_max(v, m);
    }
    let amax = hmax(m);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    write_f16(block, 0, d);
    let id = _mm256_set1_ps(id);
    // Round halves to even, then convert (NaN and out-of-range values become i32::MIN).
    let q: [__m256i; 4] = std::array::from_fn(|k| {
        let scaled = _mm256_mul_ps(v[k], id);
        _mm256_cvtps_epi32(_mm256_round_ps::<
            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
        >(scaled))
    });
    // Saturating packs clamp to the i8 range; undo their lane interleaving.
    let words = [
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    ];
    let bytes = _mm256_packs_epi16(words[0], words[1]);
    let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    let codes_at = if with_sum { 4 } else { 2 };
    let out: &mut [u8; 32] = (&mut block[codes_at..codes_at + 32])
        .try_into()
        .expect("32 code bytes");
    // SAFETY: `out` is 32 writable bytes; `storeu` has no alignment requirement.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), bytes) };
    if with_sum {
        // The unclamped codes, summed in wrapping i32 arithmetic.
        let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
        write_f16(block, 2, d * _mm_cvtsi128_si32(s) as f32);
    }
}

/// Quantizes 256 values to a Q8_K block, as `Q8K::quantize_block` does.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn quantize_q8k_block(src: &[f32], block: &mut [u8]) {
    let mut m = _mm256_setzero_ps();
    for k in 0..32 {
        m = abs_max(load8(&src[8 * k..]), m);
    }
    let amax = hmax(m);
    if amax == 0.0 {
        block.fill(0);
        return;
    }
    // The first value of that magnitude (the scalar `|v| > amax` fold keeps the first).
    let target = _mm256_set1_ps(amax);
    let abs_mask = _mm256_set1_ps(-0.0);
    let mut max = amax;
    for k in 0..32 {
        let v = load8(&src[8 * k..]);
        let hits = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(
            _mm256_andnot_ps(abs_mask, v),
            target,
        ));
        if hits != 0 {
            max = src[8 * k + hits.trailing_zeros() as usize];
            break;
        }
    }
    let iscale = -127.0 / max;
    let scale = _mm256_set1_ps(iscale);
    // `nearest_int`: add 1.5·2²³, keep the mantissa, subtract 2²²; then min(127) and
    // truncate to the low byte.
    let magic = _mm256_set1_ps(12_582_912.0);
    let mantissa = _mm256_set1_epi32(0x007f_ffff);
    let offset = _mm256_set1_epi32(0x0040_0000);
    let top = _mm256_set1_epi32(127);
    let low_bytes = _mm256_setr_epi8(
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, //
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    );
    let (head, sums_bytes) = block.split_at_mut(q8_k::SUMS_AT);
    let codes = &mut head[q8_k::CODES_AT..];
    for k in 0..32 {
        let scaled = _mm256_mul_ps(scale, load8(&src[8 * k..]));
        let bits = _mm256_castps_si256(_mm256_add_ps(scaled, magic));
        let q = _mm256_sub_epi32(_mm256_and_si256(bits, mantissa), offset);
        let q = _mm256_min_epi32(q, top);
        let bytes = _mm256_shuffle_epi8(q, low_bytes);
        let low = _mm_cvtsi128_si32(_mm256_castsi256_si128(bytes)) as u32;
        let high = _mm_cvtsi128_si32(_mm256_extracti128_si256::<1>(bytes)) as u32;
        codes[8 * k..8 * k + 4].copy_from_slice(&low.to_le_bytes());
        codes[8 * k + 4..8 * k + 8].copy_from_slice(&high.to_le_bytes());
    }
    // Group sums of 16 codes: bias each code by 128 to sum unsigned bytes (`vpsadbw`),
    // then remove the bias.
    for half in 0..8 {
        let chunk: &[u8; 32] = codes[32 * half..32 * half + 32]
            .try_into()
            .expect("32 codes");
        // SAFETY: `chunk` is 32 readable bytes.
        let v = unsafe { _mm256_loadu_si256(chunk.as_ptr().cast()) };
        let sums = _mm256_sad_epu8(
            _mm256_xor_si256(v, _mm256_set1_epi8(-128)),
            _mm256_setzero_si256(),
        );
        let mut parts = [0i64; 4];
        // SAFETY: `parts` is 32 writable bytes.
        unsafe { _mm256_storeu_si256(parts.as_mut_ptr().cast(), sums) };
        for g in 0..2 {
            let sum = (parts[2 * g] + parts[2 * g + 1] - 16 * 128) as i16;
            let at = 2 * (2 * half + g);
            sums_bytes[at..at + 2].copy_from_slice(&sum.to_le_bytes());
        }
    }
    block[q8_k::D_AT..q8_k::D_AT + 4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
}
