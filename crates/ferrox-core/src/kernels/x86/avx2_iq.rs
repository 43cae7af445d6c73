//! The shared shape of the i-quant AVX2 kernels (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
//! IQ3_XXS, IQ3_S), which give the scalar reference's results bit for bit: per super-block
//! the exact integer `isum = Σ scale·w·q` (`w` the value's small signed integer weight,
//! `q` the activation code), then `sum = (d_w·d_x).mul_add(isum, sum)`, then the format's
//! factor. Exact integers and one fixed float order make the results independent of the
//! instruction set and of how many activation rows are multiplied together.
//!
//! `maddubs` multiplies unsigned bytes by signed ones. ggml's AVX2 kernels move the
//! weights' signs onto the activations (`sign_epi8`), which wraps at code −128. Here the
//! weights enter biased, `w + B` with `B` the format's largest |w|, so they are unsigned
//! and the codes stay as they are; the bias's share `B·Σ scale·q` comes from the
//! activations' stored sums of 16 codes (exact, as every Q8_K writer stores them; the
//! k-quant kernels rely on them too), once per super-block and row. That is three
//! instructions per row and sub-block, one fewer than ggml's (`|q|` times `w·sgn(q)`, the
//! other exact way, would be one more).
//!
//! Each weight sub-block is decoded once and then serves all `N` activation rows.

use std::arch::x86_64::*;

use crate::quant::int8::{Int8Block, CODE_OFFSET};
use crate::quant::kquants::q8_k::{CODES_AT, SUMS_AT};
use crate::quant::kquants::QK_K;

/// An i-quant as the shared kernel [`iq_dot`] sees it: value `e` of a block is
/// `d·scale(e)·w(e)·FACTOR` with small integers `scale` (per 16 or 32 values) and `w`.
pub(super) trait IqAvx2 {
    const BYTES: usize;
    /// The largest |w|. `2·(2·BIAS)·128` must stay below 2¹⁵ (a pair of `maddubs`) and
    /// `BIAS·scale` fit an i16.
    const BIAS: i8;
    /// The factor applied to the final sum (`None`: none).
    const FACTOR: Option<f32>;
    /// Whether each scale covers 32 values (the two of a sub-block are equal): the format's
    /// [`Int8Expand::SCALE_PER_32`](crate::quant::int8::Int8Expand::SCALE_PER_32).
    const SCALE_PER_32: bool;

    /// The bits of the super-block scale `d`, an f16.
    fn d_bits(block: &[u8]) -> u16;

    /// The super-block scale `d`.
    #[inline]
    fn d(block: &[u8]) -> f32 {
        super::avx2_common::f16_at(&Self::d_bits(block).to_le_bytes(), 0)
    }

    /// The scale of each 16 values in i16 lane `g` (values `16g..16g + 16`, the span of
    /// the activations' stored sum `g`).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    unsafe fn scales(block: &[u8]) -> __m256i;

    /// The multipliers of each 16 values' products, from [`IqAvx2::scales`]'s `scales`
    /// (by default those).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn product_scales(scales: __m256i) -> __m256i {
        scales
    }

    /// The multipliers of the activations' sums of 16 codes that remove what the weights'
    /// offsets added (by default the bias's share, `−B·scale`).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group_factors(_block: &[u8], scales: __m256i) -> __m256i {
        _mm256_mullo_epi16(scales, _mm256_set1_epi16(-i16::from(Self::BIAS)))
    }

    /// What a super-block's sub-blocks share, made once per block by [`IqAvx2::shared`]
    /// (`()` for most formats).
    type Shared;

    /// The block's [`IqAvx2::Shared`].
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `block` is one whole block.
    unsafe fn shared(block: &[u8]) -> Self::Shared;

    /// Sub-block `ib`'s 32 weights plus their offset, unsigned (values `32ib..32ib + 32`):
    /// by default `w + BIAS`. `shared` is the block's [`IqAvx2::shared`].
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    unsafe fn biased(block: &[u8], shared: &Self::Shared, ib: usize) -> __m256i;

    /// Sub-block `ib`'s codes in the int8 form (`v + 64`, see [`crate::quant::int8`]) from
    /// [`IqAvx2::biased`]'s (by default `v + BIAS`).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `block` is one whole block.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn int8_codes(_block: &[u8], biased: __m256i, _ib: usize) -> __m256i {
        _mm256_add_epi8(
            biased,
            _mm256_set1_epi8((CODE_OFFSET - i32::from(Self::BIAS)) as i8),
        )
    }
}

