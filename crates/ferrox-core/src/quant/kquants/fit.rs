//! The per-sub-block scale searches of the K-quant reference quantizers.
//!
//! These reproduce ggml's `make_qkx2_quants`, `make_qx_quants` (the `rmse_type = 1`,
//! no-importance case) and `make_q3_quants` operation for operation: the arithmetic is
//! all f32 with the same association order (Rust never fuses a multiply-add on its own),
//! so the chosen levels and scales are bit-identical.

use crate::quant::bits::{nearest_int, signed_absmax};

/// Below this magnitude a sub-block counts as all zero (ggml's `GROUP_MAX_EPS`).
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// The scale grid that [`fit_affine`] tries: `nstep + 1` candidates whose inverse scale is
/// `(rmin + rdelta·i + nmax) / (max − min)`.
pub(crate) struct AffineSearch {
    pub nmax: i32,
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
    /// Minimize weighted absolute error instead of weighted squared error.
    pub use_mad: bool,
}

/// Affine fit `x ≈ scale·L − min_offset` with levels `L` in `0..=nmax` (ggml's
/// `make_qkx2_quants`). Writes the levels and returns `(scale, min_offset)`, where
/// `min_offset >= 0` is the amount subtracted.
pub(crate) fn fit_affine(
    x: &[f32],
    weights: &[f32],
    search: &AffineSearch,
    levels: &mut [u8],
) -> (f32, f32) {
    let n = x.len();
    let nmax = search.nmax;
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    // The offset can only move values down, so the fit always covers zero.
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels[..n].fill(0);
        return (0.0, -min);
    }

    let error_of = |diff: f32| {
        if search.use_mad {
            diff.abs()
        } else {
            diff * diff
        }
    };
    let clamp_level = |l: i32| l.clamp(0, nmax) as u8;

    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = clamp_level(nearest_int(iscale * (x[i] - min)));
        levels[i] = l;
        let diff = scale * f32::from(l) + min - x[i];
        best_error += weights[i] * error_of(diff);
    }
    if search.nstep < 1 {
        return (scale, -min);
    }

    let mut trial = [0u8; 32];
    let trial = &mut trial[..n];
    for step in 0..=search.nstep {
        iscale = (search.rmin + search.rdelta * step as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = clamp_level(nearest_int(iscale * (x[i] - min)));
            trial[i] = l;
            let (w, l) = (weights[i], f32::from(l));
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        // Weighted least squares for (scale, min) given these levels.
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * f32::from(trial[i]) + this_min - x[i];
                error += weights[i] * error_of(diff);
            }
            if error < best_error {
                levels[..n].copy_from_slice(trial);
                best_error = error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Symmetric fit `x ≈ scale·(L − nmax)` with `L` in `0..2·nmax`, weighting each value by
/// x² (ggml's `make_qx_quants` with `rmse_type = 1` and no importance weights). Writes
/// the offset levels and returns the scale (0 for an all-zero sub-block).
pub(crate) fn fit_symmetric(x: &[f32], nmax: i32, levels: &mut [u8]) -> f32 {
    let (amax, max) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        levels[..x.len()].fill(0);
        return 0.0;
    }
    let level_for = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    // Weighted sums Σw·x·l and Σw·l² for one trial inverse scale, with w = x².
    let sums_for = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let l = level_for(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let store_levels = |iscale: f32, levels: &mut [u8]| {
        for (level, &v) in levels.iter_mut().zip(x) {
            *level = (level_for(iscale, v) + nmax) as u8;
        }
    };

    let iscale = -(nmax as f32) / max;
    store_levels(iscale, levels);
    let (sumlx, suml2) = sums_for(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for step in (-9..=9).filter(|&s| s != 0) {
        let iscale = -(nmax as f32 + 0.1 * step as f32) / max;
        let (sumlx, suml2) = sums_for(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            store_levels(iscale, levels);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Q3_K's symmetric fit (ggml's `make_q3_quants` with `do_rmse`): start from the
/// max-magnitude scale, then greedily move single levels while that lowers the x²-weighted
/// error, for at most five sweeps. Writes levels offset by `nmax` and returns the scale.
pub(crate) fn fit_symmetric_greedy(x: &[f32], nmax: i32, levels: &mut [u8]) -> f32 {
    let n = x.len();
    let (amax, max) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        levels[..n].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut signed = [0i32; 16];
    let signed = &mut signed[..n];
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (l, &v) in signed.iter_mut().zip(x) {
        *l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        let w = v * v;
        sumlx += w * v * *l as f32;
        suml2 += w * *l as f32 * *l as f32;
    }
    for _sweep in 0..5 {
        let mut changed = 0;
        for i in 0..n {
            let w = x[i] * x[i];
            let old = signed[i] as f32;
            let mut slx = sumlx - w * x[i] * old;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * old * old;
                let new_l = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != signed[i] {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        signed[i] = new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        changed += 1;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    for (level, &l) in levels.iter_mut().zip(signed.iter()) {
        *level = (l + nmax) as u8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}
