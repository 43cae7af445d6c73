//! The AVX-512 VNNI kernels over packed Q2_K, Q3_K, Q4_K, Q5_K and Q6_K groups (and I8K,
//! the i-quants' int8 form, as Q6_K with full-byte codes): per sub-block one exact
//! integer sum per row by `vpdpbusd` (as for the 32-value formats), scaled by the row's
//! sub-block scale with an integer multiply; the minimums (Q2_K, Q4_K) or the codes'
//! offset (Q3_K's 4, Q6_K's 32) by `vpdpwssd` against pairs of the activation's sums of
//! 16 values;
//! then per super-block and token one or two fused multiply-adds for all sixteen rows,
//! as the scalar reference does row by row.
//!
//! They run under the driver of `avx512.rs`, which is handed out only after the features
//! were detected, so the `unsafe` calls are sound.

use std::arch::x86_64::*;

use super::avx512::{broadcast_i32, dot32, nibbles, Block};
use super::layout::{
    affine_k_codes_at, iq4xs_codes_at, q2k_codes_at, q3k_high_at, q3k_low_at, q6k_high_at,
    q6k_low_at, q8k_code_sum, tq2_codes_at, I8K_CODES_AT, I8K_SCALES_AT, IQ4NL_CODES,
    IQ4XS_SCALES_AT, Q2K_DMIN_AT, Q2K_SCALES_AT, Q3K_CODES_AT, Q3K_SCALES_AT, Q4K_CODES_AT,
    Q4K_DMIN_AT, Q4K_MINS_AT, Q4K_SCALES_AT, Q5K_PLANES_AT, Q6K_CODES_AT, Q6K_SCALES_AT, Q8K_BYTES,
    Q8K_CODES_AT, Q8K_SUMS_AT,
};
use super::{PackedFormat, GROUP_ROWS};

/// Q4_K, or Q5_K when `FIFTH` (the same with a fifth bit per code).
pub(super) struct AffineKBlock<const FIFTH: bool>;
pub(super) struct Q6KBlock;
pub(super) struct Q2KBlock;
pub(super) struct Q3KBlock;
/// I8K; when `PAIRED`, its two sixteen-value sub-blocks of each 32 share one scale (the
/// i-quants whose scales are per 32 values).
pub(super) struct I8KBlock<const PAIRED: bool>;
pub(super) struct Iq4XsBlock;
pub(super) struct Tq2Block;

/// Sixteen f16 at `p` as f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn f16x16(p: *const u8) -> __m512 {
    // SAFETY: the caller passes 32 readable bytes.
    _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.cast()) })
}

/// Sixteen u8 at `p` widened to i32 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn u8x16(p: *const u8) -> __m512i {
    // SAFETY: the caller passes 16 readable bytes.
    _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(p.cast()) })
}

impl<const FIFTH: bool> Block for AffineKBlock<FIFTH> {
    const FORMAT: PackedFormat = if FIFTH {
        PackedFormat::Q5K
    } else {
        PackedFormat::Q4K
    };

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn add<const N: usize>(
        block: *const u8,
        b: usize,
        xs: &[*const u8],
        acc: &mut [__m512; N],
    ) {
        // SAFETY: the caller's contract.
        unsafe {
            affine_k_add::<N, FIFTH>(
                block,
                b,
                xs,
                acc,
                #[inline(always)]
                |s| affine_k_codes::<FIFTH>(block, s),
            )
        }
    }
}

/// The eight code vectors of sub-block `s` of a packed Q4_K group block (Q5_K when
/// `FIFTH`): vector `k` holds values `4k..4k + 4` of every row.
// Inlined always (not a target-feature function): a call would pass the vectors
// through memory.
#[inline(always)]
unsafe fn affine_k_codes<const FIFTH: bool>(block: *const u8, s: usize) -> [__m512i; 8] {
    let low = _mm512_set1_epi8(0x0F);
    // SAFETY: the caller passes a whole packed group block.
    unsafe {
        let raw = block.add(affine_k_codes_at(FIFTH) + 64 * 8 * (s / 2));
        std::array::from_fn(|k| {
            let v = _mm512_loadu_si512(raw.add(64 * k).cast());
            let v = if s.is_multiple_of(2) {
                v
            } else {
                _mm512_srli_epi16::<4>(v)
            };
            let code = _mm512_and_si512(v, low);
            if FIFTH {
                let plane = _mm512_loadu_si512(block.add(Q5K_PLANES_AT + 64 * k).cast());
                let bit = _mm512_set1_epi8((1u8 << s) as i8);
                let fifth = _mm512_test_epi8_mask(plane, bit);
                _mm512_mask_add_epi8(code, fifth, code, _mm512_set1_epi8(16))
            } else {
                code
            }
        })
    }
}

