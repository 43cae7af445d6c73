//! AVX-512 kernels of the i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S)
//! with Q8_K activations, for CPUs with VNNI, VBMI and BITALG (Ice Lake, Zen 4 and later).
//! They compute the AVX2 kernels' integers ([`super::avx2_iq`]) and apply the same float
//! operations, so the results are the scalar reference's bits.
//!
//! What is cheaper here, per super-block and not per sub-block:
//! - signs: the parity-completed 7-bit sign fields of IQ2_XXS, IQ2_XS and IQ3_XXS become
//!   32-bit masks for all eight sub-blocks at once (`vpmultishiftqb` picks the fields,
//!   `vpopcntb` gives each one's parity); a sub-block then negates its grid bytes with one
//!   masked subtract. IQ2_S and IQ3_S store their sign bits as such masks already;
//! - grid indices with high bits elsewhere in the block (IQ1_S, IQ1_M, IQ2_XS, IQ2_S,
//!   IQ3_S): all of a super-block's indices assembled in vector registers and stored, so a
//!   grid point costs two loads and no scalar shifting;
//! - `vpdpwssd` applies a sub-block's scale and accumulates in one instruction.
//!
//! The kernels here are 256 bits wide, their preparation too: on Intel cores a 512-bit
//! instruction in flight takes one of the two vector ports the 256-bit products need, and a
//! few of them per super-block cost several-token products a third of their speed. (The
//! 512-bit code kernels of [`super::avx512_iq_codes`] use these preparations as well; IQ3_S's,
//! used by them alone, stays 512 bits wide.)

use std::arch::x86_64::*;

use super::avx2_iq::{initial_sums, iq_rows, iq_rows4, store_codes, store_scales, IqAvx2};
use super::{avx2_iq1, avx2_iq2, avx2_iq3};
use crate::quant::grids::{
    IQ1S_GRID_PLUS_1, IQ1S_GRID_PLUS_1_TIMES_8, IQ2S_GRID_BIASED, IQ2XS_GRID_BIASED,
    IQ3S_GRID_BIASED, IQ3XXS_GRID_BIASED,
};
use crate::quant::int8::Int8Block;
use crate::quant::iq1::{M_HIGH_AT, S_HIGH_AT as IQ1S_HIGH_AT, S_INDICES_AT as IQ1S_AT};
use crate::quant::iq2::{QS_AT, S_QH_AT, S_SIGNS_AT as IQ2S_SIGNS_AT};
use crate::quant::iq3::{S_HIGH_AT, S_INDICES_AT, S_SIGNS_AT, XXS_INDICES_AT, XXS_SCALES_AT};
use crate::quant::kquants::q8_k::CODES_AT;
use crate::quant::kquants::QK_K;

/// What a super-block's sub-blocks read, made once per super-block.
#[repr(C, align(64))]
pub(super) struct Prepared {
    /// Sub-block `ib`'s signs: bit `j` set where value `32ib + j` is negative.
    signs: [u32; 8],
    /// Grid index `g` (for 8-value grids `g = 4ib + l`, for 4-value ones `8ib + k`).
    index: [u16; 64],
}

impl Default for Prepared {
    fn default() -> Self {
        Prepared {
            signs: [0; 8],
            index: [0; 64],
        }
    }
}

impl Prepared {
    /// The grid indices [`IqZmm::prepare`] stored.
    pub(super) fn index(&self) -> &[u16; 64] {
        &self.index
    }

    /// Sub-blocks `2j` and `2j + 1`'s sign masks as one, loaded from memory (as
    /// [`Prepared::sign_mask`]).
    #[inline]
    pub(super) fn pair_sign_mask(&self, j: usize) -> u64 {
        let pair: &[u32; 2] = self.signs[2 * j..].first_chunk().expect("two masks");
        // SAFETY: `pair` is 8 initialized bytes at an 8-byte aligned address (the struct
        // is 64-byte aligned, `signs` first).
        unsafe { std::ptr::read_volatile(pair.as_ptr().cast::<u64>()) }
    }

