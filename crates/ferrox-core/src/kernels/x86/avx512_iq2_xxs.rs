//! IQ2_XXS on AVX-512 (VNNI, VBMI, BITALG), the kernel of the most common 2-bit files.
//! Same integers and float operations as [`super::avx512_iq`]'s kernel (the scalar
//! reference's bits); what differs is what a sub-block costs. Once per super-block, two
//! 32-byte loads give every sub-block's sign mask (the parity rule, as there) and its odd
//! scale `2s + 1`, stored together as one word per sub-block; each sub-block then reads
//! its mask into a mask register and its scale as a broadcast straight from that word,
//! loads that need no shuffle unit, where moving them out of a vector takes two shuffles.

use std::arch::x86_64::*;

use super::avx2_iq::{iq_rows, iq_rows4, store_codes, IqAvx2};
use super::avx512_iq::{load_32, points8, signed_biased};
use crate::quant::grids::{IQ2XXS_GRID_BIASED, IQ2_LARGEST};
use crate::quant::int8::{Int8Block, CODE_OFFSET};
use crate::quant::iq2::{D_AT, QS_AT};
use crate::quant::kquants::q8_k::{CODES_AT, SUMS_AT};
use crate::quant::kquants::QK_K;

/// Sub-block `ib`'s sign mask (bit `j` set where value `32ib + j` is negative) in the low
/// 32 bits of word `ib`, its odd scale as two equal i16 in the high 32.
#[repr(C, align(64))]
struct SubBlockWords([u64; QK_K / 32]);

impl SubBlockWords {
    /// Sub-block `ib`'s sign mask, read from memory (a load, not a shuffle).
    #[inline]
    fn signs(&self, ib: usize) -> u32 {
        // SAFETY: the low half of an initialized u64 (x86 is little-endian).
        unsafe { std::ptr::read_volatile(std::ptr::from_ref(&self.0[ib]).cast::<u32>()) }
    }
}

/// Sub-block `ib`'s four grid points (biased), the first in the low 64 bits.
#[inline]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
fn grid_points(block: &[u8], ib: usize) -> __m256i {
    // One load for the four indices: byte loads would be four, and loads, not the shifts,
    // set this kernel's pace.
    let indices = u32::from_le_bytes(*block[QS_AT + 8 * ib..].first_chunk().expect("4 bytes"));
    points8(&IQ2XXS_GRID_BIASED, |l| {
        ((indices >> (8 * l)) & 0xFF) as usize
    })
}

/// Fills `words` for `block` and returns the scale of each 16 values in i16 lanes (the
/// spans of the activations' stored sums).
#[inline]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
fn prepare(block: &[u8], words: &mut SubBlockWords) -> __m256i {
    // Sub-block ib's eight bytes are 64-bit lane ib: four grid indices, then four 7-bit
    // sign fields (bits 32.., 39.., 46.., 53..) and the scale s in the top four bits. Two
    // 256-bit halves, not one 512-bit vector: on Intel cores a 512-bit instruction in
    // flight takes one of the two ports the products need. Three-input logic merges what
    // would be separate masks, shifts and ors (each instruction here costs a sub-block a
    // share of the issue width, which sets this kernel's pace).
    const SEVEN_BITS: i64 = 0x7F7F_7F7F;
    const ONES: i64 = 1 << 32 | 1 << 48;
    const FOUR_PARITIES: i64 = 0x8080_8080;
    let mut both = [_mm256_setzero_si256(); 2];
    for (h, both) in both.iter_mut().enumerate() {
        let raw = load_32(block, QS_AT + 32 * h);
        let offsets = _mm256_set1_epi64x(i64::from_le_bytes([32, 39, 46, 53, 0, 0, 0, 0]));
        // The four fields in the low bytes, the high ones 1 at bits 32 and 48 (the `+ 1` of
        // both odd scales, set before the parity count: bytes 4 and 6 have odd counts, so
        // the parities below are taken from the low four bytes only).
        let fields = _mm256_ternarylogic_epi64::<0xEA>(
            _mm256_multishift_epi64_epi8(offsets, raw),
            _mm256_set1_epi64x(SEVEN_BITS),
            _mm256_set1_epi64x(ONES),
        );
        let parities = _mm256_slli_epi16::<7>(_mm256_popcnt_epi8(fields));
        let signs =
            _mm256_ternarylogic_epi64::<0xF8>(fields, parities, _mm256_set1_epi64x(FOUR_PARITIES));
        // 2s at bits 32 and 48: the top four bits moved down to 33.. and 49...
        let twice = _mm256_and_si256(_mm256_srli_epi64::<27>(raw), _mm256_set1_epi64x(0x1E << 32));
        *both = _mm256_ternarylogic_epi64::<0xFE>(signs, twice, _mm256_slli_epi64::<16>(twice));
        // SAFETY: words `4h..4h + 4` are 32 writable bytes.
        unsafe { _mm256_storeu_si256(words.0[4 * h..].as_mut_ptr().cast(), *both) };
    }
    // Sub-block ib's odd scale pair (bytes 4..8 of lane ib) to i16 lanes 2ib and 2ib + 1.
    let pairs = _mm256_setr_epi32(
        0x0706_0504,
        0x0F0E_0D0C,
        0x1716_1514,
        0x1F1E_1D1C,
        0x2726_2524,
        0x2F2E_2D2C,
        0x3736_3534,
        0x3F3E_3D3C,
    );
    _mm256_permutex2var_epi8(both[0], pairs, both[1])
}

