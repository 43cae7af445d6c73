//! AVX-512 kernels of IQ2_XS, IQ3_XXS and IQ3_S that decode grid points in vector
//! registers instead of loading them one by one. (IQ2_XXS gains nothing this way over
//! [`super::avx512_iq`]'s loads, and IQ2_S's 1024-point table makes it slower.)
//!
//! Every coordinate of these grids is one of a few levels (3 for IQ2, 8 for IQ3), so a
//! point is a 16-bit code of level numbers (2 or 3 bits per coordinate). Per super-block
//! the codes of all its points come out of a table held in registers (`vpermi2w` over
//! 64 entries at a time, then blends on the index's higher bits); per two sub-blocks
//! (64 weights) three instructions give the biased weights: `vpermw` spreads the codes
//! one per 64-bit (or 32-bit) lane, `vpmultishiftqb` moves each coordinate's level number
//! into its byte, `vpermb` maps it to the level plus the format's bias. The signs, scales
//! and sums are then those of [`super::avx512_iq`] on 512-bit vectors, so the integers,
//! and the results, are the scalar reference's.

use std::arch::x86_64::*;

use super::avx2_iq::{initial_sums, iq_rows, iq_rows4};
use super::avx512_iq::{IqZmm, Prepared};
use super::avx512_kquants::Q6K_SCALE_INDEX;
use super::{avx2_iq2, avx2_iq3};
use crate::quant::grids::{
    IQ2XS_GRID, IQ2_LARGEST, IQ3S_GRID, IQ3S_LARGEST, IQ3XXS_GRID, IQ3XXS_LARGEST,
};
use crate::quant::iq3::{S_SIGNS_AT, XXS_INDICES_AT};
use crate::quant::kquants::q8_k::CODES_AT;

/// A grid's points as codes of level numbers, 64-byte aligned for the table loads.
#[repr(C, align(64))]
pub(super) struct Codes<const N: usize>([u16; N]);

/// The IQ2 grids' coordinates, in level order.
const IQ2_LEVELS: [u8; 3] = [8, 25, 43];
/// IQ3_XXS's coordinates.
const IQ3XXS_LEVELS: [u8; 8] = [4, 12, 20, 28, 36, 44, 52, 62];
/// IQ3_S's coordinates.
const IQ3S_LEVELS: [u8; 8] = [1, 3, 5, 7, 9, 11, 13, 15];

static IQ2XS_CODES: Codes<512> = Codes(codes8(&IQ2XS_GRID, IQ2_LEVELS));
static IQ3XXS_CODES: Codes<256> = Codes(codes4(&IQ3XXS_GRID, IQ3XXS_LEVELS));
static IQ3S_CODES: Codes<512> = Codes(codes4(&IQ3S_GRID, IQ3S_LEVELS));

/// The position of `value` in `levels` (a compile-time error if absent).
const fn level_number(levels: &[u8], value: u8) -> u16 {
    let mut i = 0;
    while i < levels.len() {
        if levels[i] == value {
            return i as u16;
        }
        i += 1;
    }
    panic!("a grid coordinate that is not one of its levels")
}

/// Codes of 8-coordinate points: coordinate `j`'s level number at bits `2j..2j + 2`.
const fn codes8<const N: usize>(grid: &[u64; N], levels: [u8; 3]) -> [u16; N] {
    let mut out = [0u16; N];
    let mut i = 0;
    while i < N {
        let bytes = grid[i].to_le_bytes();
        let mut j = 0;
        while j < 8 {
            out[i] |= level_number(&levels, bytes[j]) << (2 * j);
            j += 1;
        }
        i += 1;
    }
    out
}

/// Codes of 4-coordinate points: coordinate `j`'s level number at bits `3j..3j + 3`.
const fn codes4<const N: usize>(grid: &[u32; N], levels: [u8; 8]) -> [u16; N] {
    let mut out = [0u16; N];
    let mut i = 0;
    while i < N {
        let bytes = grid[i].to_le_bytes();
        let mut j = 0;
        while j < 4 {
            out[i] |= level_number(&levels, bytes[j]) << (3 * j);
            j += 1;
        }
        i += 1;
    }
    out
}

