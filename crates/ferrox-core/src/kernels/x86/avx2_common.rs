//! Small AVX2 building blocks shared by the kernels: loads from unaligned byte slices,
//! byte-product sums, nibble and bit unpacking, and ggml's horizontal sums (whose exact
//! order decides the last bits of every result).

use std::arch::x86_64::*;

/// Loads the first 32 bytes of `bytes`.
///
/// # Panics
/// If `bytes` is shorter than 32 (kernels slice whole blocks, so it never is).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load_32(bytes: &[u8]) -> __m256i {
    let chunk: &[u8; 32] = bytes.first_chunk().expect("a 32-byte chunk");
    // SAFETY: `chunk` is 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_si256(chunk.as_ptr().cast()) }
}

/// Loads the first 16 bytes of `bytes`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load_16(bytes: &[u8]) -> __m128i {
    let chunk: &[u8; 16] = bytes.first_chunk().expect("a 16-byte chunk");
    // SAFETY: `chunk` is 16 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm_loadu_si128(chunk.as_ptr().cast()) }
}

/// The f16 at `bytes[at..at + 2]` as f32, exactly, in integer arithmetic (about fifteen
/// instructions: fine once per super-block; per 32-value block use [`f16x4`]).
///
/// Why not F16C: converting a lone half with `vcvtph2ps` makes LLVM insert it into
/// whatever vector register is at hand, chaining each conversion to that register's last
/// writer, often an accumulator. Shifting exponent and mantissa into f32 position and
/// scaling by 2¹¹² is exact for zero, subnormal and normal halves; infinities and NaNs are
/// selected without a branch or call that would make the caller spill its accumulators.
#[inline]
pub(crate) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    let bits = u32::from(u16::from_le_bytes([bytes[at], bytes[at + 1]]));
    let finite = f32::from_bits((bits & 0x7FFF) << 13) * f32::from_bits(0x7780_0000);
    let special = 0x7F80_0000 | ((bits & 0x03FF) << 13);
    let magnitude = if bits & 0x7C00 == 0x7C00 {
        special
    } else {
        finite.to_bits()
    };
    f32::from_bits(magnitude | ((bits & 0x8000) << 16))
}

/// Four halves converted at once with F16C: lanes 0, 1 from `low[0..4]`, lanes 2, 3 from
/// `high[0..4]`. Callers use several lanes, so LLVM moves the whole 64 bits into a fresh
/// register (no false dependency, unlike a lone half).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f16x4(low: &[u8], high: &[u8]) -> __m128 {
    let word = |b: &[u8]| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let halves = word(low) | (word(high) << 32);
    _mm_cvtph_ps(_mm_cvtsi64_si128(halves as i64))
}

/// `f16(a[0..2]) · f16(b[0..2])`, both converted with one F16C instruction.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f16_product(a: &[u8], b: &[u8]) -> f32 {
    let halves = u32::from(u16::from_le_bytes([a[0], a[1]]))
        | (u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(halves as i32));
    _mm_cvtss_f32(_mm_mul_ss(v, _mm_movehdup_ps(v)))
}

/// The f32 at `bytes[at..at + 4]`.
#[inline]
pub(super) fn f32_at(bytes: &[u8], at: usize) -> f32 {
    // One bounds check and one load (indexing each byte checks and loads four times).
    f32::from_le_bytes(*bytes[at..].first_chunk().expect("four bytes"))
}

/// Sixteen packed bytes split into 32: low nibbles in bytes 0..16, high nibbles in 16..32
/// (the layout of Q4_0, Q4_1, IQ4_NL and each IQ4_XS sub-block).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn split_nibbles(packed: &[u8]) -> __m256i {
    let bytes = load_16(packed);
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(bytes), bytes);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// 0xFF in byte `j` where bit `j` of `bits` is set, 0 elsewhere.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn bits_to_byte_mask(bits: u32) -> __m256i {
    // Give each output byte the source byte holding its bit, then test that bit.
    let source_byte = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    let spread = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), source_byte);
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit)
}

