//! The engines behind one interface ([`Engine`]): the dense decoder, the Multi-head
//! Latent Attention engine and the engines built on it (DeepSeek Sparse Attention, Kimi
//! Linear), the architecture registry ([`families`]), sampling and the generation loop.

pub mod any_engine;
pub mod decoder;
pub mod deepseek4;
pub mod draft_model;
pub mod dsa;
pub mod engine;
pub mod families;
pub mod generate;
pub mod hparams;
pub mod kimi;
pub mod layers;
pub mod mla;
pub mod names;
pub mod sampling;
pub mod step;
pub(crate) mod tensors;

/// The tokenizers, chat templates and stop strings (the `ferrox-tokenizer` crate).
pub use ferrox_tokenizer::{chat_template, stop, tokenizer};

pub use any_engine::AnyEngine;
pub use decoder::Decoder;
pub use deepseek4::Deepseek4Engine;
pub use dsa::DsaEngine;
pub use engine::{
    step_sequences, Engine, EngineError, EngineExt, EngineOptions, LogitsFor, SeqInput, SeqWork,
    State, StepScratch,
};
pub use families::load_as;
pub use mla::{AttentionPath, MlaEngine};

/// The default model's file name (Gemma-3-270M Q4_K_M, as `scripts/fetch-model.sh` stores it).
pub const DEFAULT_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// Where the default model lives: `$FERROX_MODELS_DIR`, else `~/.cache/ferrox/models`.
pub fn default_model_path() -> std::path::PathBuf {
    let dir = std::env::var_os("FERROX_MODELS_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/ferrox/models")
        });
    dir.join(DEFAULT_MODEL_FILE)
}

/// Errors loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] ferrox_gguf::GgufError),
    #[error(transparent)]
    Quant(#[from] ferrox_core::QuantError),
    #[error("architecture `{0}` is not supported")]
    UnsupportedArchitecture(String),
    #[error("tensor `{0}` is missing")]
    MissingTensor(String),
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    #[error("tensor `{name}` has type {ty}, which is not supported")]
    UnsupportedTensorType { name: String, ty: String },
    #[error("invalid model configuration: {0}")]
    Config(String),
}