/// `block`'s integer form ([`Int8Block`]) from the kernel's own sub-block values: what
/// [`Int8Expand::expand`] makes, bit for bit. The prompt path expands every row once per
/// panel, and the scalar expansion took about a quarter of a prompt product.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `block` is one whole block.
///
/// [`Int8Expand::expand`]: crate::quant::int8::Int8Expand::expand
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn expand_int8<F: IqAvx2>(block: &[u8], out: &mut Int8Block) {
    // SAFETY: the caller's contract.
    unsafe {
        expand_int8_with::<F>(
            block,
            out,
            #[inline(always)]
            |block, shared, ib| F::biased(block, shared, ib),
        )
    }
}

/// [`expand_int8`] with each sub-block's values from `biased` (as `F::biased` gives them).
///
/// # Safety
/// As [`expand_int8`], from a caller that enables its features.
#[inline(always)]
pub(super) unsafe fn expand_int8_with<F: IqAvx2>(
    block: &[u8],
    out: &mut Int8Block,
    biased: impl Fn(&[u8], &F::Shared, usize) -> __m256i,
) {
    // SAFETY: the caller's contract.
    unsafe {
        out.d_bits = F::d_bits(block);
        store_scales(F::scales(block), out);
        let shared = F::shared(block);
        for ib in 0..QK_K / 32 {
            let values = biased(block, &shared, ib);
            store_codes(F::int8_codes(block, values, ib), ib, out);
        }
    }
}

/// Defines `$name(block, out)`: [`expand_int8`] for `$format` with its sub-block values
/// from `$biased`, an inline-always body of its [`IqAvx2::biased`], for formats whose
/// trait method the expansion's loop left out of line (a call per sub-block, the vector
/// returned through memory); marking the method itself inline-always slowed their row
/// kernels.
macro_rules! inline_expansion {
    ($name:ident, $format:ty, $biased:ident) => {
        /// The int8 expansion with the sub-block values in line (see `inline_expansion!`).
        ///
        /// # Safety
        /// The CPU must support AVX2, FMA and F16C; `block` is one whole block.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe fn $name(block: &[u8], out: &mut $crate::quant::int8::Int8Block) {
            // SAFETY: the caller's contract.
            unsafe {
                $crate::kernels::x86::avx2_iq::expand_int8_with::<$format>(
                    block,
                    out,
                    #[inline(always)]
                    |block, shared, ib| $biased(block, shared, ib),
                )
            }
        }
    };
}
pub(super) use inline_expansion;

/// The sixteen i16 scales as the int8 form's bytes (odd scales of at most 31: nothing lost).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn store_scales(scales: __m256i, out: &mut Int8Block) {
    let bytes = _mm_packs_epi16(
        _mm256_castsi256_si128(scales),
        _mm256_extracti128_si256::<1>(scales),
    );
    // SAFETY: 16 writable bytes.
    unsafe { _mm_storeu_si128(out.scales.as_mut_ptr().cast(), bytes) };
}

/// Sub-block `ib`'s 32 codes into the int8 form.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn store_codes(codes: __m256i, ib: usize, out: &mut Int8Block) {
    let dst: &mut [u64; 4] = out.codes[4 * ib..].first_chunk_mut().expect("4 words");
    // SAFETY: 32 writable bytes.
    unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), codes) };
}

/// The first 32 bytes of `bytes`, for a block's scales. A plain load there lets LLVM take
/// the block's other fields in those bytes (grid indices, sign words) out of this vector,
/// two vector instructions each, instead of loading them; `lddqu` is opaque to it.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn opaque_load_32(bytes: &[u8]) -> __m256i {
    let chunk: &[u8; 32] = bytes.first_chunk().expect("a 32-byte chunk");
    // SAFETY: `chunk` is 32 readable bytes; `lddqu` has no alignment requirement.
    unsafe { _mm256_lddqu_si256(chunk.as_ptr().cast()) }
}

/// Sixteen 4-bit fields as i16 lanes, from the eight bytes of `bytes` (low nibble first).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn nibbles16(bytes: u64) -> __m256i {
    _mm256_cvtepu8_epi16(nibble_bytes(_mm_cvtsi64_si128(bytes as i64)))
}

