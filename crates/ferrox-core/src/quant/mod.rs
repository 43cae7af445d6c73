//! ggml's quantized block formats: conversion of rows of values between f32 and the
//! on-disk bytes, bit-identical to llama.cpp's reference C code (`ggml-quants.c`).
//!
//! Each format is a type implementing `BlockFormat` (and `QuantizeBlock` when we can
//! produce it); the public functions here validate lengths once and then walk the blocks,
//! so the per-format code never sees a short block.

pub(crate) mod bits;
mod float;
pub(crate) mod fp4;
pub(crate) mod grids;
pub(crate) mod int8;
pub(crate) mod iq1;
pub(crate) mod iq2;
pub(crate) mod iq3;
pub(crate) mod iq4;
pub(crate) mod kquants;
pub(crate) mod legacy;
pub(crate) mod low_bit;
pub(crate) mod ternary;

use ferrox_gguf::GgmlType;

/// Why a conversion or a matrix view was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("dequantizing {0} is not supported")]
    UnsupportedDequantize(GgmlType),
    #[error("quantizing to {0} is not supported")]
    UnsupportedQuantize(GgmlType),
    #[error("{0} has no known block layout")]
    UnknownLayout(GgmlType),
    #[error("{ty}: {elements} values are not a whole number of {block_elems}-value blocks")]
    PartialBlock {
        ty: GgmlType,
        elements: usize,
        block_elems: usize,
    },
    #[error("{ty}: {elements} values take {expected} bytes, but {actual} were given")]
    ByteLength {
        ty: GgmlType,
        elements: usize,
        expected: usize,
        actual: usize,
    },
    #[error("{ty}: a {rows}x{cols} matrix is too large to address")]
    MatrixTooLarge {
        ty: GgmlType,
        rows: usize,
        cols: usize,
    },
    #[error("row {row} is out of range for a matrix of {rows} rows")]
    RowOutOfRange { row: usize, rows: usize },
    #[error("no dot-product kernel pairs with {0} weights")]
    UnsupportedDot(GgmlType),
    #[error("this machine cannot run {0:?} kernels")]
    IsaUnavailable(crate::kernels::Isa),
    #[error("cannot allocate {bytes} bytes for a packed matrix: {reason}")]
    PackedAllocation { bytes: usize, reason: String },
    #[error("{what} has {actual} values, expected {expected}")]
    VectorLength {
        what: &'static str,
        expected: usize,
        actual: usize,
    },
}

/// One ggml block format: `ELEMS` values stored in `BYTES` bytes.
pub(crate) trait BlockFormat {
    const ELEMS: usize;
    const BYTES: usize;

    /// Decodes one block. `block.len() == BYTES` and `out.len() == ELEMS`.
    fn dequantize_block(block: &[u8], out: &mut [f32]);
}

/// A block format we can also encode, following ggml's `quantize_row_*_ref`.
pub(crate) trait QuantizeBlock: BlockFormat {
    /// Encodes one block, writing every byte of it. `src.len() == ELEMS` and
    /// `block.len() == BYTES`.
    fn quantize_block(src: &[f32], block: &mut [u8]);
}

type DequantizeFn = fn(GgmlType, &[u8], &mut [f32]) -> Result<(), QuantError>;
type QuantizeFn = fn(GgmlType, &[f32], &mut [u8]) -> Result<(), QuantError>;

