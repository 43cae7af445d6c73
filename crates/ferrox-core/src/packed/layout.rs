//! The packed formats and how sixteen file rows become one group (see the module notes of
//! [`super`] for the 32-value formats; the 256-value ones are described here).
//!
//! Q4_K, per super-block of a group: `d` and `dmin` (16 f16 each), the eight sub-block
//! scales and then the eight minimums as bytes (`[sub-block][row]`, the file's 6-bit
//! fields unpacked: four bytes more per row than the file), then 32 vectors of nibbles:
//! vector `8j + k` holds the file's bytes `32j + 4k..+4` of each row, whose low nibbles are
//! values `64j + 4k..+4` (sub-block `2j`) and high nibbles values `64j + 32 + 4k..+4`.
//!
//! Q6_K, per super-block of a group: `d` (16 f16), the sixteen signed scales as pairs
//! (`[pair p][row][2]`: scales `2p` and `2p + 1`), then the six-bit codes (unsigned, the
//! value plus 32) split as the file splits them, four low bits and two high bits, laid out
//! by quads of values (`q` = values `4q..4q+4`): vector `m` of the low bits holds quad
//! `2m` in its low nibbles and quad `2m + 1` in its high ones; vector `n` of the high bits
//! holds quads `4n..4n+4` in bit pairs 0-1, 2-3, 4-5, 6-7; high vector `n` follows low
//! vectors `2n` and `2n + 1`, whose values it completes. Same size as the file.
//!
//! Q2_K and Q3_K keep their 2-bit codes by sub-block of 16 values: code vector `s` holds
//! sub-block `s`, value `16s + 4k + j` of row `r` in bits `2k..2k+2` of byte `4r + j`, so
//! that a shift by `2k` and a mask give the four values of quad `k` of all sixteen rows in
//! their lanes, and each vector serves one sub-block.
//!
//! Q2_K, per super-block of a group: `d` and `dmin` (16 f16 each), the file's scale bytes
//! (`m << 4 | scale`) as pairs (`[pair p][row][2]`: sub-blocks `2p` and `2p + 1`, so that
//! one widening load gives each row's two minimums for the activation's pair of sums),
//! then the sixteen code vectors. Same size as the file.
//!
//! Q3_K, per super-block of a group: `d` (16 f16), the sixteen signed scales (the file's
//! 6-bit fields minus 32) as pairs like Q6_K's, then the three-bit codes (unsigned, the
//! value plus 4) as two low bits in code vectors and a plane of third bits per pair of
//! sub-blocks: bit `4i + k` of byte `4r + j` of plane `p` is the third bit of value
//! `16(2p + i) + 4k + j` of row `r`. Plane `p` follows code vectors `2p` and `2p + 1`
//! (`[codes 2p][codes 2p + 1][plane p]`, 192 bytes each) so that a block is read front to
//! back. Four bytes more per row than the file (the scales unpacked).
//!
//! Q1_0 (128 values) and Q2_0 (64) take Q8_0 activations, one block per 32 values, so a
//! block of theirs spans several (`parts`), all scaled by the block's one `d` (16 f16 first).
//! Q1_0: per part, a 64-byte plane of signs ([`q1_0_plane_at`]), a set bit the code 2
//! (`+d`), a clear one 0 (`−d`). Q2_0: four code vectors laid out as Q2_K's (vector `s`: values
//! `16s..16s + 16`), codes 0..3 for −1..+2. Both the size of the file.
//!
//! NVFP4 (64 values, two activation blocks) keeps a scale per 16 values: per block of a
//! group, its four sub-block scales as f16 (`[sub-block][row]`, 32 bytes each: the E4M3
//! scales, halved, are f16 values exactly), then per 32-value part `k` four nibble vectors
//! as Q4_0's, the nibbles moved so that the low ones are sub-block `2k` and the high ones
//! sub-block `2k + 1` (a nibble indexes the FP4 levels, read as MXFP4's codes). Each part
//! gives two integer sums per row, so its activation block carries the sums of its two
//! halves (see [`PackedFormat::activations`]). Four bytes more per row than the file.
//!
//! TQ2_0, per super-block of a group: `d` (16 f16), then the sixteen code vectors laid out
//! as Q2_K's (a code `c` of 0, 1 or 2 stands for `c − 1`). Same size as the file. TQ1_0
//! packs into the same layout, its five codes per byte unpacked to two bits each (66 bytes
//! per row and block where the file has 54), so that it runs TQ2_0's kernels.
//!
//! IQ4_XS, per super-block of a group: `d` (16 f16), the eight signed 6-bit scales as bytes
//! (`[sub-block][row]`), then per 32-value sub-block four nibble vectors laid out as
//! IQ4_NL's (a nibble indexes the non-linear levels, read as `level + 128`). Two bytes
//! more per row than the file.
//!
//! I8K holds no file type: it is the i-quants' integer form ([`crate::quant::int8`]), made
//! from a panel of rows just before a prompt's product and dropped after it. Per
//! super-block of a group: `d` (16 f16), the sixteen odd scales as pairs like Q6_K's, then
//! 64 code vectors: vector `q` holds values `4q..4q + 4` of row `r` at bytes `4r..4r + 4`,
//! as unsigned `v + 64`.

