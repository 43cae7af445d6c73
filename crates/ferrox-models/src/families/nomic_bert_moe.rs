//! Nomic's mixture-of-experts BERT (`nomic-bert-moe`: nomic-embed-text-v2-moe): nomic-bert's
//! attention, GELU FFNs with biases, and every `moe_every_n_layers`-th layer (from layer 1)
//! routed ungated GELU experts (softmax routing); run by the encoder.

use ferrox_gguf::Metadata;

use crate::encoder::{read_encoder, EncoderConfig, EncoderFfn, EncoderMoe, PositionKind};
use crate::hparams::{moe_error, Keys};
use crate::ModelError;

/// `nomic-bert-moe`, run by the encoder.
pub const ARCH: super::Architecture = super::Architecture {
    name: "nomic-bert-moe",
    load: |gguf, options| super::encoder(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<EncoderConfig, ModelError> {
    let arch = "nomic-bert-moe";
    let mut config = read_encoder(meta, arch, PositionKind::Rotary, EncoderFfn::Gelu)?;
    let k = Keys { meta, arch };
    let every_n = k
        .opt_count("moe_every_n_layers", Keys::MAX_LAYERS)?
        .unwrap_or(0);
    if every_n > 0 {
        let router = ferrox_moe::RouterConfig::from_metadata(meta, arch).map_err(moe_error)?;
        router.validate().map_err(moe_error)?;
        config.moe = Some(EncoderMoe { router, every_n });
    }
    Ok(config)
}