/// One Q4_K (Q5_K when `FIFTH`) group block against `N` tokens, sub-block `s`'s codes from
/// `codes(s)`.
#[inline(always)]
unsafe fn affine_k_add<const N: usize, const FIFTH: bool>(
    block: *const u8,
    b: usize,
    xs: &[*const u8],
    acc: &mut [__m512; N],
    codes: impl Fn(usize) -> [__m512i; 8],
) {
    let zero = _mm512_setzero_si512();
    // SAFETY: the caller's contract (and the features, which every caller enables).
    unsafe {
        let mut scaled = [zero; N];
        for s in 0..8 {
            let codes = codes(s);
            let scale = u8x16(block.add(Q4K_SCALES_AT + GROUP_ROWS * s));
            for t in 0..N {
                let x = xs[t].add(b * Q8K_BYTES + Q8K_CODES_AT + 32 * s);
                let sum = dot32(zero, &codes, x);
                scaled[t] = _mm512_add_epi32(scaled[t], _mm512_mullo_epi32(scale, sum));
            }
        }
        // Σ min·Σx: each sub-block's minimum, as an i16 pair (m, m), against the
        // activation's sums of its two halves of 16 values.
        let mut mins = [zero; N];
        for s in 0..8 {
            let min = u8x16(block.add(Q4K_MINS_AT + GROUP_ROWS * s));
            let min_pair = _mm512_or_si512(min, _mm512_slli_epi32::<16>(min));
            add_pair_sums(xs, b, s, min_pair, &mut mins);
        }
        add_affine_block(block, Q4K_DMIN_AT, b, xs, (&scaled, &mins), acc);
    }
}

/// The low nibbles of `nibbles` with bits 4-5 of `bits`: six-bit codes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
fn six_bits(nibbles: __m512i, bits: __m512i) -> __m512i {
    // (nibbles & 0x0F) | (bits & 0x30): ternary-logic table for a | (b & c), a pre-masked.
    let low = _mm512_and_si512(nibbles, _mm512_set1_epi8(0x0F));
    _mm512_ternarylogic_epi32::<0xF8>(low, bits, _mm512_set1_epi8(0x30))
}

impl Block for Q6KBlock {
    const FORMAT: PackedFormat = PackedFormat::Q6K;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn add<const N: usize>(
        block: *const u8,
        b: usize,
        xs: &[*const u8],
        acc: &mut [__m512; N],
    ) {
        // SAFETY: the caller's contract.
        unsafe {
            offset_block::<N, 5, false>(
                block,
                b,
                xs,
                acc,
                #[inline(always)]
                |s| q6k_codes(block, s),
            )
        }
    }
}

/// The four code vectors of sixteen-value sub-block `s` of a packed Q6_K group block.
// Inlined always (not a target-feature function): a call would pass the vectors
// through memory.
#[inline(always)]
unsafe fn q6k_codes(block: *const u8, s: usize) -> [__m512i; 4] {
    // SAFETY: the caller passes a whole packed group block.
    unsafe {
        let n0 = _mm512_loadu_si512(block.add(q6k_low_at(2 * s)).cast());
        let n1 = _mm512_loadu_si512(block.add(q6k_low_at(2 * s + 1)).cast());
        let hb = _mm512_loadu_si512(block.add(q6k_high_at(s)).cast());
        [
            six_bits(n0, _mm512_slli_epi16::<4>(hb)),
            six_bits(_mm512_srli_epi16::<4>(n0), _mm512_slli_epi16::<2>(hb)),
            six_bits(n1, hb),
            six_bits(_mm512_srli_epi16::<4>(n1), _mm512_srli_epi16::<2>(hb)),
        ]
    }
}

/// Q5_K groups in their prompt form: the packed block's scales and minimums, then the codes
/// one byte each as [`affine_k_codes`] makes them, sub-block by sub-block (see
/// [`prompt_form`]).
pub(super) struct PromptQ5KBlock;
/// Q6_K or Q3_K groups (format id `F`) in their prompt form: the packed block's scales,
/// then the codes one byte each as [`q6k_codes`] or [`q3k_codes`] makes them.
pub(super) struct PromptOffsetBlock<const F: u8>;

