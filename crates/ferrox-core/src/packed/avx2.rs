//! The AVX2 kernels over packed groups, for CPUs without AVX-512 VNNI: the same integer
//! sums and float steps as the scalar reference, so the same bits.
//!
//! A group's 64-byte vectors are two halves of eight rows each (AVX2 has sixteen 256-bit
//! registers). For a decode step's one or two tokens both halves of a block run one after
//! the other, the second from cache, so that the weights stream at an even pace; for more
//! tokens one half runs over all of the group's blocks, then the other from cache (see
//! [`BLOCK_BY_BLOCK_TOKENS`]).
//! `vpmaddubsw` multiplies the unsigned codes by the signed activation bytes in pairs,
//! `vpmaddwd` by ones widens the pairs to one i32 per four values, as `vpdpbusd` does at
//! once. A pair of products fits an i16 for codes below 128; Q8_0's codes go back to
//! signed and through a sign trick (`|w|` times `x` with `w`'s sign).
//!
//! Only [`kernel`] and [`prompt_form`] hand these functions out, and the packed products
//! ask for them only after detecting AVX2, FMA and F16C, so the `unsafe` calls are sound.

use crate::kernels::Isa;
use std::arch::x86_64::*;

use super::layout::id::{
    I8K, IQ4_NL, IQ4_XS, MXFP4, NVFP4, Q1_0, Q2K, Q2_0, Q3K, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K,
    Q8_0, TQ2_0,
};
use super::layout::{
    affine_k_codes_at, iq4xs_codes_at, nvfp4_scales_at, q2k_codes_at, q3k_high_at, q3k_low_at,
    q6k_high_at, q6k_low_at, ACT_SCALE_AT, ACT_SUM_AT, I8K_CODES_AT, I8K_SCALES_AT, IQ4XS_CODES_AT,
    IQ4XS_SCALES_AT, MXFP4_CODES, Q2K_CODES_AT, Q2K_DMIN_AT, Q2K_SCALES_AT, Q3K_CODES_AT,
    Q3K_SCALES_AT, Q4K_CODES_AT, Q4K_DMIN_AT, Q4K_MINS_AT, Q4K_SCALES_AT, Q5K_PLANES_AT,
    Q6K_CODES_AT, Q6K_SCALES_AT, Q8K_BYTES, Q8K_CODES_AT, Q8K_SUMS_AT, SCALES_BYTES,
};
use super::layout::{place_int8_scales, q1_0_plane_at, q8k_code_sum, tq2_codes_at, QK_K};
use super::{
    prefetch_ahead, prefetch_lines, GroupsFn, PackedFormat, PromptForm, ACTIVATION_BLOCK_BYTES,
    GROUP_ROWS,
};
use crate::quant::int8::Int8Block;
use crate::quant::iq4::LEVELS as IQ4_LEVELS;

/// [`super::layout::PlaceFn`] with the codes moved by vectors: each eight quads of each
/// half of the rows are a transposition of 8 × 8 dwords, 384 shuffles and 128 stores per
/// group block where a quad at a time took 1024 stores (a quarter of an IQ3_XXS product at
/// 16 tokens).
pub(super) fn place_int8(rows: &[Int8Block], dst: &mut [u8]) {
    assert!(rows.len() == GROUP_ROWS && dst.len() >= PackedFormat::I8K.group_block_bytes());
    place_int8_scales(rows, dst);
    // SAFETY: handed out only where AVX2 is available (`super::int8_placement`); the
    // lengths are checked above.
    unsafe { transpose_codes(rows, dst) }
}

/// # Safety
/// The CPU has AVX2; sixteen rows, a whole I8K group block at `dst`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn transpose_codes(rows: &[Int8Block], dst: &mut [u8]) {
    const QUADS: usize = 8;
    for half in 0..2 {
        for t in 0..QK_K / 4 / QUADS {
            let mut a = [_mm256_setzero_si256(); 8];
            for (r, v) in a.iter_mut().enumerate() {
                let codes = rows[8 * half + r].codes.as_ptr().cast::<u8>();
                // SAFETY: a row's 256 codes are 8 · 32 bytes.
                *v = unsafe { _mm256_loadu_si256(codes.add(32 * t).cast()) };
            }
            let b = transpose_dwords(&a);
            for (c, v) in b.iter().enumerate() {
                // Quad `q` of every row: 64 bytes at `I8K_CODES_AT + 64q`, a half each.
                let at = I8K_CODES_AT + 64 * (QUADS * t + c) + 32 * half;
                // SAFETY: inside the group block (the caller's contract).
                unsafe { _mm256_storeu_si256(dst.as_mut_ptr().add(at).cast(), *v) };
            }
        }
    }
}

