//! The AVX-512 VNNI kernels over packed groups: one register per four values of the
//! group's sixteen rows, one `vpdpbusd` per four activation values (broadcast), each lane
//! an exact integer sum for its row; then per block and token one conversion, one
//! multiply and one fused multiply-add for all sixteen rows, as the scalar reference does
//! row by row. This file holds the driver and the 32-value formats' blocks; the K-quants'
//! blocks are in `avx512_kquants.rs`.
//!
//! Only [`kernel`] and [`prompt_form`] hand these functions out, and the packed products
//! ask for them only after checking that the CPU has AVX-512 VNNI (`Isa::is_available`),
//! so the `unsafe` calls are sound.

use crate::kernels::Isa;
use std::arch::x86_64::*;

use super::layout::{
    id, nvfp4_scales_at, place_int8_scales, q1_0_plane_at, ACT_SCALE_AT, ACT_SUM_AT, I8K_CODES_AT,
    IQ4NL_CODES, MXFP4_CODES, NVFP4_CODES_AT, QK_K, SCALES_BYTES,
};
use super::{
    prefetch_ahead, prefetch_lines, GroupsFn, PackedFormat, ACTIVATION_BLOCK_BYTES, GROUP_ROWS,
};
use crate::quant::int8::Int8Block;

use super::avx512_kquants::{
    two_bit_quads, AffineKBlock, I8KBlock, Iq4XsBlock, Q2KBlock, Q3KBlock, Q6KBlock, Tq2Block,
};

pub(super) fn kernel(format: PackedFormat) -> GroupsFn {
    match format {
        PackedFormat::Q4_0 => groups::<Legacy<NibbleCodes<false>>>,
        PackedFormat::Q4_1 => groups::<Legacy<NibbleCodes<true>>>,
        PackedFormat::Q5_0 => groups::<Legacy<FiveBitCodes<false>>>,
        PackedFormat::Q5_1 => groups::<Legacy<FiveBitCodes<true>>>,
        PackedFormat::Q8_0 => groups::<Legacy<Q8_0Codes>>,
        PackedFormat::Mxfp4 => groups::<Legacy<LevelCodes<{ id::MXFP4 }>>>,
        PackedFormat::Iq4Nl => groups::<Legacy<LevelCodes<{ id::IQ4_NL }>>>,
        PackedFormat::Q4K => groups::<AffineKBlock<false>>,
        PackedFormat::Q5K => groups::<AffineKBlock<true>>,
        PackedFormat::Q6K => groups::<Q6KBlock>,
        PackedFormat::I8K => groups::<I8KBlock<false>>,
        PackedFormat::Iq4Xs => groups::<Iq4XsBlock>,
        PackedFormat::Q2K => groups::<Q2KBlock>,
        PackedFormat::Q3K => groups::<Q3KBlock>,
        PackedFormat::Tq2_0 | PackedFormat::Tq1_0 => groups::<Tq2Block>,
        PackedFormat::Q1_0 => groups::<Legacy<SignCodes>>,
        PackedFormat::Q2_0 => groups::<Legacy<TwoBitCodes>>,
        PackedFormat::Nvfp4 => groups::<Nvfp4Block>,
    }
}

/// The I8K kernel for i-quants whose scales are per 32 values.
pub(super) fn paired_i8k_kernel() -> GroupsFn {
    groups::<I8KBlock<true>>
}

/// [`super::layout::PlaceFn`] with the codes moved by vectors: each sixteen quads of the
/// sixteen rows are a transposition of 16 × 16 dwords, 256 shuffles and 64 full-line
/// stores per group block where a quad at a time took 1024 stores.
pub(super) fn place_int8(rows: &[Int8Block], dst: &mut [u8]) {
    assert!(rows.len() == GROUP_ROWS && dst.len() >= PackedFormat::I8K.group_block_bytes());
    place_int8_scales(rows, dst);
    // SAFETY: handed out only where AVX-512 is available (`super::int8_placement`); the
    // lengths are checked above.
    unsafe { transpose_codes(rows, dst) }
}

