//! AVX-512 VNNI panels of Q4_K and Q6_K with Q8_K activations.
//!
//! ggml's AVX2 kernels (and ours, `avx2_kquants`) sum each super-block's products into
//! eight i32 lanes (lane `i` takes values `4i..4i+4` of every 32-value chunk, times the
//! chunk's 16-value sub-block scale), fold the format's minimums or offsets in, and scale
//! the lanes into eight float accumulators. Here a 512-bit register covers two chunks:
//! `vpmaddubsw` makes the same pair sums, `vpdpwssd` scales and accumulates them, and
//! adding the two halves gives exactly the AVX2 lanes (integer sums, in any order). The
//! float steps then run on two rows at once, one per half, exactly as AVX2 runs them, so
//! results are bit-identical to the AVX2 kernels'.
//!
//! A tile is two rows against `N` tokens: each weight super-block is decoded once for all
//! `N` tokens.

use std::arch::x86_64::*;

use super::avx2_common::{hsum4_ggml, hsum_ggml};
use super::avx512_common::{
    f16_pair, f16_pair4, fold_halves, join, pair_rows, panel_shape, prefetch_ahead,
    prefetch_distance, prefetch_start, u32_at,
};
use crate::kernels::{DotKernel, PanelRows};
use crate::quant::kquants::{q4_q5_k, q6_k, q8_k};

const Q8K_BYTES: usize = 292;

/// A 256-value weight format as its AVX-512 kernel sees it.
pub(crate) trait SuperZmm {
    const BYTES: usize;
    /// Offset of the f16 super-block scale.
    const D_AT: usize;
    /// Q4_K: per-32 minimums, folded in four side lanes as ggml's AVX2 kernel does
    /// (offset of the f16 `dmin`).
    const DMIN_AT: Option<usize>;
    /// A decoded super-block.
    type Block: Copy;

    /// # Safety
    /// The CPU must support the AVX-512 kernel features; `p` addresses a whole block.
    unsafe fn decode(p: *const u8) -> Self::Block;

    /// ggml's eight AVX2 integer lanes of the block against the Q8_K block at `x`
    /// (with Q6_K's offset folded in).
    ///
    /// # Safety
    /// As for [`SuperZmm::decode`]; `x` addresses a whole Q8_K block.
    unsafe fn lane_sums(block: &Self::Block, x: *const u8) -> __m256i;

    /// Q4_K: the eight per-32 minimums as i16.
    fn mins(block: &Self::Block) -> __m128i;
}

pub(crate) struct Q4KZmm;
pub(crate) struct Q6KZmm;

/// Word indices picking, for the chunk pair `j`, Q4_K's scale of chunk `2j` for the low 16
/// words and of chunk `2j + 1` for the high 16.
const fn q4k_scale_index(j: usize) -> [i16; 32] {
    let mut idx = [0i16; 32];
    let mut w = 0;
    while w < 32 {
        idx[w] = (2 * j + w / 16) as i16;
        w += 1;
    }
    idx
}

/// Word indices picking, for the chunk pair `j`, Q6_K's four 16-value scales `4j..4j+4`,
/// eight words each.
const fn q6k_scale_index(j: usize) -> [i16; 32] {
    let mut idx = [0i16; 32];
    let mut w = 0;
    while w < 32 {
        idx[w] = (4 * j + w / 8) as i16;
        w += 1;
    }
    idx
}

const Q4K_SCALE_INDEX: [[i16; 32]; 4] = [
    q4k_scale_index(0),
    q4k_scale_index(1),
    q4k_scale_index(2),
    q4k_scale_index(3),
];
/// For the chunk pair `j` (64 values), each word's 16-value scale: `4j + w/8`.
pub(super) const Q6K_SCALE_INDEX: [[i16; 32]; 4] = [
    q6k_scale_index(0),
    q6k_scale_index(1),
    q6k_scale_index(2),
    q6k_scale_index(3),
];

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
fn index_vector(idx: &[i16; 32]) -> __m512i {
    // SAFETY: `idx` is 64 readable bytes.
    unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) }
}

