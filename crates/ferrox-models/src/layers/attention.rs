//! Scaled dot-product attention over the KV cache, one query head at a time, with an
//! online-softmax accumulator (one pass over the keys, no score buffer). Prefill runs the
//! same per-query routine as decode, so a prompt's logits do not depend on how it was
//! batched or chunked.
//!
//! With an f16 cache this follows ggml's CPU flash-attention arithmetic (its default
//! configuration): the query is rounded to f16 for the q·k products and the weighted sum
//! of values accumulates in f16, rounding after every step. With an f32 cache everything
//! stays in f32.

use ferrox_core::{vec_f16, KvRows};
use half::f16;

/// Largest head size the on-stack query buffer holds.
pub const MAX_HEAD_DIM: usize = 1024;

/// Per-layer attention settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    /// Multiplies q·k (after any scaling already applied to q).
    pub scale: f32,
    /// Gemma-2 attention logit soft cap.
    pub softcap: Option<f32>,
}

/// Where one query head reads its keys and values.
#[derive(Clone, Copy, Debug)]
pub struct KvView<'a> {
    /// Keys of positions `first..first + n`, position-major, `key_width` per position.
    pub keys: KvRows<'a>,
    pub values: KvRows<'a>,
    pub key_width: usize,
    pub value_width: usize,
    /// Which KV head (offset inside each position's row).
    pub head: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
}

/// `out = softmax(q·K^T * scale) · V` over positions `lo..hi` of the view (indices relative
/// to the view's first position).
pub fn attend(
    q: &[f32],
    kv: &KvView<'_>,
    lo: usize,
    hi: usize,
    params: &AttentionParams,
    out: &mut [f32],
) {
    let mut acc = OnlineAttention::new(q, kv, params, out);
    acc.consume(q, kv, lo, hi, out);
    acc.finish(out);
}

/// One query's attention accumulated run by run (the runs of a paged cache, in position
/// order). The arithmetic is the same whether the keys come in one run or many.
pub struct OnlineAttention {
    /// The query rounded to f16 (f16 caches only).
    q16: [f16; MAX_HEAD_DIM],
    /// The weighted sum of f16 values (f16 caches only; f32 sums accumulate in `out`).
    acc16: [f16; MAX_HEAD_DIM],
    max: f32,
    sum: f32,
    scale: f32,
    softcap: Option<f32>,
    head_dim_v: usize,
    f16_values: bool,
}

impl OnlineAttention {
    /// Starts an empty accumulation for `q`; `out` (the head's output row) is zeroed.
    /// `kv` gives the shapes and storage of the runs to come.
    pub fn new(
        q: &[f32],
        kv: &KvView<'_>,
        params: &AttentionParams,
        out: &mut [f32],
    ) -> OnlineAttention {
        out[..kv.head_dim_v].fill(0.0);
        let mut q16 = [f16::ZERO; MAX_HEAD_DIM];
        // f16 caches are read the way ggml reads them: the query is rounded to f16 once
        // and the dot product accumulates in f32.
        if let KvRows::F16(_) = kv.keys {
            for (d, &s) in q16.iter_mut().zip(&q[..kv.head_dim_k]) {
                *d = f16::from_f32(s);
            }
        }
        let scale = match params.softcap {
            Some(cap) => params.scale / cap,
            None => params.scale,
        };
        OnlineAttention {
            q16,
            acc16: [f16::ZERO; MAX_HEAD_DIM],
            max: f32::NEG_INFINITY,
            sum: 0.0,
            scale,
            softcap: params.softcap,
            head_dim_v: kv.head_dim_v,
            f16_values: matches!(kv.values, KvRows::F16(_)),
        }
    }

