//! Kimi-K3's residual attention across layers: the first layer of every block of
//! `attn_res.block_size` layers banks its raw input as a checkpoint (and restarts the
//! stream from its attention output), and before each sublayer and the output head the
//! stream is replaced by a softmax-weighted mix of the checkpoints and itself.
//!
//! A mix scores each vector `v` as `Σ_d rms_normalize(v)_d · w_d` (one score vector `w` per
//! sublayer) and sums the *raw* vectors by the softmax of the scores. Everything is per
//! token: the checkpoints are activations of the micro-batch's rows, nothing is kept
//! across steps.

use rayon::prelude::*;
use smallvec::SmallVec;

use crate::scaffold::{sized, OutputRows, Row};

/// Checkpoints a mix scores without allocating (Kimi-K3 has 8).
const INLINE_CHECKPOINTS: usize = 16;

/// Per layer, the score vectors of the mixes before its attention and its FFN.
#[derive(Clone, Debug)]
pub struct ResidualScores {
    pub attn: Vec<f32>,
    pub ffn: Vec<f32>,
}

/// The checkpoints banked so far for a micro-batch: `count` slabs of `n × n_embd`.
#[derive(Default)]
pub struct Checkpoints {
    stack: Vec<f32>,
    count: usize,
    n: usize,
    n_embd: usize,
}

impl Checkpoints {
    /// Forgets the checkpoints; the next ones are for `n` rows of `n_embd`.
    pub fn reset(&mut self, n: usize, n_embd: usize) {
        (self.count, self.n, self.n_embd) = (0, n, n_embd);
    }

    /// Banks the stream `x` (`n × n_embd`) as the next checkpoint.
    pub fn push(&mut self, x: &[f32]) {
        let slab = self.n * self.n_embd;
        let len = (self.count + 1) * slab;
        // Grow without losing the banked slabs.
        if self.stack.len() < len {
            self.stack.resize(len, 0.0);
        }
        self.stack[self.count * slab..len].copy_from_slice(&x[..slab]);
        self.count += 1;
    }

    /// Keeps only the rows `kept` kept (see [`OutputRows::keep`]) of every checkpoint.
    pub fn keep_output_rows(&mut self, rows: &[Row], kept: &OutputRows) {
        let (old_slab, n_kept) = (self.n * self.n_embd, kept.of(rows).len());
        let new_slab = n_kept * self.n_embd;
        for i in 0..self.count {
            kept.compact(
                rows,
                &mut self.stack[i * old_slab..(i + 1) * old_slab],
                self.n_embd,
            );
            // Slabs move towards the front, in order: none overwrites one still to move.
            let from = i * old_slab;
            self.stack.copy_within(from..from + new_slab, i * new_slab);
        }
        self.n = n_kept;
    }

    /// `out` = the mix of the checkpoints and the stream `cur` scored by `w`; `cur` itself
    /// when nothing is banked yet.
    pub fn mix(&self, cur: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        let (n_embd, slab) = (self.n_embd, self.n * self.n_embd);
        let out = &mut out[..slab];
        if self.count == 0 {
            out.copy_from_slice(&cur[..slab]);
            return;
        }
        let stack = &self.stack[..self.count * slab];
        out.par_chunks_mut(n_embd)
            .zip(cur.par_chunks(n_embd))
            .enumerate()
            .for_each(|(t, (o, c))| {
                let row = |i: usize| &stack[i * slab + t * n_embd..i * slab + (t + 1) * n_embd];
                let mut scores: SmallVec<[f32; INLINE_CHECKPOINTS]> =
                    (0..self.count).map(|i| score(row(i), w, eps)).collect();
                scores.push(score(c, w, eps));
                let mut p: SmallVec<[f32; INLINE_CHECKPOINTS]> =
                    SmallVec::from_elem(0.0, scores.len());
                ferrox_moe::numerics::softmax(&scores, &mut p);
                let p_cur = p[self.count];
                // As ggml: the checkpoints summed in order in f32, then the stream added.
                for (d, od) in o.iter_mut().enumerate() {
                    let mut sum = 0.0f32;
                    for (i, &pi) in p[..self.count].iter().enumerate() {
                        sum += row(i)[d] * pi;
                    }
                    *od = sum + c[d] * p_cur;
                }
            });
    }
}

/// `Σ_d (x_d · s) · w_d` with `s` the RMS normalisation scale of `x` (ggml's `rms_norm`,
/// `mul` and `sum_rows`, which sums in f64).
fn score(x: &[f32], w: &[f32], eps: f32) -> f32 {
    let sq: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
    let scale = 1.0 / ((sq / x.len() as f64) as f32 + eps).sqrt();
    x.iter()
        .zip(w)
        .map(|(&v, &wv)| f64::from((v * scale) * wv))
        .sum::<f64>() as f32
}

/// The stream of a micro-batch with residual attention: the stream itself, the mixed input
/// of the next sublayer, and the banked checkpoints.
#[derive(Default)]
pub struct MixedStream {
    pub checkpoints: Checkpoints,
    mixed: Vec<f32>,
}

impl MixedStream {
    /// The mix of the checkpoints and `x` scored by `w` (`x` itself without scores).
    pub fn input<'a>(&'a mut self, x: &'a [f32], w: Option<&[f32]>, eps: f32) -> &'a [f32] {
        match w {
            None => x,
            Some(w) => {
                let mixed = sized(&mut self.mixed, x.len());
                self.checkpoints.mix(x, w, eps, mixed);
                mixed
            }
        }
    }
}
