//! Gemma (1): GeGLU, embeddings scaled by sqrt(n_embd), queries pre-scaled.

use ferrox_gguf::Metadata;

use crate::decoder::{read_common, DecoderConfig};
use crate::layers::activation::Activation;
use crate::layers::rope::RopeStyle;
use crate::ModelError;

/// `gemma`, run by the dense decoder.
pub const ARCH: super::Architecture = super::Architecture {
    name: "gemma",
    load: |gguf, options| super::dense(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<DecoderConfig, ModelError> {
    let mut config = read_common(meta, "gemma", RopeStyle::Neox)?;
    config.activation = Activation::Gelu;
    config.embedding_scale = Some((config.n_embd as f32).sqrt());
    config.query_scale = Some(super::gemma_query_scale(&config, false));
    Ok(config)
}