use ferrox_gguf::GgmlType;

use crate::quant::fp4::{e8m0_half, ue4m3_half, LEVELS as FP4_LEVELS, NVFP4_SCALES};
use crate::quant::int8::{Int8Block, CODE_OFFSET, MAX_MAGNITUDE};
use crate::quant::iq4::{Iq4Xs, LEVELS as IQ4_LEVELS, XS_NIBBLES_AT};
use crate::quant::kquants::{q3_k, scale_min_k4, unpack_two_bit_codes};
use crate::quant::low_bit::CODES_AT;
use crate::quant::ternary::{tq1_codes, tq2_code, TQ1_D_AT, TQ2_CODES};

/// Rows interleaved in one group.
pub const GROUP_ROWS: usize = 16;
/// Values per block of the 32-value formats.
pub(super) const QK: usize = 32;
/// Values per super-block of the 256-value formats.
pub(super) const QK_K: usize = 256;
/// Bytes of one activation block of the 32-value formats: 32 codes, the scale as f32, the
/// codes' sum as i32.
pub(super) const ACTIVATION_BLOCK_BYTES: usize = 40;
pub(super) const ACT_SCALE_AT: usize = 32;
/// The codes' sum as an i32, or (NVFP4's [`Activations::HalfSums`]) the sums of codes
/// `0..16` and `16..32` as two i16, the first in the low bytes.
pub(super) const ACT_SUM_AT: usize = 36;
/// Bytes of a Q8_K activation block (f32 scale, 256 codes, 16 i16 sums of 16 codes).
pub(super) const Q8K_BYTES: usize = 292;
pub(super) const Q8K_CODES_AT: usize = 4;
pub(super) const Q8K_SUMS_AT: usize = 260;
/// The sum of a Q8_K activation block's 256 codes, from its sixteen sums of 16 (TQ2_0's
/// codes are the value plus one: the products take this sum off once per block).
///
/// # Safety
/// `block` addresses a whole Q8_K activation block.
#[inline(always)]
pub(super) unsafe fn q8k_code_sum(block: *const u8) -> i32 {
    let mut total = 0;
    for s in 0..16 {
        // SAFETY: the caller's contract: the sums lie inside the block.
        total += i32::from(unsafe {
            block
                .add(Q8K_SUMS_AT + 2 * s)
                .cast::<i16>()
                .read_unaligned()
        });
    }
    total
}

/// Bytes of the sixteen f16 scales at the start of every group block.
pub(super) const SCALES_BYTES: usize = 2 * GROUP_ROWS;

/// Offsets inside a Q4_K group block.
pub(super) const Q4K_DMIN_AT: usize = 32;
pub(super) const Q4K_SCALES_AT: usize = 64;
pub(super) const Q4K_MINS_AT: usize = 192;
pub(super) const Q4K_CODES_AT: usize = 320;
/// Q5_K's group blocks are Q4_K's with the fifth bits between the minimums and the codes,
/// as eight planes of 64 bytes: bit `s` of byte `4r + j` of plane `k` is the fifth bit of
/// value `32s + 4k + j` of row `r`, so one plane serves the code vectors of quad `k` in
/// all eight sub-blocks (a shift and a mask each), and a block is read front to back.
pub(super) const Q5K_PLANES_AT: usize = Q4K_CODES_AT;
pub(super) const Q5K_CODES_AT: usize = Q5K_PLANES_AT + 8 * 64;

/// Where a Q4_K (or, `fifth`, Q5_K) group block's code vectors start.
pub(super) const fn affine_k_codes_at(fifth: bool) -> usize {
    if fifth {
        Q5K_CODES_AT
    } else {
        Q4K_CODES_AT
    }
}
/// Offsets inside a Q6_K group block.
pub(super) const Q6K_SCALES_AT: usize = 32;
pub(super) const Q6K_CODES_AT: usize = 288;

/// Where a Q6_K group block's low-bit vector `m` lies: with the high-bit vector of the
/// same sixteen values, sub-block by sub-block (`[low 2s][low 2s + 1][high s]`, 192 bytes
/// each), so that a block is read front to back in one stream.
pub(super) const fn q6k_low_at(m: usize) -> usize {
    Q6K_CODES_AT + 192 * (m / 2) + 64 * (m % 2)
}

/// Where a Q6_K group block's high-bit vector `n` lies (see [`q6k_low_at`]).
pub(super) const fn q6k_high_at(n: usize) -> usize {
    Q6K_CODES_AT + 192 * n + 128
}

/// Where an NVFP4 group block's nibble vectors start: after its four sub-blocks' scales.
pub(super) const NVFP4_CODES_AT: usize = NVFP4_SCALES * SCALES_BYTES;

/// Where an NVFP4 group block's scales of sub-block `s` lie.
pub(super) const fn nvfp4_scales_at(s: usize) -> usize {
    SCALES_BYTES * s
}

