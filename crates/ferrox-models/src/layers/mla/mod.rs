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

use crate::engine::EngineOptions;
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

/// The options with the latent cache's type ([`crate::scaffold::keys_only_cache`]: the
/// values are each row's first `kv_lora_rank` entries), for the latent rows and `more_rows`
/// (a sparse-attention engine's indexer keys, kept in the same type). A quantized latent cache
/// is read as llama.cpp's flash attention reads it (the query rounded to the keys' vec-dot
/// type, no rotation: llama.cpp rotates only caches with their own values); it is built for
/// files with split `attn_k_b`/`attn_v_b` (llama.cpp keeps whole per-head keys and values for
/// an `attn_kv_b` file) and without a multi-token-prediction block (whose stored states would
/// be quantized with it).
pub(crate) fn latent_cache_options(
    options: &EngineOptions,
    config: &MlaConfig,
    more_rows: &[(&str, usize)],
) -> Result<EngineOptions, ModelError> {
    let ty = options.kv_storage.keys;
    if !ferrox_core::KvStorage::uniform(ty).is_float() {
        let refuse = |why: &str| {
            Err(ModelError::Config(format!(
                "a {} latent cache (-ctk) {why}: use f16 or f32",
                ty.name()
            )))
        };
        if config.kv_b != KvB::Split {
            return refuse(
                "is built for files with split attn_k_b/attn_v_b; this one has attn_kv_b",
            );
        }
        if options.mtp {
            return refuse("is not built with the multi-token-prediction block");
        }
    }
    let latent = [("latent rows", config.cache_width())];
    let rows: Vec<(&str, usize)> = latent.iter().chain(more_rows).copied().collect();
    crate::scaffold::keys_only_cache(options, &rows)
}
