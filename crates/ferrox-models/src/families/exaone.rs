//! EXAONE 3.0 / 3.5 (LG AI Research): Llama's graph with NeoX-style RoPE, optional Llama-3
//! `rope_freqs`, and Q/K/V as three matrices or one fused `attn_qkv`.

use ferrox_gguf::Metadata;

use crate::decoder::{read_common, DecoderConfig};
use crate::layers::rope::RopeStyle;
use crate::ModelError;

/// `exaone`, run by the dense decoder.
pub const ARCH: super::Architecture = super::Architecture {
    name: "exaone",
    load: |gguf, options| super::dense(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<DecoderConfig, ModelError> {
    let config = read_common(meta, "exaone", RopeStyle::Neox)?;
    // llama.cpp rotates whole heads here and refuses other files.
    let layer = &config.layers[0];
    if layer.rope.n_dims != layer.head_dim_k || layer.head_dim_k != layer.head_dim_v {
        return Err(ModelError::Config(format!(
            "exaone: rope.dimension_count {} must equal the key and value head sizes {}/{}",
            layer.rope.n_dims, layer.head_dim_k, layer.head_dim_v
        )));
    }
    Ok(config)
}
