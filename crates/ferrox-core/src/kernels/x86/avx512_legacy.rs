//! AVX-512 VNNI panels of the 32-value formats with Q8_0 activations (Q4_0, Q5_0, Q8_0).
//!
//! Per block, ggml's AVX2 kernel sums the products of the 32 weight codes `w` with the 32
//! activation codes `x` four adjacent values per i32 lane, converts the eight lanes to
//! float and adds them, times `dx·dy`, into eight float accumulators by FMA; the result is
//! their horizontal sum. Here `vpdpbusd` makes the same eight lane sums, exactly. It
//! multiplies unsigned by signed bytes, so one side enters biased and each lane starts
//! from minus the bias times the sum of the other side's four values:
//! - usually the weights enter as `w + b` (the format's unsigned codes) and each lane
//!   starts from `-b·Σx` of its activations, computed once per activation block for all
//!   the rows of a tile (one token) or of a panel (several tokens, see below);
//! - against several tokens with rows too long to prepare, the activations enter as
//!   `x + 128` (their sign bit flipped) and each lane starts from `-128·Σw`, computed once
//!   per weight block for all tokens.
//!
//! The float steps are the AVX2 kernel's, per row in its own half register, so results are
//! bit-identical.
//!
//! A tile is four pairs of rows against one token, or two pairs against several: each
//! weight block is loaded and decoded once for all the tile's tokens, each activation block
//! once for all its rows. Against several tokens, a panel first prepares each activation
//! block's scale (as f32) and lane starting values once for all its rows, so that the
//! tile's inner loop only loads them; per row and token, what remains is one `vpdpbusd`,
//! one conversion, one multiply and one fused multiply-add per block and pair of rows.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::avx512_common::{
    f16_broadcast, f16_quad, hsum_each, load_pair_32, nibble_pair, pair_rows, panel_shape,
    prefetch_ahead, prefetch_distance, prefetch_start, u16_at, u32_at,
};
use crate::kernels::{DotKernel, PanelRows};

const Q8_0_BYTES: usize = 34;
const Q8_0_CODES_AT: usize = 2;

/// A 32-value weight format with an f16 scale at offset 0, paired with Q8_0 activations
/// and accumulated as ggml's AVX2 `Scaled` kernels do.
///
/// # Safety (of every method)
/// The CPU must support the AVX-512 kernel features; both pointers address whole blocks.
pub(crate) trait LegacyZmm {
    const BYTES: usize;
    /// The bias `b` that makes the codes unsigned.
    const BIAS: u8;

    /// The unsigned codes `w + b` of the blocks at `p0` (low half: value `j` in byte `j`)
    /// and `p1` (high half).
    unsafe fn biased(p0: *const u8, p1: *const u8) -> __m512i;

    /// The signed codes `w` of the blocks at `p0` and `p1`.
    unsafe fn signed(p0: *const u8, p1: *const u8) -> __m512i;
}

pub(crate) struct Q4_0Zmm;
pub(crate) struct Q5_0Zmm;
pub(crate) struct Q8_0Zmm;

