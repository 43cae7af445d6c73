//! Gemma 2: Gemma plus post-attention/post-FFN norms, attention and final logit soft
//! caps, and sliding-window attention on every other layer.

use ferrox_gguf::Metadata;

use crate::decoder::{apply_swa_pattern, read_common, DecoderConfig, Keys};
use crate::layers::activation::Activation;
use crate::layers::rope::RopeStyle;
use crate::ModelError;

/// `gemma2`, run by the dense decoder.
pub const ARCH: super::Architecture = super::Architecture {
    name: "gemma2",
    load: |gguf, options| super::dense(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<DecoderConfig, ModelError> {
    let arch = "gemma2";
    let mut config = read_common(meta, arch, RopeStyle::Neox)?;
    let keys = Keys { meta, arch };
    config.activation = Activation::Gelu;
    config.embedding_scale = Some((config.n_embd as f32).sqrt());
    config.post_norms = true;
    config.attn_softcap = Some(keys.opt_f32("attn_logit_softcapping")?.unwrap_or(50.0));
    config.final_logit_softcap = Some(keys.opt_f32("final_logit_softcapping")?.unwrap_or(30.0));
    config.query_scale = Some(super::gemma_query_scale(&config, config.n_layer() == 46));
    let window = keys.opt_usize("attention.sliding_window")?.unwrap_or(4096);
    apply_swa_pattern(&mut config, meta, window, 2)?;
    // Local layers use the same RoPE base unless the file says otherwise.
    if let Some(base) = keys.opt_f32("rope.freq_base_swa")? {
        for layer in config
            .layers
            .iter_mut()
            .filter(|l| l.sliding_window.is_some())
        {
            layer.rope.freq_base = base;
        }
    }
    Ok(config)
}
