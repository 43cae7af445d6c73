//! Qwen3-VL language models: Qwen3 (per-head Q/K RMSNorm) with interleaved multimodal RoPE:
//! for text, NeoX RoPE with the pairs of the fourth position held still (see
//! [`super::qwen2vl`]; with Qwen3-VL's sections [24, 20, 20, 0], pairs 61 and 62). The
//! "deepstack" inputs that image rows add to the first layers' outputs are zero for text
//! tokens.

use ferrox_gguf::Metadata;

use crate::decoder::{read_common, DecoderConfig};
use crate::layers::rope::RopeStyle;
use crate::ModelError;

/// `qwen3vl`, run by the dense decoder.
pub const ARCH: super::Architecture = super::Architecture {
    name: "qwen3vl",
    load: |gguf, options| super::dense(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<DecoderConfig, ModelError> {
    config_of(meta, "qwen3vl")
}

/// Qwen3-VL's attention, M-RoPE and deepstack under `arch`'s keys (the MoE variant's too).
pub fn config_of(meta: &Metadata<'_>, arch: &str) -> Result<DecoderConfig, ModelError> {
    let mut config = read_common(meta, arch, RopeStyle::Neox)?;
    config.qk_norm = true;
    config.deepstack_layers = meta
        .opt_usize(&format!("{arch}.n_deepstack_layers"))?
        .unwrap_or(0);
    if config.deepstack_layers > config.layers.len() {
        return Err(ModelError::Config(format!(
            "`{arch}.n_deepstack_layers` = {} with {} layers",
            config.deepstack_layers,
            config.layers.len()
        )));
    }
    super::qwen2vl::text_mrope(meta, arch, &mut config, true)?;
    Ok(config)
}