/// `vpermb`'s table: byte `i` is `bias` plus the level numbered `i mod levels.len()`
/// (the multishift leaves higher bits above a level number; the table ignores them).
const fn biased_levels<const L: usize>(levels: [u8; L], bias: u8) -> [u8; 64] {
    let mut out = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        let level = if L == 3 {
            // Two bits per number; 3 never occurs.
            let n = i % 4;
            if n < 3 {
                levels[n]
            } else {
                0
            }
        } else {
            levels[i % L]
        };
        out[i] = level + bias;
        i += 1;
    }
    out
}

/// An i-quant whose grid points are decoded from codes (see the module's description).
pub(super) trait IqCodes: IqZmm {
    /// Coordinates per point: 8 (2-bit level numbers) or 4 (3-bit).
    const POINT: usize;
    /// The code of each grid point.
    fn codes() -> &'static [u16];
    /// Byte `i`: `B` plus the level numbered `i` (modulo the number of levels).
    const LEVELS: [u8; 64];

    /// The super-block's grid indices as u16 lanes, in point order: 32 in `[0]` for
    /// 8-coordinate points, 64 in `[0]` and `[1]` for 4-coordinate ones. `prepared` is
    /// what [`IqZmm::prepare`] made (by default the indices are read from it).
    ///
    /// # Safety
    /// The CPU must have this module's features; `block` is one whole block.
    #[inline]
    #[target_feature(
        enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
    )]
    unsafe fn indices(_block: &[u8], prepared: &Prepared) -> [__m512i; 2] {
        let index = prepared.index();
        // SAFETY: `index` is 64 readable u16.
        unsafe {
            [
                _mm512_loadu_si512(index.as_ptr().cast()),
                _mm512_loadu_si512(index.as_ptr().add(32).cast()),
            ]
        }
    }

    /// Sub-blocks `2j` and `2j + 1`'s sign bits: bit `e` set where value `64j + e` is
    /// negative.
    fn pair_signs(block: &[u8], prepared: &Prepared, j: usize) -> u64;
}

/// The u16 lanes of `table` at `index` (each below the table's length, a multiple of 64).
#[inline]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
fn look_up(table: &[u16], index: __m512i) -> __m512i {
    let mut parts = [_mm512_setzero_si512(); 16];
    let count = table.len() / 64;
    assert!(count.is_power_of_two() && count <= parts.len());
    for (b, part) in parts.iter_mut().take(count).enumerate() {
        let pair: &[u16; 64] = table[64 * b..].first_chunk().expect("64 entries");
        // SAFETY: `pair` is 128 readable bytes.
        *part = unsafe {
            _mm512_permutex2var_epi16(
                _mm512_loadu_si512(pair.as_ptr().cast()),
                index,
                _mm512_loadu_si512(pair.as_ptr().add(32).cast()),
            )
        };
    }
    // Entry 64b + r came out of part b: halve the parts on index bit 6, 7, ...
    let mut live = count;
    let mut bit = 6;
    while live > 1 {
        let upper = _mm512_test_epi16_mask(index, _mm512_set1_epi16(1 << bit));
        for p in 0..live / 2 {
            parts[p] = _mm512_mask_blend_epi16(upper, parts[2 * p], parts[2 * p + 1]);
        }
        live /= 2;
        bit += 1;
    }
    parts[0]
}

/// `vpermw` indices that spread codes `first..first + 8` (8-coordinate points) one per
/// 64-bit lane, or codes `first..first + 16` (4-coordinate) one per 32-bit lane, each in
/// its lane's low 16 bits.
const fn spread(point: usize, first: usize) -> [u16; 32] {
    let mut out = [0u16; 32];
    let mut i = 0;
    while i < 32 {
        out[i] = (first + i / (point / 2)) as u16 % 32;
        i += 1;
    }
    out
}

/// `vpmultishiftqb`'s offsets: byte `b` of a 64-bit lane takes the level number of its
/// coordinate (bits `2b..` for 8-coordinate points; for 4-coordinate ones bits `3b..` of
/// the lane's low code, then `32 + 3(b − 4)..` of its high code).
const fn field_offsets(point: usize) -> u64 {
    let mut out = [0u8; 8];
    let mut b = 0;
    while b < 8 {
        out[b] = if point == 8 {
            2 * b as u8
        } else if b < 4 {
            3 * b as u8
        } else {
            32 + 3 * (b as u8 - 4)
        };
        b += 1;
    }
    u64::from_le_bytes(out)
}

