//! Qwen3: per-head RMSNorm of queries and keys, NeoX RoPE, no biases.

use ferrox_gguf::Metadata;

use crate::decoder::{read_common, DecoderConfig};
use crate::layers::rope::RopeStyle;
use crate::ModelError;

/// `qwen3`, run by the dense decoder.
pub const ARCH: super::Architecture = super::Architecture {
    name: "qwen3",
    load: |gguf, options| super::dense(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<DecoderConfig, ModelError> {
    let mut config = read_common(meta, "qwen3", RopeStyle::Neox)?;
    config.qk_norm = true;
    // Qwen3-Reranker files: the yes/no rows of the head, compared by a softmax.
    config.rank_softmax = true;
    Ok(config)
}