/// Code vectors of a K-quant group block in its prompt form.
const PROMPT_CODE_VECTORS: usize = 64;
/// Where Q6_K's codes start in its prompt form: after the packed block's scales, at a whole
/// cache line (as Q4_K's do), so that no code vector straddles two.
const Q6K_PROMPT_CODES_AT: usize = Q6K_CODES_AT.next_multiple_of(64);
/// Where Q3_K's codes start in its prompt form, likewise.
const Q3K_PROMPT_CODES_AT: usize = Q3K_CODES_AT.next_multiple_of(64);

/// Where format `F`'s codes start in its prompt form, and where its packed block's codes
/// start (what precedes them, scales and minimums, is copied as it is).
const fn prompt_codes_at(format: PackedFormat) -> (usize, usize) {
    match format {
        PackedFormat::Q6K => (Q6K_PROMPT_CODES_AT, Q6K_CODES_AT),
        PackedFormat::Q3K => (Q3K_PROMPT_CODES_AT, Q3K_CODES_AT),
        PackedFormat::Q5K => (Q4K_CODES_AT, Q4K_CODES_AT),
        _ => panic!("a format with an AVX-512 prompt form"),
    }
}
const _: () = assert!(Q4K_CODES_AT.is_multiple_of(64));

/// The prompt form of `format`'s panels under AVX-512 (see [`super::PromptForm`]): Q5_K's,
/// Q6_K's and Q3_K's codes unpacked once per panel (masked, shifted, fifth, high or third
/// bits merged), not on every pass of up to eight tokens.
pub(super) fn prompt_form(format: PackedFormat) -> Option<super::PromptForm> {
    let (rewrite, kernel): (_, super::GroupsFn) = match format {
        PackedFormat::Q5K => (
            prompt_rewrite::<{ super::layout::id::Q5K }> as _,
            super::avx512::groups::<PromptQ5KBlock>,
        ),
        PackedFormat::Q6K => (
            prompt_rewrite::<{ super::layout::id::Q6K }> as _,
            super::avx512::groups::<PromptOffsetBlock<{ super::layout::id::Q6K }>>,
        ),
        PackedFormat::Q3K => (
            prompt_rewrite::<{ super::layout::id::Q3K }> as _,
            super::avx512::groups::<PromptOffsetBlock<{ super::layout::id::Q3K }>>,
        ),
        _ => return None,
    };
    Some(super::PromptForm {
        group_block_bytes: prompt_codes_at(format).0 + 64 * PROMPT_CODE_VECTORS,
        rewrite,
        kernel,
        min_tokens: if format == PackedFormat::Q3K {
            Q3K_PROMPT_MIN_TOKENS
        } else {
            PROMPT_MIN_TOKENS
        },
    })
}

/// Fewest tokens for which the AVX-512 prompt forms pay: `decode_stack q5_k|q6_k 1 1 cached
/// tokens=N` (Intel Xeon, alternated) is level or slower at 12 and 16 tokens, 1.0-1.07x at
/// 24, 1.12-1.25x at 64 and 512. Q4_K has none: its unpacking is one mask (and a shift for
/// odd sub-blocks), and the form measured 0.75-0.9x below 64 tokens and 1.02-1.06x above.
const PROMPT_MIN_TOKENS: usize = 24;
/// Q3_K's (its third bits are a test and a masked add per quad): 1.07x at 16 tokens, 1.14x
/// at 24, 1.23-1.26x at 64 and 1.35x at 512, measured as [`PROMPT_MIN_TOKENS`].
const Q3K_PROMPT_MIN_TOKENS: usize = 16;

