//! Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention (biased Q/K/V, NeoX RoPE)
//! with a mixture-of-experts FFN in every layer: softmax routing without weight
//! normalisation, plus a shared expert scaled by `sigmoid(ffn_gate_inp_shexp · x)`.

use ferrox_gguf::Metadata;

use crate::decoder::{read_common, DecoderConfig, FfnKind, Keys, MoeFfnConfig};
use crate::layers::rope::RopeStyle;
use crate::ModelError;

/// `qwen2moe`, run by the dense decoder.
pub const ARCH: super::Architecture = super::Architecture {
    name: "qwen2moe",
    load: |gguf, options| super::dense(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<DecoderConfig, ModelError> {
    let arch = "qwen2moe";
    let mut config = read_common(meta, arch, RopeStyle::Neox)?;
    let keys = Keys { meta, arch };
    let shexp = keys
        .opt_usize("expert_shared_feed_forward_length")?
        .filter(|&n| n > 0);
    for layer in &mut config.layers {
        let mut moe = MoeFfnConfig::from_metadata(meta, arch, layer.n_ff)?;
        // llama.cpp: the shared expert is always there, `n_ff` wide unless the key says.
        moe.n_ff_shexp = Some(shexp.unwrap_or(layer.n_ff));
        moe.shexp_gate = true;
        layer.ffn = FfnKind::Moe(moe);
    }
    Ok(config)
}