/// One super-block's exact integer sums against each row, as `super_block_zmm` computes
/// them for IQ2_XXS.
#[inline]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
fn super_block_xxs<F: IqAvx2, const N: usize>(
    block: &[u8],
    xs: &[&[u8]; N],
    at: usize,
    _: &mut (),
) -> [__m256i; N] {
    let mut words = SubBlockWords([0; QK_K / 32]);
    let scales = prepare(block, &mut words);
    let factors = _mm256_mullo_epi16(scales, _mm256_set1_epi16(-i16::from(F::BIAS)));
    let mut isums = xs.map(|x| {
        // SAFETY: the block's 16 stored sums end where it ends: in bounds (checked by
        // `check_rows`).
        let group_sums = unsafe { _mm256_loadu_si256(x.as_ptr().add(at + SUMS_AT).cast()) };
        _mm256_madd_epi16(group_sums, factors)
    });
    for ib in 0..QK_K / 32 {
        let biased = signed_biased(grid_points(block, ib), words.signs(ib), F::BIAS);
        let scale = _mm256_set1_epi32((words.0[ib] >> 32) as i32);
        for (s, x) in isums.iter_mut().zip(xs) {
            // SAFETY: codes `32ib..32ib + 32` of this block, in bounds as the sums above.
            let q = unsafe { _mm256_loadu_si256(x.as_ptr().add(at + CODES_AT + 32 * ib).cast()) };
            // |pair sum| <= 2·2B·128 < 2¹⁵: no saturation.
            *s = _mm256_dpwssd_epi32(*s, _mm256_maddubs_epi16(biased, q), scale);
        }
    }
    isums
}

iq_rows!(
    "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c",
    iq2_xxs_dot_zmm,
    IqAvx2,
    super_block_xxs
);

/// Four rows' super-blocks against one activation row, each row's sums as
/// [`super_block_xxs`] computes them: the four rows' words are made first, then each
/// sub-block's activations are loaded once for the four rows.
#[inline]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
fn super_block4_xxs<F: IqAvx2>(
    blocks: [&[u8]; 4],
    x: &[u8],
    at: usize,
    _: &mut (),
) -> [__m256i; 4] {
    // SAFETY: the block's 16 stored sums, in bounds (checked by `check_rows`).
    let group_sums = unsafe { _mm256_loadu_si256(x.as_ptr().add(at + SUMS_AT).cast()) };
    let mut words: [SubBlockWords; 4] = std::array::from_fn(|_| SubBlockWords([0; 8]));
    let mut isums = [_mm256_setzero_si256(); 4];
    for r in 0..4 {
        let scales = prepare(blocks[r], &mut words[r]);
        let factors = _mm256_mullo_epi16(scales, _mm256_set1_epi16(-i16::from(F::BIAS)));
        isums[r] = _mm256_madd_epi16(group_sums, factors);
    }
    for ib in 0..QK_K / 32 {
        // SAFETY: codes `32ib..32ib + 32` of this block, in bounds as the sums above.
        let q = unsafe { _mm256_loadu_si256(x.as_ptr().add(at + CODES_AT + 32 * ib).cast()) };
        for r in 0..4 {
            let grid = grid_points(blocks[r], ib);
            let biased = signed_biased(grid, words[r].signs(ib), F::BIAS);
            // A plain read: LLVM folds it into the product as a broadcast operand.
            let scale = _mm256_set1_epi32((words[r].0[ib] >> 32) as i32);
            isums[r] = _mm256_dpwssd_epi32(isums[r], _mm256_maddubs_epi16(biased, q), scale);
        }
    }
    isums
}

iq_rows4!(
    "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c",
    iq2_xxs_rows4_zmm,
    IqAvx2,
    super_block4_xxs
);

/// `block`'s integer form ([`Int8Block`]), as [`Int8Expand::expand`] makes it for IQ2_XXS:
/// the values as the kernels above make them (biased by the grid's largest coordinate),
/// moved to the int8 form's offset, and each sub-block's odd scale from [`prepare`]. The
/// prompt path expands every row once per panel; the scalar expansion took a quarter of an
/// IQ2_XXS prompt product.
///
/// [`Int8Expand::expand`]: crate::quant::int8::Int8Expand::expand
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c"
)]
pub(super) fn expand_int8(block: &[u8], out: &mut Int8Block) {
    const BIAS: i8 = IQ2_LARGEST as i8;
    const TO_CODES: i8 = (CODE_OFFSET - BIAS as i32) as i8;
    let mut words = SubBlockWords([0; QK_K / 32]);
    prepare(block, &mut words);
    out.d_bits = u16::from_le_bytes([block[D_AT], block[D_AT + 1]]);
    for ib in 0..QK_K / 32 {
        // The high half of word `ib` is the odd scale twice as i16 (at most 31).
        let scale = (words.0[ib] >> 32) as u8 as i8;
        out.scales[2 * ib] = scale;
        out.scales[2 * ib + 1] = scale;
        // The mask from the register just made, not reloaded as the row kernels do: here
        // no token amortizes the load waiting on the store (3% of an expansion).
        let biased = signed_biased(grid_points(block, ib), words.0[ib] as u32, BIAS);
        store_codes(_mm256_add_epi8(biased, _mm256_set1_epi8(TO_CODES)), ib, out);
    }
}