/// Rewrites packed K-quant groups into their prompt form.
///
/// # Safety
/// See [`super::PromptForm::rewrite`]; the CPU has the kernels' features.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn prompt_rewrite<const F: u8>(w: *const u8, groups: usize, blocks: usize, dst: *mut u8) {
    use super::layout::id::{Q3K, Q5K, Q6K};
    const { assert!(matches!(F, Q3K | Q5K | Q6K)) };
    let format = PackedFormat::from_id(F);
    // The packed block's scales (and minimums), then the codes from `values_at`.
    let (values_at, scales) = prompt_codes_at(PackedFormat::from_id(F));
    let (gb, rb) = (
        format.group_block_bytes(),
        values_at + 64 * PROMPT_CODE_VECTORS,
    );
    for i in 0..groups * blocks {
        // SAFETY: the caller's contract: block `i` of the groups at `w`, its rewritten
        // block at `dst`.
        unsafe {
            let block = w.add(i * gb);
            let out = dst.add(i * rb);
            std::ptr::copy_nonoverlapping(block, out, scales);
            let mut v = out.add(values_at);
            let mut put = |x: __m512i| {
                _mm512_storeu_si512(v.cast(), x);
                v = v.add(64);
            };
            match F {
                Q5K => {
                    for s in 0..8 {
                        affine_k_codes::<true>(block, s)
                            .into_iter()
                            .for_each(&mut put);
                    }
                }
                Q3K => {
                    for s in 0..16 {
                        q3k_codes(block, s).into_iter().for_each(&mut put);
                    }
                }
                _ => {
                    for s in 0..16 {
                        q6k_codes(block, s).into_iter().for_each(&mut put);
                    }
                }
            }
        }
    }
}

impl Block for PromptQ5KBlock {
    const FORMAT: PackedFormat = PackedFormat::Q5K;
    const PROMPT_FORM: bool = true;

    fn group_block_bytes() -> usize {
        Q4K_CODES_AT + 64 * PROMPT_CODE_VECTORS
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn add<const N: usize>(
        block: *const u8,
        b: usize,
        xs: &[*const u8],
        acc: &mut [__m512; N],
    ) {
        // SAFETY: the caller's contract: a whole prompt-form block.
        unsafe {
            affine_k_add::<N, true>(
                block,
                b,
                xs,
                acc,
                #[inline(always)]
                |s| load_vectors(block.add(Q4K_CODES_AT + 512 * s)),
            )
        }
    }
}

impl<const F: u8> Block for PromptOffsetBlock<F> {
    const FORMAT: PackedFormat = PackedFormat::from_id(F);
    const PROMPT_FORM: bool = true;

    fn group_block_bytes() -> usize {
        Self::CODES_AT + 64 * PROMPT_CODE_VECTORS
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn add<const N: usize>(
        block: *const u8,
        b: usize,
        xs: &[*const u8],
        acc: &mut [__m512; N],
    ) {
        // SAFETY (both arms): the caller's contract: a whole prompt-form block. Q6_K's
        // codes are the value plus 32, Q3_K's plus 4.
        unsafe {
            if F == super::layout::id::Q6K {
                stored_offset_block::<N, 5, false>(block, b, xs, acc, Self::CODES_AT)
            } else {
                stored_offset_block::<N, 2, false>(block, b, xs, acc, Self::CODES_AT)
            }
        }
    }
}

impl<const F: u8> PromptOffsetBlock<F> {
    /// Where the codes start.
    const CODES_AT: usize = {
        use super::layout::id::{Q3K, Q6K};
        assert!(F == Q6K || F == Q3K);
        prompt_codes_at(PackedFormat::from_id(F)).0
    };
}

impl<const PAIRED: bool> Block for I8KBlock<PAIRED> {
    const FORMAT: PackedFormat = PackedFormat::I8K;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn add<const N: usize>(
        block: *const u8,
        b: usize,
        xs: &[*const u8],
        acc: &mut [__m512; N],
    ) {
        // SAFETY: the caller's contract.
        unsafe { stored_offset_block::<N, 6, PAIRED>(block, b, xs, acc, I8K_CODES_AT) }
    }
}

/// The four quads of a Q2_K or Q3_K code vector at `p`: quad `k` in bits `2k..2k+2` of
/// each byte, moved down and masked (what a 16-bit shift brings from the next byte lands
/// above bit 1, where the mask clears it).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn two_bit_quads(p: *const u8) -> [__m512i; 4] {
    let mask = _mm512_set1_epi8(3);
    // SAFETY: the caller passes a whole 64-byte vector.
    let v = unsafe { _mm512_loadu_si512(p.cast()) };
    [
        _mm512_and_si512(v, mask),
        _mm512_and_si512(_mm512_srli_epi16::<2>(v), mask),
        _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask),
        _mm512_and_si512(_mm512_srli_epi16::<6>(v), mask),
    ]
}

