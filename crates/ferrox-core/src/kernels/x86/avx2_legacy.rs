//! AVX2 dot products of the 32-value formats with Q8_0/Q8_1 activations.
//!
//! Per block, the 32 weight codes become one vector; its products with the activation
//! codes are summed four adjacent bytes per i32 lane, converted to float and multiplied
//! into eight float lanes by FMA, which are added up with ggml's horizontal sum at the end:
//! the same order as ggml's AVX2 kernels, so results match theirs bit for bit.

use std::arch::x86_64::*;

use super::avx2_common::{
    bits_to_byte_mask, f16_product, f16x4, hsum8_ggml, hsum_ggml, hsum_i32, load_32,
    pair_sums_signed, pair_sums_unsigned, quads, split_nibbles, zeros,
};
use crate::kernels::PanelRows;
use crate::quant::fp4::{self, e8m0_half};
use crate::quant::iq4::LEVELS;

const Q8_0_BYTES: usize = 34;
const Q8_1_BYTES: usize = 36;

/// How ggml's AVX2 kernel for a format turns block sums into the result.
#[derive(PartialEq, Eq)]
pub(super) enum Accumulation {
    /// `acc = fma(dx·dy, sums, acc)`; result `hsum(acc)`.
    Scaled,
    /// As `Scaled`, plus a scalar `summs = fma(m, s, summs)` for the block minimum;
    /// result `hsum(acc) + summs`.
    ScaledWithMin,
    /// Even and odd blocks in two accumulators, added before the horizontal sum; an odd
    /// last block is added afterwards in scalar arithmetic (IQ4_NL).
    PairedBlocks,
}

/// A 32-value weight format, as its AVX2 kernel sees it.
pub(super) trait LegacyAvx2 {
    const BYTES: usize;
    /// Activation block size: Q8_0 or Q8_1.
    const ACTIVATION_BYTES: usize;
    /// Whether the codes are signed (otherwise they are 0..=31).
    const SIGNED: bool;
    const ACCUMULATION: Accumulation;

    /// The block's 32 codes, value `j` in byte `j`.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    unsafe fn codes(block: &[u8]) -> __m256i;

    /// The product of the weight block's and the activation block's scales (both f16 at
    /// their start, unless the format says otherwise).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scale(block: &[u8], activation: &[u8]) -> f32 {
        f16_product(block, activation)
    }
}

pub(super) struct Q4_0Avx2;
pub(super) struct Q4_1Avx2;
pub(super) struct Q5_0Avx2;
pub(super) struct Q5_1Avx2;
pub(super) struct Q8_0Avx2;
pub(super) struct Iq4NlAvx2;
pub(super) struct Mxfp4Avx2;

/// The fifth bits of Q5_0/Q5_1 as a byte mask.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fifth_bits(block: &[u8], at: usize) -> __m256i {
    let bits = u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]);
    bits_to_byte_mask(bits)
}

impl LegacyAvx2 for Q4_0Avx2 {
    const BYTES: usize = 18;
    const ACTIVATION_BYTES: usize = Q8_0_BYTES;
    const SIGNED: bool = true;
    const ACCUMULATION: Accumulation = Accumulation::Scaled;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn codes(block: &[u8]) -> __m256i {
        _mm256_sub_epi8(split_nibbles(&block[2..]), _mm256_set1_epi8(8))
    }
}

impl LegacyAvx2 for Q4_1Avx2 {
    const BYTES: usize = 20;
    const ACTIVATION_BYTES: usize = Q8_1_BYTES;
    const SIGNED: bool = false;
    const ACCUMULATION: Accumulation = Accumulation::ScaledWithMin;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn codes(block: &[u8]) -> __m256i {
        split_nibbles(&block[4..])
    }
}