/// MXFP4's codes by nibble: the FP4 level plus 12 (unsigned, at most 24). NVFP4's levels
/// are the same.
pub(super) const MXFP4_CODES: [u8; 16] = level_codes(&FP4_LEVELS, 12);

/// Unsigned codes `level + bias` of a table of levels indexed by nibbles.
const fn level_codes(levels: &[i8; 16], bias: i32) -> [u8; 16] {
    let mut codes = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        codes[i] = (levels[i] as i32 + bias) as u8;
        i += 1;
    }
    codes
}

/// IQ4_NL's codes by nibble: the level plus 128 (unsigned, as Q8_0's codes).
pub(super) const IQ4NL_CODES: [u8; 16] = level_codes(&IQ4_LEVELS, 128);

/// Offsets inside an IQ4_XS group block.
pub(super) const IQ4XS_SCALES_AT: usize = 32;
pub(super) const IQ4XS_CODES_AT: usize = 160;

/// Where an IQ4_XS group block's four nibble vectors of sub-block `s` lie.
pub(super) const fn iq4xs_codes_at(s: usize) -> usize {
    IQ4XS_CODES_AT + 256 * s
}

/// Offsets inside an I8K group block.
pub(super) const I8K_SCALES_AT: usize = 32;
/// After the scales, at a whole cache line (the group blocks are whole lines too).
pub(super) const I8K_CODES_AT: usize = 320;
/// What I8K's unsigned codes add to the values.
pub(super) const I8K_BIAS: i32 = CODE_OFFSET;
// The codes stay below 128: `maddubs` pair sums (two codes times activation bytes of up
// to 128 in magnitude) never saturate an i16.
const _: () = assert!(MAX_MAGNITUDE + I8K_BIAS < 128 && I8K_BIAS - MAX_MAGNITUDE >= 0);
const _: () = assert!(I8K_CODES_AT.is_multiple_of(64) && I8K_CODES_AT >= I8K_SCALES_AT + 256);

/// Offsets inside a Q2_K group block.
pub(super) const Q2K_DMIN_AT: usize = 32;
pub(super) const Q2K_SCALES_AT: usize = 64;
pub(super) const Q2K_CODES_AT: usize = 320;

/// Where a Q2_K group block's code vector `s` (sub-block `s`) lies.
pub(super) const fn q2k_codes_at(s: usize) -> usize {
    Q2K_CODES_AT + 64 * s
}

/// Where a TQ2_0 group block's code vector `s` (values `16s..16s + 16`) lies: after the
/// scales, as Q2_K's.
pub(super) const fn tq2_codes_at(s: usize) -> usize {
    SCALES_BYTES + 64 * s
}

/// Where a Q1_0 group block's plane of signs of 32-value part `k` lies: bit `g` of byte
/// `4r + j` is the sign (set: `+d`) of value `32k + 4g + j` of row `r`, so that a shift and
/// a mask (or a test) give the codes of quad `g` of all sixteen rows in their lanes, as Q5_0's
/// fifth bits do.
pub(super) const fn q1_0_plane_at(k: usize) -> usize {
    SCALES_BYTES + 64 * k
}

/// Offsets inside a Q3_K group block.
pub(super) const Q3K_SCALES_AT: usize = 32;
pub(super) const Q3K_CODES_AT: usize = 288;

/// Where a Q3_K group block's low-bit vector `s` (sub-block `s`) lies.
pub(super) const fn q3k_low_at(s: usize) -> usize {
    Q3K_CODES_AT + 192 * (s / 2) + 64 * (s % 2)
}

/// Where a Q3_K group block's plane of third bits `p` (sub-blocks `2p`, `2p + 1`) lies.
pub(super) const fn q3k_high_at(p: usize) -> usize {
    Q3K_CODES_AT + 192 * p + 128
}

/// The packed formats as numbers, for kernels generic over their format (const generic
/// parameters take no enums): see [`PackedFormat::from_id`].
pub(super) mod id {
    pub const Q4_0: u8 = 0;
    pub const Q5_0: u8 = 1;
    pub const Q8_0: u8 = 2;
    pub const Q4K: u8 = 3;
    pub const Q5K: u8 = 5;
    pub const Q4_1: u8 = 6;
    pub const Q5_1: u8 = 7;
    pub const Q6K: u8 = 4;
    pub const Q2K: u8 = 8;
    pub const Q3K: u8 = 9;
    pub const I8K: u8 = 10;
    pub const MXFP4: u8 = 11;
    pub const IQ4_NL: u8 = 12;
    pub const IQ4_XS: u8 = 13;
    pub const TQ2_0: u8 = 14;
    pub const Q1_0: u8 = 15;
    pub const Q2_0: u8 = 16;
    pub const NVFP4: u8 = 17;
}

/// How a format's activation rows are laid out: Q8_K blocks, or Q8_0-based blocks of 32
/// values ([`ACTIVATION_BLOCK_BYTES`]) with the codes' sum or the sums of their halves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Activations {
    Q8K,
    Sum,
    HalfSums,
}