    /// Sub-block `ib`'s sign mask, loaded from memory: moving it out of the vector it was
    /// made in (extract, move to a general register, move to a mask register) costs
    /// several times more on current cores.
    #[inline]
    fn sign_mask(&self, ib: usize) -> u32 {
        // SAFETY: a reference to an initialized u32.
        unsafe { std::ptr::read_volatile(&self.signs[ib]) }
    }
}

/// An i-quant as the AVX-512 kernel sees it: the AVX2 description plus the per-super-block
/// preparation.
pub(super) trait IqZmm: IqAvx2 {
    /// Fills the parts of `prepared` that [`IqZmm::biased_zmm`] reads.
    ///
    /// # Safety
    /// The CPU must have this module's features; `block` is one whole block.
    unsafe fn prepare(block: &[u8], prepared: &mut Prepared);

    /// Sub-block `ib`'s 32 weights plus their offset (unsigned), as [`IqAvx2::biased`].
    ///
    /// # Safety
    /// As [`IqZmm::prepare`], after it ran on this block.
    unsafe fn biased_zmm(block: &[u8], prepared: &Prepared, ib: usize) -> __m256i;
}

/// `block`'s integer form ([`Int8Block`]) from the kernel's own preparation, as
/// [`super::avx2_iq::expand_int8`] from the AVX2 kernel's: what [`Int8Expand::expand`]
/// makes, bit for bit.
///
/// # Safety
/// The CPU must have this module's features; `block` is one whole block.
///
/// [`Int8Expand::expand`]: crate::quant::int8::Int8Expand::expand
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
pub(super) unsafe fn expand_int8<F: IqZmm>(block: &[u8], out: &mut Int8Block) {
    let mut prepared = Prepared::default();
    // SAFETY: the caller's contract.
    unsafe {
        F::prepare(block, &mut prepared);
        out.d_bits = F::d_bits(block);
        store_scales(F::scales(block), out);
        for ib in 0..QK_K / 32 {
            let codes = F::int8_codes(block, F::biased_zmm(block, &prepared, ib), ib);
            store_codes(codes, ib, out);
        }
    }
}

/// `B ± w` from the biased grid bytes `B + w`: `2B − (B + w)` where `negative` has the
/// byte's bit set.
#[inline]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
pub(super) fn signed_biased(biased_grid: __m256i, negative: u32, bias: i8) -> __m256i {
    _mm256_mask_sub_epi8(
        biased_grid,
        negative,
        _mm256_set1_epi8(2 * bias),
        biased_grid,
    )
}

/// Eight-bit sign masks from 7-bit fields: byte `b` of each 64-bit lane of `words` takes
/// the seven bits at offset `offsets[b]` of that lane, and its parity as bit 7 (the even
/// count of minus signs ggml's `keven_signs` completes).
#[inline]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
pub(super) fn even_signs_ymm(words: __m256i, offsets: [u8; 8]) -> __m256i {
    let fields = _mm256_and_si256(
        _mm256_multishift_epi64_epi8(_mm256_set1_epi64x(i64::from_le_bytes(offsets)), words),
        _mm256_set1_epi8(0x7F),
    );
    let parity = _mm256_and_si256(_mm256_popcnt_epi8(fields), _mm256_set1_epi8(1));
    // Bit 0 of each byte to bit 7: within a 16-bit lane neither byte spills.
    _mm256_or_si256(fields, _mm256_slli_epi16::<7>(parity))
}

/// The 32 bytes at `bytes[at..]`.
#[inline]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
pub(super) fn load_32(bytes: &[u8], at: usize) -> __m256i {
    let chunk: &[u8; 32] = bytes[at..].first_chunk().expect("32 bytes");
    // SAFETY: `chunk` is 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_si256(chunk.as_ptr().cast()) }
}

/// The 32 bytes at `bytes[at..]`, each widened to 16 bits.
#[inline]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
fn widen_32(bytes: &[u8], at: usize) -> __m512i {
    _mm512_cvtepu8_epi16(load_32(bytes, at))
}