/// Sub-block `s`'s four quads of three-bit codes: bit `4i + k` of a plane byte is the
/// third bit of quad `k` of sub-block `2p + i`, and a test against it gives the bytes to
/// add 4 to.
#[inline(always)]
unsafe fn q3k_codes(block: *const u8, s: usize) -> [__m512i; 4] {
    // SAFETY: the caller passes a whole packed group block.
    unsafe {
        let plane = _mm512_loadu_si512(block.add(q3k_high_at(s / 2)).cast());
        let low = two_bit_quads(block.add(q3k_low_at(s)));
        std::array::from_fn(|k| {
            let bit = _mm512_set1_epi8((1u8 << (4 * (s % 2) + k)) as i8);
            let third = _mm512_test_epi8_mask(plane, bit);
            _mm512_mask_add_epi8(low[k], third, low[k], _mm512_set1_epi8(4))
        })
    }
}

impl Block for Q3KBlock {
    const FORMAT: PackedFormat = PackedFormat::Q3K;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn add<const N: usize>(
        block: *const u8,
        b: usize,
        xs: &[*const u8],
        acc: &mut [__m512; N],
    ) {
        // SAFETY: the caller's contract.
        unsafe {
            offset_block::<N, 2, false>(
                block,
                b,
                xs,
                acc,
                #[inline(always)]
                |s| q3k_codes(block, s),
            )
        }
    }
}

impl Block for Q2KBlock {
    const FORMAT: PackedFormat = PackedFormat::Q2K;

    /// Per sub-block of 16 values `Σ code·x` by `vpdpbusd` times its 4-bit scale; the
    /// minimums (the scale bytes' high nibbles) by `vpdpwssd` against the activation's
    /// pairs of sums of 16; then the scalar reference's two fused multiply-adds.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn add<const N: usize>(
        block: *const u8,
        b: usize,
        xs: &[*const u8],
        acc: &mut [__m512; N],
    ) {
        let zero = _mm512_setzero_si512();
        // SAFETY: the caller's contract.
        unsafe {
            let mut scaled = [zero; N];
            let mut mins = [zero; N];
            for p in 0..8 {
                // Lane r: row r's scale bytes (`m << 4 | scale`) of sub-blocks 2p and 2p + 1
                // as two i16.
                let pair = _mm512_cvtepu8_epi16(_mm256_loadu_si256(
                    block.add(Q2K_SCALES_AT + 32 * p).cast(),
                ));
                let scale_pair = _mm512_and_si512(pair, _mm512_set1_epi16(15));
                let min_pair = _mm512_srli_epi16::<4>(pair);
                let codes = [
                    two_bit_quads(block.add(q2k_codes_at(2 * p))),
                    two_bit_quads(block.add(q2k_codes_at(2 * p + 1))),
                ];
                for t in 0..N {
                    let x = xs[t].add(b * Q8K_BYTES + Q8K_CODES_AT + 32 * p);
                    // Codes below 4: see `small_pair_sums`.
                    let sums = small_pair_sums(&codes, x);
                    scaled[t] = _mm512_dpwssd_epi32(scaled[t], sums, scale_pair);
                }
                add_pair_sums(xs, b, p, min_pair, &mut mins);
            }
            add_affine_block(block, Q2K_DMIN_AT, b, xs, (&scaled, &mins), acc);
        }
    }
}

/// `sums[t] += Σ pair·x_sums` for the activations' pair `p` of sums of 16 values (i16 lanes
/// against the two i16 sums of each row's pair of sub-blocks).
///
/// # Safety
/// The CPU has the kernels' features; each token's block `b` is whole.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn add_pair_sums<const N: usize>(
    xs: &[*const u8],
    b: usize,
    p: usize,
    pair: __m512i,
    sums: &mut [__m512i; N],
) {
    for (t, sum) in sums.iter_mut().enumerate() {
        // SAFETY: the caller's contract.
        let x = unsafe { broadcast_i32(xs[t].add(b * Q8K_BYTES + Q8K_SUMS_AT + 4 * p)) };
        *sum = _mm512_dpwssd_epi32(*sum, pair, x);
    }
}

/// An affine K-quant super-block's float step (Q2_K, Q4_K, Q5_K): the scaled sums times
/// `d·dy`, less the minimums' sums times `dmin·dy`, as the scalar reference's two fused
/// multiply-adds.
///
/// # Safety
/// The CPU has the kernels' features; `block` is a whole group block, each token's block
/// `b` is whole.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn add_affine_block<const N: usize>(
    block: *const u8,
    dmin_at: usize,
    b: usize,
    xs: &[*const u8],
    (scaled, mins): (&[__m512i; N], &[__m512i; N]),
    acc: &mut [__m512; N],
) {
    // SAFETY: the caller's contract.
    unsafe {
        let dw = f16x16(block);
        let dmin = f16x16(block.add(dmin_at));
        for t in 0..N {
            let dy = _mm512_set1_ps(xs[t].add(b * Q8K_BYTES).cast::<f32>().read_unaligned());
            let s = _mm512_cvtepi32_ps(scaled[t]);
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dy), s, acc[t]);
            let m = _mm512_cvtepi32_ps(mins[t]);
            acc[t] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, dy), m, acc[t]);
        }
    }
}