/// A format that can be packed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackedFormat {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Mxfp4,
    Iq4Nl,
    Q4K,
    Q5K,
    Q6K,
    Q2K,
    Q3K,
    Iq4Xs,
    Tq2_0,
    /// TQ1_0, its base-3 codes unpacked to TQ2_0's group layout (see the module notes).
    Tq1_0,
    Q1_0,
    Q2_0,
    Nvfp4,
    /// The i-quants expanded to int8 for a prompt (see the module notes): never the
    /// format of a [`super::PackedMatrix`].
    I8K,
}

impl PackedFormat {
    pub fn of(ty: GgmlType) -> Option<PackedFormat> {
        match ty {
            GgmlType::Q4_0 => Some(PackedFormat::Q4_0),
            GgmlType::Q5_0 => Some(PackedFormat::Q5_0),
            GgmlType::Q4_1 => Some(PackedFormat::Q4_1),
            GgmlType::Q5_1 => Some(PackedFormat::Q5_1),
            GgmlType::Q8_0 => Some(PackedFormat::Q8_0),
            GgmlType::Mxfp4 => Some(PackedFormat::Mxfp4),
            GgmlType::Iq4Nl => Some(PackedFormat::Iq4Nl),
            GgmlType::Q4K => Some(PackedFormat::Q4K),
            GgmlType::Q5K => Some(PackedFormat::Q5K),
            GgmlType::Q6K => Some(PackedFormat::Q6K),
            GgmlType::Q2K => Some(PackedFormat::Q2K),
            GgmlType::Q3K => Some(PackedFormat::Q3K),
            GgmlType::Iq4Xs => Some(PackedFormat::Iq4Xs),
            GgmlType::Tq2_0 => Some(PackedFormat::Tq2_0),
            GgmlType::Tq1_0 => Some(PackedFormat::Tq1_0),
            GgmlType::Q1_0 => Some(PackedFormat::Q1_0),
            GgmlType::Q2_0 => Some(PackedFormat::Q2_0),
            GgmlType::Nvfp4 => Some(PackedFormat::Nvfp4),
            _ => None,
        }
    }

    /// The format numbered `n` in [`id`].
    pub(super) const fn from_id(n: u8) -> PackedFormat {
        match n {
            id::Q4_0 => PackedFormat::Q4_0,
            id::Q5_0 => PackedFormat::Q5_0,
            id::Q4_1 => PackedFormat::Q4_1,
            id::Q5_1 => PackedFormat::Q5_1,
            id::Q8_0 => PackedFormat::Q8_0,
            id::MXFP4 => PackedFormat::Mxfp4,
            id::IQ4_NL => PackedFormat::Iq4Nl,
            id::Q4K => PackedFormat::Q4K,
            id::Q5K => PackedFormat::Q5K,
            id::Q2K => PackedFormat::Q2K,
            id::Q3K => PackedFormat::Q3K,
            id::I8K => PackedFormat::I8K,
            id::IQ4_XS => PackedFormat::Iq4Xs,
            id::TQ2_0 => PackedFormat::Tq2_0,
            id::Q1_0 => PackedFormat::Q1_0,
            id::Q2_0 => PackedFormat::Q2_0,
            id::NVFP4 => PackedFormat::Nvfp4,
            _ => PackedFormat::Q6K,
        }
    }

    pub fn ty(self) -> GgmlType {
        match self {
            PackedFormat::Q4_0 => GgmlType::Q4_0,
            PackedFormat::Q5_0 => GgmlType::Q5_0,
            PackedFormat::Q4_1 => GgmlType::Q4_1,
            PackedFormat::Q5_1 => GgmlType::Q5_1,
            PackedFormat::Q8_0 => GgmlType::Q8_0,
            PackedFormat::Mxfp4 => GgmlType::Mxfp4,
            PackedFormat::Iq4Nl => GgmlType::Iq4Nl,
            PackedFormat::Q4K => GgmlType::Q4K,
            PackedFormat::Q5K => GgmlType::Q5K,
            PackedFormat::Q6K => GgmlType::Q6K,
            PackedFormat::Q2K => GgmlType::Q2K,
            PackedFormat::Q3K => GgmlType::Q3K,
            PackedFormat::Iq4Xs => GgmlType::Iq4Xs,
            PackedFormat::Tq2_0 => GgmlType::Tq2_0,
            PackedFormat::Tq1_0 => GgmlType::Tq1_0,
            PackedFormat::Q1_0 => GgmlType::Q1_0,
            PackedFormat::Q2_0 => GgmlType::Q2_0,
            PackedFormat::Nvfp4 => GgmlType::Nvfp4,
            // Not a file type; its values are Q8_K-like (int8 codes, 256 per block).
            PackedFormat::I8K => GgmlType::Q8K,
        }
    }

