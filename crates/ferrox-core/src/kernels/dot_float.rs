//! Scalar reference dot products of the float types with activations of the same type,
//! following ggml's non-SIMD code: each product rounded to f32, summed in f64.

use super::ScalarDot;
use crate::quant::bits::{bf16_bits_to_f32, f16_bits_to_f32, read_f32, read_u16};

/// An element type stored as `BYTES` little-endian bytes per value.
pub(crate) trait FloatElement {
    const BYTES: usize;
    fn read(bytes: &[u8]) -> f32;
}

pub(crate) struct F32Dot;
pub(crate) struct F16Dot;
pub(crate) struct Bf16Dot;

impl FloatElement for F32Dot {
    const BYTES: usize = 4;
    fn read(bytes: &[u8]) -> f32 {
        read_f32(bytes, 0)
    }
}

impl FloatElement for F16Dot {
    const BYTES: usize = 2;
    fn read(bytes: &[u8]) -> f32 {
        f16_bits_to_f32(read_u16(bytes, 0))
    }
}

impl FloatElement for Bf16Dot {
    const BYTES: usize = 2;
    fn read(bytes: &[u8]) -> f32 {
        bf16_bits_to_f32(read_u16(bytes, 0))
    }
}

fn float_dot<E: FloatElement>(w: &[u8], x: &[u8]) -> f32 {
    w.chunks_exact(E::BYTES)
        .zip(x.chunks_exact(E::BYTES))
        .fold(0.0f64, |sum, (a, b)| {
            sum + f64::from(E::read(a) * E::read(b))
        }) as f32
}

macro_rules! float_scalar_dot {
    ($($ty:ty),*) => {$(
        impl ScalarDot for $ty {
            fn dot(w: &[u8], x: &[u8]) -> f32 {
                float_dot::<Self>(w, x)
            }
        }
    )*};
}

float_scalar_dot!(F32Dot, F16Dot, Bf16Dot);
