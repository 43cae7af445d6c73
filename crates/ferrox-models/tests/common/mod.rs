#![allow(dead_code)]
//! Shared helpers for tests that need the default model.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use ferrox_gguf::Gguf;
use ferrox_models::{Decoder, EngineOptions};
use ferrox_tokenizer::tokenizer::Tokenizer;

/// The default model as `scripts/fetch-model.sh` stores it (the README's path).
pub fn default_model_path() -> PathBuf {
    let path = ferrox_models::default_model_path();
    assert!(
        path.is_file(),
        "{} is missing: run scripts/fetch-model.sh",
        path.display()
    );
    path
}

pub fn gemma() -> Arc<Gguf> {
    static GGUF: OnceLock<Arc<Gguf>> = OnceLock::new();
    GGUF.get_or_init(|| {
        let path = default_model_path();
        Arc::new(Gguf::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
    })
    .clone()
}

pub fn gemma_tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| Tokenizer::from_gguf(&gemma()).expect("tokenizer"))
}

/// A decoder over the default model with the given context and threads.
pub fn gemma_decoder(n_ctx: usize, threads: usize) -> Decoder {
    let options = EngineOptions {
        n_ctx,
        threads,
        ..EngineOptions::default()
    };
    ferrox_models::load_as::<Decoder>(gemma(), &options).expect("decoder")
}

pub fn fixture(path: &str) -> serde_json::Value {
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(path);
    let text = std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}
