//! Kimi Delta Attention: one KDA layer over a micro-batch of rows, token by token.
//!
//! Per token: the projected q, k, v each go through a depthwise causal convolution (its state:
//! the last `d_conv - 1` projected inputs) and SiLU; q and k are L2-normalised per head; a
//! per-channel log-decay ([`Decay`]: `A · softplus(f_b(f_a(x)) + dt_bias)`, or Kimi-K3's
//! lower-bound form) and a per-head `β = sigmoid(W_β x)` drive the delta rule on an f32
//! `Dh × Dh` state per head (decay along the key axis, as ggml's fused `gated_delta_net` op
//! computes it); the output is RMS-normalised per head and gated by the sigmoid of
//! [`OutputGate`] (low rank in Kimi Linear, full rank in Kimi-K3).

use crate::plan::Packing;
use ferrox_gguf::Gguf;
use ferrox_memory::StepMemory;
use rayon::prelude::*;

use super::delta_rule::{Run, SharedOut, CHUNK};
use crate::engine::EngineError;
use crate::layers::linear::{linear, linear_many};
use crate::layers::norm::{rms_norm_in_place, rms_normalize_in_place};
use crate::scaffold::{sized, Row};
use crate::tensors::MatrixRef;

/// A KDA layer's geometry and decay form.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KdaShape {
    pub n_head: usize,
    /// Dh: key and value width of a head (the state is `Dh × Dh`).
    pub head_dim: usize,
    pub d_conv: usize,
    pub decay: Decay,
}

/// How a channel's log-decay comes from `z = f_b(f_a(x)) + dt_bias` and the head's
/// `A = ssm_a = −exp(A_log)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decay {
    /// `A · softplus(z)` (Kimi Linear; Kimi-K3 without `kda.gate_lower_bound`).
    Softplus,
    /// `lb · sigmoid(−A · z)`, in `(lb, 0)`: a reparametrisation, not a clamp (Kimi-K3's
    /// `kda.gate_lower_bound`).
    LowerBound(f32),
}

impl Decay {
    fn log_decay(self, a: f32, z: f32) -> f32 {
        match self {
            Decay::Softplus => a * softplus(z),
            // ggml computes `sigmoid(-(z·A))`.
            Decay::LowerBound(lb) => lb * sigmoid(-(z * a)),
        }
    }
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
    /// Tap by tap, every channel's weight (`d_conv × d_inner`, the file's layout
    /// transposed, so that a tap runs over contiguous channels); the last tap is the
    /// current token's.
    pub conv: [Vec<f32>; 3],
    pub f_a: MatrixRef,
    pub f_b: MatrixRef,
    pub beta: MatrixRef,
    /// Per head: −exp(A_log).
    pub a: Vec<f32>,
    pub dt_bias: Vec<f32>,
    pub gate: OutputGate,
    pub o_norm: Vec<f32>,
    pub wo: MatrixRef,
}

/// The projection whose sigmoid gates the normalised output.
#[derive(Clone, Debug)]
pub enum OutputGate {
    /// `ssm_g_b · (ssm_g_a · x)` (Kimi Linear).
    LowRank { a: MatrixRef, b: MatrixRef },
    /// `ssm_g · x` (Kimi-K3).
    Full(MatrixRef),
}

impl OutputGate {
    fn matrices(&mut self) -> Vec<&mut MatrixRef> {
        match self {
            OutputGate::LowRank { a, b } => vec![a, b],
            OutputGate::Full(g) => vec![g],
        }
    }

    fn n_bytes(&self) -> u64 {
        match self {
            OutputGate::LowRank { a, b } => a.n_bytes() + b.n_bytes(),
            OutputGate::Full(g) => g.n_bytes(),
        }
    }
}

impl KdaWeights {
    pub fn pack(&mut self, gguf: &Packing<'_>) -> Result<(), crate::ModelError> {
        for m in [
            &mut self.q,
            &mut self.k,
            &mut self.v,
            &mut self.f_a,
            &mut self.f_b,
            &mut self.beta,
            &mut self.wo,
        ] {
            m.pack(gguf)?;
        }
        for m in self.gate.matrices() {
            m.pack(gguf)?;
        }
        Ok(())
    }

