//! RMSNorm and LayerNorm.

/// `out = x / rms(x) * weight`, with ggml's arithmetic: the sum of squares accumulates in
/// f64, the scale is computed in f32, and the weight multiplies after normalization.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let scale = rms_scale(x, eps);
    for ((o, &xi), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = (xi * scale) * w;
    }
}

/// RMSNorm in place.
pub fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let scale = rms_scale(x, eps);
    for (xi, &w) in x.iter_mut().zip(weight) {
        *xi = (*xi * scale) * w;
    }
}

/// RMSNorm in place without a weight (ggml's `rms_norm` alone).
pub fn rms_normalize_in_place(x: &mut [f32], eps: f32) {
    let scale = rms_scale(x, eps);
    x.iter_mut().for_each(|xi| *xi *= scale);
}

fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// LayerNorm with optional bias, as ggml computes it (mean and variance accumulated in f64).
pub fn layer_norm(x: &[f32], weight: &[f32], bias: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    let (mean, scale) = layer_norm_stats(x, eps);
    for (i, o) in out.iter_mut().enumerate() {
        let y = ((x[i] - mean) * scale) * weight[i];
        *o = bias.map_or(y, |b| y + b[i]);
    }
}

/// [`layer_norm`] in place.
pub fn layer_norm_in_place(x: &mut [f32], weight: &[f32], bias: Option<&[f32]>, eps: f32) {
    let (mean, scale) = layer_norm_stats(x, eps);
    for (i, v) in x.iter_mut().enumerate() {
        let y = ((*v - mean) * scale) * weight[i];
        *v = bias.map_or(y, |b| y + b[i]);
    }
}

/// The mean and `1 / sqrt(variance + eps)` of a row.
fn layer_norm_stats(x: &[f32], eps: f32) -> (f32, f32) {
    let n = x.len() as f64;
    let mean = (x.iter().map(|&v| f64::from(v)).sum::<f64>() / n) as f32;
    let var: f64 = x
        .iter()
        .map(|&v| f64::from((v - mean) * (v - mean)))
        .sum::<f64>()
        / n;
    (mean, 1.0 / (var as f32 + eps).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_normalizes() {
        let x = [3.0f32, 4.0];
        let mut out = [0.0; 2];
        rms_norm(&x, &[1.0, 2.0], 0.0, &mut out);
        let rms = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / rms).abs() < 1e-6);
        assert!((out[1] - 8.0 / rms).abs() < 1e-6);
    }

    #[test]
    fn layer_norm_centres() {
        let mut out = [0.0; 3];
        layer_norm(&[1.0, 2.0, 3.0], &[1.0; 3], Some(&[1.0; 3]), 0.0, &mut out);
        assert!((out[1] - 1.0).abs() < 1e-6);
        assert!((out[0] + out[2] - 2.0).abs() < 1e-6);
    }
}