/// `out[c]` lane `r` = `a[r]` lane `c`: pairs of dwords, then of qwords, interleaved
/// within 128-bit lanes, then the lanes exchanged.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn transpose_dwords(a: &[__m256i; 8]) -> [__m256i; 8] {
    let mut t = [_mm256_setzero_si256(); 8];
    for i in 0..4 {
        t[2 * i] = _mm256_unpacklo_epi32(a[2 * i], a[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(a[2 * i], a[2 * i + 1]);
    }
    // u[4j + k], 128-bit lane L: column 4L + k of rows 4j..4j + 4.
    let mut u = [_mm256_setzero_si256(); 8];
    for j in 0..2 {
        u[4 * j] = _mm256_unpacklo_epi64(t[4 * j], t[4 * j + 2]);
        u[4 * j + 1] = _mm256_unpackhi_epi64(t[4 * j], t[4 * j + 2]);
        u[4 * j + 2] = _mm256_unpacklo_epi64(t[4 * j + 1], t[4 * j + 3]);
        u[4 * j + 3] = _mm256_unpackhi_epi64(t[4 * j + 1], t[4 * j + 3]);
    }
    let mut out = [_mm256_setzero_si256(); 8];
    for k in 0..4 {
        out[k] = _mm256_permute2x128_si256::<0x20>(u[k], u[4 + k]);
        out[4 + k] = _mm256_permute2x128_si256::<0x31>(u[k], u[4 + k]);
    }
    out
}

pub(super) fn kernel(format: PackedFormat) -> GroupsFn {
    match format {
        PackedFormat::Q4_0 => groups::<Q4_0, false>,
        PackedFormat::Q5_0 => groups::<Q5_0, false>,
        PackedFormat::Q4_1 => groups::<Q4_1, false>,
        PackedFormat::Q5_1 => groups::<Q5_1, false>,
        PackedFormat::Q8_0 => groups::<Q8_0, false>,
        PackedFormat::Mxfp4 => groups::<MXFP4, false>,
        PackedFormat::Iq4Nl => groups::<IQ4_NL, false>,
        PackedFormat::Q4K => groups::<Q4K, false>,
        PackedFormat::Q5K => groups::<Q5K, false>,
        PackedFormat::Q6K => groups::<Q6K, false>,
        PackedFormat::Q2K => groups::<Q2K, false>,
        PackedFormat::Q3K => groups::<Q3K, false>,
        PackedFormat::I8K => groups::<I8K, false>,
        PackedFormat::Iq4Xs => groups::<IQ4_XS, false>,
        PackedFormat::Tq2_0 | PackedFormat::Tq1_0 => groups::<TQ2_0, false>,
        PackedFormat::Q1_0 => groups::<Q1_0, false>,
        PackedFormat::Q2_0 => groups::<Q2_0, false>,
        PackedFormat::Nvfp4 => groups::<NVFP4, false>,
    }
}

/// The prompt form of `format`'s panels under AVX2, where one pays (see [`PromptForm`]):
/// each block's values as a pass over it uses them, so that passes only load them.
pub(super) fn prompt_form(format: PackedFormat) -> Option<PromptForm> {
    // Fewest tokens measured faster than the packed kernel (`decode_stack TYPE 1 1 cached
    // tokens=N`, alternated): Q5_K and Q6_K 1.1x from 12 tokens on, IQ4_XS 1.04-1.28x at 16
    // (its pass also drops a sign operation per token: 1.34x at 64), Q4_K 1.02x at 24,
    // Q8_0 level at 24 and 1.03x at 32, Q3_K 1.17x at 12 (1.38x at 64), Q2_K level at 12
    // and 16 and 1.05x at 24 (1.11x at 64).
    Some(match format {
        PackedFormat::Q8_0 => form::<Q8_0>(32),
        PackedFormat::Iq4Nl => form::<IQ4_NL>(32),
        PackedFormat::Q4K => form::<Q4K>(24),
        PackedFormat::Q5K => form::<Q5K>(12),
        PackedFormat::Q6K => form::<Q6K>(12),
        PackedFormat::Iq4Xs => form::<IQ4_XS>(16),
        PackedFormat::Q2K => form::<Q2K>(Q2K_PROMPT_FROM),
        PackedFormat::Q3K => form::<Q3K>(Q3K_PROMPT_FROM),
        PackedFormat::Tq2_0 => form::<TQ2_0>(TQ2_PROMPT_FROM),
        _ => return None,
    })
}

/// The prompt form of format `F`: its size, rewriting and kernel all from `F`, so that
/// they cannot disagree.
fn form<const F: u8>(min_tokens: usize) -> PromptForm {
    PromptForm {
        group_block_bytes: group_block_bytes::<true>(PackedFormat::from_id(F)),
        rewrite: prompt_rewrite::<F>,
        kernel: groups::<F, true>,
        min_tokens,
    }
}

/// Fewest tokens for Q2_K's and Q3_K's prompt forms (see [`prompt_form`]): Q3_K's third
/// bits cost a shift, a mask and an or per quad, Q2_K's codes only a shift and a mask.
const Q2K_PROMPT_FROM: usize = 24;
const Q3K_PROMPT_FROM: usize = 12;
/// TQ2_0's (and TQ1_0's, packed alike): `decode_stack tq2_0 1 1 cached tokens=N`, best of
/// three, 0.97-1.01x at 12 and 16 tokens, 1.06x at 24, 1.12x at 64.
const TQ2_PROMPT_FROM: usize = 24;

/// Where a group block's values start in the prompt form: after the packed block's scales
/// (and minimums), copied as they are.
const fn prompt_values_at(format: PackedFormat) -> usize {
    match format {
        PackedFormat::Q4K | PackedFormat::Q5K => Q4K_CODES_AT,
        PackedFormat::Q6K => Q6K_CODES_AT,
        PackedFormat::Iq4Xs => IQ4XS_CODES_AT,
        PackedFormat::Q2K => Q2K_CODES_AT,
        PackedFormat::Tq2_0 => tq2_codes_at(0),
        PackedFormat::Q3K => Q3K_CODES_AT,
        _ => SCALES_BYTES,
    }
}

/// 32-byte vectors per half of a group block in the prompt form: the K-quants' 256 codes per
/// row, or values and their magnitudes (IQ4_XS's 256, Q8_0's and IQ4_NL's 32).
const fn prompt_vectors_per_half(format: PackedFormat) -> usize {
    match format {
        PackedFormat::Q4K
        | PackedFormat::Q5K
        | PackedFormat::Q6K
        | PackedFormat::Q2K
        | PackedFormat::Q3K
        | PackedFormat::Tq2_0 => 64,
        PackedFormat::Iq4Xs => 128,
        _ => 16,
    }
}

/// Bytes of a group block, packed or (`PROMPT`) in its prompt form: for the K-quants (Q2_K
/// to Q6_K) the codes one byte each, for each half (eight rows) and sub-block the vectors
/// a pass multiplies (masked, shifted, high or third bits merged once, not on every pass);
/// for Q8_0 and IQ4_NL, whose values are signed bytes, each vector of four values beside its
/// magnitudes (`|w|·(x·sgn w)`, see [`dot4_signed`]: Q8_0's made back from `w + 128` and
/// IQ4_NL's from nibbles and levels once). `decode_stack q8_0 1 1 cached tokens=N`
/// (`FERROX_ISA=avx2`, Intel Xeon, alternated): 32 tokens 1.03x, 64 1.06x, 512 1.11x.
fn group_block_bytes<const PROMPT: bool>(format: PackedFormat) -> usize {
    if !PROMPT {
        return format.group_block_bytes();
    }
    prompt_values_at(format) + 2 * prompt_vectors_per_half(format) * 32
}

/// The `i`th 32-byte vector of half `half` of a prompt-form group block.
#[inline(always)]
unsafe fn prompt_vector(format: PackedFormat, block: *const u8, half: usize, i: usize) -> __m256i {
    // SAFETY: the caller passes a whole prompt-form block.
    unsafe {
        let at = prompt_values_at(format) + 32 * (prompt_vectors_per_half(format) * half + i);
        _mm256_loadu_si256(block.add(at).cast())
    }
}

/// Vectors `first..first + K` of half `half` of a prompt-form group block. A loop, not
/// `std::array::from_fn`: a closure does not take the caller's target features, and the
/// compiler left such loads out of line (a call per vector).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn prompt_vectors<const K: usize>(
    format: PackedFormat,
    block: *const u8,
    half: usize,
    first: usize,
) -> [__m256i; K] {
    let mut out = [_mm256_setzero_si256(); K];
    for (k, v) in out.iter_mut().enumerate() {
        // SAFETY: the caller passes a whole prompt-form block.
        *v = unsafe { prompt_vector(format, block, half, first + k) };
    }
    out
}

/// Half `half` of each of the `K` 64-byte vectors from `p` (see [`prompt_vectors`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn halves_of<const K: usize>(p: *const u8, half: usize) -> [__m256i; K] {
    let mut out = [_mm256_setzero_si256(); K];
    for (k, v) in out.iter_mut().enumerate() {
        // SAFETY: the caller passes `K` whole vectors.
        *v = unsafe { half_of(p.add(64 * k), half) };
    }
    out
}

/// Rewrites packed groups into their prompt form (see [`group_block_bytes`]).
///
/// # Safety
/// See [`PromptForm::rewrite`]; the CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn prompt_rewrite<const F: u8>(w: *const u8, groups: usize, blocks: usize, dst: *mut u8) {
    let format = PackedFormat::from_id(F);
    let (gb, rb) = (
        group_block_bytes::<false>(format),
        group_block_bytes::<true>(format),
    );
    for i in 0..groups * blocks {
        // SAFETY: the caller's contract: block `i` of the groups at `w`, its rewritten
        // block at `dst`.
        unsafe {
            let block = w.add(i * gb);
            let out = dst.add(i * rb);
            std::ptr::copy_nonoverlapping(block, out, prompt_values_at(format));
            let mut v = out.add(prompt_values_at(format)).cast::<__m256i>();
            let mut put = |x: __m256i| {
                _mm256_storeu_si256(v, x);
                v = v.add(1);
            };
            for half in 0..2 {
                match F {
                    Q4K | Q5K => {
                        for s in 0..8 {
                            let codes = if F == Q5K {
                                q4k_codes::<true>(block, half, s)
                            } else {
                                q4k_codes::<false>(block, half, s)
                            };
                            codes.into_iter().for_each(&mut put);
                        }
                    }
                    Q6K => {
                        for s in 0..16 {
                            q6k_codes(block, half, s).into_iter().for_each(&mut put);
                        }
                    }
                    Q2K | TQ2_0 => {
                        for s in 0..16 {
                            let at = if F == Q2K {
                                q2k_codes_at(s)
                            } else {
                                tq2_codes_at(s)
                            };
                            two_bit_quads(block.add(at), half)
                                .into_iter()
                                .for_each(&mut put);
                        }
                    }
                    Q3K => {
                        for s in 0..16 {
                            q3k_codes(block, half, s).into_iter().for_each(&mut put);
                        }
                    }
                    IQ4_XS => {
                        for s in 0..8 {
                            for values in iq4xs_values(block, half, s) {
                                put(values);
                                put(_mm256_abs_epi8(values));
                            }
                        }
                    }
                    _ => {
                        for values in legacy_codes::<F>(block, half, 0) {
                            put(values);
                            put(_mm256_abs_epi8(values));
                        }
                    }
                }
            }
        }
    }
}

