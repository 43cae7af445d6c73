//! Blocks of the i-quant formats for synthetic models. Those formats need an importance
//! matrix and a codebook search to encode (llama-quantize's job), which a test model does
//! not need: any indices, signs and sub-scales make valid blocks that llama.cpp decodes.
//! So the blocks are random bytes, reproducible from the tensor's values, with each block's
//! f16 scale set so that the tensor's decoded values have the deviation of those values.

use ferrox_gguf::GgmlType;
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

/// Whether [`codebook_blocks`] writes `ty`.
pub fn is_codebook_type(ty: GgmlType) -> bool {
    scale_writer(ty).is_some()
}

/// `data` as blocks of `ty`: random codes, scales fitted to `data`'s deviation.
pub fn codebook_blocks(ty: GgmlType, data: &[f32]) -> Vec<u8> {
    let write_scale = scale_writer(ty).unwrap_or_else(|| panic!("{ty} is not a codebook type"));
    let block_bytes = ty.block_bytes().expect("known type") as usize;
    let bytes = ty.bytes_for(data.len() as u64).expect("whole blocks") as usize;
    let seed = data.iter().take(64).fold(data.len() as u64, |h, v| {
        h.rotate_left(7) ^ u64::from(v.to_bits())
    });
    let mut out = vec![0u8; bytes];
    StdRng::seed_from_u64(seed).fill_bytes(&mut out);
    let set_all = |out: &mut [u8], d: f32| {
        let mut half = [0u8; 2];
        ferrox_core::quantize_row(GgmlType::F16, &[d], &mut half).expect("one f16");
        for block in out.chunks_exact_mut(block_bytes) {
            write_scale(block, u16::from_le_bytes(half));
        }
    };
    set_all(&mut out, 1.0);
    let rms = |xs: &[f32]| {
        (xs.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / xs.len() as f64).sqrt()
    };
    let mut decoded = vec![0f32; data.len()];
    ferrox_core::dequantize_row(ty, &out, &mut decoded).expect("valid blocks");
    let d = (rms(data) / rms(&decoded).max(1e-30)) as f32;
    set_all(&mut out, d);
    out
}

/// Where each codebook type keeps its f16 block scale.
fn scale_writer(ty: GgmlType) -> Option<fn(&mut [u8], u16)> {
    use GgmlType as T;
    match ty {
        T::Iq2Xxs | T::Iq2Xs | T::Iq2S | T::Iq3Xxs | T::Iq3S | T::Iq1S => {
            Some(|block, d| block[..2].copy_from_slice(&d.to_le_bytes()))
        }
        // IQ1_M spreads its scale over the top nibbles of the four u16 words that end the
        // block, lowest nibble first.
        T::Iq1M => Some(|block, d| {
            let at = block.len() - 8;
            for k in 0..4 {
                let word = &mut block[at + 2 * k..at + 2 * k + 2];
                let w = u16::from_le_bytes([word[0], word[1]]) & 0x0fff;
                let nibble = (d >> (4 * k)) & 0xf;
                word.copy_from_slice(&(w | (nibble << 12)).to_le_bytes());
            }
        }),
        _ => None,
    }
}
