//! The engines behind one interface ([`Engine`], from `ferrox-engine`): the dense decoder,
//! the Multi-head Latent Attention engine and the engines built on its layers (DeepSeek
//! Sparse Attention, Kimi, DeepSeek-V4), the layers they share ([`layers`]) and the
//! architecture registry ([`families`]). Sampling and the generation loop are
//! `ferrox-generate`'s; tokenizers are `ferrox-tokenizer`'s.

pub mod any_engine;
pub mod decoder;
pub mod deepseek4;
pub mod dsa;
pub mod encoder;
pub mod families;
pub mod hparams;
pub mod kimi;
pub mod layers;
pub mod mla;
pub mod names;
pub mod numa;
pub mod plan;
pub mod scaffold;
pub(crate) mod tensors;
pub mod vision;

pub use any_engine::AnyEngine;
pub use decoder::Decoder;
pub use deepseek4::Deepseek4Engine;
pub use dsa::DsaEngine;
pub use encoder::Encoder;
pub use families::load_as;
/// The interface the engines implement (the `ferrox-engine` crate).
pub use ferrox_engine as engine;
pub use ferrox_engine::{
    step_sequences, Engine, EngineError, EngineExt, EngineOptions, LogitsFor, ModelError,
    NumaPolicy, Output, SeqInput, SeqWork, State, StepScratch, TokenId,
};
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
