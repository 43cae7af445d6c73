//! Kimi Delta Attention: one KDA layer over a micro-batch of rows, token by token.
//!
//! Per token: the projected q, k, v each go through a depthwise causal convolution (its state:
//! the last `d_conv - 1` projected inputs) and SiLU; q and k are L2-normalised per head; a
//! per-channel decay `g = A · softplus(f_b(f_a(x)) + dt_bias)` and a per-head `β =
//! sigmoid(W_β x)` drive the delta rule on an f32 `Dh × Dh` state per head (decay along the
//! key axis, as ggml's fused `gated_delta_net` op computes it); the output is RMS-normalised
//! per head and gated by `sigmoid(g_b(g_a(x)))`.

use ferrox_core::StepMemory;
use ferrox_gguf::Gguf;
use rayon::prelude::*;

use crate::engine::EngineError;
use crate::layers::attention::MAX_HEAD_DIM;
use crate::layers::linear::{linear, linear_many};
use crate::layers::norm::{rms_norm_in_place, rms_normalize_in_place};
use crate::step::{sized, Row};
use crate::tensors::MatrixRef;

/// A KDA layer's geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KdaShape {
    pub n_head: usize,
    /// Dh: key and value width of a head (the state is `Dh × Dh`).
    pub head_dim: usize,
    pub d_conv: usize,
}

impl KdaShape {
    pub fn d_inner(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Values of one convolution's state (q, k or v).
    fn conv_values(&self) -> usize {
        (self.d_conv - 1) * self.d_inner()
    }

    /// f32 values one sequence keeps for one KDA layer: three convolution states, then the
    /// heads' delta-rule states.
    pub fn state_values(&self) -> usize {
        3 * self.conv_values() + self.n_head * self.head_dim * self.head_dim
    }
}

#[derive(Clone, Debug)]
pub struct KdaWeights {
    pub q: MatrixRef,
    pub k: MatrixRef,
    pub v: MatrixRef,
    /// Per channel, `d_conv` taps, the last for the current token.
    pub conv: [Vec<f32>; 3],
    pub f_a: MatrixRef,
    pub f_b: MatrixRef,
    pub beta: MatrixRef,
    /// Per head: −exp(A_log).
    pub a: Vec<f32>,
    pub dt_bias: Vec<f32>,
    pub g_a: MatrixRef,
    pub g_b: MatrixRef,
    pub o_norm: Vec<f32>,
    pub wo: MatrixRef,
}

impl KdaWeights {
    pub fn pack(&mut self, gguf: &Gguf) -> Result<(), crate::ModelError> {
        for m in [
            &mut self.q,
            &mut self.k,
            &mut self.v,
            &mut self.f_a,
            &mut self.f_b,
            &mut self.beta,
            &mut self.g_a,
            &mut self.g_b,
            &mut self.wo,
        ] {
            m.pack(gguf)?;
        }
        Ok(())
    }

