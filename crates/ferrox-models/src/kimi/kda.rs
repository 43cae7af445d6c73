//! Kimi Delta Attention: one KDA layer over a micro-batch of rows, token by token.
//!
//! Per token: the projected q, k, v each go through a depthwise causal convolution (its state:
//! the last `d_conv - 1` projected inputs) and SiLU; q and k are L2-normalised per head; a
//! per-channel log-decay ([`Decay`]: `A · softplus(f_b(f_a(x)) + dt_bias)`, or Kimi-K3's
//! lower-bound form) and a per-head `β = sigmoid(W_β x)` drive the delta rule on an f32
//! `Dh × Dh` state per head (decay along the key axis, as ggml's fused `gated_delta_net` op
//! computes it); the output is RMS-normalised per head and gated by the sigmoid of
//! [`OutputGate`] (low rank in Kimi Linear, full rank in Kimi-K3).

use ferrox_core::StepMemory;
use ferrox_gguf::Gguf;
use rayon::prelude::*;

use crate::engine::EngineError;
use crate::layers::attention::MAX_HEAD_DIM;
use crate::layers::linear::{linear, linear_many};
use crate::layers::norm::{rms_norm_in_place, rms_normalize_in_place};
use crate::step::{sized, Row};
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
    /// Per channel, `d_conv` taps, the last for the current token.
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
    pub fn pack(&mut self, gguf: &Gguf) -> Result<(), crate::ModelError> {
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
    xq: Vec<u8>,
}

/// Positions per chunk of the chunked recurrence (llama.cpp's KDA chunk size).
const CHUNK: usize = 16;

/// Rows' inputs to the recurrence: q, k, v (`d_inner` per row), log-decays (`d_inner`),
/// betas (`n_head`).
type Inputs<'a> = (&'a [f32], &'a [f32], &'a [f32], &'a [f32], &'a [f32]);

/// The output buffer, written by the heads of a run in parallel, each into its own columns.
struct SharedOut(*mut f32);

// SAFETY: the heads of a run write disjoint `Dh`-wide column slices of the output rows.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// Row `t`'s slice for head `hd`.
    ///
    /// # Safety
    /// No two callers may hold the same (row, head) slice at once.
    #[allow(clippy::mut_from_ref)]
    unsafe fn head(&self, t: usize, hd: usize, d_inner: usize, dh: usize) -> &mut [f32] {
        // SAFETY: the caller's promise; the offsets stay inside the `n × d_inner` buffer the
        // pointer was taken from.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(t * d_inner + hd * dh), dh) }
    }
}

/// One run of a sequence's rows through the recurrence.
struct Run {
    rows: std::ops::Range<usize>,
    d_inner: usize,
    dh: usize,
    scale: f32,
}

impl Run {
    /// Token by token, as ggml's fused `gated_delta_net` op: decay, delta rule, output.
    fn token(&self, hd: usize, h: usize, m: &mut [f32], x: Inputs<'_>, o: &SharedOut) {
        let (q, k, v, g, beta) = x;
        let (dh, d_inner) = (self.dh, self.d_inner);
        let mut decay = [0f32; MAX_HEAD_DIM];
        let mut delta = [0f32; MAX_HEAD_DIM];
        let (decay, delta) = (&mut decay[..dh], &mut delta[..dh]);
        for t in self.rows.clone() {
            let at = t * d_inner + hd * dh;
            let (qh, kh, vh) = (&q[at..at + dh], &k[at..at + dh], &v[at..at + dh]);
            let b = beta[t * h + hd];
            decay
                .iter_mut()
                .zip(&g[at..at + dh])
                .for_each(|(d, &gi)| *d = gi.exp());
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
            // SAFETY: this head's slice of row t, written by this task only.
            let oh = unsafe { o.head(t, hd, d_inner, dh) };
            for (j, oj) in oh.iter_mut().enumerate() {
                *oj = dot(&m[j * dh..(j + 1) * dh], qh) * self.scale;
            }
        }
    }

    /// The chunked form: with the cumulative log-decays G_t from the run's start and the
    /// state S0 there, the pseudo-values u_t solve
    /// `u_t = β_t (v_t − S0ᵀ(e^{G_t}⊙k_t)) − Σ_{s<t} β_t (k_t·(e^{G_t−G_s}⊙k_s)) u_s`,
    /// the outputs are `o_t = S0ᵀ(e^{G_t}⊙q_t) + Σ_{s≤t} (k_s·(e^{G_t−G_s}⊙q_t)) u_s` and the
    /// state becomes `e^{G_C}⊙S0 + Σ_s (e^{G_C−G_s}⊙k_s) u_sᵀ`: the token-by-token
    /// recurrence unrolled over the run.
    fn chunked(&self, hd: usize, h: usize, m: &mut [f32], x: Inputs<'_>, o: &SharedOut) {
        CHUNK_SCRATCH.with_borrow_mut(|buf| self.chunked_in(hd, h, m, x, o, buf));
    }