/// [`spread`] for each pair of sub-blocks.
static SPREAD_8: [[u16; 32]; 4] = [spread(8, 0), spread(8, 8), spread(8, 16), spread(8, 24)];
static SPREAD_4: [[u16; 32]; 2] = [spread(4, 0), spread(4, 16)];
#[inline]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
fn load_u16s<T: Copy>(lanes: &[T; 32]) -> __m512i {
    const { assert!(std::mem::size_of::<T>() == 2) };
    // SAFETY: `lanes` is 64 readable bytes.
    unsafe { _mm512_loadu_si512(lanes.as_ptr().cast()) }
}

/// The format's levels (biased) as 64 bytes, and the bit offsets of a point's fields in
/// each 64-bit lane.
#[inline]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
fn levels_and_offsets<F: IqCodes>() -> (__m512i, __m512i) {
    let levels = F::LEVELS;
    // SAFETY: `levels` is 64 readable bytes.
    let levels = unsafe { _mm512_loadu_si512(levels.as_ptr().cast()) };
    (levels, _mm512_set1_epi64(field_offsets(F::POINT) as i64))
}

/// Which code vector holds the points of sub-blocks `2j` and `2j + 1` (8 from the 32 codes,
/// or 16 from the 64), and the permutation that spreads them.
#[inline]
fn spread_of<F: IqCodes>(j: usize) -> (usize, &'static [u16; 32]) {
    if F::POINT == 8 {
        (0, &SPREAD_8[j])
    } else {
        (j / 2, &SPREAD_4[j % 2])
    }
}

/// One super-block's exact integer sums against each row, as the AVX2 kernel's
/// `super_block` computes them, two sub-blocks at a time.
#[inline]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
fn super_block_codes<F: IqCodes, const N: usize>(
    block: &[u8],
    xs: &[&[u8]; N],
    at: usize,
    _: &mut (),
) -> [__m256i; N] {
    let (scales, isums) = initial_sums::<F, N>(block, xs, at);
    // Made here, not kept between super-blocks: the compiler then forwards its stores to
    // the loads that follow without a trip through memory.
    let mut prepared = Prepared::default();
    // SAFETY: this function's features are the ones `prepare` and `indices` need; `block`
    // is one whole block.
    let index = unsafe {
        F::prepare(block, &mut prepared);
        F::indices(block, &prepared)
    };
    let codes = [
        look_up(F::codes(), index[0]),
        if F::POINT == 4 {
            look_up(F::codes(), index[1])
        } else {
            _mm512_setzero_si512()
        },
    ];
    let (levels, offsets) = levels_and_offsets::<F>();
    let scales = _mm512_castsi256_si512(scales);
    let mut sums = isums.map(|s| _mm512_zextsi256_si512(s));
    for (j, scale_index) in Q6K_SCALE_INDEX.iter().enumerate() {
        let (vector, spread) = spread_of::<F>(j);
        let spread_codes = _mm512_permutexvar_epi16(load_u16s(spread), codes[vector]);
        let numbers = _mm512_multishift_epi64_epi8(offsets, spread_codes);
        let biased = _mm512_permutexvar_epi8(numbers, levels);
        let biased = _mm512_mask_sub_epi8(
            biased,
            F::pair_signs(block, &prepared, j),
            _mm512_set1_epi8(2 * F::BIAS),
            biased,
        );
        // Every u16 lane of the 64 values' products (values 2i, 2i + 1) gets the scale
        // of its 16 values, as Q6_K's chunk pairs.
        let pair_scales = _mm512_permutexvar_epi16(load_u16s(scale_index), scales);
        for (s, x) in sums.iter_mut().zip(xs) {
            // SAFETY: codes `64j..64j + 64` of this block, in bounds as the sums
            // `initial_sums` read.
            let q = unsafe { _mm512_loadu_si512(x.as_ptr().add(at + CODES_AT + 64 * j).cast()) };
            // |pair sum| <= 2·2B·128 < 2¹⁵: no saturation.
            *s = _mm512_dpwssd_epi32(*s, _mm512_maddubs_epi16(biased, q), pair_scales);
        }
    }
    sums.map(|s| _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s)))
}

iq_rows!(
    "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c",
    iq_dot_codes,
    IqCodes,
    super_block_codes
);

