//! OLMoE: RMSNorm of the whole query and key projections (one weight of `n_embd` values
//! each, before the heads are split and RoPE'd), NeoX RoPE, and a mixture-of-experts FFN in
//! every layer (softmax routing without weight normalisation, no shared expert), each expert
//! `feed_forward_length` wide.

use ferrox_gguf::Metadata;

use crate::decoder::{read_common, DecoderConfig, FfnKind, MoeFfnConfig};
use crate::layers::rope::RopeStyle;
use crate::ModelError;

/// `olmoe`, run by the dense decoder.
pub const ARCH: super::Architecture = super::Architecture {
    name: "olmoe",
    load: |gguf, options| super::dense(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<DecoderConfig, ModelError> {
    let arch = "olmoe";
    let mut config = read_common(meta, arch, RopeStyle::Neox)?;
    config.qk_norm = true;
    config.qk_norm_whole = true;
    for layer in &mut config.layers {
        let mut moe = MoeFfnConfig::from_metadata(meta, arch, layer.n_ff)?;
        // llama.cpp sizes OLMoE's experts by `feed_forward_length` alone.
        moe.n_ff_exp = layer.n_ff;
        layer.ffn = FfnKind::Moe(moe);
    }
    Ok(config)
}