    /// Whether activations are Q8_K (the 256-value formats) rather than Q8_0-based.
    pub(super) fn is_k(self) -> bool {
        matches!(
            self,
            PackedFormat::Q4K
                | PackedFormat::Q5K
                | PackedFormat::Q6K
                | PackedFormat::Q2K
                | PackedFormat::Q3K
                | PackedFormat::Iq4Xs
                | PackedFormat::Tq2_0
                | PackedFormat::Tq1_0
                | PackedFormat::I8K
        )
    }

    /// The layout of this format's activation rows: matrices whose formats agree on it
    /// (and on the columns) take the same quantized rows.
    pub(super) fn activations(self) -> Activations {
        if self.is_k() {
            Activations::Q8K
        } else if self == PackedFormat::Nvfp4 {
            Activations::HalfSums
        } else {
            Activations::Sum
        }
    }

    /// Whether the format has Q4_K's shape (scales and minimums per 32 values; Q5_K adds a
    /// fifth bit).
    pub(super) fn is_affine_k(self) -> bool {
        matches!(self, PackedFormat::Q4K | PackedFormat::Q5K)
    }

    /// The format whose group layout this one is packed into, as the kernels and prompt
    /// forms read it: TQ1_0's is TQ2_0's.
    pub(super) fn layout(self) -> PackedFormat {
        match self {
            PackedFormat::Tq1_0 => PackedFormat::Tq2_0,
            other => other,
        }
    }

    /// Values per block.
    pub(super) fn values(self) -> usize {
        if self.is_k() {
            QK_K
        } else {
            QK * self.parts()
        }
    }

    /// Activation blocks (of 32 values) per block of a 32-value format: Q1_0's one scale
    /// serves 128 values, Q2_0's 64, NVFP4's blocks hold 64.
    pub(super) const fn parts(self) -> usize {
        match self {
            PackedFormat::Q1_0 => 4,
            PackedFormat::Q2_0 | PackedFormat::Nvfp4 => 2,
            _ => 1,
        }
    }

    /// Bytes of one block of one row in the file.
    fn file_block_bytes(self) -> usize {
        match self {
            PackedFormat::Q4_0 => 18,
            PackedFormat::Q5_0 => 22,
            PackedFormat::Q4_1 => 20,
            PackedFormat::Q5_1 => 24,
            PackedFormat::Q8_0 => 34,
            PackedFormat::Mxfp4 => 17,
            PackedFormat::Iq4Nl => 18,
            PackedFormat::Q4K => 144,
            PackedFormat::Q5K => 176,
            PackedFormat::Q6K => 210,
            PackedFormat::Q2K => 84,
            PackedFormat::Q3K => 110,
            PackedFormat::Iq4Xs => 136,
            PackedFormat::Tq2_0 => 66,
            PackedFormat::Tq1_0 => 54,
            PackedFormat::Q1_0 | PackedFormat::Q2_0 => 18,
            PackedFormat::Nvfp4 => 36,
            // d, the sixteen scales as bytes, 256 codes.
            PackedFormat::I8K => 2 + 16 + 256,
        }
    }

    /// Bytes of one block of a whole group.
    pub(super) fn group_block_bytes(self) -> usize {
        let per_row = match self {
            // The scales and minimums unpacked to bytes.
            PackedFormat::Q4K => 148,
            PackedFormat::Q5K => 180,
            // The scales unpacked to signed bytes.
            PackedFormat::Q3K => 114,
            // The power-of-two scale as an f32.
            PackedFormat::Mxfp4 => 20,
            // The four scales as f16.
            PackedFormat::Nvfp4 => 40,
            // The scales unpacked to signed bytes.
            PackedFormat::Iq4Xs => 138,
            // The codes two bits each, as TQ2_0's.
            PackedFormat::Tq1_0 => PackedFormat::Tq2_0.file_block_bytes(),
            // Two bytes of padding per row: the codes start at a cache line.
            PackedFormat::I8K => 276,
            other => other.file_block_bytes(),
        };
        GROUP_ROWS * per_row
    }

    /// Bytes of the activations of one block: one Q8_K block, or a Q8_0-based block per 32
    /// values.
    pub(super) fn activation_block_bytes(self) -> usize {
        if self.is_k() {
            Q8K_BYTES
        } else {
            ACTIVATION_BLOCK_BYTES * self.parts()
        }
    }

    /// Whether values are `d·code + m` (Q4_1, Q5_1): a minimum per block and row, stored
    /// after the scales.
    pub(super) const fn has_min(self) -> bool {
        matches!(self, PackedFormat::Q4_1 | PackedFormat::Q5_1)
    }

    /// Whether codes have a fifth bit, kept as a plane of 64 bytes before the nibbles.
    pub(super) const fn has_fifth_bit(self) -> bool {
        matches!(self, PackedFormat::Q5_0 | PackedFormat::Q5_1)
    }

    /// Whether the sixteen scales are f32 (MXFP4's powers of two, beyond f16's range)
    /// rather than f16.
    pub(super) const fn has_f32_scales(self) -> bool {
        matches!(self, PackedFormat::Mxfp4)
    }