/// ±1 per value for four groups of eight, from 7-bit sign fields, each group's eighth sign
/// making its count of minus signs even (ggml's `keven_signs`). Byte `8l + j` (`j < 7`) of
/// `spread` must hold the bit of group `l`'s sign `j` at the bit set in byte `8l + j` of
/// `bit`; bytes `8l + 7` of `spread` must be zero and of `bit` non-zero.
///
/// All in vector registers: a table of sign patterns costs four scalar lookups and their
/// assembly per sub-block, about twice these instructions.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn even_signs(spread: __m256i, bit: __m256i) -> __m256i {
    let negative = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    // Each group's sum of bytes is 255 times its count of minus signs: bit 0 is the parity,
    // shifted to bit 7 of the group's last byte.
    let parity = _mm256_slli_epi64(_mm256_sad_epu8(negative, _mm256_setzero_si256()), 63);
    _mm256_or_si256(_mm256_or_si256(negative, parity), _mm256_set1_epi8(1))
}

/// Eight sign words of IQ2_XXS or IQ3_XXS (four 7-bit sign fields, then the scale) each
/// beside its fields' parities, for [`even_signs_paired`]: `aux | p << 32` with bit `7l`
/// of `p` the parity of field `l`, counted here once per block for eight words at a time
/// (per sub-block, a count took three instructions). `aux` holds the words in the order
/// 0, 1, 4, 5 | 2, 3, 6, 7 (as `vshufps` takes them out of two 32-byte halves); the result
/// is in sub-block order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn sign_words_with_parities(aux: __m256i) -> [u64; 8] {
    // Bit i of `w2`, `w3`, `w4`, `seven`: the parity of bits i..i + 2, 3, 4, 7.
    let w2 = _mm256_xor_si256(aux, _mm256_srli_epi32::<1>(aux));
    let w3 = _mm256_xor_si256(w2, _mm256_srli_epi32::<2>(aux));
    let w4 = _mm256_xor_si256(w2, _mm256_srli_epi32::<2>(w2));
    let seven = _mm256_xor_si256(w4, _mm256_srli_epi32::<4>(w3));
    let mut words = [0u64; 8];
    // SAFETY: 64 writable bytes; `storeu` needs no alignment.
    unsafe {
        _mm256_storeu_si256(words.as_mut_ptr().cast(), _mm256_unpacklo_epi32(aux, seven));
        _mm256_storeu_si256(
            words[4..].as_mut_ptr().cast(),
            _mm256_unpackhi_epi32(aux, seven),
        );
    }
    words
}

/// ±1 per value of a sub-block from its [`sign_words_with_parities`] word, as
/// [`even_signs`] makes them: the eighth sign of each group is read from the parity word.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn even_signs_paired(word: u64) -> __m256i {
    // Output byte 8l + j (j < 7) takes the byte holding bit 7l + j of the sign word, byte
    // 8l + 7 the byte holding bit 7l of the parity word (bytes 4..8).
    let source = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 4, 0, 1, 1, 1, 1, 1, 1, 4, //
        1, 1, 2, 2, 2, 2, 2, 5, 2, 2, 2, 3, 3, 3, 3, 6,
    );
    let bit = _mm256_setr_epi8(
        1, 2, 4, 8, 16, 32, 64, 1, -128, 1, 2, 4, 8, 16, 32, -128, //
        64, -128, 1, 2, 4, 8, 16, 64, 32, 64, -128, 1, 2, 4, 8, 32,
    );
    let spread = _mm256_shuffle_epi8(_mm256_set1_epi64x(word as i64), source);
    let negative = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    _mm256_or_si256(negative, _mm256_set1_epi8(1))
}

/// The signs of an IQ2_XS sub-block from its four 16-bit words `q` (sign field in bits
/// 9..16 of each), as [`even_signs`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn even_signs_high7(q: u64) -> __m256i {
    // Group l's sign j is bit j + 1 of byte 2l + 1.
    let source = _mm256_setr_epi8(
        1, 1, 1, 1, 1, 1, 1, -128, 3, 3, 3, 3, 3, 3, 3, -128, //
        5, 5, 5, 5, 5, 5, 5, -128, 7, 7, 7, 7, 7, 7, 7, -128,
    );
    let bit = _mm256_set1_epi64x(0x0180_4020_1008_0402);
    even_signs(
        _mm256_shuffle_epi8(_mm256_set1_epi64x(q as i64), source),
        bit,
    )
}

