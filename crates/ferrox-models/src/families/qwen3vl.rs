//! Qwen3-VL language models: Qwen3 (per-head Q/K RMSNorm) with interleaved multimodal RoPE:
//! for text, NeoX RoPE with the pairs of the fourth position held still (see
//! [`super::qwen2vl`]; with Qwen3-VL's sections [24, 20, 20, 0], pairs 61 and 62). The
//! "deepstack" inputs that image rows add to the first layers' outputs are zero for text
//! tokens. Images need the Qwen3-VL projector, which is not built.

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
    let mut config = read_common(meta, "qwen3vl", RopeStyle::Neox)?;
    config.qk_norm = true;
    config.deepstack_layers = meta.opt_usize("qwen3vl.n_deepstack_layers")?.unwrap_or(0);
    if config.deepstack_layers > config.layers.len() {
        return Err(ModelError::Config(format!(
            "`qwen3vl.n_deepstack_layers` = {} with {} layers",
            config.deepstack_layers,
            config.layers.len()
        )));
    }
    super::qwen2vl::text_mrope(meta, "qwen3vl", &mut config, true)?;
    Ok(config)
}