impl LegacyZmm for Q4_0Zmm {
    const BYTES: usize = 18;
    const BIAS: u8 = 8;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn biased(p0: *const u8, p1: *const u8) -> __m512i {
        // SAFETY: the caller's contract.
        unsafe { nibble_pair(p0.add(2), p1.add(2)) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn signed(p0: *const u8, p1: *const u8) -> __m512i {
        // SAFETY: the caller's contract.
        let nibbles = unsafe { Self::biased(p0, p1) };
        _mm512_sub_epi8(nibbles, _mm512_set1_epi8(8))
    }
}

impl Q5_0Zmm {
    /// The nibbles and the fifth bits (bit `j` of the u32 at offset 2) as a byte mask.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn parts(p0: *const u8, p1: *const u8) -> (__m512i, __mmask64) {
        // SAFETY: the caller's contract.
        unsafe {
            let fifth = u64::from(u32_at(p0.add(2))) | (u64::from(u32_at(p1.add(2))) << 32);
            (nibble_pair(p0.add(6), p1.add(6)), fifth)
        }
    }
}

impl LegacyZmm for Q5_0Zmm {
    const BYTES: usize = 22;
    const BIAS: u8 = 16;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn biased(p0: *const u8, p1: *const u8) -> __m512i {
        // SAFETY: the caller's contract. The nibble plus 16 where the fifth bit is set.
        let (nibbles, fifth) = unsafe { Self::parts(p0, p1) };
        _mm512_mask_add_epi8(nibbles, fifth, nibbles, _mm512_set1_epi8(16))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn signed(p0: *const u8, p1: *const u8) -> __m512i {
        // SAFETY: the caller's contract. The nibble minus 16 where the fifth bit is clear.
        let (nibbles, fifth) = unsafe { Self::parts(p0, p1) };
        _mm512_mask_sub_epi8(nibbles, !fifth, nibbles, _mm512_set1_epi8(16))
    }
}

impl LegacyZmm for Q8_0Zmm {
    const BYTES: usize = 34;
    const BIAS: u8 = 128;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn biased(p0: *const u8, p1: *const u8) -> __m512i {
        // SAFETY: the caller's contract; `w ^ 0x80` read unsigned is `w + 128`.
        let codes = unsafe { Self::signed(p0, p1) };
        _mm512_xor_si512(codes, _mm512_set1_epi8(0x80u8 as i8))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn signed(p0: *const u8, p1: *const u8) -> __m512i {
        // SAFETY: the caller's contract.
        unsafe { load_pair_32(p0.add(2), p1.add(2)) }
    }
}

/// Rows `rows[p][h]` (block pointers advance by `L::BYTES`) against the `N` activations;
/// returns each row's results. `P` is 2: the four rows' scales convert together.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<L: LegacyZmm, const N: usize, const P: usize, const PREPARED: bool>(
    rows: [[*const u8; 2]; P],
    blocks: usize,
    xs: &[*const u8; N],
    prepared: &Prepared<N>,
    prefetch: usize,
) -> [[[f32; N]; 2]; P] {
    // Bias the weights when the activation corrections are prepared or there is a single
    // token; otherwise bias the activations (see the module notes).
    let weights_biased = PREPARED || N == 1;
    let zero = _mm512_setzero_si512();
    let bias = if weights_biased {
        _mm512_set1_epi8(L::BIAS as i8)
    } else {
        _mm512_set1_epi8(0x80u8 as i8)
    };
    let mut acc = [[_mm512_setzero_ps(); N]; P];
    for b in 0..blocks {
        let mut codes = [zero; P];
        let mut start = [zero; P];
        // SAFETY: `b < blocks`, so every block lies inside its row.
        let mut dw = [_mm512_setzero_ps(); P];
        unsafe {
            let at = |p: usize, h: usize| rows[p][h].add(b * L::BYTES);
            // The tile's rows are consecutive: stream the region `prefetch` bytes ahead,
            // as many lines per step as the step consumes (plus one for alignment).
            let ahead = rows[0][0].add(prefetch + b * 2 * P * L::BYTES);
            for line in 0..(2 * P * L::BYTES).div_ceil(64) + 1 {
                prefetch_ahead(ahead, 64 * line);
            }
            for (p, code) in codes.iter_mut().enumerate() {
                let (p0, p1) = (at(p, 0), at(p, 1));
                *code = if weights_biased {
                    L::biased(p0, p1)
                } else {
                    L::signed(p0, p1)
                };
            }
            for q in 0..P / 2 {
                let [a, b] = f16_quad([
                    at(2 * q, 0),
                    at(2 * q, 1),
                    at(2 * q + 1, 0),
                    at(2 * q + 1, 1),
                ]);
                dw[2 * q] = a;
                dw[2 * q + 1] = b;
            }
        }
        if !weights_biased {
            for p in 0..P {
                start[p] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, codes[p]));
            }
        }
        for t in 0..N {
            // SAFETY: activation rows hold `blocks` Q8_0 blocks, and the prepared values
            // `blocks` entries per token.
            let (x, dy, token_start) = unsafe {
                let xb = xs[t].add(b * Q8_0_BYTES);
                let codes = _mm256_loadu_si256(xb.add(Q8_0_CODES_AT).cast());
                let x = _mm512_broadcast_i64x4(codes);
                if PREPARED {
                    let at = t * MAX_PREPARED_BLOCKS + b;
                    let start = prepared.start.as_ptr().cast::<__m256i>().add(at);
                    let dy = prepared.dy.as_ptr().cast::<f32>().add(at);
                    (
                        x,
                        _mm512_set1_ps(dy.read()),
                        _mm512_broadcast_i64x4(_mm256_loadu_si256(start)),
                    )
                } else if weights_biased {
                    let start = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, x));
                    (x, f16_broadcast(xb), start)
                } else {
                    (_mm512_xor_si512(x, bias), f16_broadcast(xb), zero)
                }
            };
            for p in 0..P {
                let sums = if weights_biased {
                    _mm512_dpbusd_epi32(token_start, codes[p], x)
                } else {
                    _mm512_dpbusd_epi32(start[p], x, codes[p])
                };
                let d = _mm512_mul_ps(dw[p], dy);
                acc[p][t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sums), acc[p][t]);
            }
        }
    }
    // Plain loops: LLVM does not inline target-feature closures into `array::map`.
    let mut halves = [[[_mm256_setzero_ps(); N]; 2]; P];
    for p in 0..P {
        for t in 0..N {
            halves[p][0][t] = _mm512_castps512_ps256(acc[p][t]);
            halves[p][1][t] = _mm512_extractf32x8_ps::<1>(acc[p][t]);
        }
    }
    let mut results = [[[0.0; N]; 2]; P];
    hsum_each(
        halves.as_flattened().as_flattened(),
        results.as_flattened_mut().as_flattened_mut(),
    );
    results
}

