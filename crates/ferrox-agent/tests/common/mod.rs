#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use ferrox_agent::ConstraintCompiler;
use ferrox_tokenizer::tokenizer::Tokenizer;

/// Qwen2.5-Coder-0.5B-Instruct, fetched by `scripts/fetch-model.sh qwen-0.5b` (which
/// `scripts/test.sh` runs).
pub fn qwen_model() -> PathBuf {
    let path = ferrox_models::default_model_path().with_file_name(QWEN_FILE);
    assert!(
        path.is_file(),
        "the Qwen2.5-Coder-0.5B model is not at {}: run scripts/fetch-model.sh qwen-0.5b",
        path.display()
    );
    path
}

pub const QWEN_FILE: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

/// The logits row length of the Qwen model (its embedding rows; more than the tokenizer's
/// vocabulary).
pub const QWEN_N_VOCAB: usize = 151_936;

pub fn qwen_tokenizer() -> Arc<Tokenizer> {
    static T: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    T.get_or_init(|| {
        let gguf = ferrox_gguf::Gguf::open(qwen_model()).expect("open the Qwen model");
        Arc::new(Tokenizer::from_gguf(&gguf).expect("its tokenizer"))
    })
    .clone()
}

pub fn compiler() -> &'static ConstraintCompiler {
    static C: OnceLock<ConstraintCompiler> = OnceLock::new();
    C.get_or_init(|| ConstraintCompiler::new(qwen_tokenizer(), QWEN_N_VOCAB).unwrap())
}

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}
