//! The unigram (`t5`) tokenizer against llama.cpp on `ggml-vocab-nomic-bert-moe.gguf`, a t5
//! vocabulary with a precompiled charsmap, for which llama.cpp's vocab suite has no
//! inputs. The ids were recorded with llama.cpp's `llama-tokenize` by
//! scripts/gen-unigram-fixtures.sh.

mod llama_fixtures;

use llama_fixtures::{check_fixture, check_hostile_inputs, suite_tokenizer};

#[test]
fn matches_llama_cpp() {
    let tokenizer = suite_tokenizer("nomic-bert-moe");
    check_fixture(&tokenizer, "unigram-nomic-bert-moe", false, false);
}

#[test]
fn matches_llama_cpp_with_special_tokens() {
    let tokenizer = suite_tokenizer("nomic-bert-moe");
    check_fixture(&tokenizer, "unigram-nomic-bert-moe-special", true, true);
}

#[test]
fn survives_hostile_inputs() {
    check_hostile_inputs(&suite_tokenizer("nomic-bert-moe"));
}