/// Four rows' super-blocks against one activation row, each row's sums as
/// [`super_block_codes`] computes them: the four rows' codes are looked up first, then each
/// pair of sub-blocks' activations is loaded once for the four rows.
#[inline]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
fn super_block4_codes<F: IqCodes>(
    blocks: [&[u8]; 4],
    x: &[u8],
    at: usize,
    _: &mut (),
) -> [__m256i; 4] {
    let mut prepared: [Prepared; 4] = Default::default();
    let mut scales = [_mm512_setzero_si512(); 4];
    let mut sums = [_mm512_setzero_si512(); 4];
    let mut codes = [[_mm512_setzero_si512(); 2]; 4];
    for r in 0..4 {
        let (s, [i]) = initial_sums::<F, 1>(blocks[r], &[x], at);
        (scales[r], sums[r]) = (_mm512_castsi256_si512(s), _mm512_zextsi256_si512(i));
        // SAFETY: this function's features are the ones `prepare` and `indices` need;
        // `blocks[r]` is one whole block.
        let index = unsafe {
            F::prepare(blocks[r], &mut prepared[r]);
            F::indices(blocks[r], &prepared[r])
        };
        codes[r][0] = look_up(F::codes(), index[0]);
        if F::POINT == 4 {
            codes[r][1] = look_up(F::codes(), index[1]);
        }
    }
    let (levels, offsets) = levels_and_offsets::<F>();
    for (j, scale_index) in Q6K_SCALE_INDEX.iter().enumerate() {
        let (vector, spread) = spread_of::<F>(j);
        // SAFETY: codes `64j..64j + 64` of this block, in bounds as the sums
        // `initial_sums` read.
        let q = unsafe { _mm512_loadu_si512(x.as_ptr().add(at + CODES_AT + 64 * j).cast()) };
        for r in 0..4 {
            let spread_codes = _mm512_permutexvar_epi16(load_u16s(spread), codes[r][vector]);
            let numbers = _mm512_multishift_epi64_epi8(offsets, spread_codes);
            let biased = _mm512_permutexvar_epi8(numbers, levels);
            let biased = _mm512_mask_sub_epi8(
                biased,
                F::pair_signs(blocks[r], &prepared[r], j),
                _mm512_set1_epi8(2 * F::BIAS),
                biased,
            );
            let pair_scales = _mm512_permutexvar_epi16(load_u16s(scale_index), scales[r]);
            sums[r] = _mm512_dpwssd_epi32(sums[r], _mm512_maddubs_epi16(biased, q), pair_scales);
        }
    }
    sums.map(|s| _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s)))
}

iq_rows4!(
    "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c",
    iq_rows4_codes,
    IqCodes,
    super_block4_codes
);

#[inline]
fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(*bytes[at..].first_chunk().expect("eight bytes"))
}

impl IqCodes for avx2_iq2::Iq2XsAvx2 {
    const POINT: usize = 8;
    fn codes() -> &'static [u16] {
        &IQ2XS_CODES.0
    }
    const LEVELS: [u8; 64] = biased_levels(IQ2_LEVELS, IQ2_LARGEST);

    fn pair_signs(_block: &[u8], prepared: &Prepared, j: usize) -> u64 {
        prepared.pair_sign_mask(j)
    }
}

impl IqCodes for avx2_iq3::Xxs {
    const POINT: usize = 4;
    fn codes() -> &'static [u16] {
        &IQ3XXS_CODES.0
    }
    const LEVELS: [u8; 64] = biased_levels(IQ3XXS_LEVELS, IQ3XXS_LARGEST);

    #[inline]
    #[target_feature(
        enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
    )]
    unsafe fn indices(block: &[u8], _prepared: &Prepared) -> [__m512i; 2] {
        let chunk: &[u8; 64] = block[XXS_INDICES_AT..].first_chunk().expect("64 indices");
        // SAFETY: `chunk` is 64 readable bytes.
        unsafe {
            [
                _mm512_cvtepu8_epi16(_mm256_loadu_si256(chunk.as_ptr().cast())),
                _mm512_cvtepu8_epi16(_mm256_loadu_si256(chunk.as_ptr().add(32).cast())),
            ]
        }
    }

    fn pair_signs(_block: &[u8], prepared: &Prepared, j: usize) -> u64 {
        prepared.pair_sign_mask(j)
    }
}

impl IqCodes for avx2_iq3::S {
    const POINT: usize = 4;
    fn codes() -> &'static [u16] {
        &IQ3S_CODES.0
    }
    const LEVELS: [u8; 64] = biased_levels(IQ3S_LEVELS, IQ3S_LARGEST);

    fn pair_signs(block: &[u8], _prepared: &Prepared, j: usize) -> u64 {
        u64_at(block, S_SIGNS_AT + 8 * j)
    }
}