    /// Where a 32-value format's codes (or fifth-bit masks) start in a group block.
    pub(super) const fn codes_at(self) -> usize {
        if matches!(self, PackedFormat::Nvfp4) {
            NVFP4_CODES_AT
        } else if self.has_min() || self.has_f32_scales() {
            2 * SCALES_BYTES
        } else {
            SCALES_BYTES
        }
    }

    /// What the unsigned codes of the 32-value formats add to the values.
    pub(super) fn bias(self) -> i32 {
        match self {
            PackedFormat::Q4_0 => 8,
            PackedFormat::Q5_0 => 16,
            PackedFormat::Q4_1 | PackedFormat::Q5_1 => 0,
            PackedFormat::Q8_0 => 128,
            // Nibbles index the FP4 levels; codes are the level plus 12 (see `MXFP4_CODES`).
            PackedFormat::Mxfp4 | PackedFormat::Nvfp4 => 12,
            // IQ4_NL's levels span −127..=113: unsigned `level + 128`, as Q8_0's codes.
            PackedFormat::Iq4Nl => 128,
            PackedFormat::Q4K | PackedFormat::Q5K | PackedFormat::Q2K => 0,
            PackedFormat::Q6K => 32,
            PackedFormat::Q3K => 4,
            PackedFormat::I8K => I8K_BIAS,
            PackedFormat::Iq4Xs => 128,
            // Q1_0's signs as codes 0 and 2; Q2_0's codes 0..3 stand for −1..+2.
            PackedFormat::Tq2_0 | PackedFormat::Tq1_0 | PackedFormat::Q1_0 | PackedFormat::Q2_0 => {
                1
            }
        }
    }
}