    /// Adds positions `lo..hi` of `kv` (which must follow everything consumed so far).
    pub fn consume(&mut self, q: &[f32], kv: &KvView<'_>, lo: usize, hi: usize, out: &mut [f32]) {
        let dk = kv.head_dim_k;
        let dv = kv.head_dim_v;
        for p in lo..hi {
            let k_at = p * kv.key_width + kv.head * dk;
            let mut s = match kv.keys {
                KvRows::F32(k) => dot_f32(&k[k_at..k_at + dk], &q[..dk]),
                KvRows::F16(k) => vec_f16::dot_f16(&k[k_at..k_at + dk], &self.q16[..dk]),
            };
            s *= self.scale;
            if let Some(cap) = self.softcap {
                s = cap * s.tanh();
            }
            // Online softmax: rescale what has accumulated when a new maximum appears.
            let (ms, vs) = if s > self.max {
                let ms = (self.max - s).exp();
                self.max = s;
                (ms, 1.0)
            } else {
                (1.0, (s - self.max).exp())
            };
            let v_at = p * kv.value_width + kv.head * dv;
            match kv.values {
                KvRows::F32(v) => mad(&mut out[..dv], ms, &v[v_at..v_at + dv], vs),
                KvRows::F16(v) => {
                    if ms != 1.0 {
                        vec_f16::scale_f16(&mut self.acc16[..dv], ms);
                    }
                    vec_f16::mad_f16(&mut self.acc16[..dv], &v[v_at..v_at + dv], vs);
                }
            }
            self.sum = self.sum * ms + vs;
        }
    }

    /// Writes the normalised result to `out`.
    pub fn finish(&self, out: &mut [f32]) {
        let out = &mut out[..self.head_dim_v];
        if self.f16_values {
            for (o, a) in out.iter_mut().zip(&self.acc16) {
                *o = a.to_f32();
            }
        }
        let inv = if self.sum > 0.0 { 1.0 / self.sum } else { 0.0 };
        out.iter_mut().for_each(|o| *o *= inv);
    }
}

fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `acc = acc * ms + v * vs`.
fn mad(acc: &mut [f32], ms: f32, v: &[f32], vs: f32) {
    if ms != 1.0 {
        acc.iter_mut().for_each(|a| *a *= ms);
    }
    for (a, &x) in acc.iter_mut().zip(v) {
        *a += x * vs;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two-pass softmax reference.
    fn reference(q: &[f32], keys: &[Vec<f32>], values: &[Vec<f32>], scale: f32) -> Vec<f32> {
        let scores: Vec<f32> = keys.iter().map(|k| dot_f32(k, q) * scale).collect();
        let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let w: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f32 = w.iter().sum();
        let mut out = vec![0.0; values[0].len()];
        for (wi, v) in w.iter().zip(values) {
            for (o, x) in out.iter_mut().zip(v) {
                *o += wi / total * x;
            }
        }
        out
    }

    #[test]
    fn online_softmax_matches_two_pass() {
        let (n, d) = (13, 8);
        let keys: Vec<Vec<f32>> = (0..n)
            .map(|p| {
                (0..d)
                    .map(|i| ((p * 7 + i * 3) % 11) as f32 * 0.3 - 1.5)
                    .collect()
            })
            .collect();
        let values: Vec<Vec<f32>> = (0..n)
            .map(|p| (0..d).map(|i| ((p * 5 + i) % 7) as f32 - 3.0).collect())
            .collect();
        let q: Vec<f32> = (0..d).map(|i| i as f32 * 0.25 - 1.0).collect();
        let flat = |rows: &[Vec<f32>]| rows.concat();
        let (kf, vf) = (flat(&keys), flat(&values));
        let view = KvView {
            keys: KvRows::F32(&kf),
            values: KvRows::F32(&vf),
            key_width: d,
            value_width: d,
            head: 0,
            head_dim_k: d,
            head_dim_v: d,
        };
        let params = AttentionParams {
            scale: 0.35,
            softcap: None,
        };
        let mut out = vec![0.0; d];
        attend(&q, &view, 3, 11, &params, &mut out);
        let expected = reference(&q, &keys[3..11], &values[3..11], 0.35);
        for (a, b) in out.iter().zip(&expected) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }
}