    fn chunked_in(
        &self,
        hd: usize,
        h: usize,
        m: &mut [f32],
        x: Inputs<'_>,
        o: &SharedOut,
        buf: &mut Vec<f32>,
    ) {
        let (q, k, v, g, beta) = x;
        let (dh, d_inner) = (self.dh, self.d_inner);
        let c = self.rows.len();
        let t0 = self.rows.start;
        // Row t's slice for this head.
        let head = |t: usize| (t0 + t) * d_inner + hd * dh..(t0 + t) * d_inner + (hd + 1) * dh;
        // Per position of the run (Dh each): cumulative log-decays, pseudo-values, and a
        // key or query decayed from the run's start.
        let (cum, rest) = sized(buf, 3 * c * dh).split_at_mut(c * dh);
        let (u, tmp) = rest.split_at_mut(c * dh);
        let tmp = &mut tmp[..dh];
        for t in 0..c {
            let gt = &g[head(t)];
            for i in 0..dh {
                let before = if t > 0 { cum[(t - 1) * dh + i] } else { 0.0 };
                cum[t * dh + i] = gt[i] + before;
            }
        }
        // For s <= t, with e = e^{G_t - G_s} per channel: a[t][s] = β_t k_t·(e⊙k_s) (s < t)
        // and w[t][s] = k_s·(e⊙q_t), each decay computed once for both.
        let (mut a, mut w) = ([[0f32; CHUNK]; CHUNK], [[0f32; CHUNK]; CHUNK]);
        for t in 0..c {
            let (kt, qt) = (&k[head(t)], &q[head(t)]);
            let b = beta[(t0 + t) * h + hd];
            for s in 0..=t {
                let ks = &k[head(s)];
                let (mut kk, mut kq) = (0.0f32, 0.0f32);
                for i in 0..dh {
                    let e = (cum[t * dh + i] - cum[s * dh + i]).exp();
                    kk += kt[i] * ks[i] * e;
                    kq += ks[i] * qt[i] * e;
                }
                a[t][s] = kk * b;
                w[t][s] = kq;
            }
        }
        for t in 0..c {
            let (kt, vt) = (&k[head(t)], &v[head(t)]);
            let b = beta[(t0 + t) * h + hd];
            for i in 0..dh {
                tmp[i] = cum[t * dh + i].exp() * kt[i];
            }
            let (done, ut) = u.split_at_mut(t * dh);
            let ut = &mut ut[..dh];
            for (j, uj) in ut.iter_mut().enumerate() {
                *uj = b * (vt[j] - dot(&m[j * dh..(j + 1) * dh], tmp));
            }
            for s in 0..t {
                let us = &done[s * dh..(s + 1) * dh];
                ut.iter_mut().zip(us).for_each(|(x, &y)| *x -= a[t][s] * y);
            }
        }
        for t in 0..c {
            let qt = &q[head(t)];
            for i in 0..dh {
                tmp[i] = cum[t * dh + i].exp() * qt[i];
            }
            // SAFETY: this head's slice of the run's row t, written by this task only.
            let oh = unsafe { o.head(t0 + t, hd, d_inner, dh) };
            for (j, oj) in oh.iter_mut().enumerate() {
                *oj = dot(&m[j * dh..(j + 1) * dh], tmp);
            }
            for s in 0..=t {
                let us = &u[s * dh..(s + 1) * dh];
                oh.iter_mut().zip(us).for_each(|(x, &y)| *x += w[t][s] * y);
            }
            oh.iter_mut().for_each(|x| *x *= self.scale);
        }
        // The new state; each key decayed to the run's end once (kept in `cum`, whose values
        // are no longer needed once read).
        for i in 0..dh {
            let end = cum[(c - 1) * dh + i];
            tmp[i] = end.exp();
            for s in 0..c {
                cum[s * dh + i] = (end - cum[s * dh + i]).exp() * k[head(s)][i];
            }
        }
        for (j, row) in m.chunks_exact_mut(dh).enumerate() {
            for i in 0..dh {
                let mut x = tmp[i] * row[i];
                for s in 0..c {
                    x += cum[s * dh + i] * u[s * dh + j];
                }
                row[i] = x;
            }
        }
    }
}

thread_local! {
    /// Each worker's buffers for the chunked form (sized for the largest run once).
    static CHUNK_SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
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
                if len == 1 {
                    run.token(hd, h, m, inputs, &o);
                } else {
                    run.chunked(hd, h, m, inputs, &o);
                }
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