/// # Safety
/// The CPU has the kernels' features; sixteen rows, a whole I8K group block at `dst`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn transpose_codes(rows: &[Int8Block], dst: &mut [u8]) {
    const QUADS: usize = 16;
    for t in 0..QK_K / 4 / QUADS {
        let mut a = [_mm512_setzero_si512(); GROUP_ROWS];
        for (r, v) in a.iter_mut().enumerate() {
            // SAFETY: a row's 256 codes are 4 · 64 bytes.
            *v = unsafe {
                _mm512_loadu_si512(rows[r].codes.as_ptr().cast::<u8>().add(64 * t).cast())
            };
        }
        let b = transpose_dwords(&a);
        for (c, v) in b.iter().enumerate() {
            // Quad `q` of every row: 64 bytes at `I8K_CODES_AT + 64q`.
            let at = I8K_CODES_AT + 64 * (QUADS * t + c);
            // SAFETY: inside the group block (the caller's contract).
            unsafe { _mm512_storeu_si512(dst.as_mut_ptr().add(at).cast(), *v) };
        }
    }
}

/// `out[c]` lane `r` = `a[r]` lane `c`: pairs of dwords, then of qwords, interleaved
/// within 128-bit lanes, then a 4 × 4 transposition of the lanes in two steps.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
fn transpose_dwords(a: &[__m512i; 16]) -> [__m512i; 16] {
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(a[2 * i], a[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(a[2 * i], a[2 * i + 1]);
    }
    // u[4j + k], 128-bit lane L: column 4L + k of rows 4j..4j + 4.
    let mut u = [_mm512_setzero_si512(); 16];
    for j in 0..4 {
        u[4 * j] = _mm512_unpacklo_epi64(t[4 * j], t[4 * j + 2]);
        u[4 * j + 1] = _mm512_unpackhi_epi64(t[4 * j], t[4 * j + 2]);
        u[4 * j + 2] = _mm512_unpacklo_epi64(t[4 * j + 1], t[4 * j + 3]);
        u[4 * j + 3] = _mm512_unpackhi_epi64(t[4 * j + 1], t[4 * j + 3]);
    }
    let mut out = [_mm512_setzero_si512(); 16];
    for k in 0..4 {
        let low = _mm512_shuffle_i32x4::<0x44>(u[k], u[4 + k]);
        let high = _mm512_shuffle_i32x4::<0xEE>(u[k], u[4 + k]);
        let low2 = _mm512_shuffle_i32x4::<0x44>(u[8 + k], u[12 + k]);
        let high2 = _mm512_shuffle_i32x4::<0xEE>(u[8 + k], u[12 + k]);
        out[k] = _mm512_shuffle_i32x4::<0x88>(low, low2);
        out[4 + k] = _mm512_shuffle_i32x4::<0xDD>(low, low2);
        out[8 + k] = _mm512_shuffle_i32x4::<0x88>(high, high2);
        out[12 + k] = _mm512_shuffle_i32x4::<0xDD>(high, high2);
    }
    out
}

/// The prompt form of `format`'s panels, where one pays (the K-quants', in
/// `avx512_kquants.rs`).
pub(super) fn prompt_form(format: PackedFormat) -> Option<super::PromptForm> {
    super::avx512_kquants::prompt_form(format)
}

/// One group block of a format against `N` tokens, added into their accumulators (one
/// lane per row).
pub(super) trait Block {
    const FORMAT: PackedFormat;
    /// Whether the groups are in a prompt form, written just before the kernel reads them.
    const PROMPT_FORM: bool = false;

    /// Bytes of one group block as the kernel reads it.
    fn group_block_bytes() -> usize {
        Self::FORMAT.group_block_bytes()
    }

    /// # Safety
    /// The CPU has the kernels' features; `block` is block `b` of a group, every `xs[t]`
    /// a whole activation row.
    unsafe fn add<const N: usize>(
        block: *const u8,
        b: usize,
        xs: &[*const u8],
        acc: &mut [__m512; N],
    );
}

/// The 32-value formats, whose codes unpack as `C` says.
struct Legacy<C>(std::marker::PhantomData<C>);

/// How one group block's codes become eight registers of unsigned bytes per 32 values
/// (register `g`: values `32·part + 4g..+4` of every row).
trait Codes {
    const FORMAT: PackedFormat;

    /// # Safety
    /// The CPU has the kernel's features; `block` addresses a whole group block, `part` is
    /// below the format's [`PackedFormat::parts`].
    unsafe fn unpack(block: *const u8, part: usize) -> [__m512i; 8];
}

/// Q4_0, or Q4_1 when `MIN`.
struct NibbleCodes<const MIN: bool>;
/// Q5_0, or Q5_1 when `MIN`.
struct FiveBitCodes<const MIN: bool>;
struct Q8_0Codes;
/// MXFP4 or IQ4_NL (by their [`id`]): nibbles that index a table of codes.
struct LevelCodes<const F: u8>;
/// Q1_0: planes of signs, a set bit the code 2.
struct SignCodes;
/// Q2_0: two-bit codes as Q2_K's.
struct TwoBitCodes;

/// The low nibbles of the four registers at `p` (values `4k..4k+4`) in registers `0..4`,
/// the high nibbles (values `16+4k..`) in `4..8`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn nibbles(p: *const u8) -> [__m512i; 8] {
    let low = _mm512_set1_epi8(0x0F);
    let mut out = [_mm512_setzero_si512(); 8];
    for k in 0..4 {
        // SAFETY: the caller's contract.
        let v = unsafe { _mm512_loadu_si512(p.add(64 * k).cast()) };
        out[k] = _mm512_and_si512(v, low);
        out[k + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
    }
    out
}

impl<const MIN: bool> Codes for NibbleCodes<MIN> {
    const FORMAT: PackedFormat = if MIN {
        PackedFormat::Q4_1
    } else {
        PackedFormat::Q4_0
    };

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn unpack(block: *const u8, _part: usize) -> [__m512i; 8] {
        // SAFETY: the caller's contract.
        unsafe { nibbles(block.add(Self::FORMAT.codes_at())) }
    }
}

impl<const MIN: bool> Codes for FiveBitCodes<MIN> {
    const FORMAT: PackedFormat = if MIN {
        PackedFormat::Q5_1
    } else {
        PackedFormat::Q5_0
    };

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn unpack(block: *const u8, _part: usize) -> [__m512i; 8] {
        let sixteen = _mm512_set1_epi8(16);
        // SAFETY: the caller's contract.
        unsafe {
            let planes = block.add(Self::FORMAT.codes_at());
            let plane = _mm512_loadu_si512(planes.cast());
            let mut codes = nibbles(planes.add(64));
            for (g, c) in codes.iter_mut().enumerate() {
                let fifth = _mm512_test_epi8_mask(plane, _mm512_set1_epi8(1 << g));
                *c = _mm512_mask_add_epi8(*c, fifth, *c, sixteen);
            }
            codes
        }
    }
}

impl Codes for Q8_0Codes {
    const FORMAT: PackedFormat = PackedFormat::Q8_0;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn unpack(block: *const u8, _part: usize) -> [__m512i; 8] {
        // SAFETY: the caller's contract.
        unsafe {
            let p = block.add(SCALES_BYTES);
            std::array::from_fn(|g| _mm512_loadu_si512(p.add(64 * g).cast()))
        }
    }
}

impl<const F: u8> Codes for LevelCodes<F> {
    const FORMAT: PackedFormat = PackedFormat::from_id(F);

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn unpack(block: *const u8, _part: usize) -> [__m512i; 8] {
        let table = if F == id::MXFP4 {
            &MXFP4_CODES
        } else {
            &IQ4NL_CODES
        };
        // SAFETY: the caller's contract; the table is 16 readable bytes.
        unsafe {
            let levels = _mm512_broadcast_i32x4(_mm_loadu_si128(table.as_ptr().cast()));
            nibbles(block.add(Self::FORMAT.codes_at())).map(|n| _mm512_shuffle_epi8(levels, n))
        }
    }
}

impl<C: Codes> Block for Legacy<C> {
    const FORMAT: PackedFormat = C::FORMAT;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn add<const N: usize>(
        block: *const u8,
        b: usize,
        xs: &[*const u8],
        acc: &mut [__m512; N],
    ) {
        let bias = C::FORMAT.bias();
        // SAFETY: the caller's contract.
        unsafe {
            let dw = if C::FORMAT.has_f32_scales() {
                _mm512_loadu_ps(block.cast())
            } else {
                _mm512_cvtph_ps(_mm256_loadu_si256(block.cast()))
            };
            let parts = C::FORMAT.parts();
            for part in 0..parts {
                let codes = C::unpack(block, part);
                for t in 0..N {
                    let a = xs[t].add((b * parts + part) * ACTIVATION_BLOCK_BYTES);
                    let x_sum = a.add(ACT_SUM_AT).cast::<i32>().read_unaligned();
                    // The codes are `w + bias`: start from `-bias·Σx`.
                    let sums = dot32(_mm512_set1_epi32(bias * -x_sum), &codes, a);
                    let sums = _mm512_cvtepi32_ps(sums);
                    let dy = _mm512_set1_ps(a.add(ACT_SCALE_AT).cast::<f32>().read_unaligned());
                    acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dy), sums, acc[t]);
                    if C::FORMAT.has_min() {
                        // `d·code + m`: the minimums against the activations' sum.
                        let m = _mm512_cvtph_ps(_mm256_loadu_si256(block.add(SCALES_BYTES).cast()));
                        let x_sum = _mm512_set1_ps(x_sum as f32);
                        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(m, dy), x_sum, acc[t]);
                    }
                }
            }
        }
    }
}

