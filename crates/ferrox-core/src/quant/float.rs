//! The unquantized element types: F32, F16 and BF16, as one-element "blocks".

use super::bits::{
    bf16_bits_to_f32, f16_bits_to_f32, f32_to_bf16_bits, f32_to_f16_bits, read_f32, read_u16,
    write_u16,
};
use super::{BlockFormat, QuantizeBlock};

pub(crate) struct F32;
pub(crate) struct F16;
pub(crate) struct Bf16;

impl BlockFormat for F32 {
    const ELEMS: usize = 1;
    const BYTES: usize = 4;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        out[0] = read_f32(block, 0);
    }
}

impl QuantizeBlock for F32 {
    fn quantize_block(src: &[f32], block: &mut [u8]) {
        block.copy_from_slice(&src[0].to_le_bytes());
    }
}

impl BlockFormat for F16 {
    const ELEMS: usize = 1;
    const BYTES: usize = 2;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        out[0] = f16_bits_to_f32(read_u16(block, 0));
    }
}

impl QuantizeBlock for F16 {
    fn quantize_block(src: &[f32], block: &mut [u8]) {
        write_u16(block, 0, f32_to_f16_bits(src[0]));
    }
}

impl BlockFormat for Bf16 {
    const ELEMS: usize = 1;
    const BYTES: usize = 2;

    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        out[0] = bf16_bits_to_f32(read_u16(block, 0));
    }
}

impl QuantizeBlock for Bf16 {
    fn quantize_block(src: &[f32], block: &mut [u8]) {
        write_u16(block, 0, f32_to_bf16_bits(src[0]));
    }
}
