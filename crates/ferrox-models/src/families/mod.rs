//! One module per architecture family: each reads its hyperparameters, says how it
//! differs from the engine that runs it, and declares its [`Architecture`]. Adding a family
//! means adding a file here and a line in [`ARCHITECTURES`].

mod bert;
mod deepseek2;
mod deepseek32;
mod deepseek4;
mod exaone;
mod gemma;
mod gemma2;
mod gemma3;
mod glm_dsa;
mod jina_bert_v2;
mod kimi_k3;
mod kimi_linear;
mod llama;
mod mistral4;
mod nomic_bert;
mod nomic_bert_moe;
mod olmoe;
mod phi3;
mod qwen2;
mod qwen2moe;
mod qwen2vl;
mod qwen3;
mod qwen3moe;
mod qwen3vl;
mod qwen3vlmoe;

use std::sync::Arc;

use ferrox_gguf::{Gguf, Metadata};

use crate::decoder::{Decoder, DecoderConfig};
use crate::dsa::{DsaConfig, DsaEngine};
use crate::encoder::{Encoder, EncoderConfig};
use crate::engine::Engine;
use crate::engine::EngineOptions;
use crate::layers::mla::MlaConfig;
use crate::mla::MlaEngine;
use crate::ModelError;

/// Loads a checkpoint into its engine.
pub type Loader = fn(Arc<Gguf>, &EngineOptions) -> Result<Box<dyn Engine>, ModelError>;

/// An architecture ferrox runs: its `general.architecture` name and how to load it.
pub struct Architecture {
    pub name: &'static str,
    pub load: Loader,
}

/// Every architecture, one line per family module (each declares its own [`Architecture`]).
pub const ARCHITECTURES: &[Architecture] = &[
    llama::ARCH,
    qwen2::ARCH,
    qwen3::ARCH,
    gemma::ARCH,
    gemma2::ARCH,
    gemma3::ARCH,
    phi3::ARCH,
    exaone::ARCH,
    qwen2moe::ARCH,
    qwen3moe::ARCH,
    qwen2vl::ARCH,
    qwen3vl::ARCH,
    qwen3vlmoe::ARCH,
    olmoe::ARCH,
    deepseek2::ARCH,
    mistral4::ARCH,
    kimi_linear::ARCH,
    kimi_k3::ARCH,
    deepseek32::ARCH,
    glm_dsa::ARCH,
    deepseek4::ARCH,
    bert::ARCH,
    nomic_bert::ARCH,
    jina_bert_v2::ARCH,
    nomic_bert_moe::ARCH,
];

/// The registered architecture named `name`.
pub fn architecture(name: &str) -> Result<&'static Architecture, ModelError> {
    ARCHITECTURES
        .iter()
        .find(|a| a.name == name)
        .ok_or_else(|| ModelError::UnsupportedArchitecture(name.to_string()))
}

/// Loads a family: its configuration read from the file's metadata, then its engine built.
fn load_with<C, E: Engine>(
    gguf: Arc<Gguf>,
    options: &EngineOptions,
    config: fn(&Metadata<'_>) -> Result<C, ModelError>,
    build: fn(Arc<Gguf>, &EngineOptions, C) -> Result<E, ModelError>,
) -> Result<Box<dyn Engine>, ModelError> {
    let config = config(&gguf.metadata())?;
    Ok(Box::new(build(gguf, options, config)?))
}

/// Loads a family run by the dense decoder.
fn dense(
    gguf: Arc<Gguf>,
    options: &EngineOptions,
    config: fn(&Metadata<'_>) -> Result<DecoderConfig, ModelError>,
) -> Result<Box<dyn Engine>, ModelError> {
    load_with(gguf, options, config, Decoder::with_config)
}

/// Loads a family run by the Multi-head Latent Attention engine.
fn mla(
    gguf: Arc<Gguf>,
    options: &EngineOptions,
    config: fn(&Metadata<'_>) -> Result<MlaConfig, ModelError>,
) -> Result<Box<dyn Engine>, ModelError> {
    load_with(gguf, options, config, MlaEngine::with_config)
}

/// Loads a family run by the DeepSeek Sparse Attention engine.
fn dsa(
    gguf: Arc<Gguf>,
    options: &EngineOptions,
    config: fn(&Metadata<'_>) -> Result<DsaConfig, ModelError>,
) -> Result<Box<dyn Engine>, ModelError> {
    load_with(gguf, options, config, DsaEngine::with_config)
}

/// Loads a family run by the encoder.
fn encoder(
    gguf: Arc<Gguf>,
    options: &EngineOptions,
    config: fn(&Metadata<'_>) -> Result<EncoderConfig, ModelError>,
) -> Result<Box<dyn Engine>, ModelError> {
    load_with(gguf, options, config, Encoder::with_config)
}

/// Loads the file's architecture as the engine type `T` (an error when the registered
/// architecture runs on another engine).
pub fn load_as<T: Engine>(gguf: Arc<Gguf>, options: &EngineOptions) -> Result<T, ModelError> {
    let arch = gguf.metadata().architecture()?.to_string();
    let engine: Box<dyn std::any::Any> = (architecture(&arch)?.load)(gguf, options)?;
    engine.downcast::<T>().map(|e| *e).map_err(|_| {
        ModelError::UnsupportedArchitecture(format!(
            "{arch} (runs on another engine than {})",
            std::any::type_name::<T>()
        ))
    })
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