impl Codes for SignCodes {
    const FORMAT: PackedFormat = PackedFormat::Q1_0;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn unpack(block: *const u8, part: usize) -> [__m512i; 8] {
        let two = _mm512_set1_epi8(2);
        let mut codes = [_mm512_setzero_si512(); 8];
        // SAFETY: the caller's contract: the part's plane lies in the block.
        let plane = unsafe { _mm512_loadu_si512(block.add(q1_0_plane_at(part)).cast()) };
        for (g, c) in codes.iter_mut().enumerate() {
            let signs = _mm512_test_epi8_mask(plane, _mm512_set1_epi8((1u8 << g) as i8));
            *c = _mm512_maskz_mov_epi8(signs, two);
        }
        codes
    }
}

impl Codes for TwoBitCodes {
    const FORMAT: PackedFormat = PackedFormat::Q2_0;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn unpack(block: *const u8, part: usize) -> [__m512i; 8] {
        // SAFETY: the caller's contract: the part's two code vectors lie in the block.
        let [a, b] = unsafe {
            let p = block.add(SCALES_BYTES + 128 * part);
            [two_bit_quads(p), two_bit_quads(p.add(64))]
        };
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
    }
}

/// NVFP4: per part, the two sub-blocks' sums each scaled by its own scale.
struct Nvfp4Block;

