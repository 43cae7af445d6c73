//! Dot products of one weight row with activation rows, the inner loop of every matrix
//! product.
//!
//! As in ggml, the activation is first quantized to the weight type's *vec-dot type*
//! ([`vec_dot_type`]: Q8_0, Q8_1, Q8_K, or the float type itself), so the products are
//! integer sums per block with one float scaling per block. Each pair has a scalar
//! reference following ggml's `_generic` C code and, on x86-64, an AVX2+FMA+F16C version
//! whose float accumulation order follows ggml's own AVX2 kernels, so that our results
//! match llama.cpp's on the same machine bit for bit where that is cheap.
//!
//! The best kernel set is picked once per process ([`best_isa`]) and kept in a table of
//! function pointers; every kernel takes `N` activation rows at once (`N` = 1 or 4) so that
//! batched products decode each weight block once, while computing every output with
//! exactly the same operations as the single-row call.

mod activation;
mod dot_float;
mod dot_kquants;
mod dot_legacy;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::sync::OnceLock;

use ferrox_gguf::GgmlType;

use crate::quant::{self, QuantError};

pub use activation::quantize_activation;

/// The instruction sets kernels exist for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust following ggml's `_generic` reference arithmetic.
    Scalar,
    /// x86-64 AVX2 with FMA and F16C, following ggml's AVX2 kernels.
    Avx2,
}

impl Isa {
    /// Whether this machine can run kernels for `self`.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2 => avx2_detected(),
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_detected() -> bool {
    x86::avx2_detected()
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_detected() -> bool {
    false
}

/// The fastest instruction set available here, detected once.
pub fn best_isa() -> Isa {
    static BEST: OnceLock<Isa> = OnceLock::new();
    *BEST.get_or_init(|| {
        if Isa::Avx2.is_available() {
            Isa::Avx2
        } else {
            Isa::Scalar
        }
    })
}

/// The activation type ggml quantizes the input to before a product with weights of type
/// `ty` (`type_traits_cpu[ty].vec_dot_type`), or `None` when we have no kernel for `ty`.
pub fn vec_dot_type(ty: GgmlType) -> Option<GgmlType> {
    WeightKind::of(ty).map(WeightKind::vec_dot_type)
}

/// Whether a dot-product kernel for weights of type `ty` exists for `isa` (on any machine).
pub fn has_kernel(ty: GgmlType, isa: Isa) -> bool {
    WeightKind::of(ty).is_some_and(|kind| kernel_for(kind, isa).is_some())
}

/// Dot product of one weight row `w` (whole blocks of `ty`) with one activation row `x`
/// already quantized to [`vec_dot_type`]`(ty)`, using the best kernel available.
pub fn vec_dot(ty: GgmlType, w: &[u8], x: &[u8]) -> Result<f32, QuantError> {
    vec_dot_with(best_isa(), ty, w, x)
}

/// [`vec_dot`] with an explicit instruction set, for comparing kernels.
pub fn vec_dot_with(isa: Isa, ty: GgmlType, w: &[u8], x: &[u8]) -> Result<f32, QuantError> {
    let kind = WeightKind::of(ty).ok_or(QuantError::UnsupportedDot(ty))?;
    if !isa.is_available() {
        return Err(QuantError::IsaUnavailable(isa));
    }
    let kernel = kernel_for(kind, isa).ok_or(QuantError::UnsupportedDot(ty))?;
    let cols = elements_in(ty, w.len())?;
    check_activation_len(kind, cols, x.len())?;
    Ok((kernel.one)(w, [x])[0])
}

/// Values in `bytes` bytes of `ty`, which must be whole blocks.
pub(crate) fn elements_in(ty: GgmlType, bytes: usize) -> Result<usize, QuantError> {
    let (block_elems, block_bytes) = quant::block_geometry(ty)?;
    if bytes % block_bytes != 0 {
        return Err(QuantError::ByteLength {
            ty,
            elements: bytes / block_bytes * block_elems,
            expected: bytes / block_bytes * block_bytes,
            actual: bytes,
        });
    }
    Ok(bytes / block_bytes * block_elems)
}

fn check_activation_len(kind: WeightKind, cols: usize, actual: usize) -> Result<(), QuantError> {
    let dot_ty = kind.vec_dot_type();
    let expected = quant::row_byte_len(dot_ty, cols)?;
    if actual != expected {
        return Err(QuantError::ByteLength {
            ty: dot_ty,
            elements: cols,
            expected,
            actual,
        });
    }
    Ok(())
}

/// One weight row against `N` activation rows of the matching vec-dot type. Callers
/// guarantee the lengths: the weight row is whole blocks and every activation row holds
/// exactly as many values.
pub(crate) type DotFn<const N: usize> = fn(&[u8], [&[u8]; N]) -> [f32; N];

/// The kernels for one weight type on one instruction set. `four` gives, for each of its
/// rows, exactly the bits `one` gives for that row alone.
#[derive(Clone, Copy)]
pub(crate) struct DotKernel {
    pub(crate) one: DotFn<1>,
    pub(crate) four: DotFn<4>,
}

/// The weight types we have kernels for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WeightKind {
    F32,
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Iq4Nl,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Iq4Xs,
}

impl WeightKind {
    const ALL: [WeightKind; 15] = [
        WeightKind::F32,
        WeightKind::F16,
        WeightKind::Bf16,
        WeightKind::Q4_0,
        WeightKind::Q4_1,
        WeightKind::Q5_0,
        WeightKind::Q5_1,
        WeightKind::Q8_0,
        WeightKind::Iq4Nl,
        WeightKind::Q2K,
        WeightKind::Q3K,
        WeightKind::Q4K,
        WeightKind::Q5K,
        WeightKind::Q6K,
        WeightKind::Iq4Xs,
    ];

