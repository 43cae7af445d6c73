//! Manifold-constrained hyper-connections (mHC): the residual stream is `hc` streams of
//! `n_embd` per token. Before each sub-block a token's streams are mixed, from the RMS-normed
//! flattened streams, into `hc` "pre" weights (the sub-block's input is their weighted sum),
//! `hc` "post" weights (how much of the sub-block's output each stream gets) and an
//! `hc × hc` combination of the old streams, made nearly doubly stochastic by Sinkhorn
//! normalisation. Every step follows llama.cpp's graph: the order of its divisions, sums and
//! epsilons included.

use ferrox_gguf::Gguf;
use ferrox_moe::numerics::{sigmoid, softmax};
use rayon::prelude::*;

use super::config::HC_STREAMS as HC;
use crate::layers::linear::linear;
use crate::layers::norm::rms_normalize_in_place;
use crate::scaffold::sized;
use crate::tensors::MatrixRef;
use crate::ModelError;

/// Mixing values per token: `hc` pre weights, `hc` post weights, `hc × hc` combination.
pub const MIX: usize = (2 + HC) * HC;

/// One sub-block's (or the output head's) mixing weights.
#[derive(Clone, Debug)]
pub struct HcWeights {
    /// `hc·n_embd` inputs → the mixing values (`MIX`, or `hc` for the head).
    pub mix: MatrixRef,
    pub base: Vec<f32>,
    pub scale: Vec<f32>,
}

/// Buffers of the mixing, reused across layers and steps.
#[derive(Default)]
pub struct HcScratch {
    normed: Vec<f32>,
    /// Per token: `[pre (hc) | post (hc) | comb (hc × hc, dst fastest)]`.
    mixes: Vec<f32>,
    streams: Vec<f32>,
    xq: Vec<u8>,
}

/// The mixing values of `n` tokens' streams `x` (`n × hc × n_embd`) with `w.mix`'s outputs
/// per token, into `s.mixes` (raw: the affine maps are applied by the callers).
fn raw_mixes(
    gguf: &Gguf,
    w: &HcWeights,
    x: &[f32],
    n: usize,
    eps: f32,
    s: &mut HcScratch,
) -> Result<usize, ModelError> {
    let m = w.mix.view(gguf)?;
    let width = m.cols();
    let normed = sized(&mut s.normed, n * width);
    normed.copy_from_slice(&x[..n * width]);
    normed
        .par_chunks_mut(width)
        .for_each(|row| rms_normalize_in_place(row, eps));
    let outputs = m.rows();
    let mixes = sized(&mut s.mixes, n * outputs);
    linear(&m, normed, n, mixes, &mut s.xq)?;
    Ok(outputs)
}

/// Sinkhorn normalisation of one token's `hc × hc` combination (`comb[dst + hc·src]`), as
/// llama.cpp orders it: a softmax over destinations for each source, `+ eps`, a division of
/// each destination's row by its sum over sources (`+ eps`), then `iterations - 1` rounds of
/// the column division followed by the row division.
fn sinkhorn(comb: &mut [f32], iterations: usize, eps: f32) {
    let mut row = [0f32; HC];
    for src in 0..HC {
        let column = &mut comb[src * HC..(src + 1) * HC];
        row.copy_from_slice(column);
        softmax(&row, column);
    }
    comb.iter_mut().for_each(|c| *c += eps);
    // ggml sums in f64 and divides by the f32 rounding of the sum plus eps.
    let per_destination = |comb: &mut [f32]| {
        for dst in 0..HC {
            let sum: f64 = (0..HC).map(|src| comb[dst + HC * src] as f64).sum();
            let d = sum as f32 + eps;
            (0..HC).for_each(|src| comb[dst + HC * src] /= d);
        }
    };
    let per_source = |comb: &mut [f32]| {
        for src in 0..HC {
            let column = &mut comb[src * HC..(src + 1) * HC];
            let sum: f64 = column.iter().map(|&c| c as f64).sum();
            let d = sum as f32 + eps;
            column.iter_mut().for_each(|c| *c /= d);
        }
    };
    per_destination(comb);
    for _ in 1..iterations {
        per_source(comb);
        per_destination(comb);
    }
}

/// `out[t] = Σ_s pre[t][s] · x[t][s]`, streams added in order.
fn weighted_sum(
    x: &[f32],
    pre: impl Fn(usize) -> [f32; HC] + Sync,
    n_embd: usize,
    out: &mut [f32],
) {
    out.par_chunks_mut(n_embd)
        .zip(x.par_chunks(HC * n_embd))
        .enumerate()
        .for_each(|(t, (o, streams))| {
            let p = pre(t);
            for (s, stream) in streams.chunks_exact(n_embd).enumerate() {
                if s == 0 {
                    o.iter_mut().zip(stream).for_each(|(o, &v)| *o = v * p[0]);
                } else {
                    o.iter_mut().zip(stream).for_each(|(o, &v)| *o += v * p[s]);
                }
            }
        });
}

