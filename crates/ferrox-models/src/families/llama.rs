//! Llama 2/3, Mistral, TinyLlama, SmolLM: RMSNorm, SwiGLU, normal-style RoPE.

use ferrox_gguf::Metadata;

use crate::decoder::{read_common, DecoderConfig};
use crate::layers::rope::RopeStyle;
use crate::ModelError;

/// `llama`, run by the dense decoder.
pub const ARCH: super::Architecture = super::Architecture {
    name: "llama",
    load: |gguf, options| super::dense(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<DecoderConfig, ModelError> {
    let config = read_common(meta, "llama", RopeStyle::Normal)?;
    let layer = &config.layers[0];
    if layer.rope.n_dims != layer.head_dim_k {
        return Err(ModelError::Config(format!(
            "llama: rope.dimension_count {} must equal the head size {}",
            layer.rope.n_dims, layer.head_dim_k
        )));
    }
    Ok(config)
}
