//! Scalar reference dot products of the 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! IQ4_NL, MXFP4) with Q8_0 or Q8_1 activations, following ggml's `_generic` code: an exact
//! integer sum per block, then one float step per block in ggml's operand order. The
//! formats whose blocks span several Q8_0 blocks (Q1_0, Q2_0, NVFP4) follow at the end.

use super::ScalarDot;
use crate::quant::bits::{read_f16, unpack_nibbles};
use crate::quant::fp4::{self, e8m0_half, ue4m3_half, Mxfp4, Nvfp4, NVFP4_SCALES};
use crate::quant::iq4::{Iq4Nl, LEVELS};
use crate::quant::legacy::{LowBitBlock, Q8Block, Q8_0, Q8_1};
use crate::quant::low_bit::{q2_code, CODES_AT as LOW_BIT_CODES_AT, Q1_0, Q2_0};
use crate::quant::BlockFormat;

const QK: usize = 32;

/// A 32-value weight format as the integer dot product sees it.
pub(crate) trait LegacyWeights: BlockFormat {
    /// The activation format ggml pairs it with.
    type Activation: BlockFormat;
    /// The block's codes as they enter the integer product.
    fn product_codes(block: &[u8]) -> [i8; QK];
    /// ggml's float step: `sumf` after adding a block with integer sum `sumi`.
    fn accumulate(sumf: f32, sumi: i32, w: &[u8], x: &[u8]) -> f32;
}

/// The scale of an activation block (Q8_0 and Q8_1 both start with f16 `d`).
pub(crate) fn activation_scale(x: &[u8]) -> f32 {
    read_f16(x, 0)
}

/// Q8_1's `s = d·Σq`, which pays for the weight minimum of the `_1` formats.
pub(crate) fn activation_sum(x: &[u8]) -> f32 {
    read_f16(x, Q8_1::SUM_AT)
}

impl<const BITS: u32, const WITH_MIN: bool> LegacyWeights for LowBitBlock<BITS, WITH_MIN> {
    type Activation = Q8Block<WITH_MIN>;

    fn product_codes(block: &[u8]) -> [i8; QK] {
        let offset = if WITH_MIN { 0 } else { Self::MID_CODE };
        Self::codes(block).map(|code| (i32::from(code) - offset) as i8)
    }

    fn accumulate(sumf: f32, sumi: i32, w: &[u8], x: &[u8]) -> f32 {
        let (dx, dy) = (read_f16(w, 0), activation_scale(x));
        if WITH_MIN {
            let m = read_f16(w, Self::MIN_AT);
            sumf + ((dx * dy) * sumi as f32 + m * activation_sum(x))
        } else if BITS == 4 {
            // ggml writes Q4_0's scaling as sumi·dx·dy, evaluated left to right.
            sumf + sumi as f32 * dx * dy
        } else {
            sumf + (dx * dy) * sumi as f32
        }
    }
}

impl LegacyWeights for Q8_0 {
    type Activation = Q8_0;

    fn product_codes(block: &[u8]) -> [i8; QK] {
        std::array::from_fn(|j| block[Self::CODES_AT + j] as i8)
    }

    fn accumulate(sumf: f32, sumi: i32, w: &[u8], x: &[u8]) -> f32 {
        sumf + sumi as f32 * (read_f16(w, 0) * activation_scale(x))
    }
}

impl LegacyWeights for Iq4Nl {
    type Activation = Q8_0;

    fn product_codes(block: &[u8]) -> [i8; QK] {
        let mut codes = [0u8; QK];
        unpack_nibbles(&block[2..], &mut codes);
        codes.map(|code| LEVELS[usize::from(code)])
    }

    fn accumulate(sumf: f32, sumi: i32, w: &[u8], x: &[u8]) -> f32 {
        sumf + (activation_scale(x) * read_f16(w, 0)) * sumi as f32
    }
}

impl LegacyWeights for Mxfp4 {
    type Activation = Q8_0;

    fn product_codes(block: &[u8]) -> [i8; QK] {
        let mut codes = [0u8; QK];
        unpack_nibbles(&block[1..], &mut codes);
        codes.map(|code| fp4::LEVELS[usize::from(code)])
    }

    fn accumulate(sumf: f32, sumi: i32, w: &[u8], x: &[u8]) -> f32 {
        sumf + (activation_scale(x) * e8m0_half(w[0])) * sumi as f32
    }
}