/// `Σ code·x` per row lane over one sub-block of 16 values: `codes[k]` holds values
/// `4k..4k + 4` of each row (unsigned), `x` the 16 activation bytes.
///
/// # Safety
/// The CPU has the kernels' features; `x` addresses 16 readable bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn sixteen(codes: &[__m512i; 4], x: *const u8) -> __m512i {
    let zero = _mm512_setzero_si512();
    // SAFETY: the caller's contract.
    unsafe {
        let even = _mm512_dpbusd_epi32(zero, codes[0], broadcast_i32(x));
        let even = _mm512_dpbusd_epi32(even, codes[2], broadcast_i32(x.add(8)));
        let odd = _mm512_dpbusd_epi32(zero, codes[1], broadcast_i32(x.add(4)));
        let odd = _mm512_dpbusd_epi32(odd, codes[3], broadcast_i32(x.add(12)));
        _mm512_add_epi32(even, odd)
    }
}

/// `init + Σ code·x` per row lane over two sixteen-value sub-blocks (`pair[0]` against the 16
/// activation bytes at `x`, `pair[1]` at `x + 16`).
///
/// # Safety
/// The CPU has the kernels' features; `x` addresses 32 readable bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn thirty_two(init: __m512i, pair: &[[__m512i; 4]; 2], x: *const u8) -> __m512i {
    let mut sum = init;
    // SAFETY: the caller's contract.
    unsafe {
        for (h, codes) in pair.iter().enumerate() {
            for (k, c) in codes.iter().enumerate() {
                sum = _mm512_dpbusd_epi32(sum, *c, broadcast_i32(x.add(16 * h + 4 * k)));
            }
        }
    }
    sum
}

/// The `K` 64-byte vectors from `p`. A loop, not `std::array::from_fn`: a closure does not
/// take the caller's target features, and the compiler left such loads out of line (a call
/// per vector in the prompt forms' and I8K's products).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn load_vectors<const K: usize>(p: *const u8) -> [__m512i; K] {
    let mut out = [_mm512_setzero_si512(); K];
    for (k, v) in out.iter_mut().enumerate() {
        // SAFETY: the caller passes `K` readable vectors.
        *v = unsafe { _mm512_loadu_si512(p.add(64 * k).cast()) };
    }
    out
}

/// Two sixteen-value sub-blocks' `Σ code·x` (codes `pair[0]` against the activation bytes
/// at `x`, `pair[1]` at `x + 16`) as each lane's two i16, the first low: with codes below 8
/// a sum is at most 16·7·128 in magnitude, so one `vpdpwssd` then applies both sub-blocks'
/// scales (i16 pairs in the same order), where two `vpmulld` took twice the uops.
///
/// # Safety
/// 32 readable bytes at `x`; the CPU has the kernels' features.
#[inline(always)]
unsafe fn small_pair_sums(pair: &[[__m512i; 4]; 2], x: *const u8) -> __m512i {
    // SAFETY: the caller's contract.
    unsafe {
        _mm512_ternarylogic_epi32::<0xF8>(
            _mm512_slli_epi32::<16>(sixteen(&pair[1], x.add(16))),
            sixteen(&pair[0], x),
            _mm512_set1_epi32(0xFFFF),
        )
    }
}

/// [`offset_block`] over codes stored one byte each from `codes_at`, sixteen-value
/// sub-block `s`'s four vectors at `codes_at + 256·s` (I8K; Q6_K's and Q3_K's prompt forms).
#[inline(always)]
unsafe fn stored_offset_block<const N: usize, const SHIFT: u32, const PAIRED: bool>(
    block: *const u8,
    b: usize,
    xs: &[*const u8],
    acc: &mut [__m512; N],
    codes_at: usize,
) {
    // SAFETY: the caller's contract: a whole block with its codes at `codes_at`.
    unsafe {
        offset_block::<N, SHIFT, PAIRED>(
            block,
            b,
            xs,
            acc,
            #[inline(always)]
            |s| load_vectors(block.add(codes_at + 256 * s)),
        )
    }
}