fn dequantizer(ty: GgmlType) -> Option<DequantizeFn> {
    use GgmlType as T;
    Some(match ty {
        T::F32 => dequantize_blocks::<float::F32>,
        T::F16 => dequantize_blocks::<float::F16>,
        T::Bf16 => dequantize_blocks::<float::Bf16>,
        T::Q4_0 => dequantize_blocks::<legacy::Q4_0>,
        T::Q4_1 => dequantize_blocks::<legacy::Q4_1>,
        T::Q5_0 => dequantize_blocks::<legacy::Q5_0>,
        T::Q5_1 => dequantize_blocks::<legacy::Q5_1>,
        T::Q8_0 => dequantize_blocks::<legacy::Q8_0>,
        T::Q8_1 => dequantize_blocks::<legacy::Q8_1>,
        T::Q2K => dequantize_blocks::<kquants::Q2K>,
        T::Q3K => dequantize_blocks::<kquants::Q3K>,
        T::Q4K => dequantize_blocks::<kquants::Q4K>,
        T::Q5K => dequantize_blocks::<kquants::Q5K>,
        T::Q6K => dequantize_blocks::<kquants::Q6K>,
        T::Q8K => dequantize_blocks::<kquants::Q8K>,
        T::Iq4Nl => dequantize_blocks::<iq4::Iq4Nl>,
        T::Iq4Xs => dequantize_blocks::<iq4::Iq4Xs>,
        T::Mxfp4 => dequantize_blocks::<fp4::Mxfp4>,
        T::Tq2_0 => dequantize_blocks::<ternary::Tq2_0>,
        T::Tq1_0 => dequantize_blocks::<ternary::Tq1_0>,
        T::Nvfp4 => dequantize_blocks::<fp4::Nvfp4>,
        T::Q1_0 => dequantize_blocks::<low_bit::Q1_0>,
        T::Q2_0 => dequantize_blocks::<low_bit::Q2_0>,
        T::Iq3Xxs => dequantize_blocks::<iq3::Iq3Xxs>,
        T::Iq3S => dequantize_blocks::<iq3::Iq3S>,
        T::Iq1S => dequantize_blocks::<iq1::Iq1S>,
        T::Iq1M => dequantize_blocks::<iq1::Iq1M>,
        T::Iq2Xxs => dequantize_blocks::<iq2::Iq2Xxs>,
        T::Iq2Xs => dequantize_blocks::<iq2::Iq2Xs>,
        T::Iq2S => dequantize_blocks::<iq2::Iq2S>,
        _ => return None,
    })
}

fn quantizer(ty: GgmlType) -> Option<QuantizeFn> {
    use GgmlType as T;
    Some(match ty {
        T::F32 => quantize_blocks::<float::F32>,
        T::F16 => quantize_blocks::<float::F16>,
        T::Bf16 => quantize_blocks::<float::Bf16>,
        T::Q4_0 => quantize_blocks::<legacy::Q4_0>,
        T::Q4_1 => quantize_blocks::<legacy::Q4_1>,
        T::Q5_0 => quantize_blocks::<legacy::Q5_0>,
        T::Q5_1 => quantize_blocks::<legacy::Q5_1>,
        T::Q8_0 => quantize_blocks::<legacy::Q8_0>,
        T::Q8_1 => quantize_blocks::<legacy::Q8_1>,
        T::Q2K => quantize_blocks::<kquants::Q2K>,
        T::Q3K => quantize_blocks::<kquants::Q3K>,
        T::Q4K => quantize_blocks::<kquants::Q4K>,
        T::Q5K => quantize_blocks::<kquants::Q5K>,
        T::Q6K => quantize_blocks::<kquants::Q6K>,
        T::Q8K => quantize_blocks::<kquants::Q8K>,
        T::Iq4Nl => quantize_blocks::<iq4::Iq4Nl>,
        T::Iq4Xs => quantize_blocks::<iq4::Iq4Xs>,
        T::Mxfp4 => quantize_blocks::<fp4::Mxfp4>,
        T::Tq2_0 => quantize_blocks::<ternary::Tq2_0>,
        T::Tq1_0 => quantize_blocks::<ternary::Tq1_0>,
        T::Nvfp4 => quantize_blocks::<fp4::Nvfp4>,
        T::Q1_0 => quantize_blocks::<low_bit::Q1_0>,
        T::Q2_0 => quantize_blocks::<low_bit::Q2_0>,
        _ => return None,
    })
}

/// Whether [`dequantize_row`] handles `ty`.
pub fn can_dequantize(ty: GgmlType) -> bool {
    dequantizer(ty).is_some()
}