/// A sub-block's hyper-connection over a micro-batch: [`HyperConnection::pre`] mixes the
/// streams into the sub-block's input, [`HyperConnection::post`] folds its output back.
pub struct HyperConnection<'a> {
    pub weights: &'a HcWeights,
    pub n_embd: usize,
    pub norm_eps: f32,
    pub hc_eps: f32,
    pub sinkhorn_iterations: usize,
}

impl HyperConnection<'_> {
    /// The mixing of `n` tokens' streams `x`, and their weighted sum into `out`
    /// (`n × n_embd`).
    pub fn pre(
        &self,
        gguf: &Gguf,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        s: &mut HcScratch,
    ) -> Result<(), ModelError> {
        let outputs = raw_mixes(gguf, self.weights, x, n, self.norm_eps, s)?;
        if outputs != MIX {
            return Err(ModelError::Config(format!(
                "a hyper-connection mixes {outputs} values, expected {MIX}"
            )));
        }
        let (base, scale) = (&self.weights.base, &self.weights.scale);
        let (eps, iterations) = (self.hc_eps, self.sinkhorn_iterations);
        s.mixes[..n * MIX].par_chunks_mut(MIX).for_each(|m| {
            for i in 0..HC {
                m[i] = sigmoid(m[i] * scale[0] + base[i]) + eps;
                m[HC + i] = sigmoid(m[HC + i] * scale[1] + base[HC + i]) * 2.0;
            }
            for i in 2 * HC..MIX {
                m[i] = m[i] * scale[2] + base[i];
            }
            sinkhorn(&mut m[2 * HC..], iterations, eps);
        });
        let mixes = &s.mixes;
        let pre = |t: usize| -> [f32; HC] { mixes[t * MIX..t * MIX + HC].try_into().unwrap() };
        weighted_sum(x, pre, self.n_embd, out);
        Ok(())
    }

    /// Folds the sub-block's output `y` (`n × n_embd`) into the streams `x`:
    /// `x'[dst] = post[dst] · y + Σ_src comb[dst, src] · x[src]`, with the mixing of the
    /// last [`HyperConnection::pre`].
    pub fn post(&self, x: &mut [f32], y: &[f32], n: usize, s: &mut HcScratch) {
        let e = self.n_embd;
        let old = sized(&mut s.streams, n * HC * e);
        old.copy_from_slice(&x[..n * HC * e]);
        let mixes = &s.mixes;
        x[..n * HC * e]
            .par_chunks_mut(HC * e)
            .zip(old.par_chunks(HC * e))
            .zip(y.par_chunks(e))
            .enumerate()
            .for_each(|(t, ((new, old), y))| {
                let m = &mixes[t * MIX..(t + 1) * MIX];
                let (post, comb) = (&m[HC..2 * HC], &m[2 * HC..]);
                for (dst, out) in new.chunks_exact_mut(e).enumerate() {
                    out.iter_mut().zip(y).for_each(|(o, &v)| *o = v * post[dst]);
                    for (src, stream) in old.chunks_exact(e).enumerate() {
                        let c = comb[dst + HC * src];
                        out.iter_mut().zip(stream).for_each(|(o, &v)| *o += v * c);
                    }
                }
            });
    }
}

/// The output head's collapse of the streams `x` into one row per token (`out`,
/// `n × n_embd`): only pre weights, from `hc` mixing values.
#[allow(clippy::too_many_arguments)]
pub fn collapse(
    gguf: &Gguf,
    w: &HcWeights,
    x: &[f32],
    n: usize,
    n_embd: usize,
    (norm_eps, hc_eps): (f32, f32),
    out: &mut [f32],
    s: &mut HcScratch,
) -> Result<(), ModelError> {
    let outputs = raw_mixes(gguf, w, x, n, norm_eps, s)?;
    if outputs != HC {
        return Err(ModelError::Config(format!(
            "the output head's hyper-connection mixes {outputs} values, expected {HC}"
        )));
    }
    let mixes = &mut s.mixes[..n * HC];
    mixes.iter_mut().enumerate().for_each(|(i, m)| {
        *m = sigmoid(*m * w.scale[0] + w.base[i % HC]) + hc_eps;
    });
    let mixes = &*mixes;
    let pre = |t: usize| -> [f32; HC] { mixes[t * HC..(t + 1) * HC].try_into().unwrap() };
    weighted_sum(x, pre, n_embd, out);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinkhorn_is_nearly_doubly_stochastic() {
        let mut comb: Vec<f32> = (0..HC * HC)
            .map(|i| (i as f32 * 0.37).sin() * 3.0)
            .collect();
        sinkhorn(&mut comb, 20, 1e-6);
        for k in 0..HC {
            let per_dst: f32 = (0..HC).map(|src| comb[k + HC * src]).sum();
            let per_src: f32 = comb[k * HC..(k + 1) * HC].iter().sum();
            assert!((per_dst - 1.0).abs() < 1e-3, "{per_dst}");
            assert!((per_src - 1.0).abs() < 1e-3, "{per_src}");
        }
    }
}
