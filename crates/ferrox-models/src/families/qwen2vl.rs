//! Qwen2-VL / Qwen2.5-VL language models: Qwen2 with multimodal RoPE (M-RoPE). M-RoPE splits
//! each head's rotated pairs into sections (`rope.dimension_sections`: time, height, width
//! and a fourth) turned by a row's four positions ([`crate::layers::rope::Mrope`]); llama.cpp
//! gives a text token `[p, p, p, 0]` (NeoX RoPE but for the fourth section's pairs, which
//! stay still) and an image token of a Qwen-VL projector its row and column in the image's
//! grid.
//!
//! llama.cpp (this build) reads no RMS-norm epsilon for `qwen2vl` and normalises with 0;
//! ferrox uses the file's, as the model was trained.

use ferrox_gguf::Metadata;

use crate::decoder::{read_common, DecoderConfig};
use crate::layers::rope::{Mrope, RopeStyle};
use crate::ModelError;

/// `qwen2vl`, run by the dense decoder.
pub const ARCH: super::Architecture = super::Architecture {
    name: "qwen2vl",
    load: |gguf, options| super::dense(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<DecoderConfig, ModelError> {
    let mut config = read_common(meta, "qwen2vl", RopeStyle::Neox)?;
    text_mrope(meta, "qwen2vl", &mut config, false)?;
    Ok(config)
}

/// M-RoPE sections on every layer, checked as llama.cpp requires them
/// (`rope.dimension_sections`, every head rotated whole). `interleaved`: Qwen3-VL's layout.
pub(super) fn text_mrope(
    meta: &Metadata<'_>,
    arch: &str,
    config: &mut DecoderConfig,
    interleaved: bool,
) -> Result<(), ModelError> {
    let sections = read_sections(meta, arch, config)?;
    for layer in &mut config.layers {
        layer.rope.mrope = Some(Mrope {
            sections,
            interleaved,
        });
    }
    Ok(())
}

/// `rope.dimension_sections` as four counts of rotated pairs, checked as llama.cpp checks
/// them, with every head rotated whole.
fn read_sections(
    meta: &Metadata<'_>,
    arch: &str,
    config: &DecoderConfig,
) -> Result<[usize; 4], ModelError> {
    let key = format!("{arch}.rope.dimension_sections");
    let sections = meta
        .opt_array(&key)?
        .ok_or_else(|| ModelError::Config(format!("`{key}` is missing (M-RoPE needs it)")))?;
    let counts: Vec<i64> = match (sections.as_slice::<i32>(), sections.as_slice::<u32>()) {
        (Some(v), _) => v.iter().map(|&x| i64::from(x)).collect(),
        (_, Some(v)) => v.iter().map(|&x| i64::from(x)).collect(),
        _ => return Err(ModelError::Config(format!("`{key}` must hold integers"))),
    };
    let total: i64 = counts.iter().sum();
    if counts.is_empty() || counts.len() > 4 || counts.iter().any(|&c| c < 0) || total == 0 {
        return Err(ModelError::Config(format!(
            "`{key}` = {counts:?}: at most four counts, none negative, not all zero"
        )));
    }
    let mut sections = [0usize; 4];
    for (s, &c) in sections.iter_mut().zip(&counts) {
        *s = c as usize;
    }
    for (i, layer) in config.layers.iter().enumerate() {
        if layer.rope.n_dims != layer.head_dim_k || layer.head_dim_k != layer.head_dim_v {
            return Err(ModelError::Config(format!(
                "layer {i}: M-RoPE rotates whole heads of equal key and value size \
                 (rotated {}, key {}, value {})",
                layer.rope.n_dims, layer.head_dim_k, layer.head_dim_v
            )));
        }
        if total as usize > layer.head_dim_k {
            return Err(ModelError::Config(format!(
                "`{key}` = {counts:?}: more pairs than the head's {} values",
                layer.head_dim_k
            )));
        }
    }
    Ok(sections)
}