/// A super-block of signed scales per 16 values and unsigned codes offset by `1 << SHIFT`
/// (Q3_K, Q6_K, I8K): `codes(s)` gives sub-block `s`'s four code vectors.
#[inline(always)]
unsafe fn offset_block<const N: usize, const SHIFT: u32, const PAIRED: bool>(
    block: *const u8,
    b: usize,
    xs: &[*const u8],
    acc: &mut [__m512; N],
    codes: impl Fn(usize) -> [__m512i; 4],
) {
    let zero = _mm512_setzero_si512();
    // SAFETY: the caller's contract (and the features, which every caller enables).
    unsafe {
        let mut scaled = [zero; N];
        let mut offsets = [zero; N];
        for p in 0..8 {
            // Lane r: row r's scales 2p and 2p + 1 as two i16.
            const _: () = assert!(Q6K_SCALES_AT == I8K_SCALES_AT);
            const _: () = assert!(Q6K_SCALES_AT == Q3K_SCALES_AT);
            let pair =
                _mm512_cvtepi8_epi16(_mm256_loadu_si256(block.add(Q6K_SCALES_AT + 32 * p).cast()));
            if PAIRED {
                // One scale for both sub-blocks: a sum of 32 that starts from the codes'
                // offset against the activations' sum (one `vpmaddwd` of the pair of sums
                // of 16), then one `vpmulld`.
                let scale = _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(pair));
                let minus_offset = _mm512_set1_epi16(-(1 << SHIFT));
                let codes = [codes(2 * p), codes(2 * p + 1)];
                for t in 0..N {
                    let x = xs[t].add(b * Q8K_BYTES);
                    let x_sums = broadcast_i32(x.add(Q8K_SUMS_AT + 4 * p));
                    let init = _mm512_madd_epi16(x_sums, minus_offset);
                    let sum = thirty_two(init, &codes, x.add(Q8K_CODES_AT + 32 * p));
                    scaled[t] = _mm512_add_epi32(scaled[t], _mm512_mullo_epi32(scale, sum));
                }
            } else if SHIFT == 2 {
                // Q3_K's codes are below 8: see `small_pair_sums`.
                // Not `array::map`: a closure called from it does not run with this
                // function's features, and every intrinsic in it becomes a call.
                let codes = [codes(2 * p), codes(2 * p + 1)];
                for t in 0..N {
                    let x = xs[t].add(b * Q8K_BYTES + Q8K_CODES_AT + 32 * p);
                    scaled[t] = _mm512_dpwssd_epi32(scaled[t], small_pair_sums(&codes, x), pair);
                }
            } else {
                let scales = [
                    _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(pair)),
                    _mm512_srai_epi32::<16>(pair),
                ];
                for (h, scale) in scales.iter().enumerate() {
                    let s = 2 * p + h;
                    let codes = codes(s);
                    for t in 0..N {
                        let x = xs[t].add(b * Q8K_BYTES + Q8K_CODES_AT + 16 * s);
                        let sum = sixteen(&codes, x);
                        scaled[t] = _mm512_add_epi32(scaled[t], _mm512_mullo_epi32(*scale, sum));
                    }
                }
            }
            if !PAIRED {
                add_pair_sums(xs, b, p, pair, &mut offsets);
            }
        }
        let dw = f16x16(block);
        for t in 0..N {
            let dy = _mm512_set1_ps(xs[t].add(b * Q8K_BYTES).cast::<f32>().read_unaligned());
            let total = _mm512_sub_epi32(scaled[t], _mm512_slli_epi32::<SHIFT>(offsets[t]));
            let total = _mm512_cvtepi32_ps(total);
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dy), total, acc[t]);
        }
    }
}

impl Block for Iq4XsBlock {
    const FORMAT: PackedFormat = PackedFormat::Iq4Xs;

