//! Model configurations, one module per architecture family, tokenizers, sampling and
//! generation.

pub mod any_engine;
pub mod chat_template;
pub mod decoder;
pub mod engine;
pub mod families;
pub mod generate;
pub mod layers;
pub mod mla;
pub mod sampling;
pub mod stop;
pub(crate) mod tensors;
pub mod tokenizer;

pub use any_engine::{AnyEngine, AnyState};
pub use decoder::{Decoder, DecoderOptions, DecoderState};
pub use engine::{Engine, EngineError, LogitsFor};
pub use mla::{AttentionPath, MlaEngine, MlaState};

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