/// The scaled pair sums of four chunk pairs, folded to ggml's eight lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn chunk_sums(codes: &[__m512i; 4], scales: &[__m512i; 4], x: *const u8) -> __m256i {
    let mut sums = _mm512_setzero_si512();
    for j in 0..4 {
        // SAFETY: a Q8_K block holds 256 codes from `CODES_AT`.
        let act = unsafe { _mm512_loadu_si512(x.add(q8_k::CODES_AT + 64 * j).cast()) };
        sums = _mm512_dpwssd_epi32(sums, _mm512_maddubs_epi16(codes[j], act), scales[j]);
    }
    fold_halves(sums)
}

#[derive(Clone, Copy)]
pub(crate) struct Q4KBlock {
    codes: [__m512i; 4],
    scales: [__m512i; 4],
    mins: __m128i,
}

impl SuperZmm for Q4KZmm {
    const BYTES: usize = 144;
    const D_AT: usize = q4_q5_k::D_AT;
    const DMIN_AT: Option<usize> = Some(q4_q5_k::DMIN_AT);
    type Block = Q4KBlock;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn decode(p: *const u8) -> Q4KBlock {
        // ggml's unpacking of the twelve bytes of 6-bit scales and minimums into eight
        // scale bytes then eight minimum bytes.
        const LOW6: u32 = 0x3F3F_3F3F;
        const LOW4: u32 = 0x0F0F_0F0F;
        const LOW2: u32 = 0x0303_0303;
        // SAFETY: the block holds twelve scale bytes at `SCALES_AT`.
        let (u0, u1, u2) = unsafe {
            let s = p.add(q4_q5_k::SCALES_AT);
            (u32_at(s), u32_at(s.add(4)), u32_at(s.add(8)))
        };
        let mins_high = ((u2 >> 4) & LOW4) | (((u1 >> 6) & LOW2) << 4);
        let mins_low = u1 & LOW6;
        let scales_high = (u2 & LOW4) | (((u0 >> 6) & LOW2) << 4);
        let scales_low = u0 & LOW6;
        let packed = _mm_setr_epi32(
            scales_low as i32,
            scales_high as i32,
            mins_low as i32,
            mins_high as i32,
        );
        let words = _mm256_cvtepu8_epi16(packed);
        let wide = _mm512_castsi256_si512(words);
        // Plain loops: LLVM does not inline target-feature closures into `array::map`.
        let mut scales = [wide; 4];
        let mut codes = [wide; 4];
        for j in 0..4 {
            scales[j] = _mm512_permutexvar_epi16(index_vector(&Q4K_SCALE_INDEX[j]), wide);
            // Chunk 2j: low nibbles of bytes 32j..32j+32; chunk 2j+1: their high nibbles.
            // SAFETY: the block holds 128 nibble bytes at `HIGH_BITS_AT`.
            let bytes = unsafe { _mm256_loadu_si256(p.add(q4_q5_k::HIGH_BITS_AT + 32 * j).cast()) };
            let both = _mm512_broadcast_i64x4(bytes);
            let shifted = _mm512_mask_srli_epi16::<4>(both, 0xFFFF_0000, both);
            codes[j] = _mm512_and_si512(shifted, _mm512_set1_epi8(0x0F));
        }
        Q4KBlock {
            codes,
            scales,
            mins: _mm256_extracti128_si256::<1>(words),
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn lane_sums(block: &Q4KBlock, x: *const u8) -> __m256i {
        // SAFETY: the caller's contract.
        unsafe { chunk_sums(&block.codes, &block.scales, x) }
    }

    fn mins(block: &Q4KBlock) -> __m128i {
        block.mins
    }
}

#[derive(Clone, Copy)]
pub(crate) struct Q6KBlock {
    codes: [__m512i; 4],
    scales: [__m512i; 4],
    /// The sixteen scales as i16, for the offset term.
    scales16: __m256i,
}

impl SuperZmm for Q6KZmm {
    const BYTES: usize = 210;
    const D_AT: usize = q6_k::D_AT;
    const DMIN_AT: Option<usize> = None;
    type Block = Q6KBlock;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn decode(p: *const u8) -> Q6KBlock {
        let low_nibbles = _mm512_set1_epi8(0x0F);
        let high_bits = _mm512_set1_epi8(0x30);
        // Chunk pair (4h, 4h+1) shifts the high-bit bytes left by 4 and 2 to put bits
        // 0-1 and 2-3 at bits 4-5; pair (4h+2, 4h+3) right by 0 and 2 for bits 4-5, 6-7.
        let left = _mm512_inserti64x4::<1>(_mm512_set1_epi16(4), _mm256_set1_epi16(2));
        let right = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(2));
        let mut codes = [_mm512_setzero_si512(); 4];
        for h in 0..2 {
            // SAFETY: the block holds 128 low bytes at `LOW_AT` and 64 high-bit bytes at
            // `HIGH_AT`.
            let (low, high) = unsafe {
                (
                    _mm512_loadu_si512(p.add(q6_k::LOW_AT + 64 * h).cast()),
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(
                        p.add(q6_k::HIGH_AT + 32 * h).cast(),
                    )),
                )
            };
            let low_a = _mm512_and_si512(low, low_nibbles);
            let low_b = _mm512_and_si512(_mm512_srli_epi16::<4>(low), low_nibbles);
            let high_a = _mm512_sllv_epi16(high, left);
            let high_b = _mm512_srlv_epi16(high, right);
            // low | (high & 0x30)
            codes[2 * h] = _mm512_ternarylogic_epi32::<0xF8>(low_a, high_a, high_bits);
            codes[2 * h + 1] = _mm512_ternarylogic_epi32::<0xF8>(low_b, high_b, high_bits);
        }
        // SAFETY: the block holds sixteen i8 scales at `SCALES_AT`.
        let scale_bytes = unsafe { _mm_loadu_si128(p.add(q6_k::SCALES_AT).cast()) };
        let scales16 = _mm256_cvtepi8_epi16(scale_bytes);
        let wide = _mm512_castsi256_si512(scales16);
        let mut scales = [wide; 4];
        for j in 0..4 {
            scales[j] = _mm512_permutexvar_epi16(index_vector(&Q6K_SCALE_INDEX[j]), wide);
        }
        Q6KBlock {
            codes,
            scales,
            scales16,
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn lane_sums(block: &Q6KBlock, x: *const u8) -> __m256i {
        // SAFETY: the caller's contract.
        let (sums, group_sums) = unsafe {
            (
                chunk_sums(&block.codes, &block.scales, x),
                _mm256_loadu_si256(x.add(q8_k::SUMS_AT).cast()),
            )
        };
        // Codes are stored +32: subtract 32·scale·(group sum), per ggml's lanes.
        let offset = _mm256_madd_epi16(group_sums, block.scales16);
        _mm256_sub_epi32(sums, _mm256_slli_epi32::<5>(offset))
    }

    fn mins(_block: &Q6KBlock) -> __m128i {
        // SAFETY: SSE2 is part of x86-64.
        unsafe { _mm_setzero_si128() }
    }
}

/// Rows `rows[0]` and `rows[1]` against the `N` activations.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<S: SuperZmm, const N: usize>(
    rows: [*const u8; 2],
    blocks: usize,
    xs: &[*const u8; N],
    prefetch: usize,
) -> [[f32; N]; 2] {
    let mut acc = [_mm512_setzero_ps(); N];
    let mut side = [_mm256_setzero_ps(); N];
    for b in 0..blocks {
        // SAFETY: `b < blocks`: whole blocks of both rows and of every activation.
        unsafe {
            let (p0, p1) = (rows[0].add(b * S::BYTES), rows[1].add(b * S::BYTES));
            // The two rows are consecutive: stream the region `prefetch` bytes ahead, as
            // many lines per step as the step consumes (plus one for alignment).
            let ahead = rows[0].add(prefetch + b * 2 * S::BYTES);
            for line in 0..(2 * S::BYTES).div_ceil(64) + 1 {
                prefetch_ahead(ahead, 64 * line);
            }
            let (w0, w1) = (S::decode(p0), S::decode(p1));
            let d = f16_pair(p0.add(S::D_AT), p1.add(S::D_AT));
            let (dmin, mins) = match S::DMIN_AT {
                Some(at) => (
                    f16_pair4(p0.add(at), p1.add(at)),
                    _mm256_set_m128i(S::mins(&w1), S::mins(&w0)),
                ),
                None => (_mm256_setzero_ps(), _mm256_setzero_si256()),
            };
            for t in 0..N {
                let x = xs[t].add(b * Q8K_BYTES);
                let sums = join(S::lane_sums(&w0, x), S::lane_sums(&w1, x));
                let d8 = x.cast::<f32>().read_unaligned();
                if S::DMIN_AT.is_some() {
                    let g = _mm256_loadu_si256(x.add(q8_k::SUMS_AT).cast());
                    let per_32 =
                        _mm_hadd_epi16(_mm256_castsi256_si128(g), _mm256_extracti128_si256::<1>(g));
                    let lanes = _mm256_madd_epi16(mins, _mm256_set_m128i(per_32, per_32));
                    let scale = _mm256_mul_ps(_mm256_set1_ps(-d8), dmin);
                    side[t] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(lanes), side[t]);
                }
                let scale = _mm512_mul_ps(_mm512_set1_ps(d8), d);
                acc[t] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sums), acc[t]);
            }
        }
    }
    let mut results = [[0.0; N]; 2];
    for t in 0..N {
        let halves = [
            _mm512_castps512_ps256(acc[t]),
            _mm512_extractf32x8_ps::<1>(acc[t]),
        ];
        let sides = [
            _mm256_castps256_ps128(side[t]),
            _mm256_extractf128_ps::<1>(side[t]),
        ];
        for h in 0..2 {
            let sum = hsum_ggml(halves[h]);
            results[h][t] = if S::DMIN_AT.is_some() {
                sum + hsum4_ggml(sides[h])
            } else {
                sum
            };
        }
    }
    results
}