/// # Safety
/// See [`GroupsFn`], the groups in their prompt form when `PROMPT`; the CPU has AVX2, FMA
/// and F16C.
unsafe fn groups<const F: u8, const PROMPT: bool>(
    w: *const u8,
    groups: usize,
    blocks: usize,
    xs: &[*const u8],
    out: *mut f32,
    out_stride: usize,
) {
    // At most `tokens_per_pass::<F, PROMPT>()` tokens per pass. More tokens take the groups
    // a panel at a time, each panel passed over by every chunk while it is cached (not the
    // whole range chunk by chunk, which would read the weights from memory once per chunk).
    let per_pass = tokens_per_pass::<F, PROMPT>();
    let group_bytes = blocks * group_block_bytes::<PROMPT>(PackedFormat::from_id(F));
    let panel = if xs.len() <= per_pass {
        groups
    } else {
        (SEVERAL_PASSES_PANEL_BYTES / group_bytes.max(1)).max(1)
    };
    let mut first = 0;
    while first < groups {
        let n = panel.min(groups - first);
        let w = w.wrapping_add(first * group_bytes);
        for (i, chunk) in xs.chunks(per_pass).enumerate() {
            // SAFETY: forwarded contract; groups `first..first + n`, outputs of their rows
            // and of the chunk's tokens.
            unsafe {
                let out = out.add(per_pass * i * out_stride + first * GROUP_ROWS);
                match chunk.len() {
                    8 => run::<F, 8, PROMPT>(w, n, blocks, chunk, out, out_stride),
                    7 => run::<F, 7, PROMPT>(w, n, blocks, chunk, out, out_stride),
                    6 => run::<F, 6, PROMPT>(w, n, blocks, chunk, out, out_stride),
                    5 => run::<F, 5, PROMPT>(w, n, blocks, chunk, out, out_stride),
                    4 => run::<F, 4, PROMPT>(w, n, blocks, chunk, out, out_stride),
                    3 => run::<F, 3, PROMPT>(w, n, blocks, chunk, out, out_stride),
                    2 => run::<F, 2, PROMPT>(w, n, blocks, chunk, out, out_stride),
                    _ => run::<F, 1, PROMPT>(w, n, blocks, chunk, out, out_stride),
                }
            }
        }
        first += n;
    }
}

/// Tokens per pass over a group for format `F`. Four tokens' accumulators and a block's
/// codes fill AVX2's sixteen registers; Q4_K, Q5_K and Q6_K take eight: their codes are
/// unpacked (masked, shifted, high bits merged) once per pass, and with eight tokens that
/// work is halved per token while the accumulators that no longer fit cost loads and
/// stores, which do not compete with the products for the vector ports. Measured with
/// `decode_stack TYPE 1 1 cached tokens=64` (`FERROX_ISA=avx2`, Intel Xeon, two rounds):
/// Q4_K 1.09x, Q5_K 1.20x, Q6_K 1.13x; Q8_0 level, Q4_0 0.93x and Q5_0 0.97x stay at four.
/// In the prompt form there is nothing left to unpack, and four tokens are 1.07x (Q4_K),
/// 1.05x (Q5_K) and level (Q6_K) against eight at 64 and 512 tokens.
const fn tokens_per_pass<const F: u8, const PROMPT: bool>() -> usize {
    match F {
        Q4K | Q5K | Q6K if !PROMPT => 8,
        _ => 4,
    }
}

/// Weight bytes of the panel that every chunk of tokens passes over in turn when a call has
/// more than one pass's tokens: small enough to stay in the L2 cache between the passes.
const SEVERAL_PASSES_PANEL_BYTES: usize = 64 * 1024;

/// Products of eight values of eight rows, unsigned codes below 64 (`c0`: each row's values
/// 0..4 in its lane, `c1`: values 4..8) times the eight signed activation bytes at `x`,
/// summed in each lane's two i16 halves (four products each, at most 4·63·128) and not yet
/// widened: codes below 16 let four such results be added before widening (at most
/// 16·15·128 in an i16), codes below 32 two.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pairs8(c0: __m256i, c1: __m256i, x: *const u8) -> __m256i {
    // SAFETY: the caller passes eight readable bytes.
    let (x0, x1) = unsafe {
        (
            _mm256_set1_epi32(x.cast::<i32>().read_unaligned()),
            _mm256_set1_epi32(x.add(4).cast::<i32>().read_unaligned()),
        )
    };
    _mm256_add_epi16(_mm256_maddubs_epi16(c0, x0), _mm256_maddubs_epi16(c1, x1))
}

/// Each lane's i32 `v` as the same i16 in both halves, so that `_mm256_madd_epi16` by it
/// multiplies a lane's two partial sums by `v` and adds them (widening exactly).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn both_halves(v: __m256i) -> __m256i {
    _mm256_or_si256(v, _mm256_slli_epi32::<16>(v))
}

/// `acc + Σ` over four values of eight rows: signed `codes` (each row's four bytes in its
/// lane, `magnitudes` their absolute values) times the four signed activation bytes at
/// `x`, as `|w|·(x·sgn w)`: each product is `w·x` exactly (activation codes are never
/// −128, so `x·sgn w` fits a byte; a code of −128 has magnitude 128 as an unsigned byte),
/// and a pair of them stays below 2¹⁵. The magnitudes are the block's, shared by all
/// tokens, so a token pays one `sign` per four values where `|x|·(w·sgn x)` pays two.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot4_signed(acc: __m256i, codes: __m256i, magnitudes: __m256i, x: *const u8) -> __m256i {
    // SAFETY: the caller passes four readable bytes.
    let x = _mm256_set1_epi32(unsafe { x.cast::<i32>().read_unaligned() });
    let pairs = _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(x, codes));
    _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

/// The 32 bytes of half `half` of the vector at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn half_of(p: *const u8, half: usize) -> __m256i {
    // SAFETY: the caller passes a whole 64-byte vector.
    unsafe { _mm256_loadu_si256(p.add(32 * half).cast()) }
}

/// Eight f16 at `p` as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16x8(p: *const u8) -> __m256 {
    // SAFETY: the caller passes 16 readable bytes.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.cast()) })
}

/// Eight u8 at `p` widened to i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn u8x8(p: *const u8) -> __m256i {
    // SAFETY: the caller passes 8 readable bytes.
    _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(p.cast()) })
}

/// Bit `g` of every byte of a Q1_0 plane of signs moved to bit 1 (the code 2), the other
/// bits clear. As in [`fifth_bits`], what a 16-bit shift brings from the neighbouring byte
/// lands below bit 1 (a left shift by one) or above it (right shifts of at most 6).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn sign_codes(plane: __m256i, g: usize) -> __m256i {
    let moved = if g == 0 {
        _mm256_slli_epi16::<1>(plane)
    } else {
        _mm256_srl_epi16(plane, _mm_cvtsi32_si128(g as i32 - 1))
    };
    _mm256_and_si256(moved, _mm256_set1_epi8(2))
}

