//! Qwen3-MoE: Qwen3's attention (per-head Q/K RMSNorm, NeoX RoPE) with a mixture-of-experts
//! FFN in every layer (softmax routing, selected weights renormalised, no shared expert).

use ferrox_gguf::Metadata;

use crate::decoder::{read_common, DecoderConfig, FfnKind, MoeFfnConfig};
use crate::layers::rope::RopeStyle;
use crate::ModelError;

/// `qwen3moe`, run by the dense decoder.
pub const ARCH: super::Architecture = super::Architecture {
    name: "qwen3moe",
    load: |gguf, options| super::dense(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<DecoderConfig, ModelError> {
    let arch = "qwen3moe";
    let mut config = read_common(meta, arch, RopeStyle::Neox)?;
    config.qk_norm = true;
    for layer in &mut config.layers {
        layer.ffn = FfnKind::Moe(MoeFfnConfig::from_metadata(meta, arch, layer.n_ff)?);
    }
    Ok(config)
}
