//! AVX-512 products of float weight rows (F32, F16, BF16) with many activation rows, both
//! widened to f32 first: a tile of four weight rows by three activation rows keeps the
//! twelve outputs' accumulators in registers, so each value loaded feeds three or four
//! multiply-adds and nothing is converted inside the loop (the row kernel converts every
//! activation value at every use). Each output has the row kernel's bits
//! ([`float_dot_512`](super::avx512_float::float_dot_512)): the same two sixteen-lane
//! accumulators, updated in the same order, and the same reduction and leftovers.

use std::arch::x86_64::*;

use super::avx2_float::{Bf16Lanes, F16Lanes, F32Lanes, LeftoverSum};
use super::avx512_float::Lanes16;
use crate::kernels::WeightKind;
use crate::kernels::{FloatGemm, FloatTile, TILE_ROWS, TILE_TOKENS};

const STEP: usize = 32;

/// `out[r][t]` = weight row `r` · activation row `t`, rows of `cols` values back to back in
/// `w` (`R` of them) and `x` (`T`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `h`, `t` and `r` index operands and accumulators
fn tile<E: Lanes16, const R: usize, const T: usize>(
    w: &[f32],
    x: &[f32],
    cols: usize,
    out: &mut FloatTile,
) {
    assert!(w.len() >= R * cols && x.len() >= T * cols, "tile operands");
    let full = cols / STEP * STEP;
    let mut acc = [[[_mm512_setzero_ps(); 2]; T]; R];
    for at in (0..full).step_by(STEP) {
        for h in 0..2 {
            let lane = at + 16 * h;
            // SAFETY: row `r` holds `cols >= full` values from `r * cols`, and
            // `lane + 16 <= full`; `loadu` has no alignment requirement.
            let weights: [__m512; R] = std::array::from_fn(|r| unsafe {
                _mm512_loadu_ps(w.as_ptr().add(r * cols + lane))
            });
            for t in 0..T {
                // SAFETY: as above, for activation row `t`.
                let b = unsafe { _mm512_loadu_ps(x.as_ptr().add(t * cols + lane)) };
                for r in 0..R {
                    let slot = &mut acc[r][t][h];
                    *slot = if E::FUSED {
                        _mm512_fmadd_ps(weights[r], b, *slot)
                    } else {
                        _mm512_add_ps(_mm512_mul_ps(weights[r], b), *slot)
                    };
                }
            }
        }
    }
    // Split back into the AVX2 kernel's four accumulators for its reduction.
    let mut sums: [[E::Sum; T]; R] = std::array::from_fn(|r| {
        std::array::from_fn(|t| {
            let [lo, hi] = acc[r][t];
            let split = [
                _mm512_castps512_ps256(lo),
                _mm512_extractf32x8_ps::<1>(lo),
                _mm512_castps512_ps256(hi),
                _mm512_extractf32x8_ps::<1>(hi),
            ];
            // SAFETY: the AVX2 features are part of this function's.
            unsafe { E::reduce(split) }
        })
    });
    // The leftovers column by column, so that the outputs' sums advance side by side.
    for i in full..cols {
        for (r, sums) in sums.iter_mut().enumerate() {
            for (t, sum) in sums.iter_mut().enumerate() {
                *sum = sum.add(w[r * cols + i], x[t * cols + i]);
            }
        }
    }
    for (out, sums) in out.iter_mut().zip(&sums) {
        for (out, &sum) in out.iter_mut().zip(sums) {
            *out = sum.end();
        }
    }
}

/// The safe entries for element type `E`.
fn entry<E: Lanes16>() -> FloatGemm {
    fn run<E: Lanes16>(
        w: &[f32],
        rows: usize,
        x: &[f32],
        tokens: usize,
        cols: usize,
        out: &mut FloatTile,
    ) {
        // SAFETY (every call): handed out only by `avx512_float_gemm`, after detecting
        // the features.
        macro_rules! go {
            ($r:literal, $t:literal) => {
                unsafe { tile::<E, $r, $t>(w, x, cols, out) }
            };
        }
        match (rows, tokens) {
            (4, 3) => go!(4, 3),
            (4, 2) => go!(4, 2),
            (4, 1) => go!(4, 1),
            (3, 3) => go!(3, 3),
            (3, 2) => go!(3, 2),
            (3, 1) => go!(3, 1),
            (2, 3) => go!(2, 3),
            (2, 2) => go!(2, 2),
            (2, 1) => go!(2, 1),
            (1, 3) => go!(1, 3),
            (1, 2) => go!(1, 2),
            (1, 1) => go!(1, 1),
            _ => panic!("float tile of {rows}x{tokens} (at most {TILE_ROWS}x{TILE_TOKENS})"),
        }
    }
    FloatGemm {
        // Widening is a small share of the work: the AVX2 loop serves.
        widen: super::avx2_float_gemm::widen_entry::<E>,
        tile: run::<E>,
        tile_rows: TILE_ROWS,
        tile_tokens: TILE_TOKENS,
    }
}

/// The tiled float products for `kind`, if it is a float type. The caller has detected
/// the AVX-512 kernel features.
pub(super) fn kernel(kind: WeightKind) -> Option<FloatGemm> {
    match kind {
        WeightKind::F32 => Some(entry::<F32Lanes>()),
        WeightKind::F16 => Some(entry::<F16Lanes>()),
        WeightKind::Bf16 => Some(entry::<Bf16Lanes>()),
        _ => None,
    }
}
