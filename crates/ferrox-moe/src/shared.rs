//! The shared expert: a plain gated FFN every token goes through beside the routed experts.
//!
//! Alone ([`SharedExpert::forward_add`]) it is two passes over the thread pool (gate and up
//! together, then down). Attached to the routed experts ([`crate::MoeExperts::with_shared`])
//! its products ride in the routed experts' own two passes when a step's experts fit one
//! chunk (a decode step, a small batch), so the layer enters the pool no more often than
//! without it. Either way every output is the one the product alone gives.

use ferrox_core::{MatrixProduct, WeightMatrix};

use crate::experts::{router_logits_with, Activation};
use crate::{numerics, MoeError};

/// Qwen2-MoE's shared-expert gate for one token: `silu(l) / l` (ggml computes the sigmoid
/// that way), where `l = ffn_gate_inp_shexp · x`. NaN when `l == 0`, as in llama.cpp.
pub fn shared_expert_gate(logit: f32) -> f32 {
    numerics::silu(logit) / logit
}

/// A shared expert: `ffn_{gate,up,down}_shexp`, optionally scaled per token by
/// [`shared_expert_gate`] of `ffn_gate_inp_shexp · x` (Qwen2-MoE). DeepSeek-style models
/// have no gate.
#[derive(Clone, Copy, Debug)]
pub struct SharedExpert<'a> {
    pub gate: WeightMatrix<'a>,
    pub up: WeightMatrix<'a>,
    pub down: WeightMatrix<'a>,
    pub activation: Activation,
    /// `ffn_gate_inp_shexp`: one row of `n_embd`.
    pub gate_inp: Option<WeightMatrix<'a>>,
}

/// The shared expert's buffers, reused between calls.
#[derive(Default, Debug)]
pub(crate) struct SharedScratch {
    xq_gate: Vec<u8>,
    xq_up: Vec<u8>,
    /// Whether up reads the gate's quantized activations (same vec-dot type).
    up_reads_gate_xq: bool,
    n_tokens: usize,
    g: Vec<f32>,
    u: Vec<f32>,
    hq: Vec<u8>,
    y: Vec<f32>,
    gate_xq: Vec<u8>,
    gates: Vec<f32>,
}

impl<'a> SharedExpert<'a> {
    /// Checks the projections' shapes against each other and `x` / `out`.
    pub(crate) fn check(&self, x: &[f32], out: &[f32]) -> Result<(), MoeError> {
        let n_embd = self.gate.cols();
        if self.up.cols() != n_embd
            || self.up.rows() != self.gate.rows()
            || self.down.cols() != self.gate.rows()
            || self.down.rows() != n_embd
            || self
                .gate_inp
                .is_some_and(|g| g.rows() != 1 || g.cols() != n_embd)
            || out.len() != x.len()
        {
            return Err(MoeError::Shape("shared expert shapes disagree".into()));
        }
        Ok(())
    }

    /// Quantizes `x` for gate and up and sizes their outputs.
    pub(crate) fn prepare(&self, x: &[f32], s: &mut SharedScratch) -> Result<(), MoeError> {
        s.n_tokens = self.gate.quantize_activation(x, &mut s.xq_gate)?;
        s.up_reads_gate_xq = self.up.vec_dot_type() == self.gate.vec_dot_type();
        if !s.up_reads_gate_xq {
            self.up.quantize_activation(x, &mut s.xq_up)?;
        }
        let len = s.n_tokens * self.gate.rows();
        for buf in [&mut s.g, &mut s.u] {
            buf.clear();
            buf.resize(len, 0.0);
        }
        Ok(())
    }

    /// The gate and up products (after [`Self::prepare`]).
    pub(crate) fn gate_up<'p>(&'p self, s: &'p mut SharedScratch) -> [MatrixProduct<'p, 'a>; 2] {
        let xu: &[u8] = if s.up_reads_gate_xq {
            &s.xq_gate
        } else {
            &s.xq_up
        };
        [
            MatrixProduct {
                matrix: &self.gate,
                xq: &s.xq_gate,
                n_tokens: s.n_tokens,
                out: &mut s.g,
            },
            MatrixProduct {
                matrix: &self.up,
                xq: xu,
                n_tokens: s.n_tokens,
                out: &mut s.u,
            },
        ]
    }

    /// The activation of gate and up, quantized for down, and down's output sized.
    pub(crate) fn activate(&self, s: &mut SharedScratch) -> Result<(), MoeError> {
        let n_ff = self.gate.rows();
        if n_ff > 0 {
            for (g, u) in s.g.chunks_exact_mut(n_ff).zip(s.u.chunks_exact(n_ff)) {
                self.activation.apply(g, u);
            }
        }
        self.down.quantize_activation(&s.g, &mut s.hq)?;
        s.y.clear();
        s.y.resize(s.n_tokens * self.down.rows(), 0.0);
        Ok(())
    }

    /// The down product (after [`Self::activate`]).
    pub(crate) fn down<'p>(&'p self, s: &'p mut SharedScratch) -> MatrixProduct<'p, 'a> {
        MatrixProduct {
            matrix: &self.down,
            xq: &s.hq,
            n_tokens: s.n_tokens,
            out: &mut s.y,
        }
    }

    /// `out[t] += g_t · y[t]` (`g_t = 1` without a gate), the order of llama.cpp's
    /// `moe_out + ffn_shexp_out`.
    pub(crate) fn add_output(
        &self,
        x: &[f32],
        out: &mut [f32],
        s: &mut SharedScratch,
    ) -> Result<(), MoeError> {
        let n_embd = self.gate.cols();
        s.gates.clear();
        if let Some(gi) = &self.gate_inp {
            router_logits_with(gi, x, &mut s.gates, &mut s.gate_xq)?;
            s.gates.iter_mut().for_each(|l| *l = shared_expert_gate(*l));
        }
        for (t, (o, y)) in out
            .chunks_exact_mut(n_embd)
            .zip(s.y.chunks_exact(n_embd))
            .enumerate()
        {
            match s.gates.get(t) {
                Some(&g) => o.iter_mut().zip(y).for_each(|(a, &b)| *a += b * g),
                None => o.iter_mut().zip(y).for_each(|(a, &b)| *a += b),
            }
        }
        Ok(())
    }

    /// The whole shared FFN in its own two passes over the pool (output left in `s.y`).
    pub(crate) fn run_alone(&self, s: &mut SharedScratch) -> Result<(), MoeError> {
        WeightMatrix::matmul_products(&mut self.gate_up(s))?;
        self.activate(s)?;
        WeightMatrix::matmul_products(&mut [self.down(s)])?;
        Ok(())
    }

    /// `out[t] += g_t · shared_ffn(x[t])` for every token.
    pub fn forward_add(
        &self,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut crate::MoeScratch,
    ) -> Result<(), MoeError> {
        self.check(x, out)?;
        let s = &mut scratch.shared;
        self.prepare(x, s)?;
        self.run_alone(s)?;
        self.add_output(x, out, s)
    }
}