/// Bit `s` of every byte of a fifth-bit plane (Q5_0, Q5_1, Q5_K) moved to bit 4 (the
/// fifth bit's place), the other bits clear. The shifts are by 16-bit lanes: the bits a byte takes
/// from its neighbour land below bit 4 (left shifts of at most 4) or above it (right
/// shifts of at most 3), where the mask clears them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fifth_bits(plane: __m256i, s: usize) -> __m256i {
    let moved = if s <= 4 {
        _mm256_sll_epi16(plane, _mm_cvtsi32_si128(4 - s as i32))
    } else {
        _mm256_srl_epi16(plane, _mm_cvtsi32_si128(s as i32 - 4))
    };
    _mm256_and_si256(moved, _mm256_set1_epi8(16))
}

/// The eight code vectors (half `half`) of part `part` (values `32·part..+32`) of a
/// 32-value format's group block: unsigned, except Q8_0's and IQ4_NL's, signed.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy_codes<const F: u8>(block: *const u8, half: usize, part: usize) -> [__m256i; 8] {
    let low = _mm256_set1_epi8(0x0F);
    let mut codes = [_mm256_setzero_si256(); 8];
    // SAFETY: the caller passes a whole group block and a part of its format.
    unsafe {
        let format = PackedFormat::from_id(F);
        let p = block.add(format.codes_at());
        match F {
            Q1_0 => {
                let plane = half_of(block.add(q1_0_plane_at(part)), half);
                for (g, c) in codes.iter_mut().enumerate() {
                    *c = sign_codes(plane, g);
                }
            }
            Q2_0 => {
                let p = p.add(128 * part);
                let [a, b] = [two_bit_quads(p, half), two_bit_quads(p.add(64), half)];
                codes = [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]];
            }
            Q8_0 => {
                for (g, c) in codes.iter_mut().enumerate() {
                    *c = _mm256_xor_si256(half_of(p.add(64 * g), half), _mm256_set1_epi8(-128));
                }
            }
            _ => {
                let nibbles = if format.has_fifth_bit() {
                    p.add(64)
                } else {
                    // NVFP4's parts: four vectors each.
                    p.add(256 * part)
                };
                for k in 0..4 {
                    let v = half_of(nibbles.add(64 * k), half);
                    codes[k] = _mm256_and_si256(v, low);
                    codes[k + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                }
                if format.has_fifth_bit() {
                    let plane = half_of(p, half);
                    for (g, c) in codes.iter_mut().enumerate() {
                        *c = _mm256_or_si256(*c, fifth_bits(plane, g));
                    }
                }
                // Nibbles index levels: MXFP4's unsigned codes, IQ4_NL's signed levels
                // (taken as Q8_0's signed codes are).
                let table = match F {
                    MXFP4 | NVFP4 => Some(MXFP4_CODES.as_ptr()),
                    IQ4_NL => Some(IQ4_LEVELS.as_ptr().cast::<u8>()),
                    _ => None,
                };
                if let Some(table) = table {
                    let levels = _mm256_broadcastsi128_si256(_mm_loadu_si128(table.cast()));
                    for c in codes.iter_mut() {
                        *c = _mm256_shuffle_epi8(levels, *c);
                    }
                }
            }
        }
    }
    codes
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<const F: u8, const N: usize, const PROMPT: bool>(
    w: *const u8,
    groups: usize,
    blocks: usize,
    xs: &[*const u8],
    out: *mut f32,
    out_stride: usize,
) {
    crate::kernels::x86::align_frame!();
    let format = PackedFormat::from_id(F);
    let gb = group_block_bytes::<PROMPT>(format);
    let end = w.wrapping_add(groups * blocks * gb);
    // A prompt-form panel was just written: in the cache.
    let ahead = if PROMPT {
        None
    } else {
        prefetch_ahead(format, Isa::Avx2)
    };
    if let Some(ahead) = ahead {
        prefetch_lines(w, ahead, end);
    }
    for g in 0..groups {
        let group = w.wrapping_add(g * blocks * gb);
        // SAFETY (both branches): the caller's contract: whole groups and activation rows,
        // sixteen outputs per group and token.
        if N <= BLOCK_BY_BLOCK_TOKENS {
            // Both halves block by block, so that the weights stream at an even pace: a
            // half's pass over all blocks would read the memory only while on the first half.
            let mut acc = [[_mm256_setzero_ps(); N]; 2];
            for b in 0..blocks {
                let block = group.wrapping_add(b * gb);
                if let Some(ahead) = ahead {
                    prefetch_lines(block.wrapping_add(ahead), gb, end);
                }
                for (half, acc) in acc.iter_mut().enumerate() {
                    unsafe { half_block::<F, N, PROMPT>(block, half, b, xs, acc) };
                }
            }
            for (half, acc) in acc.iter().enumerate() {
                unsafe { store(acc, out.add(g * GROUP_ROWS + 8 * half), out_stride) };
            }
        } else {
            // Several tokens: the products, not the memory, set the pace, and one half's
            // sums stay in registers while it runs over all blocks; the other half then
            // reads the group from cache.
            for half in 0..2 {
                let mut acc = [_mm256_setzero_ps(); N];
                for b in 0..blocks {
                    let block = group.wrapping_add(b * gb);
                    if half == 0 {
                        if let Some(ahead) = ahead {
                            prefetch_lines(block.wrapping_add(ahead), gb, end);
                        }
                    }
                    unsafe { half_block::<F, N, PROMPT>(block, half, b, xs, &mut acc) };
                }
                unsafe { store(&acc, out.add(g * GROUP_ROWS + 8 * half), out_stride) };
            }
        }
    }
}

/// Up to this many tokens, [`run`] takes a group's two halves block by block; above, one
/// half after the other over all of the group's blocks. Measured under `FERROX_ISA=avx2`
/// (AMD EPYC Zen 4, 2 threads): one token streams the 1.5B Q4_K_M's decode 20% faster block
/// by block, while prompt chunks (four tokens per pass) run 10% slower that way on Q8_0.
const BLOCK_BY_BLOCK_TOKENS: usize = 2;

/// One group block's half `half` into the tokens' sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn half_block<const F: u8, const N: usize, const PROMPT: bool>(
    block: *const u8,
    half: usize,
    b: usize,
    xs: &[*const u8],
    acc: &mut [__m256; N],
) {
    const {
        assert!(
            !PROMPT
                || matches!(
                    F,
                    Q4K | Q5K | Q6K | Q2K | Q3K | Q8_0 | IQ4_NL | IQ4_XS | TQ2_0
                )
        )
    };
    // SAFETY: the caller's contract.
    unsafe {
        match F {
            Q4K => q4k_block::<N, false, PROMPT>(block, half, b, xs, acc),
            Q5K => q4k_block::<N, true, PROMPT>(block, half, b, xs, acc),
            Q6K => q6k_block::<N, PROMPT>(block, half, b, xs, acc),
            Q2K => q2k_block::<N, PROMPT>(block, half, b, xs, acc),
            Q3K => q3k_block::<N, PROMPT>(block, half, b, xs, acc),
            I8K => i8k_block::<N>(block, half, b, xs, acc),
            IQ4_XS => iq4xs_block::<N, PROMPT>(block, half, b, xs, acc),
            TQ2_0 => tq2_block::<N, PROMPT>(block, half, b, xs, acc),
            _ => legacy_block::<F, N, PROMPT>(block, half, b, xs, acc),
        }
    }
}