/// 16 i16 lanes: `x[2i]·y[2i] + x[2i+1]·y[2i+1]` for unsigned `x` and signed `y`.
/// Exact while each pair stays within i16, which holds for every format's code range.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn pair_sums_unsigned(x: __m256i, y: __m256i) -> __m256i {
    _mm256_maddubs_epi16(x, y)
}

/// [`pair_sums_unsigned`] for signed `x`: moves `x`'s sign onto `y`. Exact for
/// |x|, |y| <= 127, and for x = -128 when y > -128.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn pair_sums_signed(x: __m256i, y: __m256i) -> __m256i {
    _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// 8 i32 lanes, each the sum of two adjacent i16 lanes times `scales` (pairwise).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn scaled_quads(pairs: __m256i, scales: __m256i) -> __m256i {
    _mm256_madd_epi16(pairs, scales)
}

/// 8 i32 lanes, each the sum of two adjacent i16 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn quads(pairs: __m256i) -> __m256i {
    _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
}

/// ggml's `hsum_float_8`: `((v0+v4) + (v2+v6)) + ((v1+v5) + (v3+v7))`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum_ggml(v: __m256) -> f32 {
    let q = _mm_add_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
    hsum4_ggml(q)
}

/// `high + low` (four lanes) of two registers side by side: the first step of every
/// horizontal sum below.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn halves_added(a: __m256, b: __m256) -> __m256 {
    _mm256_add_ps(
        _mm256_permute2f128_ps::<0x31>(a, b),
        _mm256_permute2f128_ps::<0x20>(a, b),
    )
}

/// The lanes `[t0, t2, t4, t6 | t1, t3, t5, t7]` in order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn in_order(sums: __m256) -> __m256 {
    _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// [`hsum_ggml`] of eight registers at once, the same additions for each: lane `k` of the
/// result is `hsum_ggml(t[k])`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum8_ggml(t: [__m256; 8]) -> __m256 {
    // `[a0 + a2, a1 + a3, b0 + b2, b1 + b3]` per 128-bit lane.
    let pairs = |a: __m256, b: __m256| {
        _mm256_add_ps(
            _mm256_shuffle_ps::<0b01_00_01_00>(a, b),
            _mm256_shuffle_ps::<0b11_10_11_10>(a, b),
        )
    };
    let low = pairs(halves_added(t[0], t[1]), halves_added(t[2], t[3]));
    let high = pairs(halves_added(t[4], t[5]), halves_added(t[6], t[7]));
    in_order(_mm256_hadd_ps(low, high))
}

/// The horizontal sums of eight registers at once, lane `k` of the result for `t[k]`: its
/// lanes `l` and `l + 4` added, then the four sums pairwise, `(s0 + s1) + (s2 + s3)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum8_adjacent(t: [__m256; 8]) -> __m256 {
    let low = _mm256_hadd_ps(halves_added(t[0], t[1]), halves_added(t[2], t[3]));
    let high = _mm256_hadd_ps(halves_added(t[4], t[5]), halves_added(t[6], t[7]));
    in_order(_mm256_hadd_ps(low, high))
}

/// The tail of [`hsum_ggml`] on four lanes: `(v0+v2) + (v1+v3)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum4_ggml(q: __m128) -> f32 {
    let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)))
}

/// Sum of the eight i32 lanes (exact, in wrapping arithmetic).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum_i32(v: __m256i) -> i32 {
    let q = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let q = _mm_add_epi32(q, _mm_unpackhi_epi64(q, q));
    let q = _mm_add_epi32(q, _mm_shuffle_epi32::<0b01>(q));
    _mm_cvtsi128_si32(q)
}

