//! The WordPiece (`bert`) tokenizer against llama.cpp on `ggml-vocab-bert-bge.gguf`, on
//! cases beyond llama.cpp's own bert-bge suite (accents, Chinese, punctuation runs, mixed
//! case, words longer than BERT's 100-character limit, codepoints newer than llama.cpp's
//! Unicode tables). The ids were recorded with llama.cpp's `llama-tokenize` by
//! scripts/gen-wpm-fixtures.sh.

mod llama_fixtures;

use llama_fixtures::{check_fixture, check_hostile_inputs, suite_tokenizer};

#[test]
fn matches_llama_cpp() {
    let tokenizer = suite_tokenizer("bert-bge");
    check_fixture(&tokenizer, "wpm-bert-bge", false, false);
}

#[test]
fn matches_llama_cpp_with_special_tokens() {
    let tokenizer = suite_tokenizer("bert-bge");
    check_fixture(&tokenizer, "wpm-bert-bge-special", true, true);
}

#[test]
fn survives_hostile_inputs() {
    check_hostile_inputs(&suite_tokenizer("bert-bge"));
}