/// The tokens' eight sums at `out`, token `t`'s `t · out_stride` further.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn store<const N: usize>(acc: &[__m256; N], out: *mut f32, out_stride: usize) {
    for (t, acc) in acc.iter().enumerate() {
        // SAFETY: the caller passes room for eight outputs per token.
        unsafe { _mm256_storeu_ps(out.add(t * out_stride), *acc) };
    }
}

/// One block of a 32-value format, half `half` of the group, into the tokens' sums: its
/// parts (32 values each, one activation block) one after the other.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy_block<const F: u8, const N: usize, const PROMPT: bool>(
    block: *const u8,
    half: usize,
    b: usize,
    xs: &[*const u8],
    acc: &mut [__m256; N],
) {
    let parts = PackedFormat::from_id(F).parts();
    for part in 0..parts {
        // SAFETY: the caller's contract.
        unsafe {
            if F == NVFP4 {
                nvfp4_part::<N>(block, half, (b * parts + part, part), xs, acc);
            } else {
                legacy_part::<F, N, PROMPT>(block, half, (b * parts + part, part), xs, acc);
            }
        }
    }
}

/// Part `part` of an NVFP4 block, against the tokens' activation block `a`: the sums of
/// its two sub-blocks (the low nibbles' values and the high ones'), each from its half of
/// the activations' sum and scaled by its own scale.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nvfp4_part<const N: usize>(
    block: *const u8,
    half: usize,
    (a, part): (usize, usize),
    xs: &[*const u8],
    acc: &mut [__m256; N],
) {
    let bias = PackedFormat::Nvfp4.bias();
    // SAFETY: the caller's contract.
    unsafe {
        let codes = legacy_codes::<NVFP4>(block, half, part);
        let dw = [2 * part, 2 * part + 1].map(|s| f16x8(block.add(nvfp4_scales_at(s) + 16 * half)));
        for (acc, x) in acc.iter_mut().zip(xs) {
            let a = x.add(a * ACTIVATION_BLOCK_BYTES);
            let x_sums = a.add(ACT_SUM_AT).cast::<[i16; 2]>().read_unaligned();
            let dy = _mm256_set1_ps(a.add(ACT_SCALE_AT).cast::<f32>().read_unaligned());
            for (h, x_sum) in x_sums.into_iter().enumerate() {
                // Codes below 25: two runs of four values in one i16 before widening.
                let pairs = _mm256_add_epi16(
                    pairs8(codes[4 * h], codes[4 * h + 1], a.add(16 * h)),
                    pairs8(codes[4 * h + 2], codes[4 * h + 3], a.add(16 * h + 8)),
                );
                let init = _mm256_set1_epi32(bias * -i32::from(x_sum));
                let sum = _mm256_add_epi32(init, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
                *acc = _mm256_fmadd_ps(_mm256_mul_ps(dw[h], dy), _mm256_cvtepi32_ps(sum), *acc);
            }
        }
    }
}

/// Part `part` of [`legacy_block`], against the tokens' activation block `a`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy_part<const F: u8, const N: usize, const PROMPT: bool>(
    block: *const u8,
    half: usize,
    (a, part): (usize, usize),
    xs: &[*const u8],
    acc: &mut [__m256; N],
) {
    let bias = PackedFormat::from_id(F).bias();
    // SAFETY: the caller's contract.
    unsafe {
        // In the prompt form (Q8_0, IQ4_NL) the values and magnitudes are loaded below.
        let codes = if PROMPT {
            [_mm256_setzero_si256(); 8]
        } else {
            legacy_codes::<F>(block, half, part)
        };
        let dw = if PackedFormat::from_id(F).has_f32_scales() {
            _mm256_loadu_ps(block.add(32 * half).cast())
        } else {
            f16x8(block.add(16 * half))
        };
        let activations: [*const u8; N] =
            std::array::from_fn(|t| xs[t].add(a * ACTIVATION_BLOCK_BYTES));
        let mut sums = [_mm256_setzero_si256(); N];
        if matches!(F, Q8_0 | IQ4_NL) {
            // Signed codes by the sign trick, four values at a time for every token, so
            // that a code vector and its magnitudes are live only while they serve.
            for (k, &code) in codes.iter().enumerate() {
                let (code, magnitude) = if PROMPT {
                    (
                        prompt_vector(PackedFormat::from_id(F), block, half, 2 * k),
                        prompt_vector(PackedFormat::from_id(F), block, half, 2 * k + 1),
                    )
                } else {
                    (code, _mm256_abs_epi8(code))
                };
                for (sum, a) in sums.iter_mut().zip(activations) {
                    *sum = dot4_signed(*sum, code, magnitude, a.add(4 * k));
                }
            }
        } else {
            for (sum, a) in sums.iter_mut().zip(activations) {
                // Unsigned codes `w + bias` start from `-bias·Σx`.
                let x_sum = a.add(ACT_SUM_AT).cast::<i32>().read_unaligned();
                *sum = _mm256_set1_epi32(bias * -x_sum);
                // Four-bit codes: all 32 products in i16 halves before one widening; five-bit
                // codes and MXFP4's (below 25): two runs of 16 (see `pairs8`).
                let run = if matches!(F, Q4_0 | Q4_1 | Q1_0 | Q2_0) {
                    8
                } else {
                    4
                };
                for first in (0..8).step_by(run) {
                    let mut pairs = _mm256_setzero_si256();
                    for k in (first..first + run).step_by(2) {
                        let p = pairs8(codes[k], codes[k + 1], a.add(4 * k));
                        pairs = _mm256_add_epi16(pairs, p);
                    }
                    *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
                }
            }
        }
        for ((acc, sum), a) in acc.iter_mut().zip(sums).zip(activations) {
            let dy = _mm256_set1_ps(a.add(ACT_SCALE_AT).cast::<f32>().read_unaligned());
            *acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, dy), _mm256_cvtepi32_ps(sum), *acc);
            if PackedFormat::from_id(F).has_min() {
                // `d·code + m`: the minimums against the activations' sum.
                let m = f16x8(block.add(SCALES_BYTES + 16 * half));
                let x_sum = a.add(ACT_SUM_AT).cast::<i32>().read_unaligned();
                let x_sum = _mm256_set1_ps(x_sum as f32);
                *acc = _mm256_fmadd_ps(_mm256_mul_ps(m, dy), x_sum, *acc);
            }
        }
    }
}

/// The eight code vectors of sub-block `s` of a packed Q4_K super-block (Q5_K when
/// `FIFTH`), half `half` of the group: each row's values `4k..4k + 4` in vector `k`.
// Inlined always (not a target-feature function): a call would pass the vectors
// through memory.
#[inline(always)]
unsafe fn q4k_codes<const FIFTH: bool>(block: *const u8, half: usize, s: usize) -> [__m256i; 8] {
    let low = _mm256_set1_epi8(0x0F);
    // SAFETY: the caller passes a whole packed group block.
    unsafe {
        let raw = block.add(affine_k_codes_at(FIFTH) + 64 * 8 * (s / 2));
        std::array::from_fn(|k| {
            let v = half_of(raw.add(64 * k), half);
            let v = if s.is_multiple_of(2) {
                v
            } else {
                _mm256_srli_epi16::<4>(v)
            };
            let code = _mm256_and_si256(v, low);
            if FIFTH {
                let plane = half_of(block.add(Q5K_PLANES_AT + 64 * k), half);
                _mm256_or_si256(code, fifth_bits(plane, s))
            } else {
                code
            }
        })
    }
}

