//! Qwen2 / Qwen2.5: llama-style with biased Q/K/V projections and NeoX RoPE.

use ferrox_gguf::Metadata;

use crate::decoder::{read_common, DecoderConfig};
use crate::layers::rope::RopeStyle;
use crate::ModelError;

/// `qwen2`, run by the dense decoder.
pub const ARCH: super::Architecture = super::Architecture {
    name: "qwen2",
    load: |gguf, options| super::dense(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<DecoderConfig, ModelError> {
    // The biases are found by tensor name when the weights load.
    read_common(meta, "qwen2", RopeStyle::Neox)
}