impl LegacyAvx2 for Q5_0Avx2 {
    const BYTES: usize = 22;
    const ACTIVATION_BYTES: usize = Q8_0_BYTES;
    const SIGNED: bool = true;
    const ACCUMULATION: Accumulation = Accumulation::Scaled;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn codes(block: &[u8]) -> __m256i {
        // code − 16 in two's complement: a clear fifth bit sets the top four bits.
        let negative = _mm256_andnot_si256(fifth_bits(block, 2), _mm256_set1_epi8(0xF0u8 as i8));
        _mm256_or_si256(split_nibbles(&block[6..]), negative)
    }
}

impl LegacyAvx2 for Q5_1Avx2 {
    const BYTES: usize = 24;
    const ACTIVATION_BYTES: usize = Q8_1_BYTES;
    const SIGNED: bool = false;
    const ACCUMULATION: Accumulation = Accumulation::ScaledWithMin;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn codes(block: &[u8]) -> __m256i {
        let high = _mm256_and_si256(fifth_bits(block, 4), _mm256_set1_epi8(0x10));
        _mm256_or_si256(split_nibbles(&block[8..]), high)
    }
}

impl LegacyAvx2 for Q8_0Avx2 {
    const BYTES: usize = 34;
    const ACTIVATION_BYTES: usize = Q8_0_BYTES;
    const SIGNED: bool = true;
    const ACCUMULATION: Accumulation = Accumulation::Scaled;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn codes(block: &[u8]) -> __m256i {
        load_32(&block[2..])
    }
}

/// IQ4_NL's non-linear levels for 32 nibble indices, looked up by byte shuffle.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq4_levels(indices: __m256i) -> __m256i {
    levels(LEVELS, indices)
}

/// A 16-entry table looked up for 32 nibble indices by byte shuffle.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn levels(l: [i8; 16], indices: __m256i) -> __m256i {
    let table = _mm_setr_epi8(
        l[0], l[1], l[2], l[3], l[4], l[5], l[6], l[7], l[8], l[9], l[10], l[11], l[12], l[13],
        l[14], l[15],
    );
    _mm256_shuffle_epi8(_mm256_set_m128i(table, table), indices)
}

impl LegacyAvx2 for Iq4NlAvx2 {
    const BYTES: usize = 18;
    const ACTIVATION_BYTES: usize = Q8_0_BYTES;
    const SIGNED: bool = true;
    const ACCUMULATION: Accumulation = Accumulation::PairedBlocks;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn codes(block: &[u8]) -> __m256i {
        iq4_levels(split_nibbles(&block[2..]))
    }
}

impl LegacyAvx2 for Mxfp4Avx2 {
    const BYTES: usize = 17;
    const ACTIVATION_BYTES: usize = Q8_0_BYTES;
    const SIGNED: bool = true;
    const ACCUMULATION: Accumulation = Accumulation::PairedBlocks;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn codes(block: &[u8]) -> __m256i {
        levels(fp4::LEVELS, split_nibbles(&block[1..]))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scale(block: &[u8], activation: &[u8]) -> f32 {
        // ggml: the activation's f16 scale (converted with F16C) times half the weight's
        // E8M0 scale.
        let d = i32::from(u16::from_le_bytes([activation[0], activation[1]]));
        let dy = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(d)));
        dy * e8m0_half(block[0])
    }
}

/// The i32 lane sums of one block's products (four adjacent values per lane).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn block_sums<L: LegacyAvx2>(codes: __m256i, activation: &[u8]) -> __m256i {
    let q8 = load_32(&activation[L::ACTIVATION_BYTES - 32..]);
    if L::SIGNED {
        quads(pair_sums_signed(codes, q8))
    } else {
        quads(pair_sums_unsigned(codes, q8))
    }
}