/// One Q4_K super-block (Q5_K when `FIFTH`), half `half` of the group (see the AVX-512
/// kernel).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_block<const N: usize, const FIFTH: bool, const PROMPT: bool>(
    block: *const u8,
    half: usize,
    b: usize,
    xs: &[*const u8],
    acc: &mut [__m256; N],
) {
    let zero = _mm256_setzero_si256();
    // SAFETY: the caller's contract.
    unsafe {
        let mut scaled = [zero; N];
        for s in 0..8 {
            let codes: [__m256i; 8] = if PROMPT {
                prompt_vectors(PackedFormat::Q4K, block, half, 8 * s)
            } else {
                q4k_codes::<FIFTH>(block, half, s)
            };
            let scale = both_halves(u8x8(block.add(Q4K_SCALES_AT + GROUP_ROWS * s + 8 * half)));
            for t in 0..N {
                let x = xs[t].add(b * Q8K_BYTES + Q8K_CODES_AT + 32 * s);
                // Four-bit codes: all 32 products in i16 halves, then one widening multiply
                // by the scale; five-bit codes: two halves of 16.
                let run = if FIFTH { 4 } else { 8 };
                for first in (0..8).step_by(run) {
                    let mut pairs = zero;
                    for k in (first..first + run).step_by(2) {
                        let p = pairs8(codes[k], codes[k + 1], x.add(4 * k));
                        pairs = _mm256_add_epi16(pairs, p);
                    }
                    scaled[t] = _mm256_add_epi32(scaled[t], _mm256_madd_epi16(pairs, scale));
                }
            }
        }
        let mut mins = [zero; N];
        for s in 0..8 {
            let min = u8x8(block.add(Q4K_MINS_AT + GROUP_ROWS * s + 8 * half));
            let min_pair = _mm256_or_si256(min, _mm256_slli_epi32::<16>(min));
            add_pair_sums(xs, b, s, min_pair, &mut mins);
        }
        add_affine_block(block, Q4K_DMIN_AT, half, b, xs, &scaled, &mins, acc);
    }
}

/// The four code vectors of sixteen-value sub-block `s` of a packed Q6_K super-block, half
/// `half` of the group.
// Inlined always (not a target-feature function): a call would pass the vectors
// through memory.
#[inline(always)]
unsafe fn q6k_codes(block: *const u8, half: usize, s: usize) -> [__m256i; 4] {
    // SAFETY: the caller passes a whole packed group block.
    unsafe {
        let n0 = half_of(block.add(q6k_low_at(2 * s)), half);
        let n1 = half_of(block.add(q6k_low_at(2 * s + 1)), half);
        let hb = half_of(block.add(q6k_high_at(s)), half);
        [
            six_bits(n0, _mm256_slli_epi16::<4>(hb)),
            six_bits(_mm256_srli_epi16::<4>(n0), _mm256_slli_epi16::<2>(hb)),
            six_bits(n1, hb),
            six_bits(_mm256_srli_epi16::<4>(n1), _mm256_srli_epi16::<2>(hb)),
        ]
    }
}

/// One Q6_K super-block, half `half` of the group (see the AVX-512 kernel).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_block<const N: usize, const PROMPT: bool>(
    block: *const u8,
    half: usize,
    b: usize,
    xs: &[*const u8],
    acc: &mut [__m256; N],
) {
    // SAFETY: the caller's contract.
    unsafe {
        offset_block::<N, 5>(
            block,
            half,
            b,
            xs,
            acc,
            #[inline(always)]
            |s| {
                if PROMPT {
                    prompt_vectors(PackedFormat::Q6K, block, half, 4 * s)
                } else {
                    q6k_codes(block, half, s)
                }
            },
            // Six-bit codes: one widening multiply by the scale per eight products.
            #[inline(always)]
            |codes, x, scale| {
                let p0 = _mm256_madd_epi16(pairs8(codes[0], codes[1], x), scale);
                let p1 = _mm256_madd_epi16(pairs8(codes[2], codes[3], x.add(8)), scale);
                _mm256_add_epi32(p0, p1)
            },
        )
    }
}

/// One I8K super-block, half `half` of the group: per sub-block of 16 values and quad, the
/// codes (below 128) times four activation bytes by `maddubs` (pair sums below 2·127·128,
/// no saturation), widened by `madd` with the row's scale; the codes' offset of 64 as
/// `64·Σ scale·Σ x`; then one fused multiply-add, as in the scalar reference.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn i8k_block<const N: usize>(
    block: *const u8,
    half: usize,
    b: usize,
    xs: &[*const u8],
    acc: &mut [__m256; N],
) {
    // SAFETY: the caller's contract.
    unsafe {
        offset_block::<N, 6>(
            block,
            half,
            b,
            xs,
            acc,
            #[inline(always)]
            |s| halves_of(block.add(I8K_CODES_AT + 256 * s), half),
            #[inline(always)]
            |codes, x, scale| {
                let mut sum = _mm256_setzero_si256();
                for (k, code) in codes.iter().enumerate() {
                    let xk = _mm256_set1_epi32(x.add(4 * k).cast::<i32>().read_unaligned());
                    let pairs = _mm256_maddubs_epi16(*code, xk);
                    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, scale));
                }
                sum
            },
        )
    }
}

/// A super-block of signed scales per 16 values and unsigned codes offset by `1 << SHIFT`
/// (Q6_K, I8K), half `half` of the group: `codes(s)` gives sub-block `s`'s four code
/// vectors, `sub_sum(codes, x, scale)` their `scale·Σ code·x` against the sixteen
/// activation bytes at `x` in i32 lanes.
///
/// # Safety
/// The caller's contract of [`half_block`]; the closures read only inside the block and
/// the activation bytes they are given.
#[inline(always)]
unsafe fn offset_block<const N: usize, const SHIFT: i32>(
    block: *const u8,
    half: usize,
    b: usize,
    xs: &[*const u8],
    acc: &mut [__m256; N],
    codes: impl Fn(usize) -> [__m256i; 4],
    sub_sum: impl Fn(&[__m256i; 4], *const u8, __m256i) -> __m256i,
) {
    let zero = _mm256_setzero_si256();
    // SAFETY: the caller's contract (and the features, which every caller enables).
    unsafe {
        let mut scaled = [zero; N];
        let mut offsets = [zero; N];
        for p in 0..8 {
            // Lane r: row r's scales 2p and 2p + 1 as two i16.
            const _: () = assert!(Q6K_SCALES_AT == I8K_SCALES_AT);
            let pair = _mm256_cvtepi8_epi16(_mm_loadu_si128(
                block.add(Q6K_SCALES_AT + 32 * p + 16 * half).cast(),
            ));
            let scales = split_pair(pair);
            for (h, scale) in scales.iter().enumerate() {
                let s = 2 * p + h;
                let codes = codes(s);
                for t in 0..N {
                    let x = xs[t].add(b * Q8K_BYTES + Q8K_CODES_AT + 16 * s);
                    scaled[t] = _mm256_add_epi32(scaled[t], sub_sum(&codes, x, *scale));
                }
            }
            add_pair_sums(xs, b, p, pair, &mut offsets);
        }
        add_offset_block::<N, SHIFT>(block, half, b, xs, &scaled, &offsets, acc);
    }
}

