//! One module per dense architecture family: each reads its hyperparameters and says how
//! it differs from a plain llama-style decoder. Adding a family means adding a file here
//! and a line in [`decoder_config`].

mod deepseek2;
mod gemma;
mod gemma2;
mod gemma3;
mod llama;
mod mistral4;
mod olmoe;
mod phi3;
mod qwen2;
mod qwen2moe;
mod qwen3;
mod qwen3moe;

use ferrox_gguf::Metadata;

use crate::decoder::DecoderConfig;
use crate::mla::MlaConfig;
use crate::ModelError;

/// Architectures the dense decoder runs.
pub const DENSE_ARCHITECTURES: &[&str] = &[
    "llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3",
];

/// Mixture-of-experts architectures the same decoder runs (MoE FFN layers).
pub const MOE_ARCHITECTURES: &[&str] = &["qwen2moe", "qwen3moe", "olmoe"];

/// Multi-head Latent Attention architectures, run by [`crate::mla::MlaEngine`].
pub const MLA_ARCHITECTURES: &[&str] = &["deepseek2", "mistral4"];

/// The MLA configuration for the file's `general.architecture`.
pub fn mla_config(meta: &Metadata<'_>) -> Result<MlaConfig, ModelError> {
    match meta.architecture()? {
        "deepseek2" => deepseek2::config(meta),
        "mistral4" => mistral4::config(meta),
        other => Err(ModelError::UnsupportedArchitecture(other.to_string())),
    }
}

/// The decoder configuration for the file's `general.architecture`.
pub fn decoder_config(meta: &Metadata<'_>) -> Result<DecoderConfig, ModelError> {
    let arch = meta.architecture()?;
    match arch {
        "llama" => llama::config(meta),
        "qwen2" => qwen2::config(meta),
        "qwen3" => qwen3::config(meta),
        "gemma" => gemma::config(meta),
        "gemma2" => gemma2::config(meta),
        "gemma3" => gemma3::config(meta),
        "phi3" => phi3::config(meta),
        "qwen2moe" => qwen2moe::config(meta),
        "qwen3moe" => qwen3moe::config(meta),
        "olmoe" => olmoe::config(meta),
        other => Err(ModelError::UnsupportedArchitecture(other.to_string())),
    }
}

/// Gemma's query scale: 1/sqrt(head size), except for the 27B models, which use
/// 1/sqrt(n_embd / n_head) (as the reference implementation does).
fn gemma_query_scale(config: &DecoderConfig, is_27b: bool) -> f32 {
    let layer = &config.layers[0];
    let dim = if is_27b {
        config.n_embd / layer.n_head
    } else {
        layer.head_dim_k
    };
    1.0 / (dim as f32).sqrt()
}
