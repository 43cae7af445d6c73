//! Qwen3-VL-MoE language models (Qwen3-VL-30B-A3B, -235B-A22B): Qwen3-VL's attention,
//! interleaved M-RoPE and deepstack inputs ([`super::qwen3vl`]) with Qwen3-MoE's experts in
//! every layer ([`super::qwen3moe`]).

use ferrox_gguf::Metadata;

use crate::decoder::{DecoderConfig, FfnKind, MoeFfnConfig};
use crate::ModelError;

/// `qwen3vlmoe`, run by the dense decoder.
pub const ARCH: super::Architecture = super::Architecture {
    name: "qwen3vlmoe",
    load: |gguf, options| super::dense(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<DecoderConfig, ModelError> {
    let arch = "qwen3vlmoe";
    let mut config = super::qwen3vl::config_of(meta, arch)?;
    for layer in &mut config.layers {
        layer.ffn = FfnKind::Moe(MoeFfnConfig::from_metadata(meta, arch, layer.n_ff)?);
    }
    Ok(config)
}