/// The signed levels of 32-value sub-block `s` of a packed IQ4_XS super-block, half `half`
/// of the group: each row's values `4k..4k + 4` in vector `k`.
// Inlined always (not a target-feature function): a call would pass the vectors
// through memory.
#[inline(always)]
unsafe fn iq4xs_values(block: *const u8, half: usize, s: usize) -> [__m256i; 8] {
    let low = _mm256_set1_epi8(0x0F);
    // SAFETY: the caller passes a whole packed group block; the level table is 16 bytes.
    unsafe {
        let levels = _mm256_broadcastsi128_si256(_mm_loadu_si128(IQ4_LEVELS.as_ptr().cast()));
        let mut values = [_mm256_setzero_si256(); 8];
        for k in 0..4 {
            let v = half_of(block.add(iq4xs_codes_at(s) + 64 * k), half);
            values[k] = _mm256_shuffle_epi8(levels, _mm256_and_si256(v, low));
            values[k + 4] =
                _mm256_shuffle_epi8(levels, _mm256_and_si256(_mm256_srli_epi16::<4>(v), low));
        }
        values
    }
}

/// One IQ4_XS super-block, half `half` of the group: per 32-value sub-block the signed
/// levels times the activation bytes by ggml's sign trick (pair sums at most 2·127·128),
/// widened by `madd` with the row's signed scale; then one fused multiply-add, as in the
/// scalar reference (whose `Σ (level + 128)·x − 128·Σ x` is this same integer).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4xs_block<const N: usize, const PROMPT: bool>(
    block: *const u8,
    half: usize,
    b: usize,
    xs: &[*const u8],
    acc: &mut [__m256; N],
) {
    let zero = _mm256_setzero_si256();
    // SAFETY: the caller's contract.
    unsafe {
        let mut scaled = [zero; N];
        for s in 0..8 {
            // Lane r: row r's signed scale in both i16 halves.
            let scale = _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                block
                    .add(IQ4XS_SCALES_AT + GROUP_ROWS * s + 8 * half)
                    .cast(),
            ));
            let scale = _mm256_or_si256(
                _mm256_and_si256(scale, _mm256_set1_epi32(0xFFFF)),
                _mm256_slli_epi32::<16>(scale),
            );
            // In the prompt form the values and magnitudes are loaded below.
            let codes = if PROMPT {
                [zero; 8]
            } else {
                iq4xs_values(block, half, s)
            };
            for t in 0..N {
                let x = xs[t].add(b * Q8K_BYTES + Q8K_CODES_AT + 32 * s);
                let mut sum = zero;
                for (k, code) in codes.iter().enumerate() {
                    let xk = _mm256_set1_epi32(x.add(4 * k).cast::<i32>().read_unaligned());
                    let pairs = if PROMPT {
                        // `|w|·(x·sgn w)`: the magnitudes are the block's, shared by the
                        // tokens (the same products, so the same pair sums).
                        let format = PackedFormat::Iq4Xs;
                        let values = prompt_vector(format, block, half, 16 * s + 2 * k);
                        let magnitudes = prompt_vector(format, block, half, 16 * s + 2 * k + 1);
                        _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(xk, values))
                    } else {
                        _mm256_maddubs_epi16(_mm256_abs_epi8(xk), _mm256_sign_epi8(*code, xk))
                    };
                    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, scale));
                }
                scaled[t] = _mm256_add_epi32(scaled[t], sum);
            }
        }
        add_offset_block::<N, 0>(block, half, b, xs, &scaled, &[zero; N], acc);
    }
}

/// `into[t] += pair · (token t's two activation sums of 16 values at pair index `p`)`: the
/// integer side of the K-quants' minimums and code offsets.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn add_pair_sums<const N: usize>(
    xs: &[*const u8],
    b: usize,
    p: usize,
    pair: __m256i,
    into: &mut [__m256i; N],
) {
    for (t, into) in into.iter_mut().enumerate() {
        // SAFETY: the caller's contract: token `t`'s block `b` is whole.
        let sums = unsafe { xs[t].add(b * Q8K_BYTES + Q8K_SUMS_AT + 4 * p) };
        // SAFETY: as above; four bytes of the sums, read unaligned.
        let sums = _mm256_set1_epi32(unsafe { sums.cast::<i32>().read_unaligned() });
        *into = _mm256_add_epi32(*into, _mm256_madd_epi16(pair, sums));
    }
}

/// Token `t`'s activation scale in block `b`, in every lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn activation_scale(x: *const u8, b: usize) -> __m256 {
    // SAFETY: the caller's contract: the token's block `b` is whole.
    _mm256_set1_ps(unsafe { x.add(b * Q8K_BYTES).cast::<f32>().read_unaligned() })
}

/// An affine K-quant block's float step (Q4_K, Q5_K, Q2_K), as the scalar reference orders
/// it: `acc += (d·dy)·scaled`, then `acc −= (dmin·dy)·mins`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn add_affine_block<const N: usize>(
    block: *const u8,
    dmin_at: usize,
    half: usize,
    b: usize,
    xs: &[*const u8],
    scaled: &[__m256i; N],
    mins: &[__m256i; N],
    acc: &mut [__m256; N],
) {
    // SAFETY: the caller's contract: `block` is a whole group block, each token's block `b`
    // is whole.
    unsafe {
        let dw = f16x8(block.add(16 * half));
        let dmin = f16x8(block.add(dmin_at + 16 * half));
        for t in 0..N {
            let dy = activation_scale(xs[t], b);
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dy), _mm256_cvtepi32_ps(scaled[t]), acc[t]);
            acc[t] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dy), _mm256_cvtepi32_ps(mins[t]), acc[t]);
        }
    }
}

/// An offset K-quant block's float step (Q6_K's codes are the value plus 32, Q3_K's plus 4:
/// `SHIFT` 5 or 2): `acc += (d·dy)·(scaled − offsets << SHIFT)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn add_offset_block<const N: usize, const SHIFT: i32>(
    block: *const u8,
    half: usize,
    b: usize,
    xs: &[*const u8],
    scaled: &[__m256i; N],
    offsets: &[__m256i; N],
    acc: &mut [__m256; N],
) {
    // SAFETY: the caller's contract, as in `add_affine_block`.
    unsafe {
        let dw = f16x8(block.add(16 * half));
        for t in 0..N {
            let dy = activation_scale(xs[t], b);
            let total = _mm256_sub_epi32(scaled[t], _mm256_slli_epi32::<SHIFT>(offsets[t]));
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dy), _mm256_cvtepi32_ps(total), acc[t]);
        }
    }
}

/// Each lane's two i16 (a row's values for two sub-blocks) apart, each in both i16 halves
/// of its lane: multipliers for `_mm256_madd_epi16` (see [`both_halves`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn split_pair(pair: __m256i) -> [__m256i; 2] {
    [
        both_halves(_mm256_srli_epi32::<16>(_mm256_slli_epi32::<16>(pair))),
        _mm256_or_si256(
            _mm256_srli_epi32::<16>(pair),
            _mm256_and_si256(pair, _mm256_set1_epi32(0xFFFF_0000u32 as i32)),
        ),
    ]
}

/// The four quads of a Q2_K or Q3_K code vector (half `half` at `p`): quad `k` in bits
/// `2k..2k+2` of each byte, moved down and masked. The 16-bit shifts bring the next
/// byte's bits only above bit 1, where the mask clears them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn two_bit_quads(p: *const u8, half: usize) -> [__m256i; 4] {
    let mask = _mm256_set1_epi8(3);
    // SAFETY: the caller passes a whole 64-byte vector.
    let v = unsafe { half_of(p, half) };
    [
        _mm256_and_si256(v, mask),
        _mm256_and_si256(_mm256_srli_epi16::<2>(v), mask),
        _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask),
        _mm256_and_si256(_mm256_srli_epi16::<6>(v), mask),
    ]
}

