//! The last layer's feed-forward runs only for the rows that give logits back (llama.cpp
//! keeps only its output rows there too): what those rows give back is the same, bit for
//! bit, as when every row of the prompt asks for logits.

mod synthetic;

use std::sync::Arc;

use ferrox_core::GgmlType;
use ferrox_gguf::Gguf;
use ferrox_models::{AnyEngine, Engine, EngineExt, EngineOptions, LogitsFor};

fn check(arch: &str, all: Option<GgmlType>) {
    let bytes = synthetic::gguf_bytes_with(arch, all);
    check_file(
        arch,
        bytes,
        &synthetic::token_ids(arch),
        &format!("{all:?}"),
    );
}

fn check_file(arch: &str, bytes: Vec<u8>, tokens: &[u32], all: &str) {
    let gguf = Gguf::from_bytes(bytes).unwrap();
    let options = EngineOptions {
        n_ctx: 128,
        threads: 2,
        ..EngineOptions::default()
    };
    let engine = AnyEngine::from_gguf(Arc::new(gguf), &options).unwrap();
    let (n, n_vocab) = (tokens.len(), engine.vocab_size());
    let run = |which| -> Vec<u32> {
        let mut state = engine.new_state().unwrap();
        let logits = engine.forward_batch(tokens, 0, &mut state, which).unwrap();
        logits.iter().map(|x| x.to_bits()).collect()
    };
    let every = run(LogitsFor::All);
    assert_eq!(every.len(), n * n_vocab);
    assert!(
        run(LogitsFor::Last) == every[(n - 1) * n_vocab..],
        "{arch} ({all}): the last row's logits change when the others ask for none"
    );
    let from = n / 2;
    assert!(
        run(LogitsFor::From(from)) == every[from * n_vocab..],
        "{arch} ({all}): the second half's logits change when the first half asks for none"
    );
}

#[test]
fn dense_decoders_give_the_same_logits() {
    for arch in ["llama", "gemma3"] {
        check(arch, None);
        check(arch, Some(GgmlType::F32));
    }
}

#[test]
fn moe_decoders_give_the_same_logits() {
    check("qwen3moe", None);
    check("qwen3moe", Some(GgmlType::F32));
}

#[test]
fn mla_engines_give_the_same_logits() {
    for arch in ["deepseek2", "deepseek2-v3"] {
        check(arch, None);
        check(arch, Some(GgmlType::F32));
    }
}

#[test]
fn sparse_attention_engines_give_the_same_logits() {
    for name in ["deepseek32", "glm-dsa"] {
        let tokens = synthetic::dsa::token_ids(name, 90);
        check_file(
            name,
            synthetic::dsa::gguf_bytes(name),
            &tokens,
            "file types",
        );
    }
}

#[test]
fn deepseek4_gives_the_same_logits() {
    let tokens = synthetic::deepseek4::token_ids(90);
    check_file(
        "deepseek4",
        synthetic::deepseek4::gguf_bytes(),
        &tokens,
        "F32",
    );
}

#[test]
fn kimi_engines_give_the_same_logits() {
    for &name in synthetic::kimi::KIMI_MODELS {
        let tokens = synthetic::kimi::token_ids_of(name, 90);
        check_file(name, synthetic::kimi::gguf_bytes(name), &tokens, "F32");
    }
}