    pub(crate) fn of(ty: GgmlType) -> Option<Self> {
        use GgmlType as T;
        Some(match ty {
            T::F32 => Self::F32,
            T::F16 => Self::F16,
            T::Bf16 => Self::Bf16,
            T::Q4_0 => Self::Q4_0,
            T::Q4_1 => Self::Q4_1,
            T::Q5_0 => Self::Q5_0,
            T::Q5_1 => Self::Q5_1,
            T::Q8_0 => Self::Q8_0,
            T::Iq4Nl => Self::Iq4Nl,
            T::Q2K => Self::Q2K,
            T::Q3K => Self::Q3K,
            T::Q4K => Self::Q4K,
            T::Q5K => Self::Q5K,
            T::Q6K => Self::Q6K,
            T::Iq4Xs => Self::Iq4Xs,
            _ => return None,
        })
    }

    pub(crate) fn vec_dot_type(self) -> GgmlType {
        use WeightKind as K;
        match self {
            K::F32 => GgmlType::F32,
            K::F16 => GgmlType::F16,
            K::Bf16 => GgmlType::Bf16,
            K::Q4_0 | K::Q5_0 | K::Q8_0 | K::Iq4Nl => GgmlType::Q8_0,
            K::Q4_1 | K::Q5_1 => GgmlType::Q8_1,
            K::Q2K | K::Q3K | K::Q4K | K::Q5K | K::Q6K | K::Iq4Xs => GgmlType::Q8K,
        }
    }
}

fn kernel_for(kind: WeightKind, isa: Isa) -> Option<DotKernel> {
    match isa {
        Isa::Scalar => Some(scalar_kernel(kind)),
        Isa::Avx2 => avx2_kernel(kind),
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_kernel(kind: WeightKind) -> Option<DotKernel> {
    x86::avx2_kernel(kind)
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_kernel(_kind: WeightKind) -> Option<DotKernel> {
    None
}

fn scalar_kernel(kind: WeightKind) -> DotKernel {
    use WeightKind as K;
    match kind {
        K::F32 => scalar_entry::<dot_float::F32Dot>(),
        K::F16 => scalar_entry::<dot_float::F16Dot>(),
        K::Bf16 => scalar_entry::<dot_float::Bf16Dot>(),
        K::Q4_0 => scalar_entry::<quant::legacy::Q4_0>(),
        K::Q4_1 => scalar_entry::<quant::legacy::Q4_1>(),
        K::Q5_0 => scalar_entry::<quant::legacy::Q5_0>(),
        K::Q5_1 => scalar_entry::<quant::legacy::Q5_1>(),
        K::Q8_0 => scalar_entry::<quant::legacy::Q8_0>(),
        K::Iq4Nl => scalar_entry::<quant::iq4::Iq4Nl>(),
        K::Q2K => scalar_entry::<quant::kquants::Q2K>(),
        K::Q3K => scalar_entry::<quant::kquants::Q3K>(),
        K::Q4K => scalar_entry::<quant::kquants::Q4K>(),
        K::Q5K => scalar_entry::<quant::kquants::Q5K>(),
        K::Q6K => scalar_entry::<quant::kquants::Q6K>(),
        K::Iq4Xs => scalar_entry::<quant::iq4::Iq4Xs>(),
    }
}

/// A scalar reference dot product: one weight row with one activation row.
pub(crate) trait ScalarDot {
    fn dot(w: &[u8], x: &[u8]) -> f32;
}

fn scalar_entry<S: ScalarDot>() -> DotKernel {
    fn rows<S: ScalarDot, const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
        xs.map(|x| S::dot(w, x))
    }
    DotKernel {
        one: rows::<S, 1>,
        four: rows::<S, 4>,
    }
}

/// The kernels matrix products use: the best instruction set's, falling back to scalar
/// for types it lacks. Built once.
pub(crate) fn best_kernel(kind: WeightKind) -> DotKernel {
    static TABLE: OnceLock<Vec<DotKernel>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        WeightKind::ALL
            .iter()
            .map(|&k| kernel_for(k, best_isa()).unwrap_or_else(|| scalar_kernel(k)))
            .collect()
    });
    table[kind as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_listed_in_discriminant_order() {
        for (i, kind) in WeightKind::ALL.iter().enumerate() {
            assert_eq!(*kind as usize, i);
        }
    }

    #[test]
    fn vec_dot_types_follow_ggml() {
        assert_eq!(vec_dot_type(GgmlType::Q4_0), Some(GgmlType::Q8_0));
        assert_eq!(vec_dot_type(GgmlType::Q5_1), Some(GgmlType::Q8_1));
        assert_eq!(vec_dot_type(GgmlType::Iq4Nl), Some(GgmlType::Q8_0));
        assert_eq!(vec_dot_type(GgmlType::Iq4Xs), Some(GgmlType::Q8K));
        assert_eq!(vec_dot_type(GgmlType::Bf16), Some(GgmlType::Bf16));
        assert_eq!(vec_dot_type(GgmlType::Q8K), None);
        assert_eq!(vec_dot_type(GgmlType::Iq2Xxs), None);
    }

    #[test]
    fn vec_dot_rejects_bad_lengths() {
        let w = [0u8; 34];
        let x = [0u8; 34];
        assert_eq!(vec_dot(GgmlType::Q8_0, &w, &x), Ok(0.0));
        assert!(matches!(
            vec_dot(GgmlType::Q8_0, &w[..33], &x),
            Err(QuantError::ByteLength { .. })
        ));
        assert!(matches!(
            vec_dot(GgmlType::Q8_0, &w, &x[..33]),
            Err(QuantError::ByteLength { .. })
        ));
        assert!(matches!(
            vec_dot(GgmlType::Q4_1, &w[..20], &x),
            Err(QuantError::ByteLength { .. })
        ));
        assert_eq!(
            vec_dot(GgmlType::Q8K, &[0u8; 292], &[0u8; 292]),
            Err(QuantError::UnsupportedDot(GgmlType::Q8K))
        );
    }
}