/// Whether [`quantize_row`] handles `ty`.
pub fn can_quantize(ty: GgmlType) -> bool {
    quantizer(ty).is_some()
}

/// Decodes `bytes` (whole blocks of `ty`) into `out`, one f32 per element.
///
/// `out.len()` must be a whole number of blocks and `bytes.len()` exactly the size of
/// that many blocks. `bytes` may start at any address.
pub fn dequantize_row(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let run = dequantizer(ty).ok_or(QuantError::UnsupportedDequantize(ty))?;
    run(ty, bytes, out)
}

/// Encodes `src` into `out` as blocks of `ty`, exactly as ggml's reference quantizer does
/// (no importance matrix).
///
/// `src.len()` must be a whole number of blocks and `out.len()` exactly the size of that
/// many blocks; every byte of `out` is overwritten.
pub fn quantize_row(ty: GgmlType, src: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    let run = quantizer(ty).ok_or(QuantError::UnsupportedQuantize(ty))?;
    run(ty, src, out)
}

/// Bytes taken by `elements` values of `ty`, which must be a whole number of blocks.
pub fn row_byte_len(ty: GgmlType, elements: usize) -> Result<usize, QuantError> {
    let (block_elems, block_bytes) = block_geometry(ty)?;
    byte_len(ty, elements, block_elems, block_bytes)
}

/// (elements, bytes) per block of a type with a known layout.
pub(crate) fn block_geometry(ty: GgmlType) -> Result<(usize, usize), QuantError> {
    let geometry = ty
        .block_size()
        .zip(ty.block_bytes())
        .and_then(|(elems, bytes)| {
            Some((usize::try_from(elems).ok()?, usize::try_from(bytes).ok()?))
        });
    geometry.ok_or(QuantError::UnknownLayout(ty))
}

fn byte_len(
    ty: GgmlType,
    elements: usize,
    block_elems: usize,
    block_bytes: usize,
) -> Result<usize, QuantError> {
    if !elements.is_multiple_of(block_elems) {
        return Err(QuantError::PartialBlock {
            ty,
            elements,
            block_elems,
        });
    }
    // A slice of `elements` f32s exists, so this cannot overflow for any real block ratio;
    // saturating keeps a mismatch an error rather than a wrap.
    Ok((elements / block_elems).saturating_mul(block_bytes))
}

fn check_lengths<B: BlockFormat>(
    ty: GgmlType,
    elements: usize,
    bytes: usize,
) -> Result<(), QuantError> {
    let expected = byte_len(ty, elements, B::ELEMS, B::BYTES)?;
    if bytes != expected {
        return Err(QuantError::ByteLength {
            ty,
            elements,
            expected,
            actual: bytes,
        });
    }
    Ok(())
}

fn dequantize_blocks<B: BlockFormat>(
    ty: GgmlType,
    bytes: &[u8],
    out: &mut [f32],
) -> Result<(), QuantError> {
    check_lengths::<B>(ty, out.len(), bytes.len())?;
    for (block, values) in bytes
        .chunks_exact(B::BYTES)
        .zip(out.chunks_exact_mut(B::ELEMS))
    {
        B::dequantize_block(block, values);
    }
    Ok(())
}