/// Activation blocks per token that [`Prepared`] holds (4096 values).
const MAX_PREPARED_BLOCKS: usize = 128;

/// Per token and activation block: the scale as f32 and the lanes' starting values
/// `-b·Σx` for weights biased by `b`, so that a tile's inner loop only loads them.
struct Prepared<const N: usize> {
    dy: MaybeUninit<[[f32; MAX_PREPARED_BLOCKS]; N]>,
    start: MaybeUninit<[[[i32; 8]; MAX_PREPARED_BLOCKS]; N]>,
}

impl<const N: usize> Prepared<N> {
    fn new() -> Self {
        Self {
            dy: MaybeUninit::uninit(),
            start: MaybeUninit::uninit(),
        }
    }

    /// Fills the first `blocks` entries of every token.
    ///
    /// # Safety
    /// The CPU must support the AVX-512 kernel features; `blocks <= MAX_PREPARED_BLOCKS`
    /// and every activation holds `blocks` Q8_0 blocks.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn fill(&mut self, xs: &[*const u8; N], blocks: usize, bias: u8) {
        let bias = _mm256_set1_epi8(bias as i8);
        let zero = _mm256_setzero_si256();
        let dy = self.dy.as_mut_ptr().cast::<f32>();
        let start = self.start.as_mut_ptr().cast::<__m256i>();
        for (t, &x) in xs.iter().enumerate() {
            for b in 0..blocks {
                // SAFETY: in bounds by the caller's contract.
                unsafe {
                    let xb = x.add(b * Q8_0_BYTES);
                    let codes = _mm256_loadu_si256(xb.add(Q8_0_CODES_AT).cast());
                    let lanes = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, bias, codes));
                    let at = t * MAX_PREPARED_BLOCKS + b;
                    _mm256_storeu_si256(start.add(at), lanes);
                    let half = _mm_cvtsi32_si128(i32::from(u16_at(xb)));
                    dy.add(at).write(_mm_cvtss_f32(_mm_cvtph_ps(half)));
                }
            }
        }
    }
}