/// A panel of rows of format `S` against `N` Q8_K activation rows; `out[r * N + t]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn panel<S: SuperZmm, const N: usize>(
    w: &[u8],
    layout: PanelRows,
    xs: [&[u8]; N],
    out: &mut [f32],
) {
    crate::kernels::x86::align_frame!();
    let blocks = panel_shape(w, layout, S::BYTES, &xs, Q8K_BYTES, out);
    let rows = layout.count;
    let xs = xs.map(<[u8]>::as_ptr);
    let prefetch = prefetch_distance(2 * layout.stride);
    prefetch_start(w, prefetch);
    for first in (0..rows).step_by(2) {
        let [tile_rows] = pair_rows::<1>(w.as_ptr(), layout.stride, first, rows);
        // SAFETY: every pointer is a row of `w` (whole blocks), every activation holds
        // `blocks` blocks: checked by `panel_shape`.
        let results = unsafe { tile::<S, N>(tile_rows, blocks, &xs, prefetch) };
        let valid = (rows - first).min(2);
        for (i, r) in results.iter().take(valid).enumerate() {
            out[(first + i) * N..(first + i + 1) * N].copy_from_slice(r);
        }
    }
}

/// The safe entries of format `S`'s panels.
pub(super) fn entry<S: SuperZmm>() -> DotKernel {
    fn one<S: SuperZmm>(w: &[u8], xs: [&[u8]; 1]) -> [f32; 1] {
        let mut out = [0.0];
        if !w.is_empty() {
            panel_entry::<S, 1>(w, PanelRows::dense(w, w.len()), xs, &mut out);
        }
        out
    }
    fn panel_entry<S: SuperZmm, const N: usize>(
        w: &[u8],
        rows: PanelRows,
        xs: [&[u8]; N],
        out: &mut [f32],
    ) {
        // SAFETY: handed out only by `avx512_vnni_kernel`, after detecting the features.
        unsafe { panel::<S, N>(w, rows, xs, out) }
    }
    DotKernel {
        one: one::<S>,
        panel1: panel_entry::<S, 1>,
        panel2: panel_entry::<S, 2>,
        panel3: panel_entry::<S, 3>,
        panel4: panel_entry::<S, 4>,
        panel8: panel_entry::<S, 8>,
    }
}