fn legacy_dot<W: LegacyWeights>(w: &[u8], x: &[u8]) -> f32 {
    // Both activation formats end with their 32 codes.
    let codes_at = W::Activation::BYTES - QK;
    w.chunks_exact(W::BYTES)
        .zip(x.chunks_exact(W::Activation::BYTES))
        .fold(0.0f32, |sumf, (wb, xb)| {
            let sumi = W::product_codes(wb)
                .iter()
                .zip(&xb[codes_at..])
                .map(|(&c, &q)| i32::from(c) * i32::from(q as i8))
                .sum();
            W::accumulate(sumf, sumi, wb, xb)
        })
}

impl<const BITS: u32, const WITH_MIN: bool> ScalarDot for LowBitBlock<BITS, WITH_MIN> {
    fn dot(w: &[u8], x: &[u8]) -> f32 {
        legacy_dot::<Self>(w, x)
    }
}

impl ScalarDot for Q8_0 {
    fn dot(w: &[u8], x: &[u8]) -> f32 {
        legacy_dot::<Self>(w, x)
    }
}

impl ScalarDot for Iq4Nl {
    fn dot(w: &[u8], x: &[u8]) -> f32 {
        legacy_dot::<Self>(w, x)
    }
}

impl ScalarDot for Mxfp4 {
    fn dot(w: &[u8], x: &[u8]) -> f32 {
        legacy_dot::<Self>(w, x)
    }
}

/// The 32 codes of a Q8_0 block, as integers.
fn q8_0_codes(xb: &[u8]) -> impl Iterator<Item = i32> + '_ {
    xb[Q8_0::CODES_AT..Q8_0::BYTES]
        .iter()
        .map(|&q| i32::from(q as i8))
}

/// Q1_0 and Q2_0 in ggml's shape: per weight block, `sumi += d_x·Σ` over its Q8_0 blocks
/// in order (from zero), then `sumf += d_w·sumi`. `block_sum(wb, k, xb)` is the exact
/// integer sum of the weight block's `k`-th 32 values against the Q8_0 block `xb`.
fn multi_block_dot<W: BlockFormat>(
    w: &[u8],
    x: &[u8],
    block_sum: impl Fn(&[u8], usize, &[u8]) -> i32,
) -> f32 {
    let act = W::ELEMS / QK * Q8_0::BYTES;
    w.chunks_exact(W::BYTES)
        .zip(x.chunks_exact(act))
        .fold(0.0f32, |sumf, (wb, xs)| {
            let sumi = xs
                .chunks_exact(Q8_0::BYTES)
                .enumerate()
                .fold(0.0f32, |sumi, (k, xb)| {
                    sumi + activation_scale(xb) * block_sum(wb, k, xb) as f32
                });
            sumf + read_f16(wb, 0) * sumi
        })
}

impl ScalarDot for Q1_0 {
    fn dot(w: &[u8], x: &[u8]) -> f32 {
        multi_block_dot::<Self>(w, x, |wb, k, xb| {
            q8_0_codes(xb)
                .enumerate()
                .map(|(j, q)| {
                    let e = QK * k + j;
                    let set = (wb[LOW_BIT_CODES_AT + e / 8] >> (e % 8)) & 1 != 0;
                    if set {
                        q
                    } else {
                        -q
                    }
                })
                .sum()
        })
    }
}

impl ScalarDot for Q2_0 {
    fn dot(w: &[u8], x: &[u8]) -> f32 {
        multi_block_dot::<Self>(w, x, |wb, k, xb| {
            q8_0_codes(xb)
                .enumerate()
                .map(|(j, q)| (i32::from(q2_code(wb, QK * k + j)) - 1) * q)
                .sum()
        })
    }
}

impl ScalarDot for Nvfp4 {
    /// Per 16-value sub-block `s` (half of Q8_0 block `s / 2`):
    /// `sumf += (d_x · d_s) · sumi`.
    fn dot(w: &[u8], x: &[u8]) -> f32 {
        let act = 2 * Q8_0::BYTES;
        w.chunks_exact(Nvfp4::BYTES)
            .zip(x.chunks_exact(act))
            .fold(0.0f32, |mut sumf, (wb, xs)| {
                for s in 0..NVFP4_SCALES {
                    let xb = &xs[s / 2 * Q8_0::BYTES..];
                    let q = |j: usize| i32::from(xb[Q8_0::CODES_AT + s % 2 * 16 + j] as i8);
                    let nibbles = &wb[NVFP4_SCALES + 8 * s..NVFP4_SCALES + 8 * s + 8];
                    let sumi: i32 = nibbles
                        .iter()
                        .enumerate()
                        .map(|(j, &byte)| {
                            q(j) * i32::from(fp4::LEVELS[usize::from(byte & 0x0F)])
                                + q(j + 8) * i32::from(fp4::LEVELS[usize::from(byte >> 4)])
                        })
                        .sum();
                    sumf += activation_scale(xb) * ue4m3_half(wb[s]) * sumi as f32;
                }
                sumf
            })
    }
}