/// The eight i32 lanes of each of `N` vectors summed (exact, in wrapping arithmetic),
/// four vectors at a time with horizontal adds: the per-vector reduction costs about
/// four times the instructions.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsums_i32<const N: usize>(v: [__m256i; N]) -> [i32; N] {
    let mut out = [0i32; N];
    let mut quads = v.chunks_exact(4);
    for (quad, out) in (&mut quads).zip(out.chunks_exact_mut(4)) {
        // Lane k of each 128-bit half: vector k's sum over that half.
        let t = _mm256_hadd_epi32(
            _mm256_hadd_epi32(quad[0], quad[1]),
            _mm256_hadd_epi32(quad[2], quad[3]),
        );
        let sums = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t));
        // SAFETY: `out` is four writable i32s; `storeu` needs no alignment.
        unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), sums) };
    }
    let done = N - quads.remainder().len();
    for (o, &v) in out[done..].iter_mut().zip(quads.remainder()) {
        *o = hsum_i32(v);
    }
    out
}

/// Panics unless every activation row holds `act_bytes` for each of the weight row's
/// blocks of `block_bytes` (some kernels load activation codes unchecked on the strength
/// of it).
pub(super) fn check_rows<const N: usize>(
    w: &[u8],
    block_bytes: usize,
    act_bytes: usize,
    xs: &[&[u8]; N],
) {
    let blocks = w.len() / block_bytes;
    for x in xs {
        assert_eq!(x.len(), blocks * act_bytes, "activation row length");
    }
}

/// An all-zero accumulator for each of `N` activation rows.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn zeros<const N: usize>() -> [__m256; N] {
    [_mm256_setzero_ps(); N]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_is_exact_for_every_half() {
        for bits in 0..=u16::MAX {
            let want = half::f16::from_bits(bits).to_f32();
            let got = f16_at(&bits.to_le_bytes(), 0);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{bits:#06x}: {got} vs {want}"
            );
        }
    }
}

#[cfg(test)]
mod sign_tests {
    use super::*;
    use crate::quant::grids::KSIGNS_IQ2XS;

    /// Group `l`'s eight sign bytes from `v`: +1 or −1 per bit of `KSIGNS_IQ2XS[k]`.
    fn check(v: __m256i, k: [usize; 4]) {
        let mut bytes = [0i8; 32];
        // SAFETY: `bytes` is 32 writable bytes; `storeu` needs no alignment.
        unsafe { _mm256_storeu_si256(bytes.as_mut_ptr().cast(), v) };
        for (l, &k) in k.iter().enumerate() {
            for j in 0..8 {
                let want = if KSIGNS_IQ2XS[k] & (1 << j) != 0 {
                    -1
                } else {
                    1
                };
                assert_eq!(bytes[8 * l + j].signum(), want, "pattern {k}, group {l}");
            }
        }
    }

    #[test]
    fn vector_even_signs_match_the_table() {
        if !super::super::avx2_detected() {
            return;
        }
        let patterns = |k: usize| {
            let k = k % 128;
            [k, 127 - k, (k * 5) % 128, (k * 37 + 11) % 128]
        };
        // A block's eight sign words, word `w` of block `k` with patterns `patterns(k + w)`
        // and a scale nibble beside them (which no sign may read).
        let word = |k: usize| {
            patterns(k)
                .iter()
                .enumerate()
                .fold(0u32, |a, (l, &k)| a | (k as u32) << (7 * l))
                | (k as u32 & 15) << 28
        };
        for k in 0..128usize {
            let words: [u32; 8] = std::array::from_fn(|w| word(k + w));
            // The order `sign_words_with_parities` takes: 0, 1, 4, 5 | 2, 3, 6, 7.
            let order = [0, 1, 4, 5, 2, 3, 6, 7].map(|w| words[w] as i32);
            // SAFETY: AVX2, FMA and F16C were detected above.
            let paired =
                unsafe { sign_words_with_parities(_mm256_loadu_si256(order.as_ptr().cast())) };
            for (w, &pair) in paired.iter().enumerate() {
                assert_eq!(pair as u32, words[w], "block {k}: word {w} out of place");
                // SAFETY: as above.
                check(unsafe { even_signs_paired(pair) }, patterns(k + w));
            }
            let ks = patterns(k);
            let high7 = ks
                .iter()
                .enumerate()
                .fold(0u64, |a, (l, &k)| a | ((k as u64) << 9 | 0x1FF) << (16 * l));
            // SAFETY: as above.
            check(unsafe { even_signs_high7(high7) }, ks);
        }
    }
}
