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

/// The options with the latent cache's type: it holds keys only (the values are each row's
/// first `kv_lora_rank` entries), so `-ctk` gives its type and `-ctv` has nothing to store,
/// as in llama.cpp. A quantized latent cache is read as llama.cpp's flash attention reads
/// it (the query rounded to the keys' vec-dot type, no rotation: llama.cpp rotates only
/// caches with their own values); it is built for files with split `attn_k_b`/`attn_v_b`
/// (llama.cpp keeps whole per-head keys and values for an `attn_kv_b` file) and without a
/// multi-token-prediction block (whose stored states would be quantized with it).
pub(crate) fn latent_cache_options(
    options: &EngineOptions,
    config: &MlaConfig,
) -> Result<EngineOptions, ModelError> {
    let latent = ferrox_core::KvStorage::uniform(options.kv_storage.keys);
    if !latent.is_float() {
        let refuse = |why: &str| {
            Err(ModelError::Config(format!(
                "a {} latent cache (-ctk) {why}: use f16 or f32",
                latent.name()
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
        let (width, block) = (config.cache_width(), latent.keys.block_len());
        if !width.is_multiple_of(block) {
            return refuse(&format!(
                "stores blocks of {block} values, and this model's latent rows have {width}: \
                 not whole blocks"
            ));
        }
    }
    Ok(EngineOptions {
        kv_storage: latent,
        ..options.clone()
    })
}
