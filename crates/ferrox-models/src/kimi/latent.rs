//! Kimi-K3's feed-forward blocks: every gated unit is SiTU ([`Situ`]); the leading dense
//! layers are one gated FFN; the MoE layers route on the full-width input but run their
//! experts in a latent space (`ffn_routed_down` into it, an optional RMS norm and
//! `ffn_routed_up` out of it), the shared expert staying at full width.

use crate::plan::Packing;
use ferrox_gguf::Gguf;
use ferrox_moe::{MoeExperts, MoeScratch};

use super::config::Situ;
use crate::hparams::{moe_error, FfnKind, MoeFfnConfig};
use crate::layers::linear::linear;
use crate::layers::mla::MlaFfn;
use crate::layers::norm::rms_norm_in_place;
use crate::names::{Tensor, *};
use crate::scaffold::sized;
use crate::tensors::{Loader, MatrixRef, MoeWeights, SharedExpertWeights};
use crate::ModelError;

const LATENT: &[&str] = &["expert_latent_length"];
pub const FFN_ROUTED_DOWN: Tensor = Tensor {
    base: "ffn_routed_down",
    sized_by: LATENT,
};
pub const FFN_ROUTED_UP: Tensor = Tensor {
    base: "ffn_routed_up",
    sized_by: LATENT,
};
pub const FFN_ROUTED_NORM: Tensor = Tensor {
    base: "ffn_routed_norm",
    sized_by: LATENT,
};

/// The projections into and out of the experts' latent space.
#[derive(Clone, Debug)]
pub struct LatentProjection {
    pub down: MatrixRef,
    /// Applied to the experts' weighted sum before `up`.
    pub norm: Option<Vec<f32>>,
    pub up: MatrixRef,
}

impl LatentProjection {
    pub fn pack(&mut self, gguf: &Packing<'_>) -> Result<(), ModelError> {
        self.down.pack(gguf)?;
        self.up.pack(gguf)
    }

    pub fn n_bytes(&self) -> u64 {
        self.down.n_bytes() + self.up.n_bytes()
    }
}

/// Layer `il`'s FFN: a dense gated FFN for the leading layers, else routed experts of
/// `latent` inputs (the model width without a latent space), their projections and the
/// shared expert.
pub fn load(
    l: &Loader<'_>,
    n_embd: usize,
    n_ff: usize,
    kind: &FfnKind,
    latent: Option<usize>,
    il: usize,
) -> Result<(MlaFfn, Option<LatentProjection>), ModelError> {
    let mc = match kind {
        FfnKind::Dense => {
            let dense = SharedExpertWeights {
                gate: l.matrix(&FFN_GATE.layer(il), n_embd, n_ff)?,
                up: l.matrix(&FFN_UP.layer(il), n_embd, n_ff)?,
                down: l.matrix(&FFN_DOWN.layer(il), n_ff, n_embd)?,
                gate_inp: None,
            };
            return Ok((MlaFfn::Dense(dense), None));
        }
        FfnKind::Moe(mc) => mc,
    };
    let width = latent.unwrap_or(n_embd);
    let projection = match latent {
        None => None,
        Some(lat) => Some(LatentProjection {
            down: l.matrix(&FFN_ROUTED_DOWN.layer(il), n_embd, lat)?,
            norm: l.opt_vector(&FFN_ROUTED_NORM.layer(il), lat)?,
            up: l.matrix(&FFN_ROUTED_UP.layer(il), lat, n_embd)?,
        }),
    };
    Ok((MlaFfn::Moe(load_moe(l, n_embd, width, mc, il)?), projection))
}

