//! The Multi-head Latent Attention block (DeepSeek-V2/V3, Mistral-4, and the layers of
//! DeepSeek Sparse Attention and Kimi models): its hyperparameters ([`config`]), tensors
//! ([`weights`]), attention in the absorbed and decompressed forms ([`attention`]), attention
//! over selected positions ([`sparse`]), and its dense-or-MoE feed-forward ([`ffn`]).

pub(crate) mod attention;
mod config;
pub(crate) mod sparse;
pub(crate) mod weights;

use ferrox_gguf::Gguf;

pub use config::{read as config_for, yarn_scales, KvB, MlaConfig, MscaleRule};
pub use weights::{MlaFfn, MlaLayer, MlaWeights, MtpBlock};

use crate::hparams::FfnKind;
use crate::ModelError;

/// The memory's first store: the latent row `[c | k_pe]` per position and layer (the
/// multi-token-prediction block's, when loaded, as one more layer).
pub(crate) const LATENT_STORE: usize = 0;

/// The form one sequence's rows take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    Absorbed,
    Decompressed,
}

/// A layer's FFN of `xn` into `out` (`n × n_embd`): dense SwiGLU, or routed experts plus the
/// shared expert.
pub(crate) fn ffn(
    gguf: &Gguf,
    weights: &MlaFfn,
    kind: &FfnKind,
    xn: &[f32],
    out: &mut [f32],
    router_logits: &mut Vec<f32>,
    moe: &mut ferrox_moe::MoeScratch,
) -> Result<(), ModelError> {
    match (weights, kind) {
        (MlaFfn::Dense(dense), _) => {
            out.fill(0.0);
            dense
                .view(gguf)?
                .forward_add(xn, out, moe)
                .map_err(crate::hparams::moe_error)
        }
        (MlaFfn::Moe(mw), FfnKind::Moe(mc)) => {
            mw.forward(gguf, &mc.router, xn, out, router_logits, moe)
        }
        (MlaFfn::Moe(_), FfnKind::Dense) => {
            Err(ModelError::Config("MoE weights on a dense layer".into()))
        }
    }
}
