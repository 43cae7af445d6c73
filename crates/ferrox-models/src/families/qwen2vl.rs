//! Qwen2-VL / Qwen2.5-VL language models: Qwen2 with multimodal RoPE (M-RoPE). M-RoPE splits
//! each head's rotated pairs into sections (`rope.dimension_sections`: time, height, width
//! and a fourth) turned by a token's four positions; llama.cpp gives a text token
//! `[p, p, p, 0]`, so text rotates as NeoX RoPE except the pairs of the fourth section,
//! which stay still (a divisor of infinity here). Text runs; the image positions that give
//! the sections different values come with the Qwen-VL vision projectors, which are not
//! built (their `mmproj` files are refused by projector type).
//!
//! llama.cpp (this build) reads no RMS-norm epsilon for `qwen2vl` and normalises with 0;
//! ferrox uses the file's, as the model was trained.

use ferrox_gguf::Metadata;

use crate::decoder::{read_common, DecoderConfig};
use crate::layers::rope::RopeStyle;
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

/// M-RoPE for text tokens (positions `[p, p, p, 0]`): checks what llama.cpp requires
/// (`rope.dimension_sections`, every head rotated whole) and holds still the pairs that
/// take the fourth position. `interleaved`: Qwen3-VL's layout, where pair `k` of the
/// sections' span takes time, height or width by `k mod 3` while that section lasts
/// (three times its count), and the fourth position past them.
pub(super) fn text_mrope(
    meta: &Metadata<'_>,
    arch: &str,
    config: &mut DecoderConfig,
    interleaved: bool,
) -> Result<(), ModelError> {
    let sections = read_sections(meta, arch, config)?;
    let span: usize = sections.iter().sum();
    let fourth = |pair: usize| {
        let sector = pair % span;
        if interleaved {
            let (kind, within) = (sector % 3, |count: usize| sector < 3 * count);
            !(kind == 0 && within(sections[0])
                || kind == 1 && within(sections[1])
                || kind == 2 && within(sections[2]))
        } else {
            sector >= sections[0] + sections[1] + sections[2]
        }
    };
    for layer in &mut config.layers {
        let pairs = layer.rope.n_dims / 2;
        if (0..pairs).any(fourth) {
            let base = layer.rope.freq_factors.take();
            layer.rope.freq_factors = Some(
                (0..pairs)
                    .map(|k| match (fourth(k), &base) {
                        (true, _) => f32::INFINITY,
                        (false, Some(f)) => f[k],
                        (false, None) => 1.0,
                    })
                    .collect(),
            );
        }
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
