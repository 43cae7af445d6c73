//! Cached rows' storage: f32 or f16 arrays, or the blocks of bf16 and the quantized types,
//! allocated without aborting on failure.

use ferrox_core::kernels::quantize_activation;
use ferrox_core::{KvRows, KvType};
use half::f16;
use half::vec::HalfBitsVecExt;

#[derive(Clone, Debug)]
pub(crate) enum Rows {
    F32(Vec<f32>),
    F16(Vec<f16>),
    /// Values of `KvType` in whole blocks; element offsets are multiples of its block.
    Blocks(KvType, Vec<u8>),
}

/// Element types whose all-zero bit pattern is a valid value (0.0 and 0).
trait ZeroIsValid: Copy {}
impl ZeroIsValid for f32 {}
impl ZeroIsValid for u16 {}
impl ZeroIsValid for u8 {}

/// `len` zeroed elements, or `None` when the allocator refuses (where `vec![0; len]` would
/// abort the process). Zeroed allocations come from calloc: pages are touched only as
/// positions fill.
fn try_zeroed<T: ZeroIsValid>(len: usize) -> Option<Vec<T>> {
    let layout = std::alloc::Layout::array::<T>(len).ok()?;
    if layout.size() == 0 {
        return Some(Vec::new());
    }
    // SAFETY: the layout has a non-zero size. A non-null result is a block of `len` zeroed
    // `T`s from the global allocator with the layout `Vec<T>` of capacity `len` frees with,
    // and all-zero bits are a valid `T` (`ZeroIsValid`).
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout).cast::<T>();
        (!ptr.is_null()).then(|| Vec::from_raw_parts(ptr, len, len))
    }
}

impl Rows {
    /// `len` values of `ty` (a whole number of its blocks).
    pub(crate) fn try_zeroed(ty: KvType, len: usize) -> Option<Rows> {
        Some(match ty {
            KvType::F32 => Rows::F32(try_zeroed(len)?),
            // (`vec![f16::ZERO; n]` would write every element; zero u16s come from calloc.)
            KvType::F16 => Rows::F16(try_zeroed::<u16>(len)?.reinterpret_into()),
            _ => {
                if !len.is_multiple_of(ty.block_len()) {
                    return None;
                }
                Rows::Blocks(ty, try_zeroed(ty.bytes(len))?)
            }
        })
    }

    /// Stores `values` from element `at`. Block types round them as llama.cpp's CPU backend
    /// does when it copies rows into its cache (`from_float`: Q8_0 rounds halves to even).
    pub(crate) fn write(&mut self, at: usize, values: &[f32]) {
        match self {
            Rows::F32(buf) => buf[at..at + values.len()].copy_from_slice(values),
            Rows::F16(buf) => {
                for (dst, &v) in buf[at..at + values.len()].iter_mut().zip(values) {
                    *dst = f16::from_f32(v);
                }
            }
            Rows::Blocks(ty, buf) => {
                let start = ty.bytes(at);
                let out = &mut buf[start..start + ty.bytes(values.len())];
                quantize_activation(ty.ggml(), values, out)
                    .expect("cached rows are whole blocks of a type we encode");
            }
        }
    }

    pub(crate) fn slice(&self, start: usize, end: usize) -> KvRows<'_> {
        match self {
            Rows::F32(buf) => KvRows::F32(&buf[start..end]),
            Rows::F16(buf) => KvRows::F16(&buf[start..end]),
            Rows::Blocks(ty, buf) => KvRows::Blocks(*ty, &buf[ty.bytes(start)..ty.bytes(end)]),
        }
    }

    /// Copies elements `range` to `to` (all multiples of the block).
    pub(crate) fn copy_within(&mut self, range: std::ops::Range<usize>, to: usize) {
        match self {
            Rows::F32(v) => v.copy_within(range, to),
            Rows::F16(v) => v.copy_within(range, to),
            Rows::Blocks(ty, v) => {
                v.copy_within(ty.bytes(range.start)..ty.bytes(range.end), ty.bytes(to))
            }
        }
    }
}