/// Copies sixteen rows (`src`, `row_bytes` each) into one group (`dst`, zeroed).
pub(super) fn pack_group(
    format: PackedFormat,
    blocks: usize,
    row_bytes: usize,
    src: &[u8],
    dst: &mut [u8],
) {
    let (sb, gb) = (format.file_block_bytes(), format.group_block_bytes());
    for b in 0..blocks {
        let dst = &mut dst[b * gb..(b + 1) * gb];
        let mut plane = [0u8; 64];
        for r in 0..GROUP_ROWS {
            let block = &src[r * row_bytes + b * sb..][..sb];
            // Four bytes of row `r` into the vector at `at`.
            let mut put = |at: usize, quad: &[u8], flip: u8| {
                let quad = u32::from_le_bytes([quad[0], quad[1], quad[2], quad[3]]);
                let flipped = quad ^ u32::from_le_bytes([flip; 4]);
                dst[at + 4 * r..at + 4 * r + 4].copy_from_slice(&flipped.to_le_bytes());
            };
            match format {
                PackedFormat::Q8_0 => {
                    for (g, quad) in block[2..].chunks_exact(4).enumerate() {
                        put(SCALES_BYTES + 64 * g, quad, 0x80);
                    }
                }
                PackedFormat::Q4_0
                | PackedFormat::Q4_1
                | PackedFormat::Q5_0
                | PackedFormat::Q5_1
                | PackedFormat::Mxfp4
                | PackedFormat::Iq4Nl => {
                    // The file block: d (MXFP4: an exponent byte), [m], [fifth bits], 16
                    // nibble bytes.
                    let mut at = match format {
                        PackedFormat::Mxfp4 => 1,
                        _ if format.has_min() => 4,
                        _ => 2,
                    };
                    let mut nibbles_at = format.codes_at();
                    if format.has_fifth_bit() {
                        let fifth = u32::from_le_bytes(block[at..at + 4].try_into().unwrap());
                        for i in 0..QK {
                            let (g, j) = (i / 4, i % 4);
                            plane[4 * r + j] |= ((fifth >> i & 1) as u8) << g;
                        }
                        at += 4;
                        nibbles_at += 64;
                    }
                    for (k, quad) in block[at..at + 16].chunks_exact(4).enumerate() {
                        put(nibbles_at + 64 * k, quad, 0);
                    }
                }
                PackedFormat::Q4K | PackedFormat::Q5K => {
                    let fifth = format == PackedFormat::Q5K;
                    let codes_at = if fifth { 48 } else { 16 };
                    for (q, quad) in block[codes_at..codes_at + 128].chunks_exact(4).enumerate() {
                        put(affine_k_codes_at(fifth) + 64 * q, quad, 0);
                    }
                    for s in 0..8 {
                        let (scale, min) = scale_min_k4(s, &block[4..16]);
                        dst[Q4K_SCALES_AT + GROUP_ROWS * s + r] = scale;
                        dst[Q4K_MINS_AT + GROUP_ROWS * s + r] = min;
                    }
                    dst[Q4K_DMIN_AT + 2 * r..Q4K_DMIN_AT + 2 * r + 2].copy_from_slice(&block[2..4]);
                    if format == PackedFormat::Q5K {
                        // Value e's fifth bit is bit e / 32 of qh[e % 32].
                        for e in 0..QK_K {
                            if block[16 + e % 32] >> (e / 32) & 1 == 1 {
                                let (s, k, j) = (e / 32, e % 32 / 4, e % 4);
                                dst[Q5K_PLANES_AT + 64 * k + 4 * r + j] |= 1 << s;
                            }
                        }
                    }
                }
                PackedFormat::Q2K => {
                    for s in 0..16 {
                        dst[Q2K_SCALES_AT + 32 * (s / 2) + 2 * r + s % 2] = block[s];
                    }
                    let mut codes = [0u8; QK_K];
                    unpack_two_bit_codes(&block[16..80], &mut codes);
                    for (e, &code) in codes.iter().enumerate() {
                        dst[q2k_codes_at(e / 16) + 4 * r + e % 4] |= code << (2 * (e % 16 / 4));
                    }
                    dst[Q2K_DMIN_AT + 2 * r..Q2K_DMIN_AT + 2 * r + 2]
                        .copy_from_slice(&block[82..84]);
                }
                PackedFormat::Q3K => {
                    for s in 0..16 {
                        let scale = q3_k::sub_block_scale(&block[96..108], s) as i8;
                        dst[Q3K_SCALES_AT + 32 * (s / 2) + 2 * r + s % 2] = scale as u8;
                    }
                    let mut codes = [0u8; QK_K];
                    unpack_two_bit_codes(&block[32..96], &mut codes);
                    for (e, &code) in codes.iter().enumerate() {
                        dst[q3k_low_at(e / 16) + 4 * r + e % 4] |= code << (2 * (e % 16 / 4));
                        // The file's high bit set means "no −4": the code is the value + 4.
                        if q3_k::high_bit_set(&block[..32], e) {
                            dst[q3k_high_at(e / 32) + 4 * r + e % 4] |= 1 << (e % 32 / 4);
                        }
                    }
                }
                PackedFormat::Tq2_0 | PackedFormat::Tq1_0 => {
                    let codes = if format == PackedFormat::Tq1_0 {
                        tq1_codes(block)
                    } else {
                        std::array::from_fn(|e| tq2_code(block, e))
                    };
                    for (e, code) in codes.into_iter().enumerate() {
                        dst[tq2_codes_at(e / 16) + 4 * r + e % 4] |= code << (2 * (e % 16 / 4));
                    }
                }
                PackedFormat::Q1_0 => {
                    for e in 0..format.values() {
                        let sign = block[CODES_AT + e / 8] >> (e % 8) & 1;
                        dst[q1_0_plane_at(e / 32) + 4 * r + e % 4] |= sign << (e % 32 / 4);
                    }
                }
                PackedFormat::Q2_0 => {
                    for e in 0..format.values() {
                        let code = block[CODES_AT + e / 4] >> (2 * (e % 4)) & 3;
                        dst[SCALES_BYTES + 64 * (e / 16) + 4 * r + e % 4] |=
                            code << (2 * (e % 16 / 4));
                    }
                }
                PackedFormat::Nvfp4 => pack_nvfp4_row(block, r, dst),
                PackedFormat::I8K => unreachable!("I8K groups come from `int8_group`"),
                PackedFormat::Iq4Xs => {
                    for s in 0..8 {
                        let nibbles = &block[XS_NIBBLES_AT + 16 * s..XS_NIBBLES_AT + 16 * s + 16];
                        for (k, quad) in nibbles.chunks_exact(4).enumerate() {
                            put(iq4xs_codes_at(s) + 64 * k, quad, 0);
                        }
                    }
                    for s in 0..8 {
                        dst[IQ4XS_SCALES_AT + GROUP_ROWS * s + r] = Iq4Xs::scale(block, s) as u8;
                    }
                }
                PackedFormat::Q6K => {
                    for s in 0..16 {
                        dst[Q6K_SCALES_AT + 32 * (s / 2) + 2 * r + s % 2] = block[192 + s];
                    }
                    for e in 0..QK_K {
                        let code = q6k_code(block, e);
                        let (q, j) = (e / 4, e % 4);
                        dst[q6k_low_at(q / 2) + 4 * r + j] |= (code & 15) << (4 * (q % 2));
                        dst[q6k_high_at(q / 4) + 4 * r + j] |= (code >> 4) << (2 * (q % 4));
                    }
                }
            }
            let scale_at = match format {
                PackedFormat::Q6K => 208,
                PackedFormat::Q2K => 80,
                PackedFormat::Q3K => 108,
                PackedFormat::Tq2_0 => TQ2_CODES,
                PackedFormat::Tq1_0 => TQ1_D_AT,
                _ => 0,
            };
            if format == PackedFormat::Nvfp4 {
                // Its scales are placed with its codes.
            } else if format.has_f32_scales() {
                dst[4 * r..4 * r + 4].copy_from_slice(&e8m0_half(block[0]).to_le_bytes());
            } else {
                dst[2 * r..2 * r + 2].copy_from_slice(&block[scale_at..scale_at + 2]);
            }
            if format.has_min() {
                dst[SCALES_BYTES + 2 * r..SCALES_BYTES + 2 * r + 2].copy_from_slice(&block[2..4]);
            }
        }
        if format.has_fifth_bit() {
            let at = format.codes_at();
            dst[at..at + 64].copy_from_slice(&plane);
        }
    }
}

