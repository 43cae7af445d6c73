//! Quantizing activations to a vec-dot type, as ggml-cpu's `from_float` does on x86.
//!
//! Q8_0 and Q8_1 differ from the reference quantizers in `quant`: ggml-cpu's x86 build
//! scales by `127/amax` rather than `1/(amax/127)` and rounds halves to even (the SSE
//! rounding mode) rather than away from zero. Following that makes our quantized
//! activations, and so every integer sum, identical to llama.cpp's on the machine we
//! compare with. The other vec-dot types use the reference quantizers, as ggml-cpu does.
//! The KV cache stores its rows with the same `from_float`, so IQ4_NL is here too: ggml-cpu
//! writes it with its one-pass `quantize_row_iq4_nl_ref`, not `llama-quantize`'s search.

use ferrox_gguf::GgmlType;

use super::{best_isa, Isa};
use crate::quant::bits::write_f16;
use crate::quant::kquants::{Q8K, QK_K};
use crate::quant::legacy::{Q8_0, Q8_1};
use crate::quant::{self, BlockFormat, QuantError};

const QK: usize = 32;

/// Quantizes `x` (a whole number of blocks of `dot_ty`) into `out`, which must be exactly
/// the size of that many blocks, the way ggml-cpu quantizes a matrix product's input.
pub fn quantize_activation(dot_ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    quantize_activation_with(best_isa(), dot_ty, x, out)
}

/// [`quantize_activation`] with an explicit instruction set (the AVX2 quantizers of Q8_0,
/// Q8_1 and Q8_K give the scalar ones' bytes exactly), for comparing them.
pub fn quantize_activation_with(
    isa: Isa,
    dot_ty: GgmlType,
    x: &[f32],
    out: &mut [u8],
) -> Result<(), QuantError> {
    if !isa.is_available() {
        return Err(QuantError::IsaUnavailable(isa));
    }
    let simd = isa.has_avx2() && cfg!(target_arch = "x86_64");
    match dot_ty {
        GgmlType::Q8_0 => quantize_q8_blocks::<false>(simd, x, out),
        GgmlType::Q8_1 => quantize_q8_blocks::<true>(simd, x, out),
        GgmlType::Q8K if simd => quantize_q8k_blocks(x, out),
        GgmlType::Iq4Nl => {
            check_lengths(dot_ty, x, out)?;
            quant::iq4::quantize_row_from_float(x, out);
            Ok(())
        }
        _ => quant::quantize_row(dot_ty, x, out),
    }
}

fn check_lengths(ty: GgmlType, x: &[f32], out: &[u8]) -> Result<(), QuantError> {
    let expected = quant::row_byte_len(ty, x.len())?;
    if out.len() != expected {
        return Err(QuantError::ByteLength {
            ty,
            elements: x.len(),
            expected,
            actual: out.len(),
        });
    }
    Ok(())
}

fn quantize_q8_blocks<const WITH_SUM: bool>(
    simd: bool,
    x: &[f32],
    out: &mut [u8],
) -> Result<(), QuantError> {
    let (ty, bytes) = if WITH_SUM {
        (GgmlType::Q8_1, Q8_1::BYTES)
    } else {
        (GgmlType::Q8_0, Q8_0::BYTES)
    };
    check_lengths(ty, x, out)?;
    for (src, block) in x.chunks_exact(QK).zip(out.chunks_exact_mut(bytes)) {
        #[cfg(target_arch = "x86_64")]
        if simd {
            // SAFETY: `simd` is only set where AVX2, FMA and F16C were detected.
            unsafe {
                crate::kernels::x86::avx2_activation::quantize_q8_block(src, block, WITH_SUM)
            };
            continue;
        }
        let _ = simd;
        quantize_q8_block::<WITH_SUM>(src, block);
    }
    Ok(())
}

/// Q8_K through the AVX2 quantizer (only called where it is available).
fn quantize_q8k_blocks(x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    check_lengths(GgmlType::Q8K, x, out)?;
    for (src, block) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q8K::BYTES)) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: only called where AVX2, FMA and F16C were detected.
        unsafe {
            crate::kernels::x86::avx2_activation::quantize_q8k_block(src, block)
        };
        #[cfg(not(target_arch = "x86_64"))]
        {
            use crate::quant::QuantizeBlock;
            Q8K::quantize_block(src, block);
        }
    }
    Ok(())
}

fn quantize_q8_block<const WITH_SUM: bool>(src: &[f32], block: &mut [u8]) {
    let amax = src
        .iter()
        .fold(0.0f32, |m, &v| if v.abs() > m { v.abs() } else { m });
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    write_f16(block, 0, d);

    let codes_at = if WITH_SUM {
        Q8_1::CODES_AT
    } else {
        Q8_0::CODES_AT
    };
    let mut sum = 0i32;
    for (code, &v) in block[codes_at..].iter_mut().zip(src) {
        let q = convert_like_sse((v * id).round_ties_even());
        sum = sum.wrapping_add(q);
        // The SSE packs saturate to the i8 range.
        *code = q.clamp(-128, 127) as i8 as u8;
    }
    if WITH_SUM {
        write_f16(block, Q8_1::SUM_AT, d * sum as f32);
    }
}

/// `cvtps2dq` on an already-rounded value: NaN and out-of-range values become `i32::MIN`.
fn convert_like_sse(v: f32) -> i32 {
    if v.is_nan() || !(-2_147_483_648.0..2_147_483_648.0).contains(&v) {
        i32::MIN
    } else {
        v as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::bits::read_f16;

    #[test]
    fn halves_round_to_even() {
        // amax = 127 makes the multiplier exactly 1, so codes are the rounded inputs.
        let mut src = [0f32; QK];
        src[0] = 127.0;
        src[1] = 2.5;
        src[2] = -2.5;
        src[3] = 3.5;
        src[4] = -0.5;
        let mut block = [0u8; 34];
        quantize_activation(GgmlType::Q8_0, &src, &mut block).unwrap();
        assert_eq!(read_f16(&block, 0), 1.0);
        let codes: Vec<i8> = block[2..7].iter().map(|&c| c as i8).collect();
        assert_eq!(codes, [127, 2, -2, 4, 0]);
    }

    #[test]
    fn q8_1_keeps_the_scaled_sum() {
        let src: Vec<f32> = (0..QK).map(|i| i as f32 - 10.0).collect();
        let mut block = [0u8; 36];
        quantize_activation(GgmlType::Q8_1, &src, &mut block).unwrap();
        let sum: i32 = block[4..].iter().map(|&c| i32::from(c as i8)).sum();
        // s uses the unrounded scale amax/127, as ggml does.
        let d = 21.0f32 / 127.0;
        let want = half::f16::from_f32(d * sum as f32).to_f32();
        assert_eq!(read_f16(&block, 2), want);
    }

    #[test]
    fn zero_and_bad_lengths() {
        let mut block = [0xAAu8; 34];
        quantize_activation(GgmlType::Q8_0, &[0.0; QK], &mut block).unwrap();
        assert!(block.iter().all(|&b| b == 0));
        assert!(quantize_activation(GgmlType::Q8_0, &[0.0; QK], &mut [0u8; 33]).is_err());
        assert!(quantize_activation(GgmlType::Q8_1, &[0.0; 31], &mut [0u8; 36]).is_err());
        assert!(quantize_activation(GgmlType::Q8K, &[0.0; 256], &mut [0u8; 292]).is_ok());
    }
}
