//! Gemma 3: Gemma 2's layout with per-head Q/K norms instead of soft caps, five local
//! (sliding-window) layers per global one, and a separate RoPE base (10k) for local layers.

use ferrox_gguf::Metadata;

use crate::decoder::{apply_swa_pattern, read_common, DecoderConfig, Keys};
use crate::layers::activation::Activation;
use crate::layers::rope::RopeStyle;
use crate::ModelError;

/// `gemma3`, run by the dense decoder.
pub const ARCH: super::Architecture = super::Architecture {
    name: "gemma3",
    load: |gguf, options| super::dense(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<DecoderConfig, ModelError> {
    let arch = "gemma3";
    let mut config = read_common(meta, arch, RopeStyle::Neox)?;
    let keys = Keys { meta, arch };
    config.activation = Activation::Gelu;
    config.embedding_scale = Some((config.n_embd as f32).sqrt());
    config.post_norms = true;
    config.qk_norm = true;
    config.final_logit_softcap = keys
        .opt_f32("final_logit_softcapping")?
        .filter(|&c| c != 0.0);
    config.query_scale = Some(super::gemma_query_scale(&config, config.n_layer() == 62));
    if let Some(window) = keys
        .opt_usize("attention.sliding_window")?
        .filter(|&w| w > 0)
    {
        apply_swa_pattern(&mut config, meta, window, 6)?;
        let base = keys.opt_f32("rope.freq_base_swa")?.unwrap_or(10000.0);
        for layer in config
            .layers
            .iter_mut()
            .filter(|l| l.sliding_window.is_some())
        {
            // Local layers are not affected by the global layers' linear scaling.
            layer.rope.freq_base = base;
            layer.rope.freq_scale = 1.0;
        }
    }
    Ok(config)
}