fn quantize_blocks<B: QuantizeBlock>(
    ty: GgmlType,
    src: &[f32],
    out: &mut [u8],
) -> Result<(), QuantError> {
    check_lengths::<B>(ty, src.len(), out.len())?;
    for (values, block) in src
        .chunks_exact(B::ELEMS)
        .zip(out.chunks_exact_mut(B::BYTES))
    {
        B::quantize_block(values, block);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every type we handle, with our block geometry, must agree with the GGUF type table.
    #[test]
    fn block_geometry_matches_the_type_table() {
        fn check<B: BlockFormat>(ty: GgmlType) {
            assert_eq!(block_geometry(ty), Ok((B::ELEMS, B::BYTES)), "{ty}");
        }
        check::<float::F32>(GgmlType::F32);
        check::<float::F16>(GgmlType::F16);
        check::<float::Bf16>(GgmlType::Bf16);
        check::<legacy::Q4_0>(GgmlType::Q4_0);
        check::<legacy::Q4_1>(GgmlType::Q4_1);
        check::<legacy::Q5_0>(GgmlType::Q5_0);
        check::<legacy::Q5_1>(GgmlType::Q5_1);
        check::<legacy::Q8_0>(GgmlType::Q8_0);
        check::<legacy::Q8_1>(GgmlType::Q8_1);
        check::<kquants::Q2K>(GgmlType::Q2K);
        check::<kquants::Q3K>(GgmlType::Q3K);
        check::<kquants::Q4K>(GgmlType::Q4K);
        check::<kquants::Q5K>(GgmlType::Q5K);
        check::<kquants::Q6K>(GgmlType::Q6K);
        check::<kquants::Q8K>(GgmlType::Q8K);
        check::<iq4::Iq4Nl>(GgmlType::Iq4Nl);
        check::<iq4::Iq4Xs>(GgmlType::Iq4Xs);
        check::<fp4::Mxfp4>(GgmlType::Mxfp4);
        check::<ternary::Tq2_0>(GgmlType::Tq2_0);
        check::<ternary::Tq1_0>(GgmlType::Tq1_0);
        check::<fp4::Nvfp4>(GgmlType::Nvfp4);
        check::<low_bit::Q1_0>(GgmlType::Q1_0);
        check::<low_bit::Q2_0>(GgmlType::Q2_0);
        check::<iq3::Iq3Xxs>(GgmlType::Iq3Xxs);
        check::<iq3::Iq3S>(GgmlType::Iq3S);
        check::<iq1::Iq1S>(GgmlType::Iq1S);
        check::<iq1::Iq1M>(GgmlType::Iq1M);
        check::<iq2::Iq2Xxs>(GgmlType::Iq2Xxs);
        check::<iq2::Iq2Xs>(GgmlType::Iq2Xs);
        check::<iq2::Iq2S>(GgmlType::Iq2S);
    }

    #[test]
    fn unsupported_types_are_named() {
        let mut out = [0f32; 256];
        let err = dequantize_row(GgmlType::I8, &[0u8; 256], &mut out).unwrap_err();
        assert_eq!(err, QuantError::UnsupportedDequantize(GgmlType::I8));
        assert!(err.to_string().contains("I8"), "{err}");
        let err = dequantize_row(GgmlType::Other(4), &[], &mut []).unwrap_err();
        assert!(err.to_string().contains("Q4_2"), "{err}");
        let err = quantize_row(GgmlType::Iq1S, &out, &mut [0u8; 50]).unwrap_err();
        assert!(err.to_string().contains("IQ1_S"), "{err}");
        assert!(!can_dequantize(GgmlType::I8));
        assert!(can_dequantize(GgmlType::Q6K) && can_quantize(GgmlType::Q6K));
    }

    #[test]
    fn bad_lengths_are_errors() {
        let mut out = [0f32; 64];
        assert!(matches!(
            dequantize_row(GgmlType::Q4_0, &[0u8; 18], &mut out[..31]),
            Err(QuantError::PartialBlock {
                block_elems: 32,
                ..
            })
        ));
        assert!(matches!(
            dequantize_row(GgmlType::Q4_0, &[0u8; 35], &mut out),
            Err(QuantError::ByteLength {
                expected: 36,
                actual: 35,
                ..
            })
        ));
        assert!(matches!(
            quantize_row(GgmlType::Q4K, &out, &mut [0u8; 144]),
            Err(QuantError::PartialBlock { .. })
        ));
        assert!(matches!(
            quantize_row(GgmlType::Q8_0, &out, &mut [0u8; 67]),
            Err(QuantError::ByteLength { .. })
        ));
        assert_eq!(row_byte_len(GgmlType::Q4K, 512), Ok(288));
        assert!(row_byte_len(GgmlType::Other(99), 32).is_err());
        dequantize_row(GgmlType::Q8_0, &[], &mut []).unwrap();
    }
}