    pub fn n_bytes(&self) -> u64 {
        let own: u64 = [
            &self.q, &self.k, &self.v, &self.f_a, &self.f_b, &self.beta, &self.wo,
        ]
        .iter()
        .map(|m| m.n_bytes())
        .sum();
        own + self.gate.n_bytes()
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
    /// One row's convolution sums.
    conv: Vec<f32>,
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
    let gate = sized(&mut s.gate, n * d_inner);
    match &w.gate {
        OutputGate::LowRank { a, b } => {
            let g_a = sized(&mut s.g_a, n * dh);
            linear(&a.view(gguf)?, xn, n, g_a, &mut s.xq)?;
            linear(&b.view(gguf)?, g_a, n, gate, &mut s.xq)?;
        }
        OutputGate::Full(g) => linear(&g.view(gguf)?, xn, n, gate, &mut s.xq)?,
    }
    let o = sized(&mut s.out, n * d_inner);
    let conv_len = shape.conv_values();
    let scale = 1.0 / (dh as f32).sqrt();

    // Per row: the convolutions, the L2 norms, the log-decays and the betas.
    for (t, row) in rows.iter().enumerate() {
        let state = &mut memory.state(row.seq)[state_at..state_at + 3 * conv_len];
        for (u, (buf, conv_state)) in [&mut *q, &mut *k, &mut *v]
            .into_iter()
            .zip(state.chunks_exact_mut(conv_len))
            .enumerate()
        {
            let x = &mut buf[t * d_inner..(t + 1) * d_inner];
            let taps = &w.conv[u];
            let y = sized(&mut s.conv, d_inner);
            y.fill(0.0);
            // Tap j weighs the input d_conv - 1 - j positions back, each a contiguous row of
            // the window (the oldest first).
            for (tap, past) in taps
                .chunks_exact(d_inner)
                .zip(conv_state.chunks_exact(d_inner))
            {
                y.iter_mut()
                    .zip(tap.iter().zip(past))
                    .for_each(|(y, (&w, &p))| *y += w * p);
            }
            let current = &taps[(d_conv - 1) * d_inner..];
            y.iter_mut()
                .zip(current.iter().zip(x.iter()))
                .for_each(|(y, (&w, &x))| *y += w * x);
            // The window moves on: drop the oldest input, keep this one.
            if d_conv > 1 {
                conv_state.copy_within(d_inner.., 0);
                conv_state[(d_conv - 2) * d_inner..].copy_from_slice(x);
            }
            x.iter_mut().zip(y.iter()).for_each(|(x, &y)| *x = silu(y));
        }
        // L2 norms as ggml computes them: an RMS norm with eps/Dh, then 1/sqrt(Dh).
        let l2_scale = 1.0 / (dh as f32).sqrt();
        let qk = q[t * d_inner..(t + 1) * d_inner]
            .chunks_exact_mut(dh)
            .chain(k[t * d_inner..(t + 1) * d_inner].chunks_exact_mut(dh));
        for head in qk {
            rms_normalize_in_place(head, eps / dh as f32);
            head.iter_mut().for_each(|x| *x *= l2_scale);
        }
        for (c, gc) in g[t * d_inner..(t + 1) * d_inner].iter_mut().enumerate() {
            *gc = shape.decay.log_decay(w.a[c / dh], *gc + w.dt_bias[c]);
        }
        beta[t * h..(t + 1) * h]
            .iter_mut()
            .for_each(|b| *b = sigmoid(*b));
    }

    // The recurrence, each sequence's rows in runs that end where a chunk of CHUNK positions
    // ends: a run of one row steps token by token, a longer one takes the chunked form.
    let mut start = 0;
    while start < n {
        let seq = rows[start].seq;
        let chunk_end = (rows[start].pos / CHUNK + 1) * CHUNK;
        let len = rows[start..]
            .iter()
            .take_while(|r| r.seq == seq && r.pos < chunk_end)
            .count();
        let run = Run {
            rows: start..start + len,
            d_inner,
            dh,
            n_head: h,
            scale,
        };
        let state = &mut memory.state(seq)[state_at..state_at + shape.state_values()];
        let heads = &mut state[3 * conv_len..];
        let inputs = (&*q, &*k, &*v, &*g, &*beta);
        heads
            .par_chunks_mut(dh * dh)
            .enumerate()
            .for_each(|(hd, m)| {
                // Each head writes only its own slice of every row's output.
                let o = SharedOut(o.as_ptr() as *mut f32);
                run.head(hd, m, inputs, &o);
            });
        start += len;
    }

    // Per row and head: RMS norm and the sigmoid gate.
    for (ot, gt) in o.chunks_exact_mut(d_inner).zip(gate.chunks_exact(d_inner)) {
        for (oh, gh) in ot.chunks_exact_mut(dh).zip(gt.chunks_exact(dh)) {
            rms_norm_in_place(oh, &w.o_norm, eps);
            oh.iter_mut().zip(gh).for_each(|(x, &gv)| *x *= sigmoid(gv));
        }
    }
    linear(&w.wo.view(gguf)?, o, n, out, &mut s.xq)?;
    Ok(())
}