/// The 16 nibbles of the low eight bytes of `x` as bytes, low nibble first.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn nibble_bytes(x: __m128i) -> __m128i {
    let low = _mm_set1_epi8(0x0F);
    _mm_unpacklo_epi8(
        _mm_and_si128(x, low),
        _mm_and_si128(_mm_srli_epi16::<4>(x), low),
    )
}

/// `2s + 1` in each i16 lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn odd(s: __m256i) -> __m256i {
    _mm256_or_si256(_mm256_slli_epi16::<1>(s), _mm256_set1_epi16(1))
}

/// A super-block's product scales, and each row's sums started at minus the weights'
/// offsets' share (e.g. −B·Σ scale·(sum of 16 codes), exact). Both kernels begin here.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn initial_sums<F: IqAvx2, const N: usize>(
    block: &[u8],
    xs: &[&[u8]; N],
    at: usize,
) -> (__m256i, [__m256i; N]) {
    // SAFETY: this function's features are the ones `scales` and its hooks need.
    let (scales, group_factors) = unsafe {
        let scales = F::scales(block);
        (F::product_scales(scales), F::group_factors(block, scales))
    };
    let isums = xs.map(|x| {
        // SAFETY: the block's 16 stored sums end where it ends: in bounds (checked by
        // `check_rows`).
        let group_sums = unsafe { _mm256_loadu_si256(x.as_ptr().add(at + SUMS_AT).cast()) };
        _mm256_madd_epi16(group_sums, group_factors)
    });
    (scales, isums)
}

/// The i32 lanes of `scales`: sub-block `ib`'s pair of i16 scales at `[ib]`, for a
/// broadcast from memory (a load-port operand where `vpermd` would take the shuffle port
/// once per row and sub-block).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scale_pairs(scales: __m256i) -> [i32; 8] {
    let mut pairs = [0i32; 8];
    // SAFETY: 32 writable bytes; `storeu` needs no alignment.
    unsafe { _mm256_storeu_si256(pairs.as_mut_ptr().cast(), scales) };
    pairs
}

/// `$body` for each of a super-block's eight sub-blocks, `$ib` a constant: written out,
/// since the compiler's own unrolling of these loops comes and goes with unrelated
/// changes (kept rolled, the four-token IQ2_XXS kernel measured 10% slower).
macro_rules! each_sub_block {
    ($ib:ident => $body:block) => {
        each_sub_block!(@ $ib => $body; 0 1 2 3 4 5 6 7)
    };
    (@ $ib:ident => $body:block; $($k:literal)*) => {
        $({
            let $ib: usize = $k;
            $body
        })*
    };
}

/// One super-block's exact integer sums against each row, in eight i32 lanes per row.
/// `at` is the block's offset in the activation rows.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn super_block<F: IqAvx2, const N: usize>(
    block: &[u8],
    xs: &[&[u8]; N],
    at: usize,
    _: &mut (),
) -> [__m256i; N] {
    let (scales, mut isums) = initial_sums::<F, N>(block, xs, at);
    // Sub-block ib's scales are i16 lanes 2ib and 2ib + 1 (i32 lane ib): every i32 lane
    // gets that pair, then the low half repeats its first i16, the high half its second.
    let halves = _mm256_setr_epi8(
        0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, //
        2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
    );
    // SAFETY: as above.
    let shared = unsafe { F::shared(block) };
    each_sub_block!(ib => {
        // SAFETY: as above.
        let biased = unsafe { F::biased(block, &shared, ib) };
        let pair = _mm256_permutevar8x32_epi32(scales, _mm256_set1_epi32(ib as i32));
        let sub_scales = if F::SCALE_PER_32 {
            pair
        } else {
            _mm256_shuffle_epi8(pair, halves)
        };
        for (s, x) in isums.iter_mut().zip(xs) {
            // SAFETY: as the sums above, for this block's codes `32ib..32ib + 32`; `loadu`
            // has no alignment requirement.
            let q = unsafe { _mm256_loadu_si256(x.as_ptr().add(at + CODES_AT + 32 * ib).cast()) };
            // |pair sum| <= 2·2B·128 < 2¹⁵: no saturation.
            let products = _mm256_maddubs_epi16(biased, q);
            *s = _mm256_add_epi32(*s, _mm256_madd_epi16(products, sub_scales));
        }
    });
    isums
}