/// The 16 bytes at `bytes[at..]`, each widened to 16 bits.
#[inline]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
fn widen_16(bytes: &[u8], at: usize) -> __m256i {
    let chunk: &[u8; 16] = bytes[at..].first_chunk().expect("16 bytes");
    // SAFETY: `chunk` is 16 readable bytes; `loadu` has no alignment requirement.
    _mm256_cvtepu8_epi16(unsafe { _mm_loadu_si128(chunk.as_ptr().cast()) })
}

#[inline]
fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(*bytes[at..].first_chunk().expect("four bytes"))
}

#[inline]
fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(*bytes[at..].first_chunk().expect("eight bytes"))
}

/// Four 8-value grid points, the first in the low 64 bits.
#[inline]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
pub(super) fn points8(grid: &[u64], index: impl Fn(usize) -> usize) -> __m256i {
    let p: [u64; 4] = std::array::from_fn(|l| grid[index(l)]);
    _mm256_set_epi64x(p[3] as i64, p[2] as i64, p[1] as i64, p[0] as i64)
}

/// Eight 4-value grid points, the first in the low 32 bits.
#[inline]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
fn points4(grid: &[u32], index: impl Fn(usize) -> usize) -> __m256i {
    let p: [i32; 8] = std::array::from_fn(|k| grid[index(k)] as i32);
    _mm256_setr_epi32(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7])
}

/// 8-value-grid indices `qs | (high << 8)` for groups `16h..16h + 16` (sub-blocks
/// `4h..4h + 4`): `qs` the low bytes at `low_at`; group `4ib + l`'s high bits are
/// `(word(ib) >> (step·l)) & mask`, `word(ib)` the 16-bit word `ib` at `words_at` (IQ1_S,
/// IQ1_M).
#[inline]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
fn indices_from_words(
    block: &[u8],
    (low_at, words_at): (usize, usize),
    step: u16,
    mask: u16,
    h: usize,
) -> __m256i {
    let words: &[u8; 16] = block[words_at..].first_chunk().expect("eight words");
    // SAFETY: `words` is 16 readable bytes.
    let words = unsafe { _mm_loadu_si128(words.as_ptr().cast()) };
    let first = 4 * h as i16;
    let spread = _mm256_permutexvar_epi16(
        _mm256_add_epi16(
            _mm256_set1_epi16(first),
            _mm256_setr_epi16(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
        ),
        _mm256_castsi128_si256(words),
    );
    let s = u64::from(step);
    let shifts = _mm256_set1_epi64x(((3 * s) << 48 | (2 * s) << 32 | s << 16) as i64);
    let high = _mm256_and_si256(
        _mm256_srlv_epi16(spread, shifts),
        _mm256_set1_epi16(mask as i16),
    );
    _mm256_or_si256(
        widen_16(block, low_at + 16 * h),
        _mm256_slli_epi16::<8>(high),
    )
}

/// Stores `v`'s 16 u16 lanes as indices `16q..16q + 16`.
#[inline]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
fn store_index_quarter(prepared: &mut Prepared, q: usize, v: __m256i) {
    let quarter: &mut [u16; 16] = prepared.index[16 * q..].first_chunk_mut().expect("16");
    // SAFETY: `quarter` is 32 writable bytes.
    unsafe { _mm256_storeu_si256(quarter.as_mut_ptr().cast(), v) }
}

impl IqZmm for avx2_iq2::Iq2XsAvx2 {
    #[inline]
    #[target_feature(
        enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
    )]
    unsafe fn prepare(block: &[u8], prepared: &mut Prepared) {
        // Four 16-bit words per sub-block: a 9-bit index, then a 7-bit sign field; in
        // 256-bit halves (no 512-bit instruction beside the 256-bit products).
        for h in 0..2 {
            let words = load_32(block, QS_AT + 32 * h);
            let signs = _mm256_cvtepi64_epi32(even_signs_ymm(words, [9, 25, 41, 57, 0, 0, 0, 0]));
            // SAFETY: masks `4h..4h + 4` are 16 writable bytes.
            unsafe { _mm_storeu_si128(prepared.signs[4 * h..].as_mut_ptr().cast(), signs) };
            store_index_quarter(prepared, h, _mm256_and_si256(words, _mm256_set1_epi16(511)));
        }
    }

    #[inline]
    #[target_feature(
        enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
    )]
    unsafe fn biased_zmm(_block: &[u8], prepared: &Prepared, ib: usize) -> __m256i {
        let grid = points8(&IQ2XS_GRID_BIASED, |l| {
            usize::from(prepared.index[4 * ib + l])
        });
        signed_biased(grid, prepared.sign_mask(ib), Self::BIAS)
    }
}