    pub fn n_bytes(&self) -> u64 {
        [
            &self.q, &self.k, &self.v, &self.f_a, &self.f_b, &self.beta, &self.g_a, &self.g_b,
            &self.wo,
        ]
        .iter()
        .map(|m| m.n_bytes())
        .sum()
    }
}

/// Buffers of a KDA layer, reused across layers and steps.
#[derive(Default)]
pub struct KdaScratch {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    f_a: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    g_a: Vec<f32>,
    gate: Vec<f32>,
    out: Vec<f32>,
    xq: Vec<u8>,
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The layer's output projection of `xn` (`rows.len()` normalized rows) into `out`; the
/// sequences' states (from `state_at` in each sequence's recurrent values) advance by their
/// rows, in order.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    shape: KdaShape,
    w: &KdaWeights,
    gguf: &Gguf,
    eps: f32,
    rows: &[Row],
    xn: &[f32],
    memory: &mut StepMemory<'_>,
    state_at: usize,
    s: &mut KdaScratch,
    out: &mut [f32],
) -> Result<(), EngineError> {
    let n = rows.len();
    let (h, dh, d_conv) = (shape.n_head, shape.head_dim, shape.d_conv);
    let d_inner = shape.d_inner();
    let q = sized(&mut s.q, n * d_inner);
    let k = sized(&mut s.k, n * d_inner);
    let v = sized(&mut s.v, n * d_inner);
    let (wq, wk, wv) = (w.q.view(gguf)?, w.k.view(gguf)?, w.v.view(gguf)?);
    linear_many(&[&wq, &wk, &wv], xn, n, &mut [q, k, v], &mut s.xq)?;
    let f_a = sized(&mut s.f_a, n * dh);
    linear(&w.f_a.view(gguf)?, xn, n, f_a, &mut s.xq)?;
    let g = sized(&mut s.g, n * d_inner);
    linear(&w.f_b.view(gguf)?, f_a, n, g, &mut s.xq)?;
    let beta = sized(&mut s.beta, n * h);
    linear(&w.beta.view(gguf)?, xn, n, beta, &mut s.xq)?;
    let g_a = sized(&mut s.g_a, n * dh);
    linear(&w.g_a.view(gguf)?, xn, n, g_a, &mut s.xq)?;
    let gate = sized(&mut s.gate, n * d_inner);
    linear(&w.g_b.view(gguf)?, g_a, n, gate, &mut s.xq)?;
    let o = sized(&mut s.out, n * d_inner);
    let conv_len = shape.conv_values();
    let scale = 1.0 / (dh as f32).sqrt();

    for (t, row) in rows.iter().enumerate() {
        let state = &mut memory.state(row.seq)[state_at..state_at + shape.state_values()];
        let (convs, heads) = state.split_at_mut(3 * conv_len);
        // Causal convolution + SiLU of q, k and v.
        for (u, (buf, conv_state)) in [&mut *q, &mut *k, &mut *v]
            .into_iter()
            .zip(convs.chunks_exact_mut(conv_len))
            .enumerate()
        {
            let x = &mut buf[t * d_inner..(t + 1) * d_inner];
            let taps = &w.conv[u];
            for c in 0..d_inner {
                let tap = &taps[c * d_conv..(c + 1) * d_conv];
                let mut y = 0.0f32;
                for j in 0..d_conv - 1 {
                    y += tap[j] * conv_state[j * d_inner + c];
                }
                y += tap[d_conv - 1] * x[c];
                // The window moves on: drop the oldest input, keep this one.
                for j in 0..d_conv.saturating_sub(2) {
                    conv_state[j * d_inner + c] = conv_state[(j + 1) * d_inner + c];
                }
                if d_conv > 1 {
                    conv_state[(d_conv - 2) * d_inner + c] = x[c];
                }
                x[c] = silu(y);
            }
        }
        let (qt, kt, vt) = (
            &mut q[t * d_inner..(t + 1) * d_inner],
            &mut k[t * d_inner..(t + 1) * d_inner],
            &v[t * d_inner..(t + 1) * d_inner],
        );
        // L2 norms as ggml computes them: an RMS norm with eps/Dh, then 1/sqrt(Dh).
        let l2_scale = 1.0 / (dh as f32).sqrt();
        for head in qt.chunks_exact_mut(dh).chain(kt.chunks_exact_mut(dh)) {
            rms_normalize_in_place(head, eps / dh as f32);
            head.iter_mut().for_each(|x| *x *= l2_scale);
        }
        let gt = &g[t * d_inner..(t + 1) * d_inner];
        let (bt, gate_t) = (
            &beta[t * h..(t + 1) * h],
            &gate[t * d_inner..(t + 1) * d_inner],
        );
        // Heads are independent: each runs on its own state and output slice.
        heads
            .par_chunks_mut(dh * dh)
            .zip(o[t * d_inner..(t + 1) * d_inner].par_chunks_mut(dh))
            .enumerate()
            .for_each(|(hd, (m, oh))| {
                let span = hd * dh..(hd + 1) * dh;
                let (qh, kh, vh) = (&qt[span.clone()], &kt[span.clone()], &vt[span.clone()]);
                let mut decay = [0f32; MAX_HEAD_DIM];
                let mut delta = [0f32; MAX_HEAD_DIM];
                let (decay, delta) = (&mut decay[..dh], &mut delta[..dh]);
                let b = sigmoid(bt[hd]);
                for (i, d) in decay.iter_mut().enumerate() {
                    let c = hd * dh + i;
                    *d = (w.a[hd] * softplus(gt[c] + w.dt_bias[c])).exp();
                }
                // The state is kept transposed: m[j·Dh + i] = S[i][j].
                for row in m.chunks_exact_mut(dh) {
                    row.iter_mut().zip(decay.iter()).for_each(|(x, d)| *x *= d);
                }
                for (j, dj) in delta.iter_mut().enumerate() {
                    *dj = (vh[j] - dot(&m[j * dh..(j + 1) * dh], kh)) * b;
                }
                for (row, &dj) in m.chunks_exact_mut(dh).zip(delta.iter()) {
                    row.iter_mut().zip(kh).for_each(|(x, &ki)| *x += ki * dj);
                }
                for (j, oj) in oh.iter_mut().enumerate() {
                    *oj = dot(&m[j * dh..(j + 1) * dh], qh) * scale;
                }
                rms_norm_in_place(oh, &w.o_norm, eps);
                let gh = &gate_t[span];
                oh.iter_mut().zip(gh).for_each(|(x, &gv)| *x *= sigmoid(gv));
            });
    }
    linear(&w.wo.view(gguf)?, o, n, out, &mut s.xq)?;
    Ok(())
}