/// Row `r`'s NVFP4 file block into its group block `dst` (see the module notes): the four
/// scales as f16, then per part the nibble bytes of its two sub-blocks merged, byte `b`
/// holding value `b` of sub-block `2k` low and value `b` of sub-block `2k + 1` high.
fn pack_nvfp4_row(block: &[u8], r: usize, dst: &mut [u8]) {
    for (s, &scale) in block[..NVFP4_SCALES].iter().enumerate() {
        let d = half::f16::from_f32(ue4m3_half(scale));
        dst[nvfp4_scales_at(s) + 2 * r..][..2].copy_from_slice(&d.to_le_bytes());
    }
    // The file's sub-block `s`: bytes `8s..8s + 8` after the scales, value `v` in byte
    // `v % 8`, low nibble for `v < 8`.
    let nibble = |s: usize, v: usize| block[NVFP4_SCALES + 8 * s + v % 8] >> (4 * (v / 8)) & 15;
    for part in 0..2 {
        for b in 0..16 {
            let byte = nibble(2 * part, b) | nibble(2 * part + 1, b) << 4;
            dst[NVFP4_CODES_AT + 256 * part + 64 * (b / 4) + 4 * r + b % 4] = byte;
        }
    }
}

/// Writes one block of sixteen rows' integer forms (row `r` in `rows[r]`) into an I8K
/// group block (`dst`, every byte).
pub(super) type PlaceFn = fn(&[Int8Block], &mut [u8]);

/// Sixteen rows of an i-quant (`src`, `row_bytes` each, `blocks` super-blocks of
/// `block_bytes`, each made integers by `expand`) as one I8K group (`dst`, every byte
/// written, each block by `place`); `expanded` is room for the integer forms.
pub(super) fn int8_group(
    (expand, block_bytes): (fn(&[u8], &mut Int8Block), usize),
    place: PlaceFn,
    blocks: usize,
    row_bytes: usize,
    src: &[u8],
    dst: &mut [u8],
    expanded: &mut Vec<Int8Block>,
) {
    let gb = PackedFormat::I8K.group_block_bytes();
    expanded.resize(blocks * GROUP_ROWS, Int8Block::default());
    // Row by row, each row's blocks in turn: the rows are read front to back, as the
    // hardware prefetchers follow best (block by block across the sixteen rows measured
    // 4-6% slower at 16 tokens).
    for r in 0..GROUP_ROWS {
        for b in 0..blocks {
            let block = &src[r * row_bytes + b * block_bytes..][..block_bytes];
            expand(block, &mut expanded[b * GROUP_ROWS + r]);
        }
    }
    for (rows, dst) in expanded
        .chunks_exact(GROUP_ROWS)
        .zip(dst.chunks_exact_mut(gb))
    {
        place(rows, dst);
    }
}

/// [`PlaceFn`] one field at a time.
pub(super) fn place_int8(rows: &[Int8Block], dst: &mut [u8]) {
    place_int8_scales(rows, dst);
    for (r, row) in rows.iter().enumerate() {
        // Word `g`'s low half is quad `2g`, its high half quad `2g + 1`; the codes
        // already carry I8K's offset.
        for (g, &word) in row.codes.iter().enumerate() {
            let at = I8K_CODES_AT + 128 * g + 4 * r;
            dst[at..at + 4].copy_from_slice(&(word as u32).to_le_bytes());
            dst[at + 64..at + 68].copy_from_slice(&((word >> 32) as u32).to_le_bytes());
        }
    }
}

/// Each row's `d` and scales, and the zeroed bytes before the codes, of an I8K group
/// block.
pub(super) fn place_int8_scales(rows: &[Int8Block], dst: &mut [u8]) {
    dst[I8K_SCALES_AT + 16 * GROUP_ROWS..I8K_CODES_AT].fill(0);
    for (r, row) in rows.iter().enumerate() {
        dst[2 * r..2 * r + 2].copy_from_slice(&row.d_bits.to_le_bytes());
        // Scales 2p and 2p + 1 of a row sit side by side: one two-byte store per pair.
        for (p, pair) in row.scales.chunks_exact(2).enumerate() {
            let at = I8K_SCALES_AT + 32 * p + 2 * r;
            dst[at..at + 2].copy_from_slice(&[pair[0] as u8, pair[1] as u8]);
        }
    }
}

/// The six-bit code (value + 32) of value `e` of a Q6_K file block (ggml's layout: 128
/// bytes of low nibbles, 64 of high bit pairs, per half of 128 values).
pub(super) fn q6k_code(block: &[u8], e: usize) -> u8 {
    let (half, w) = (e / 128, e % 128);
    let (quarter, l) = (w / 32, w % 32);
    let low = block[64 * half + l + 32 * (quarter % 2)] >> (4 * (quarter / 2)) & 15;
    let high = block[128 + 32 * half + l] >> (2 * quarter) & 3;
    low | high << 4
}