/// Bit `bit` of every byte of a Q3_K plane moved to bit 2 (the third bit's place), the
/// other bits clear. As in [`fifth_bits`], what a 16-bit shift brings from the
/// neighbouring byte lands below bit 2 (left shifts of at most 2) or above it (right
/// shifts of at most 5), where the mask clears it.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn third_bits(plane: __m256i, bit: usize) -> __m256i {
    let moved = if bit <= 2 {
        _mm256_sll_epi16(plane, _mm_cvtsi32_si128(2 - bit as i32))
    } else {
        _mm256_srl_epi16(plane, _mm_cvtsi32_si128(bit as i32 - 2))
    };
    _mm256_and_si256(moved, _mm256_set1_epi8(4))
}

/// `Σ code·x` of one sub-block of 16 values (quads `codes`, activation codes at `x`) in
/// each lane's two i16 halves: at most 8·7·128 for codes below 8, so no widening first.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sub_block16(codes: &[__m256i; 4], x: *const u8) -> __m256i {
    // SAFETY: the caller passes sixteen readable bytes.
    unsafe {
        _mm256_add_epi16(
            pairs8(codes[0], codes[1], x),
            pairs8(codes[2], codes[3], x.add(8)),
        )
    }
}

/// One Q2_K super-block, half `half` of the group: per sub-block `Σ code·x` times its
/// 4-bit scale by one widening multiply; the minimums against the activation's pairs of
/// sums of 16; then the two fused multiply-adds of the scalar reference.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2k_block<const N: usize, const PROMPT: bool>(
    block: *const u8,
    half: usize,
    b: usize,
    xs: &[*const u8],
    acc: &mut [__m256; N],
) {
    let zero = _mm256_setzero_si256();
    // SAFETY: the caller's contract.
    unsafe {
        let mut scaled = [zero; N];
        let mut mins = [zero; N];
        for p in 0..8 {
            // Lane r: row r's scale bytes (`m << 4 | scale`) of sub-blocks 2p and 2p + 1
            // as two i16.
            let pair = _mm256_cvtepu8_epi16(_mm_loadu_si128(
                block.add(Q2K_SCALES_AT + 32 * p + 16 * half).cast(),
            ));
            let scales = split_pair(_mm256_and_si256(pair, _mm256_set1_epi16(15)));
            let min_pair = _mm256_srli_epi16::<4>(pair);
            for (i, scale) in scales.iter().enumerate() {
                let s = 2 * p + i;
                let codes = if PROMPT {
                    prompt_vectors(PackedFormat::Q2K, block, half, 4 * s)
                } else {
                    two_bit_quads(block.add(q2k_codes_at(s)), half)
                };
                for t in 0..N {
                    let x = xs[t].add(b * Q8K_BYTES + Q8K_CODES_AT + 16 * s);
                    let sums = _mm256_madd_epi16(sub_block16(&codes, x), *scale);
                    scaled[t] = _mm256_add_epi32(scaled[t], sums);
                }
            }
            add_pair_sums(xs, b, p, min_pair, &mut mins);
        }
        add_affine_block(block, Q2K_DMIN_AT, half, b, xs, &scaled, &mins, acc);
    }
}

/// One TQ2_0 super-block, half `half` of the group: `Σ code·x` of eight sub-blocks at a
/// time in each lane's two i16 halves (at most 8·8·3·128 for codes below 4), widened, less
/// the activations' sum (the codes are the value plus one); then the scalar reference's
/// fused multiply-add.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tq2_block<const N: usize, const PROMPT: bool>(
    block: *const u8,
    half: usize,
    b: usize,
    xs: &[*const u8],
    acc: &mut [__m256; N],
) {
    let zero = _mm256_setzero_si256();
    // SAFETY: the caller's contract.
    unsafe {
        let mut sums = [zero; N];
        for eighth in 0..2 {
            let mut pairs = [zero; N];
            for s in 8 * eighth..8 * eighth + 8 {
                let codes = if PROMPT {
                    prompt_vectors(PackedFormat::Tq2_0, block, half, 4 * s)
                } else {
                    two_bit_quads(block.add(tq2_codes_at(s)), half)
                };
                for t in 0..N {
                    let x = xs[t].add(b * Q8K_BYTES + Q8K_CODES_AT + 16 * s);
                    pairs[t] = _mm256_add_epi16(pairs[t], sub_block16(&codes, x));
                }
            }
            for t in 0..N {
                let wide = _mm256_madd_epi16(pairs[t], _mm256_set1_epi16(1));
                sums[t] = _mm256_add_epi32(sums[t], wide);
            }
        }
        let mut code_sums = [zero; N];
        for (t, code_sum) in code_sums.iter_mut().enumerate() {
            *code_sum = _mm256_set1_epi32(q8k_code_sum(xs[t].add(b * Q8K_BYTES)));
        }
        add_offset_block::<N, 0>(block, half, b, xs, &sums, &code_sums, acc);
    }
}

/// Sub-block `s`'s four quads of three-bit codes (half `half`): the two low bits and the
/// plane's third.
#[inline(always)]
unsafe fn q3k_codes(block: *const u8, half: usize, s: usize) -> [__m256i; 4] {
    // SAFETY: the caller passes a whole packed group block.
    unsafe {
        let plane = half_of(block.add(q3k_high_at(s / 2)), half);
        let mut codes = two_bit_quads(block.add(q3k_low_at(s)), half);
        for (k, code) in codes.iter_mut().enumerate() {
            *code = _mm256_or_si256(*code, third_bits(plane, 4 * (s % 2) + k));
        }
        codes
    }
}

/// One Q3_K super-block, half `half` of the group: per sub-block `Σ code·x` of the
/// three-bit codes (two low bits and the plane's third) times its signed scale; the codes'
/// offset of 4 as `4·Σ scale·Σ x` against the activation's sums of 16; then one fused
/// multiply-add, as in the scalar reference.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3k_block<const N: usize, const PROMPT: bool>(
    block: *const u8,
    half: usize,
    b: usize,
    xs: &[*const u8],
    acc: &mut [__m256; N],
) {
    let zero = _mm256_setzero_si256();
    // SAFETY: the caller's contract.
    unsafe {
        let mut scaled = [zero; N];
        let mut offsets = [zero; N];
        for p in 0..8 {
            // Lane r: row r's signed scales of sub-blocks 2p and 2p + 1 as two i16.
            let pair = _mm256_cvtepi8_epi16(_mm_loadu_si128(
                block.add(Q3K_SCALES_AT + 32 * p + 16 * half).cast(),
            ));
            let scales = split_pair(pair);
            for (i, scale) in scales.iter().enumerate() {
                let s = 2 * p + i;
                let codes = if PROMPT {
                    prompt_vectors(PackedFormat::Q3K, block, half, 4 * s)
                } else {
                    q3k_codes(block, half, s)
                };
                for t in 0..N {
                    let x = xs[t].add(b * Q8K_BYTES + Q8K_CODES_AT + 16 * s);
                    let sums = _mm256_madd_epi16(sub_block16(&codes, x), *scale);
                    scaled[t] = _mm256_add_epi32(scaled[t], sums);
                }
            }
            add_pair_sums(xs, b, p, pair, &mut offsets);
        }
        add_offset_block::<N, 2>(block, half, b, xs, &scaled, &offsets, acc);
    }
}

/// The low nibbles of `nibbles` with bits 4-5 of `bits`: six-bit codes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn six_bits(nibbles: __m256i, bits: __m256i) -> __m256i {
    _mm256_or_si256(
        _mm256_and_si256(nibbles, _mm256_set1_epi8(0x0F)),
        _mm256_and_si256(bits, _mm256_set1_epi8(0x30)),
    )
}