/// For each half of IQ2_S's 32 groups, the bit offset of group `g`'s two high bits in the
/// 64-bit high word (`2g`), at its index's low byte (a constant in memory: built at run
/// time it costs stores).
const IQ2S_HIGH_OFFSETS: [[u8; 32]; 2] = {
    let mut offsets = [[0u8; 32]; 2];
    let mut b = 0;
    while b < 32 {
        offsets[0][b] = b as u8;
        offsets[1][b] = 32 + b as u8;
        b += 2;
    }
    offsets
};

impl IqZmm for avx2_iq2::Iq2SAvx2 {
    #[inline]
    #[target_feature(
        enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
    )]
    unsafe fn prepare(block: &[u8], prepared: &mut Prepared) {
        // Group g = 4ib + l takes bits 2l.. of high byte ib: bits 2g.. of the 64-bit word.
        // 256-bit halves: on Intel cores a 512-bit instruction in flight takes one of the
        // two ports the products need.
        let qh = _mm256_set1_epi64x(u64_at(block, S_QH_AT) as i64);
        for (h, offsets) in IQ2S_HIGH_OFFSETS.iter().enumerate() {
            let high = _mm256_and_si256(
                _mm256_multishift_epi64_epi8(load_32(offsets, 0), qh),
                _mm256_set1_epi16(3),
            );
            let index = _mm256_or_si256(
                widen_16(block, QS_AT + 16 * h),
                _mm256_slli_epi16::<8>(high),
            );
            store_index_quarter(prepared, h, index);
        }
    }

    #[inline]
    #[target_feature(
        enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
    )]
    unsafe fn biased_zmm(block: &[u8], prepared: &Prepared, ib: usize) -> __m256i {
        let grid = points8(&IQ2S_GRID_BIASED, |l| {
            usize::from(prepared.index[4 * ib + l])
        });
        signed_biased(grid, u32_at(block, IQ2S_SIGNS_AT + 4 * ib), Self::BIAS)
    }
}

impl IqZmm for avx2_iq3::Xxs {
    #[inline]
    #[target_feature(
        enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
    )]
    unsafe fn prepare(block: &[u8], prepared: &mut Prepared) {
        // Eight 32-bit words of four 7-bit sign fields and a scale, two per 64-bit lane.
        let words = load_32(block, XXS_SCALES_AT);
        let signs = even_signs_ymm(words, [0, 7, 14, 21, 32, 39, 46, 53]);
        // SAFETY: `signs` is 32 writable bytes.
        unsafe { _mm256_storeu_si256(prepared.signs.as_mut_ptr().cast(), signs) }
    }

    #[inline]
    #[target_feature(
        enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
    )]
    unsafe fn biased_zmm(block: &[u8], prepared: &Prepared, ib: usize) -> __m256i {
        let at = XXS_INDICES_AT + 8 * ib;
        let grid = points4(&IQ3XXS_GRID_BIASED, |k| usize::from(block[at + k]));
        signed_biased(grid, prepared.sign_mask(ib), Self::BIAS)
    }
}