/// A panel of rows of format `L` against `N` Q8_0 activation rows; `out[r * N + t]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn panel<L: LegacyZmm, const N: usize>(
    w: &[u8],
    rows: PanelRows,
    xs: [&[u8]; N],
    out: &mut [f32],
) {
    crate::kernels::x86::align_frame!();
    if N == 1 {
        // SAFETY: the caller's contract.
        unsafe { panel_tiles::<L, N, 4>(w, rows, xs, out) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { panel_tiles::<L, N, 2>(w, rows, xs, out) }
    }
}

/// [`panel`] with tiles of `P` pairs of rows (an even number: scales convert four rows at
/// a time). A single token takes eight rows per tile, so that the work per activation
/// block is shared more widely; several tokens take four, for registers.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn panel_tiles<L: LegacyZmm, const N: usize, const P: usize>(
    w: &[u8],
    layout: PanelRows,
    xs: [&[u8]; N],
    out: &mut [f32],
) {
    let blocks = panel_shape(w, layout, L::BYTES, &xs, Q8_0_BYTES, out);
    let rows = layout.count;
    let xs = xs.map(<[u8]>::as_ptr);
    let prefetch = prefetch_distance(2 * P * layout.stride);
    prefetch_start(w, prefetch);
    // Several tokens and rows short enough: prepare each activation block's scale and
    // correction once for the whole panel.
    let prepare = N > 1 && blocks <= MAX_PREPARED_BLOCKS && rows > 2 * P;
    let mut prepared = Prepared::<N>::new();
    if prepare {
        // SAFETY: `blocks` fits the buffers; the activations hold `blocks` blocks.
        unsafe { prepared.fill(&xs, blocks, L::BIAS) };
    }
    for first in (0..rows).step_by(2 * P) {
        let tile_rows = pair_rows::<P>(w.as_ptr(), layout.stride, first, rows);
        // SAFETY: every pointer is a row of `w` (whole blocks), every activation holds
        // `blocks` blocks: checked by `panel_shape`; `prepared` was filled if used.
        let results = unsafe {
            if prepare {
                tile::<L, N, P, true>(tile_rows, blocks, &xs, &prepared, prefetch)
            } else {
                tile::<L, N, P, false>(tile_rows, blocks, &xs, &prepared, prefetch)
            }
        };
        let valid = (rows - first).min(2 * P);
        for (i, r) in results.iter().flatten().take(valid).enumerate() {
            out[(first + i) * N..(first + i + 1) * N].copy_from_slice(r);
        }
    }
}

/// The safe entries of format `L`'s panels.
pub(super) fn entry<L: LegacyZmm>() -> DotKernel {
    fn one<L: LegacyZmm>(w: &[u8], xs: [&[u8]; 1]) -> [f32; 1] {
        let mut out = [0.0];
        if !w.is_empty() {
            panel_entry::<L, 1>(w, PanelRows::dense(w, w.len()), xs, &mut out);
        }
        out
    }
    fn panel_entry<L: LegacyZmm, const N: usize>(
        w: &[u8],
        rows: PanelRows,
        xs: [&[u8]; N],
        out: &mut [f32],
    ) {
        // SAFETY: handed out only by `avx512_vnni_kernel`, after detecting the features.
        unsafe { panel::<L, N>(w, rows, xs, out) }
    }
    DotKernel {
        one: one::<L>,
        panel1: panel_entry::<L, 1>,
        panel2: panel_entry::<L, 2>,
        panel3: panel_entry::<L, 3>,
        panel4: panel_entry::<L, 4>,
        panel8: panel_entry::<L, 8>,
    }
}
