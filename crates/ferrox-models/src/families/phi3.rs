//! Phi-3: fused QKV and fused gate/up projections, NeoX RoPE, queries pre-scaled.

use ferrox_gguf::Metadata;

use crate::decoder::{read_common, DecoderConfig};
use crate::layers::rope::RopeStyle;
use crate::ModelError;

/// `phi3`, run by the dense decoder.
pub const ARCH: super::Architecture = super::Architecture {
    name: "phi3",
    load: |gguf, options| super::dense(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<DecoderConfig, ModelError> {
    let mut config = read_common(meta, "phi3", RopeStyle::Neox)?;
    // llama.cpp disables Phi's sliding window (its converters record it inconsistently).
    config.query_scale = Some(1.0 / (config.layers[0].head_dim_k as f32).sqrt());
    Ok(config)
}