impl IqZmm for avx2_iq3::S {
    #[inline]
    #[target_feature(
        enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
    )]
    unsafe fn prepare(block: &[u8], prepared: &mut Prepared) {
        // Index e's ninth bit is bit e of the eight high bytes.
        let high = u64_at(block, S_HIGH_AT);
        // 512 bits wide: only the 512-bit code kernel runs IQ3_S (in 256-bit quarters its
        // products took 1.5x as long at one token).
        for h in 0..2 {
            let ninth = _mm512_maskz_mov_epi16((high >> (32 * h)) as u32, _mm512_set1_epi16(0x100));
            let index = _mm512_or_si512(widen_32(block, S_INDICES_AT + 32 * h), ninth);
            let half: &mut [u16; 32] = prepared.index[32 * h..].first_chunk_mut().expect("32");
            // SAFETY: `half` is 64 writable bytes.
            unsafe { _mm512_storeu_si512(half.as_mut_ptr().cast(), index) }
        }
    }

    #[inline]
    #[target_feature(
        enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
    )]
    unsafe fn biased_zmm(block: &[u8], prepared: &Prepared, ib: usize) -> __m256i {
        let grid = points4(&IQ3S_GRID_BIASED, |k| {
            usize::from(prepared.index[8 * ib + k])
        });
        signed_biased(grid, u32_at(block, S_SIGNS_AT + 4 * ib), Self::BIAS)
    }
}

impl IqZmm for avx2_iq1::S {
    #[inline]
    #[target_feature(
        enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
    )]
    unsafe fn prepare(block: &[u8], prepared: &mut Prepared) {
        for h in 0..2 {
            let index = indices_from_words(block, (IQ1S_AT, IQ1S_HIGH_AT), 3, 7, h);
            store_index_quarter(prepared, h, index);
        }
    }

    #[inline]
    #[target_feature(
        enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
    )]
    unsafe fn biased_zmm(_block: &[u8], prepared: &Prepared, ib: usize) -> __m256i {
        // The grid plus one, as the AVX2 kernel (see there).
        points8(&IQ1S_GRID_PLUS_1, |l| {
            usize::from(prepared.index[4 * ib + l])
        })
    }
}

/// IQ1_M's weights `8c + δ + 9` as `8·(c + 1) + (δ + 1)` with `δ + 1` 0 or 2: a table of
/// `8·(c + 1)` and one masked add of 2 where the group's shift is positive.
impl IqZmm for avx2_iq1::M {
    #[inline]
    #[target_feature(
        enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
    )]
    unsafe fn prepare(block: &[u8], prepared: &mut Prepared) {
        for h in 0..2 {
            let index = indices_from_words(block, (0, M_HIGH_AT), 4, 7, h);
            store_index_quarter(prepared, h, index);
        }
        // Group l of sub-block ib shifts down where bit 4l + 3 of word ib is set. 64-bit
        // lane j of `words` holds words 4(j/2).., so output lane j (sub-blocks 2j, 2j + 1)
        // finds word ib at bit 16·(ib % 4).
        let chunk: &[u8; 16] = block[M_HIGH_AT..].first_chunk().expect("eight words");
        // SAFETY: `chunk` is 16 readable bytes.
        let words = _mm256_castsi128_si256(unsafe { _mm_loadu_si128(chunk.as_ptr().cast()) });
        let words = _mm256_permutexvar_epi64(_mm256_setr_epi64x(0, 0, 1, 1), words);
        let offsets: [u8; 32] = std::array::from_fn(|b| {
            let (ib, l) = (b / 4, b % 4);
            (16 * (ib % 4) + 4 * l + 3) as u8
        });
        // SAFETY: `offsets` is 32 readable bytes.
        let offsets = unsafe { _mm256_loadu_si256(offsets.as_ptr().cast()) };
        let up = _mm256_testn_epi8_mask(
            _mm256_multishift_epi64_epi8(offsets, words),
            _mm256_set1_epi8(1),
        );
        // One byte per group: 0xFF where the shift is positive; sub-block ib's four are
        // the 32 bits of its mask.
        let bytes = _mm256_maskz_mov_epi8(up, _mm256_set1_epi8(-1));
        // SAFETY: `signs` is 32 writable bytes.
        unsafe { _mm256_storeu_si256(prepared.signs.as_mut_ptr().cast(), bytes) }
    }

    #[inline]
    #[target_feature(
        enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
    )]
    unsafe fn biased_zmm(_block: &[u8], prepared: &Prepared, ib: usize) -> __m256i {
        let eights = points8(&IQ1S_GRID_PLUS_1_TIMES_8, |l| {
            usize::from(prepared.index[4 * ib + l])
        });
        _mm256_mask_add_epi8(eights, prepared.sign_mask(ib), eights, _mm256_set1_epi8(2))
    }
}