/// The sum of the eight i32 lanes of `v` as f32 (`isum as f32`), without a round trip
/// through a general register.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn lane_sum_f32(v: __m256i) -> f32 {
    let q = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let q = _mm_add_epi32(q, _mm_unpackhi_epi64(q, q));
    let q = _mm_add_epi32(q, _mm_shuffle_epi32::<0b01>(q));
    _mm_cvtss_f32(_mm_cvtepi32_ps(q))
}

/// Defines `$name::<F, N>(w, xs)`: one weight row of format `F` against `N` Q8_K
/// activation rows, compiled with `$features`, each super-block's integer sums from
/// `$super_block::<F, N>(block, &xs, at, scratch)` (`scratch` a `Default` buffer of the
/// super-block function's choosing, made once per row). The AVX2 and AVX-512 kernels share
/// it, so both apply the same float operations to the same integers.
macro_rules! iq_rows {
    ($features:literal, $name:ident, $bound:path, $super_block:ident) => {
        #[target_feature(enable = $features)]
        pub(super) fn $name<F: $bound, const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
            $crate::kernels::x86::align_frame!();
            use $crate::kernels::x86::avx2_common::{check_rows, f32_at, hsums_i32};
            use $crate::quant::kquants::q8_k::Q8K;
            use $crate::quant::BlockFormat;
            check_rows(w, F::BYTES, Q8K::BYTES, &xs);
            let mut sums = [0f32; N];
            let ahead = $crate::kernels::prefetch::row_major_ahead();
            // What the super-blocks prepare into, made (and zeroed) once per row.
            let mut scratch = Default::default();
            for (i, block) in w.chunks_exact(F::BYTES).enumerate() {
                let at = i * Q8K::BYTES;
                if ahead > 0 {
                    $crate::kernels::x86::prefetch_ahead(block.as_ptr(), ahead);
                }
                let isums = $super_block::<F, N>(block, &xs, at, &mut scratch);
                let dw = F::d(block);
                if N == 1 {
                    let isum = $crate::kernels::x86::avx2_iq::lane_sum_f32(isums[0]);
                    sums[0] = (dw * f32_at(xs[0], at)).mul_add(isum, sums[0]);
                    continue;
                }
                for ((sum, isum), x) in sums.iter_mut().zip(hsums_i32(isums)).zip(&xs) {
                    *sum = (dw * f32_at(x, at)).mul_add(isum as f32, *sum);
                }
            }
            sums.map(|s| F::FACTOR.map_or(s, |f| f * s))
        }
    };
}
pub(super) use iq_rows;

/// Defines `$name::<F>(rows, x)`: four weight rows of format `F` against one Q8_K
/// activation row (a decode step), each super-block's four integer sums from
/// `$super_block4::<F>(blocks, x, at, scratch)`, which must equal [`iq_rows`]'s per row.
/// The four rows' lane sums and float steps are done side by side in the lanes of one
/// vector: each lane the single-row operations in the single-row order, so every row gets
/// the bits of the single-row kernel.
macro_rules! iq_rows4 {
    ($features:literal, $name:ident, $bound:path, $super_block4:ident) => {
        #[target_feature(enable = $features)]
        pub(super) fn $name<F: $bound>(rows: [&[u8]; 4], x: &[u8]) -> [f32; 4] {
            $crate::kernels::x86::align_frame!();
            use std::arch::x86_64::*;
            use $crate::kernels::x86::avx2_common::{check_rows, f32_at};
            use $crate::quant::kquants::q8_k::Q8K;
            use $crate::quant::BlockFormat;
            let blocks = rows[0].len() / F::BYTES;
            for w in rows {
                assert_eq!(w.len(), blocks * F::BYTES, "weight row length");
            }
            check_rows(rows[0], F::BYTES, Q8K::BYTES, &[x]);
            let mut sums = _mm_setzero_ps();
            let ahead = $crate::kernels::prefetch::row_major_ahead();
            // What the super-blocks prepare into, made (and zeroed) once per call.
            let mut scratch = Default::default();
            for i in 0..blocks {
                let at = i * Q8K::BYTES;
                if ahead > 0 {
                    // Four streams at once: Intel's prefetchers alone leave them short.
                    for w in rows {
                        $crate::kernels::x86::prefetch_ahead(w.as_ptr(), i * F::BYTES + ahead);
                    }
                }
                let block: [&[u8]; 4] = [
                    &rows[0][i * F::BYTES..][..F::BYTES],
                    &rows[1][i * F::BYTES..][..F::BYTES],
                    &rows[2][i * F::BYTES..][..F::BYTES],
                    &rows[3][i * F::BYTES..][..F::BYTES],
                ];
                let isums = $super_block4::<F>(block, x, at, &mut scratch);
                // Lane r of each half: row r's sum over that half.
                let halves = _mm256_hadd_epi32(
                    _mm256_hadd_epi32(isums[0], isums[1]),
                    _mm256_hadd_epi32(isums[2], isums[3]),
                );
                let isum = _mm_add_epi32(
                    _mm256_castsi256_si128(halves),
                    _mm256_extracti128_si256::<1>(halves),
                );
                let halves = block.map(|b| u64::from(F::d_bits(b)));
                let halves = halves[0] | halves[1] << 16 | halves[2] << 32 | halves[3] << 48;
                // Exact, as the single-row kernel's conversion.
                let dw = _mm_cvtph_ps(_mm_cvtsi64_si128(halves as i64));
                let scale = _mm_mul_ps(dw, _mm_set1_ps(f32_at(x, at)));
                sums = _mm_fmadd_ps(scale, _mm_cvtepi32_ps(isum), sums);
            }
            if let Some(f) = F::FACTOR {
                sums = _mm_mul_ps(_mm_set1_ps(f), sums);
            }
            let mut out = [0f32; 4];
            // SAFETY: `out` is four writable f32s; `storeu` needs no alignment.
            unsafe { _mm_storeu_ps(out.as_mut_ptr(), sums) };
            out
        }
    };
}
pub(super) use iq_rows4;