/// The router and shared expert at `n_embd`, the experts at `width`.
fn load_moe(
    l: &Loader<'_>,
    n_embd: usize,
    width: usize,
    mc: &MoeFfnConfig,
    il: usize,
) -> Result<MoeWeights, ModelError> {
    let (n_expert, n_ff) = (mc.router.n_expert, mc.n_ff_exp);
    let shared = match mc.n_ff_shexp {
        None => None,
        Some(n_sh) => Some(SharedExpertWeights {
            gate: l.matrix(&FFN_GATE_SHEXP.layer(il), n_embd, n_sh)?,
            up: l.matrix(&FFN_UP_SHEXP.layer(il), n_embd, n_sh)?,
            down: l.matrix(&FFN_DOWN_SHEXP.layer(il), n_sh, n_embd)?,
            gate_inp: None,
        }),
    };
    Ok(MoeWeights {
        gate_inp: l.matrix(&FFN_GATE_INP.layer(il), n_embd, n_expert)?,
        gate_exps: l.experts(&FFN_GATE_EXPS.layer(il), width, n_ff, n_expert)?,
        up_exps: l.experts(&FFN_UP_EXPS.layer(il), width, n_ff, n_expert)?,
        down_exps: l.experts(&FFN_DOWN_EXPS.layer(il), n_ff, width, n_expert)?,
        // Required, as llama.cpp requires it.
        selection_bias: Some(l.vector(&FFN_EXP_PROBS_B.layer_bias(il), n_expert)?),
        shared,
        streamed: None,
        lookahead: None,
    })
}

/// Buffers of the K3 FFN, reused across layers and steps.
#[derive(Default)]
pub struct LatentScratch {
    routed_in: Vec<f32>,
    routed_out: Vec<f32>,
    router_logits: Vec<f32>,
    xq: Vec<u8>,
    pub moe: MoeScratch,
}

/// The FFN of `xn` (`n × n_embd` normalized rows) into `out`; `eps` is the routed norm's.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    gguf: &Gguf,
    ffn: &MlaFfn,
    kind: &FfnKind,
    latent: Option<&LatentProjection>,
    situ: Situ,
    eps: f32,
    xn: &[f32],
    out: &mut [f32],
    s: &mut LatentScratch,
) -> Result<(), ModelError> {
    match (ffn, kind) {
        (MlaFfn::Dense(dense), _) => {
            out.fill(0.0);
            let dense = ferrox_moe::SharedExpert {
                activation: situ.activation(),
                ..dense.view(gguf)?
            };
            dense.forward_add(xn, out, &mut s.moe).map_err(moe_error)
        }
        (MlaFfn::Moe(m), FfnKind::Moe(mc)) => moe(gguf, m, mc, latent, (situ, eps), xn, out, s),
        (MlaFfn::Moe(_), FfnKind::Dense) => {
            Err(ModelError::Config("MoE weights on a dense layer".into()))
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn moe(
    gguf: &Gguf,
    m: &MoeWeights,
    mc: &MoeFfnConfig,
    latent: Option<&LatentProjection>,
    (situ, eps): (Situ, f32),
    xn: &[f32],
    out: &mut [f32],
    s: &mut LatentScratch,
) -> Result<(), ModelError> {
    let experts = MoeExperts::new(
        m.gate_exps.view(gguf)?,
        m.up_exps.view(gguf)?,
        m.down_exps.view(gguf)?,
        situ.activation(),
    )
    .map_err(moe_error)?;
    // The router reads the full-width input, the experts the latent one.
    s.moe
        .router_logits(&m.gate_inp.view(gguf)?, xn, &mut s.router_logits)
        .map_err(moe_error)?;
    match latent {
        None => ferrox_moe::moe_ffn(
            &mc.router,
            &experts,
            xn,
            &s.router_logits,
            m.selection_bias.as_deref(),
            out,
            &mut s.moe,
        )
        .map_err(moe_error)?,
        Some(p) => {
            let down = p.down.view(gguf)?;
            let (width, n_rows) = (down.rows(), xn.len() / down.cols());
            let routed_in = sized(&mut s.routed_in, n_rows * width);
            linear(&down, xn, n_rows, routed_in, &mut s.xq)?;
            let routed_out = sized(&mut s.routed_out, n_rows * width);
            ferrox_moe::moe_ffn(
                &mc.router,
                &experts,
                routed_in,
                &s.router_logits,
                m.selection_bias.as_deref(),
                routed_out,
                &mut s.moe,
            )
            .map_err(moe_error)?;
            if let Some(norm) = &p.norm {
                for row in routed_out.chunks_exact_mut(width) {
                    rms_norm_in_place(row, norm, eps);
                }
            }
            linear(&p.up.view(gguf)?, routed_out, n_rows, out, &mut s.xq)?;
        }
    }
    if let Some(shared) = m.shared_expert(gguf)? {
        let shared = ferrox_moe::SharedExpert {
            activation: situ.activation(),
            ..shared
        };
        shared.forward_add(xn, out, &mut s.moe).map_err(moe_error)?;
    }
    Ok(())
}