/// Adds block `$ib` (weights `$wb`) of every activation row into `$acc`, ggml's way.
/// A macro rather than a function: LLVM would not inline a `#[target_feature]` helper
/// called from three places, and a call per 32 values costs more than the block.
macro_rules! add_block {
    ($L:ty, $ib:expr, $wb:expr, $xs:expr, $acc:expr, $summs:expr) => {{
        let (ib, wb) = ($ib, $wb);
        // SAFETY: only expanded inside functions with AVX2, FMA and F16C enabled.
        let codes = unsafe { <$L>::codes(wb) };
        for ((acc, summs), x) in $acc.iter_mut().zip($summs.iter_mut()).zip($xs) {
            let xb = &x[ib * <$L>::ACTIVATION_BYTES..(ib + 1) * <$L>::ACTIVATION_BYTES];
            let sums = _mm256_cvtepi32_ps(block_sums::<$L>(codes, xb));
            if <$L>::ACCUMULATION == Accumulation::ScaledWithMin {
                // [dx, m, dy, s]: d = dx·dy, and lane 1 keeps summs = fma(m, s, summs).
                let scales = f16x4(wb, xb);
                let act = _mm_movehl_ps(scales, scales);
                let d = _mm256_broadcastss_ps(_mm_mul_ss(scales, act));
                *acc = _mm256_fmadd_ps(d, sums, *acc);
                *summs = _mm_fmadd_ps(scales, act, *summs);
            } else {
                // SAFETY: as above.
                let d = _mm256_set1_ps(unsafe { <$L>::scale(wb, xb) });
                *acc = _mm256_fmadd_ps(d, sums, *acc);
            }
        }
    }};
}

/// Most blocks per row whose activation scales [`scaled_panel`] converts up front (longer
/// rows take [`legacy_dot`] row by row): the largest attention head's (1024 values), so
/// the table a call fills stays small.
const PANEL_MAX_BLOCKS: usize = crate::flash_attn::MAX_HEAD_DIM / 32;

/// A panel of rows of a format of [`Accumulation::Scaled`] (its scale the block's f16 times
/// the activation's, [`LegacyAvx2::scale`]'s default) against `N` activation rows, four or
/// eight: `out[r·N + t]` is exactly [`legacy_dot`]'s result for row `r` and activation `t`.
/// Eight sums at a time (one row against eight activations, or two rows against four): the
/// activations' scales converted once for the panel, each block's eight `dw·dy` made in one
/// vector, the eight sums reduced together ([`hsum8_ggml`], `hsum_ggml`'s additions for
/// each). Attention scores a key against a group's queries this way, two blocks a key,
/// where the calls and reductions per key cost as much as the products.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scaled_panel<L: LegacyAvx2, const N: usize>(
    w: &[u8],
    rows: PanelRows,
    xs: [&[u8]; N],
    out: &mut [f32],
) {
    crate::kernels::x86::align_frame!();
    assert!(L::ACCUMULATION == Accumulation::Scaled && (N == 4 || N == 8));
    let blocks = rows.bytes / L::BYTES;
    // Rows per step: eight accumulators.
    let per = 8 / N;
    let steps = if blocks <= PANEL_MAX_BLOCKS {
        rows.count / per
    } else {
        0
    };
    let bytes = L::ACTIVATION_BYTES;
    // Lane `s·N + t` of `dy[b]`: activation `t`'s scale in block `b`.
    let mut dy = [_mm256_setzero_ps(); PANEL_MAX_BLOCKS];
    if steps > 0 {
        for (b, dy) in dy.iter_mut().enumerate().take(blocks) {
            let mut halves = [0u16; 8];
            for (k, h) in halves.iter_mut().enumerate() {
                let x = &xs[k % N][b * bytes..];
                *h = u16::from_le_bytes([x[0], x[1]]);
            }
            // SAFETY: `halves` holds eight values.
            *dy = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(halves.as_ptr().cast()) });
        }
    }
    let mut d = [0f32; 8];
    // (No closures below: they would not inherit the target features, nor be inlined.)
    for step in 0..steps {
        let first = step * per;
        // The step's rows: one, or two (the same row twice when one).
        let pair = [rows.row(w, first), rows.row(w, first + per - 1)];
        let mut acc = zeros::<8>();
        for (b, &dy) in dy.iter().enumerate().take(blocks) {
            let at = b * L::BYTES;
            let blocks_of = [&pair[0][at..at + L::BYTES], &pair[1][at..at + L::BYTES]];
            // Lanes of row `s` take its `dw` (one row for eight activations, two for four).
            let dw0 = i32::from(u16::from_le_bytes([blocks_of[0][0], blocks_of[0][1]]));
            let dw1 = i32::from(u16::from_le_bytes([blocks_of[1][0], blocks_of[1][1]]));
            let dw0 = _mm_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(dw0)));
            let dw1 = _mm_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(dw1)));
            let dw = _mm256_set_m128(dw1, dw0);
            // SAFETY: `d` holds eight values.
            unsafe { _mm256_storeu_ps(d.as_mut_ptr(), _mm256_mul_ps(dw, dy)) };
            for (s, &block) in blocks_of.iter().enumerate().take(per) {
                // SAFETY: this function runs with AVX2, FMA and F16C enabled.
                let codes = unsafe { L::codes(block) };
                for (t, x) in xs.iter().enumerate() {
                    let k = s * N + t;
                    let x = &x[b * bytes..(b + 1) * bytes];
                    let sums = _mm256_cvtepi32_ps(block_sums::<L>(codes, x));
                    acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(d[k]), sums, acc[k]);
                }
            }
        }
        let out = &mut out[first * N..first * N + 8];
        // SAFETY: `out` holds eight values.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), hsum8_ggml(acc)) };
    }
    for r in steps * per..rows.count {
        let dots = legacy_dot::<L, N>(rows.row(w, r), xs);
        out[r * N..(r + 1) * N].copy_from_slice(&dots);
    }
}