impl Block for Nvfp4Block {
    const FORMAT: PackedFormat = PackedFormat::Nvfp4;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn add<const N: usize>(
        block: *const u8,
        b: usize,
        xs: &[*const u8],
        acc: &mut [__m512; N],
    ) {
        let bias = Self::FORMAT.bias();
        // SAFETY: the caller's contract; the table is 16 readable bytes.
        unsafe {
            let levels = _mm512_broadcast_i32x4(_mm_loadu_si128(MXFP4_CODES.as_ptr().cast()));
            for part in 0..2 {
                let codes = nibbles(block.add(NVFP4_CODES_AT + 256 * part))
                    .map(|n| _mm512_shuffle_epi8(levels, n));
                let scale = |s: usize| {
                    _mm512_cvtph_ps(_mm256_loadu_si256(block.add(nvfp4_scales_at(s)).cast()))
                };
                let dw = [scale(2 * part), scale(2 * part + 1)];
                for t in 0..N {
                    let a = xs[t].add((2 * b + part) * ACTIVATION_BLOCK_BYTES);
                    let x_sums = a.add(ACT_SUM_AT).cast::<[i16; 2]>().read_unaligned();
                    let dy = _mm512_set1_ps(a.add(ACT_SCALE_AT).cast::<f32>().read_unaligned());
                    for (half, x_sum) in x_sums.into_iter().enumerate() {
                        // The codes are `w + bias`: start from `-bias·Σx` of the half.
                        let init = _mm512_set1_epi32(bias * -i32::from(x_sum));
                        let codes = &codes[4 * half..4 * half + 4];
                        let sums = dot16(init, codes, a.add(16 * half));
                        let sums = _mm512_cvtepi32_ps(sums);
                        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw[half], dy), sums, acc[t]);
                    }
                }
            }
        }
    }
}

