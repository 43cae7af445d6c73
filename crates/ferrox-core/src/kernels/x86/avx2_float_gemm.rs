//! AVX2 products of float weight rows (F32, F16, BF16) with many activation rows, both
//! widened to f32 first: one weight row against three activation rows, their twelve
//! eight-lane accumulators in registers and the activations read by the multiply-adds
//! themselves, so nothing is converted inside the loop (the row kernel widens every
//! activation value at every use). Each output has the row kernel's bits
//! ([`float_dot`](super::avx2_float::float_dot)): the same four accumulators, updated in
//! the same order, and the same reduction and leftovers.

use std::arch::x86_64::*;

use super::avx2_float::{Bf16Lanes, F16Lanes, F32Lanes, FloatLanes, LeftoverSum};
use crate::kernels::{FloatGemm, FloatTile, WeightKind};

const STEP: usize = 32;
/// Weight rows per tile.
const ROWS: usize = 1;
/// Activation rows per tile.
const TOKENS: usize = 3;

/// `out[0][t]` = the weight row · activation row `t`, rows of `cols` values back to back
/// in `x` (`T` of them).
#[target_feature(enable = "avx2,fma,f16c")]
fn tile<E: FloatLanes, const T: usize>(w: &[f32], x: &[f32], cols: usize, out: &mut FloatTile) {
    assert!(w.len() >= cols && x.len() >= T * cols, "tile operands");
    let full = cols / STEP * STEP;
    let mut acc = [[_mm256_setzero_ps(); 4]; T];
    for at in (0..full).step_by(STEP) {
        // SAFETY: the row holds `cols >= full` values and `at + 32 <= full`; `loadu` has no
        // alignment requirement.
        let weights: [__m256; 4] =
            std::array::from_fn(|j| unsafe { _mm256_loadu_ps(w.as_ptr().add(at + 8 * j)) });
        for (t, acc) in acc.iter_mut().enumerate() {
            for (j, (slot, a)) in acc.iter_mut().zip(weights).enumerate() {
                // SAFETY: as above, for activation row `t`.
                let b = unsafe { _mm256_loadu_ps(x.as_ptr().add(t * cols + at + 8 * j)) };
                *slot = if E::FUSED {
                    _mm256_fmadd_ps(a, b, *slot)
                } else {
                    _mm256_add_ps(_mm256_mul_ps(a, b), *slot)
                };
            }
        }
    }
    // SAFETY: this function runs with AVX2, FMA and F16C.
    let mut sums: [E::Sum; T] = std::array::from_fn(|t| unsafe { E::reduce(acc[t]) });
    // The leftovers column by column, so that the outputs' sums advance side by side.
    for i in full..cols {
        for (t, sum) in sums.iter_mut().enumerate() {
            *sum = sum.add(w[i], x[t * cols + i]);
        }
    }
    for (out, &sum) in out[0].iter_mut().zip(&sums) {
        *out = sum.end();
    }
}

/// Row `bytes` of element type `E` as f32 values.
#[target_feature(enable = "avx2,fma,f16c")]
fn widen<E: FloatLanes>(bytes: &[u8], out: &mut [f32]) {
    assert_eq!(bytes.len(), out.len() * E::BYTES, "widened row length");
    let full = out.len() / 8 * 8;
    for at in (0..full).step_by(8) {
        // SAFETY: `bytes` holds the 8 values from `at`; `out` has room for them.
        unsafe {
            let v = E::load8(&bytes[at * E::BYTES..]);
            _mm256_storeu_ps(out.as_mut_ptr().add(at), v);
        }
    }
    for (value, b) in out[full..]
        .iter_mut()
        .zip(bytes[full * E::BYTES..].chunks_exact(E::BYTES))
    {
        *value = E::scalar(b);
    }
}

/// The safe entry of [`widen`].
pub(super) fn widen_entry<E: FloatLanes>(bytes: &[u8], out: &mut [f32]) {
    // SAFETY: handed out only in the float products' entries, after detecting AVX2, FMA
    // and F16C (which the AVX-512 kernels' detection includes).
    unsafe { widen::<E>(bytes, out) }
}

/// The safe entries for element type `E`.
fn entry<E: FloatLanes>() -> FloatGemm {
    fn run<E: FloatLanes>(
        w: &[f32],
        rows: usize,
        x: &[f32],
        tokens: usize,
        cols: usize,
        out: &mut FloatTile,
    ) {
        assert_eq!(rows, ROWS, "float tile of {rows} rows");
        // SAFETY (every call): handed out only by `avx2_float_gemm`, after detecting the
        // features.
        match tokens {
            3 => unsafe { tile::<E, 3>(w, x, cols, out) },
            2 => unsafe { tile::<E, 2>(w, x, cols, out) },
            1 => unsafe { tile::<E, 1>(w, x, cols, out) },
            _ => panic!("float tile of {tokens} tokens (at most {TOKENS})"),
        }
    }
    FloatGemm {
        widen: widen_entry::<E>,
        tile: run::<E>,
        tile_rows: ROWS,
        tile_tokens: TOKENS,
    }
}

/// The tiled float products for `kind`, if it is a float type. The caller has detected
/// AVX2, FMA and F16C.
pub(super) fn kernel(kind: WeightKind) -> Option<FloatGemm> {
    match kind {
        WeightKind::F32 => Some(entry::<F32Lanes>()),
        WeightKind::F16 => Some(entry::<F16Lanes>()),
        WeightKind::Bf16 => Some(entry::<Bf16Lanes>()),
        _ => None,
    }
}