/// One weight row of format `L` against `N` activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn legacy_dot<L: LegacyAvx2, const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    let blocks = w.len() / L::BYTES;
    for x in &xs {
        assert_eq!(
            x.len(),
            blocks * L::ACTIVATION_BYTES,
            "activation row length"
        );
    }
    let mut acc = zeros::<N>();
    // Lane 1 carries the minimum terms of the `_1` formats.
    let mut extra = [_mm_setzero_ps(); N];
    if L::ACCUMULATION != Accumulation::PairedBlocks {
        for (ib, wb) in w.chunks_exact(L::BYTES).enumerate() {
            add_block!(L, ib, wb, &xs, acc, extra);
        }
        return std::array::from_fn(|t| match L::ACCUMULATION {
            Accumulation::ScaledWithMin => {
                hsum_ggml(acc[t]) + _mm_cvtss_f32(_mm_movehdup_ps(extra[t]))
            }
            _ => hsum_ggml(acc[t]),
        });
    }

    // Paired: even blocks into `acc`, odd ones into `odd`, an odd last block in scalar.
    let mut odd = zeros::<N>();
    let pairs = w.chunks_exact(2 * L::BYTES);
    let last = pairs.remainder();
    for (p, pair) in pairs.enumerate() {
        let (even_block, odd_block) = pair.split_at(L::BYTES);
        add_block!(L, 2 * p, even_block, &xs, acc, extra);
        add_block!(L, 2 * p + 1, odd_block, &xs, odd, extra);
    }
    std::array::from_fn(|t| {
        let mut sum = hsum_ggml(_mm256_add_ps(acc[t], odd[t]));
        if !last.is_empty() {
            // ggml's scalar tail: d·sumi with a plain multiply and add.
            let xb = &xs[t][(blocks - 1) * L::ACTIVATION_BYTES..];
            // SAFETY: this function runs with AVX2, FMA and F16C enabled.
            let sums = block_sums::<L>(unsafe { L::codes(last) }, xb);
            sum += unsafe { L::scale(last, xb) } * hsum_i32(sums) as f32;
        }
        sum
    })
}
