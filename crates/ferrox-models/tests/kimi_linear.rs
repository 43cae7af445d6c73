//! `kimi-linear` (Kimi Linear: KDA linear attention + NoPE MLA, MoE): the synthetic model of
//! `synthetic/kimi.rs` and llama.cpp's reference for it (`fixtures/kimi/`, recorded by
//! `scripts/reference/gen-sweep-logits.sh kimi`: the whole 160-token sequence as one batch,
//! every prefix as a prompt, and 16 greedy tokens after each, top-5 log-probabilities with
//! flash attention off and an f32 cache). The engine is not built yet: loading the file is
//! an error naming the architecture, never a wrong answer.

mod synthetic;

use std::sync::Arc;

use ferrox_gguf::Gguf;
use ferrox_models::{AnyEngine, EngineOptions, ModelError};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn fixture() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/kimi/kimi-linear.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

#[test]
fn the_reference_was_recorded_on_the_generators_file() {
    let fx = fixture();
    let bytes = synthetic::kimi::kimi_linear_gguf_bytes();
    let sha: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(sha, fx["gguf_sha256"].as_str().unwrap());
    let tokens: Vec<u32> = fx["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(tokens, synthetic::kimi::token_ids(synthetic::SWEEP_TOKENS));
    assert_eq!(fx["greedy"].as_array().unwrap().len(), tokens.len());
}

#[test]
fn kimi_linear_is_refused_by_name() {
    let gguf = Gguf::from_bytes(synthetic::kimi::kimi_linear_gguf_bytes()).unwrap();
    match AnyEngine::from_gguf(Arc::new(gguf), &EngineOptions::default()) {
        Err(ModelError::UnsupportedArchitecture(arch)) => assert_eq!(arch, "kimi-linear"),
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("kimi-linear loaded without an engine"),
    }
}