    /// Per 32-value sub-block: `Σ (level + 128)·x` by `vpdpbusd`, less `128·Σ x` from the
    /// activation's sums, times the row's signed scale; then one fused multiply-add.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn add<const N: usize>(
        block: *const u8,
        b: usize,
        xs: &[*const u8],
        acc: &mut [__m512; N],
    ) {
        let zero = _mm512_setzero_si512();
        // SAFETY: the caller's contract; the level table is 16 readable bytes.
        unsafe {
            let levels = _mm512_broadcast_i32x4(_mm_loadu_si128(IQ4NL_CODES.as_ptr().cast()));
            let mut scaled = [zero; N];
            for s in 0..8 {
                let codes =
                    nibbles(block.add(iq4xs_codes_at(s))).map(|n| _mm512_shuffle_epi8(levels, n));
                let scale = _mm512_cvtepi8_epi32(_mm_loadu_si128(
                    block.add(IQ4XS_SCALES_AT + GROUP_ROWS * s).cast(),
                ));
                for t in 0..N {
                    let y = xs[t].add(b * Q8K_BYTES);
                    let x = y.add(Q8K_CODES_AT + 32 * s);
                    let sums = y.add(Q8K_SUMS_AT + 4 * s);
                    let x_sum = i32::from(sums.cast::<i16>().read_unaligned())
                        + i32::from(sums.add(2).cast::<i16>().read_unaligned());
                    let sum = dot32(_mm512_set1_epi32(-128 * x_sum), &codes, x);
                    scaled[t] = _mm512_add_epi32(scaled[t], _mm512_mullo_epi32(scale, sum));
                }
            }
            let dw = f16x16(block);
            for t in 0..N {
                let dy = _mm512_set1_ps(xs[t].add(b * Q8K_BYTES).cast::<f32>().read_unaligned());
                let total = _mm512_cvtepi32_ps(scaled[t]);
                acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dy), total, acc[t]);
            }
        }
    }
}

impl Block for Tq2Block {
    const FORMAT: PackedFormat = PackedFormat::Tq2_0;

    /// `Σ code·x` by `vpdpbusd` from the activations' sum taken off (the codes are the
    /// value plus one), then the scalar reference's fused multiply-add. Up to four tokens,
    /// each quad's codes stay in their bit pair (`4^k` times the code): four independent
    /// sums per token, no shifts, the powers taken off at the end (exactly: each sum is a
    /// multiple of its power); more tokens share each block's shifted codes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn add<const N: usize>(
        block: *const u8,
        b: usize,
        xs: &[*const u8],
        acc: &mut [__m512; N],
    ) {
        let zero = _mm512_setzero_si512();
        // SAFETY: the caller's contract.
        unsafe {
            let mut sums = [zero; N];
            if N <= 4 {
                let mut quads = [[zero; 4]; N];
                for s in 0..16 {
                    let v = _mm512_loadu_si512(block.add(tq2_codes_at(s)).cast());
                    let mut codes = [zero; 4];
                    for (k, codes) in codes.iter_mut().enumerate() {
                        *codes = _mm512_and_si512(v, _mm512_set1_epi8((3u8 << (2 * k)) as i8));
                    }
                    for (t, quads) in quads.iter_mut().enumerate() {
                        let x = xs[t].add(b * Q8K_BYTES + Q8K_CODES_AT + 16 * s);
                        for (k, (quad, codes)) in quads.iter_mut().zip(codes).enumerate() {
                            *quad = _mm512_dpbusd_epi32(*quad, codes, broadcast_i32(x.add(4 * k)));
                        }
                    }
                }
                for t in 0..N {
                    let [q0, q1, q2, q3] = quads[t];
                    let q01 = _mm512_add_epi32(q0, _mm512_srai_epi32::<2>(q1));
                    let q23 =
                        _mm512_add_epi32(_mm512_srai_epi32::<4>(q2), _mm512_srai_epi32::<6>(q3));
                    sums[t] = _mm512_add_epi32(q01, q23);
                }
            } else {
                for p in 0..8 {
                    let codes = [
                        two_bit_quads(block.add(tq2_codes_at(2 * p))),
                        two_bit_quads(block.add(tq2_codes_at(2 * p + 1))),
                    ];
                    for t in 0..N {
                        let x = xs[t].add(b * Q8K_BYTES + Q8K_CODES_AT + 32 * p);
                        sums[t] = thirty_two(sums[t], &codes, x);
                    }
                }
            }
            let dw = f16x16(block);
            for t in 0..N {
                let y = xs[t].add(b * Q8K_BYTES);
                let dy = _mm512_set1_ps(y.cast::<f32>().read_unaligned());
                let total = _mm512_sub_epi32(sums[t], _mm512_set1_epi32(q8k_code_sum(y)));
                let total = _mm512_cvtepi32_ps(total);
                acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dy), total, acc[t]);
            }
        }
    }
}
