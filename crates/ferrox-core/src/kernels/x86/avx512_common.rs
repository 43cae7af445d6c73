//! Building blocks of the AVX-512 VNNI kernels.
//!
//! These kernels keep two weight rows in one 512-bit register: row `r` in the low 256 bits,
//! row `r + 1` in the high 256 bits. Each half then goes through exactly the operations the
//! AVX2 kernel applies to its one 256-bit register (the same integer lane sums, the same
//! float multiplies and fused multiply-adds, the same horizontal sum at the end), so every
//! result is bit-identical to the AVX2 kernel's, while each instruction does the work of
//! two and activation loads and conversions are shared by all the rows of a tile.
//!
//! Functions here take raw pointers: the kernels validate every length once at entry and
//! then address whole blocks inside those bounds.

use std::arch::x86_64::*;

use super::avx2_common::{hsum8_ggml, hsum_ggml};
use crate::kernels::PanelRows;

/// The f16 at `p`, as bits.
#[inline(always)]
pub(super) unsafe fn u16_at(p: *const u8) -> u16 {
    // SAFETY: the caller passes two readable bytes.
    unsafe { p.cast::<u16>().read_unaligned() }
}

/// The little-endian u32 at `p`.
#[inline(always)]
pub(super) unsafe fn u32_at(p: *const u8) -> u32 {
    // SAFETY: the caller passes four readable bytes.
    unsafe { p.cast::<u32>().read_unaligned() }
}

/// 32 bytes from each of `p0` (low half) and `p1` (high half).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn load_pair_32(p0: *const u8, p1: *const u8) -> __m512i {
    // SAFETY: the caller passes 32 readable bytes at each pointer.
    unsafe {
        let low = _mm256_loadu_si256(p0.cast());
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(low), _mm256_loadu_si256(p1.cast()))
    }
}

/// 16 bytes from each of `p0` and `p1` split into nibbles: the low then the high nibbles
/// of `p0`'s bytes in the low half, those of `p1` in the high half (the layout of Q4_0 and
/// Q5_0 codes).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn nibble_pair(p0: *const u8, p1: *const u8) -> __m512i {
    // SAFETY: the caller passes 16 readable bytes at each pointer.
    let both = unsafe {
        let low = _mm_loadu_si128(p0.cast());
        _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(low), _mm_loadu_si128(p1.cast()))
    };
    let wide = _mm512_castsi256_si512(both);
    // 128-bit lanes [p0, p0, p1, p1]; shift lanes 1 and 3 down a nibble.
    let spread = _mm512_shuffle_i64x2::<0b01_01_00_00>(wide, wide);
    let shifted = _mm512_mask_srli_epi16::<4>(spread, 0xFF00_FF00, spread);
    _mm512_and_si512(shifted, _mm512_set1_epi8(0x0F))
}

/// The f16 at `p0` in lanes 0..8 and the one at `p1` in lanes 8..16, as f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn f16_pair(p0: *const u8, p1: *const u8) -> __m512 {
    // SAFETY: the caller passes two readable bytes at each pointer.
    let halves = unsafe { u32::from(u16_at(p0)) | (u32::from(u16_at(p1)) << 16) };
    let spread = _mm256_permutexvar_epi16(
        _mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
        _mm256_castsi128_si256(_mm_cvtsi32_si128(halves as i32)),
    );
    _mm512_cvtph_ps(spread)
}

/// The f16 at `p[0]` in lanes 0..8 and at `p[1]` in lanes 8..16 of the first vector, those
/// at `p[2]` and `p[3]` in the second, as f32 (converted together).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn f16_quad(p: [*const u8; 4]) -> [__m512; 2] {
    // SAFETY: the caller passes two readable bytes at each pointer.
    let halves = unsafe {
        u64::from(u16_at(p[0]))
            | (u64::from(u16_at(p[1])) << 16)
            | (u64::from(u16_at(p[2])) << 32)
            | (u64::from(u16_at(p[3])) << 48)
    };
    let four = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi64_si128(halves as i64)));
    let first = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let second = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    [
        _mm512_permutexvar_ps(first, four),
        _mm512_permutexvar_ps(second, four),
    ]
}

/// The f16 at `p` in all 16 lanes, as f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn f16_broadcast(p: *const u8) -> __m512 {
    // SAFETY: the caller passes two readable bytes.
    _mm512_cvtph_ps(_mm256_set1_epi16(unsafe { u16_at(p) } as i16))
}