iq_rows!("avx2,fma,f16c", iq_dot, IqAvx2, super_block);

/// Four rows' super-blocks against one activation row, each row's sums as [`super_block`]
/// computes them, the sub-block's activations loaded once for the four rows.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn super_block4<F: IqAvx2>(blocks: [&[u8]; 4], x: &[u8], at: usize, _: &mut ()) -> [__m256i; 4] {
    let mut scales = [_mm256_setzero_si256(); 4];
    let mut isums = [_mm256_setzero_si256(); 4];
    for r in 0..4 {
        let (s, [i]) = initial_sums::<F, 1>(blocks[r], &[x], at);
        (scales[r], isums[r]) = (s, i);
    }
    let mut lane = _mm256_setzero_si256();
    let halves = _mm256_setr_epi8(
        0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, //
        2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
    );
    // Written out, not mapped: the compiler left a mapping closure out of line.
    let pairs = [
        scale_pairs(scales[0]),
        scale_pairs(scales[1]),
        scale_pairs(scales[2]),
        scale_pairs(scales[3]),
    ];
    // SAFETY: this function's features are the ones `shared` needs; whole blocks.
    let shared = unsafe {
        [
            F::shared(blocks[0]),
            F::shared(blocks[1]),
            F::shared(blocks[2]),
            F::shared(blocks[3]),
        ]
    };
    // Kept in memory, to be broadcast from there: read back from registers, each read
    // would take a shuffle.
    let (pairs, shared) = std::hint::black_box((&pairs, &shared));
    // `ib` also places the activations and the blocks' sub-blocks.
    #[allow(clippy::needless_range_loop)]
    for ib in 0..QK_K / 32 {
        // SAFETY: codes `32ib..32ib + 32` of this block, in bounds as `initial_sums`'s.
        let q = unsafe { _mm256_loadu_si256(x.as_ptr().add(at + CODES_AT + 32 * ib).cast()) };
        // Written out per row: as a loop the compiler kept it rolled for IQ3_XXS, the four
        // sums in memory.
        macro_rules! row {
            ($r:literal) => {{
                // SAFETY: this function's features are the ones `biased` needs.
                let biased = unsafe { F::biased(blocks[$r], &shared[$r], ib) };
                let sub_scales = if F::SCALE_PER_32 {
                    _mm256_set1_epi32(pairs[$r][ib])
                } else {
                    _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(scales[$r], lane), halves)
                };
                let products = _mm256_maddubs_epi16(biased, q);
                isums[$r] = _mm256_add_epi32(isums[$r], _mm256_madd_epi16(products, sub_scales));
            }};
        }
        row!(0);
        row!(1);
        row!(2);
        row!(3);
        lane = _mm256_add_epi32(lane, _mm256_set1_epi32(1));
    }
    isums
}

iq_rows4!("avx2,fma,f16c", iq_rows4_avx2, IqAvx2, super_block4);