/// `init + Σ code·x` per row lane over 16 values: `codes[g]` holds values `4g..4g + 4` of
/// each row (unsigned), `x` the 16 activation bytes; two chains, as [`dot32`]'s.
///
/// # Safety
/// The CPU has the kernels' features; `x` addresses 16 readable bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn dot16(init: __m512i, codes: &[__m512i], x: *const u8) -> __m512i {
    let mut even = init;
    let mut odd = _mm512_setzero_si512();
    // SAFETY: the caller's contract.
    unsafe {
        for k in 0..2 {
            even = _mm512_dpbusd_epi32(even, codes[2 * k], broadcast_i32(x.add(8 * k)));
            odd = _mm512_dpbusd_epi32(odd, codes[2 * k + 1], broadcast_i32(x.add(8 * k + 4)));
        }
    }
    _mm512_add_epi32(even, odd)
}

/// `init + Σ code·x` per row lane over 32 values: `codes[g]` holds values `4g..4g + 4` of
/// each row (unsigned), `x` the 32 activation bytes. Two chains of `vpdpbusd`, so that
/// neither waits on the other.
///
/// # Safety
/// The CPU has the kernels' features; `x` addresses 32 readable bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot32(init: __m512i, codes: &[__m512i; 8], x: *const u8) -> __m512i {
    let mut even = init;
    let mut odd = _mm512_setzero_si512();
    // SAFETY: the caller's contract.
    unsafe {
        for k in 0..4 {
            even = _mm512_dpbusd_epi32(even, codes[2 * k], broadcast_i32(x.add(8 * k)));
            odd = _mm512_dpbusd_epi32(odd, codes[2 * k + 1], broadcast_i32(x.add(8 * k + 4)));
        }
    }
    _mm512_add_epi32(even, odd)
}

/// The i32 at `p`, broadcast.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn broadcast_i32(p: *const u8) -> __m512i {
    // SAFETY: the caller passes four readable bytes.
    _mm512_set1_epi32(unsafe { p.cast::<i32>().read_unaligned() })
}

/// # Safety
/// See [`GroupsFn`]; the CPU has the kernels' features.
pub(super) unsafe fn groups<B: Block>(
    w: *const u8,
    groups: usize,
    blocks: usize,
    xs: &[*const u8],
    out: *mut f32,
    out_stride: usize,
) {
    // SAFETY: forwarded contract; `xs` has 1 to 8 entries.
    unsafe {
        match xs.len() {
            8 => run::<B, 8>(w, groups, blocks, xs, out, out_stride),
            7 => run::<B, 7>(w, groups, blocks, xs, out, out_stride),
            6 => run::<B, 6>(w, groups, blocks, xs, out, out_stride),
            5 => run::<B, 5>(w, groups, blocks, xs, out, out_stride),
            4 => run::<B, 4>(w, groups, blocks, xs, out, out_stride),
            3 => run::<B, 3>(w, groups, blocks, xs, out, out_stride),
            2 => run::<B, 2>(w, groups, blocks, xs, out, out_stride),
            _ => run::<B, 1>(w, groups, blocks, xs, out, out_stride),
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn run<B: Block, const N: usize>(
    w: *const u8,
    groups: usize,
    blocks: usize,
    xs: &[*const u8],
    out: *mut f32,
    out_stride: usize,
) {
    crate::kernels::x86::align_frame!();
    let gb = B::group_block_bytes();
    let end = w.wrapping_add(groups * blocks * gb);
    // A prompt-form panel was just written: in the cache.
    let ahead = if B::PROMPT_FORM {
        None
    } else {
        prefetch_ahead(B::FORMAT, Isa::Avx512Vnni)
    };
    if let Some(ahead) = ahead {
        prefetch_lines(w, ahead, end);
    }
    for g in 0..groups {
        let mut acc = [_mm512_setzero_ps(); N];
        for b in 0..blocks {
            // SAFETY: the caller's contract: whole groups and activation rows; prefetches
            // stop at the end of the groups.
            unsafe {
                let block = w.add((g * blocks + b) * gb);
                if let Some(ahead) = ahead {
                    prefetch_lines(block.wrapping_add(ahead), gb, end);
                }
                B::add::<N>(block, b, xs, &mut acc);
            }
        }
        for (t, acc) in acc.iter().enumerate() {
            // SAFETY: the caller's contract: sixteen outputs per group and token.
            unsafe { _mm512_storeu_ps(out.add(t * out_stride + g * GROUP_ROWS), *acc) };
        }
    }
}