/// ggml's horizontal sum ([`hsum_ggml`]) of each register of `v` into `out`, eight at a
/// time (short tiles' results are mostly reductions).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) fn hsum_each(v: &[__m256], out: &mut [f32]) {
    let whole = v.len() / 8 * 8;
    for (v, out) in v[..whole].chunks_exact(8).zip(out.chunks_exact_mut(8)) {
        let sums = hsum8_ggml(std::array::from_fn(|k| v[k]));
        // SAFETY: eight values.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), sums) };
    }
    for (v, out) in v[whole..].iter().zip(&mut out[whole..]) {
        *out = hsum_ggml(*v);
    }
}

/// Rows of a panel (`stride` bytes apart), two to a register. A tile of `P` pairs reads
/// rows `r .. r + 2P`; the last tile repeats its last row to fill its pairs (the copies'
/// results are dropped).
#[inline(always)]
pub(super) fn pair_rows<const P: usize>(
    base: *const u8,
    stride: usize,
    first: usize,
    rows: usize,
) -> [[*const u8; 2]; P] {
    let mut pairs = [[base; 2]; P];
    for (p, pair) in pairs.iter_mut().enumerate() {
        for (h, row) in pair.iter_mut().enumerate() {
            let r = (first + 2 * p + h).min(rows - 1);
            *row = base.wrapping_add(r * stride);
        }
    }
    pairs
}

/// Checks a panel's lengths: `rows` inside `w` (whole blocks of `block_bytes` each, rows
/// not overlapping), each activation `blocks · act_block_bytes` long, `out` `N` values per
/// row. Returns the number of blocks per row.
pub(super) fn panel_shape<const N: usize>(
    w: &[u8],
    rows: PanelRows,
    block_bytes: usize,
    xs: &[&[u8]; N],
    act_block_bytes: usize,
    out: &[f32],
) -> usize {
    assert!(
        rows.bytes > 0 && rows.bytes.is_multiple_of(block_bytes),
        "row length"
    );
    assert!(
        rows.stride >= rows.bytes && w.len() >= rows.span(),
        "rows inside the slice"
    );
    let blocks = rows.bytes / block_bytes;
    assert_eq!(out.len(), rows.count * N, "output length");
    for x in xs {
        assert_eq!(x.len(), blocks * act_block_bytes, "activation row length");
    }
    blocks
}

/// The f16 at `p0` in lanes 0..4 and the one at `p1` in lanes 4..8, as f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn f16_pair4(p0: *const u8, p1: *const u8) -> __m256 {
    // SAFETY: the caller passes two readable bytes at each pointer.
    let halves = unsafe { u32::from(u16_at(p0)) | (u32::from(u16_at(p1)) << 16) };
    let v = _mm_cvtsi32_si128(halves as i32);
    let pairs = _mm_unpacklo_epi16(v, v);
    _mm256_cvtph_ps(_mm_unpacklo_epi32(pairs, pairs))
}

/// `[low | high]`: two 8-lane vectors in one register.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) fn join(low: __m256i, high: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(low), high)
}

/// The sum of the low and high 256-bit halves, as i32 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) fn fold_halves(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// How far ahead of a tile's rows to prefetch, in bytes: at least [`MIN_PREFETCH`], and
/// at least the tile itself, so that each tile's lines are requested while an earlier tile
/// computes (the current and the coming tile still fit in L1). Rows read side by side defeat
/// the hardware prefetchers, which left matrix-vector products bound by memory latency
/// (about 20 GB/s on one core instead of about 40).
#[inline(always)]
pub(super) fn prefetch_distance(tile_bytes: usize) -> usize {
    tile_bytes.max(MIN_PREFETCH)
}

const MIN_PREFETCH: usize = 8192;

/// Asks for the cache line `distance` bytes past `p` (never faults, whatever the address).
#[inline(always)]
pub(crate) fn prefetch_ahead(p: *const u8, distance: usize) {
    // SAFETY: SSE is part of x86-64; a prefetch never faults.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(distance).cast()) }
}

/// Asks for the first `distance` bytes of a panel (the tiles' own prefetches cover the
/// rest), so that a small matrix does not start at memory latency.
#[inline(always)]
pub(super) fn prefetch_start(w: &[u8], distance: usize) {
    for at in (0..distance.min(w.len())).step_by(64) {
        prefetch_ahead(w.as_ptr(), at);
    }
}