/// Sub-block `ib`'s scales in every i16 lane of its 32 values' products, from a
/// super-block's scales (i16 lanes `2ib` and `2ib + 1`, i32 lane `ib`): every i32 lane gets
/// that pair, then, where each covers 16 values, the low half repeats the first, the high
/// half the second.
#[inline]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
fn sub_block_scales<F: IqZmm>(scales: __m256i, ib: usize) -> __m256i {
    let pair = _mm256_permutexvar_epi32(_mm256_set1_epi32(ib as i32), scales);
    if F::SCALE_PER_32 {
        return pair;
    }
    _mm256_shuffle_epi8(
        pair,
        _mm256_setr_epi8(
            0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, //
            2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
        ),
    )
}

/// One super-block's exact integer sums against each row, as the AVX2 kernel's
/// `super_block` computes them.
#[inline]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
fn super_block_zmm<F: IqZmm, const N: usize>(
    block: &[u8],
    xs: &[&[u8]; N],
    at: usize,
    prepared: &mut Prepared,
) -> [__m256i; N] {
    let (scales, mut isums) = initial_sums::<F, N>(block, xs, at);
    // SAFETY: this function's features are the ones `prepare` and `biased_zmm` need;
    // `block` is one whole block.
    unsafe { F::prepare(block, prepared) };
    for ib in 0..QK_K / 32 {
        // SAFETY: as above, after `prepare`.
        let biased = unsafe { F::biased_zmm(block, prepared, ib) };
        let sub_scales = sub_block_scales::<F>(scales, ib);
        for (s, x) in isums.iter_mut().zip(xs) {
            // SAFETY: codes `32ib..32ib + 32` of this block, in bounds as the sums above.
            let q = unsafe { _mm256_loadu_si256(x.as_ptr().add(at + CODES_AT + 32 * ib).cast()) };
            // |pair sum| <= 2·2B·128 < 2¹⁵: no saturation.
            *s = _mm256_dpwssd_epi32(*s, _mm256_maddubs_epi16(biased, q), sub_scales);
        }
    }
    isums
}

iq_rows!(
    "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c",
    iq_dot_zmm,
    IqZmm,
    super_block_zmm
);

/// Four rows' super-blocks against one activation row, each row's sums as
/// [`super_block_zmm`] computes them: the rows are prepared first, then each sub-block's
/// activations are loaded once for the four rows, whose independent sums the core overlaps.
#[inline]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
fn super_block4_zmm<F: IqZmm>(
    blocks: [&[u8]; 4],
    x: &[u8],
    at: usize,
    prepared: &mut [Prepared; 4],
) -> [__m256i; 4] {
    let mut scales = [_mm256_setzero_si256(); 4];
    let mut isums = [_mm256_setzero_si256(); 4];
    for r in 0..4 {
        let (s, [i]) = initial_sums::<F, 1>(blocks[r], &[x], at);
        (scales[r], isums[r]) = (s, i);
        // SAFETY: this function's features are the ones `prepare` needs; `blocks[r]` is
        // one whole block.
        unsafe { F::prepare(blocks[r], &mut prepared[r]) };
    }
    for ib in 0..QK_K / 32 {
        // SAFETY: codes `32ib..32ib + 32` of this block, in bounds as `initial_sums`'s.
        let q = unsafe { _mm256_loadu_si256(x.as_ptr().add(at + CODES_AT + 32 * ib).cast()) };
        for r in 0..4 {
            // SAFETY: as above, after `prepare`.
            let biased = unsafe { F::biased_zmm(blocks[r], &prepared[r], ib) };
            let sub_scales = sub_block_scales::<F>(scales[r], ib);
            isums[r] = _mm256_dpwssd_epi32(isums[r], _mm256_maddubs_epi16(biased, q), sub_scales);
        }
    }
    isums
}

iq_rows4!(
    "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c",
    iq_rows4_zmm,
    IqZmm,
    super_block4_zmm
);
