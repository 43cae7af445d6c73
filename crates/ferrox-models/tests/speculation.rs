//! Prompt-lookup speculation changes nothing but speed: with drafting, `generate` gives the
//! same tokens as without, greedy and sampled (the same seed), on the default model and on an
//! MLA model, with prompts that make drafts right (repeated text) and wrong (free text); and
//! twenty prompts of 128 greedy tokens on the default model.

mod common;
mod synthetic;

use std::sync::Arc;

use ferrox_gguf::Gguf;
use ferrox_models::generate::{generate, lookup_draft, Draft, GenerationParams, Outcome};
use ferrox_models::sampling::SamplerParams;
use ferrox_models::tokenizer::Tokenizer;
use ferrox_models::{AnyEngine, Engine, EngineExt, EngineOptions};

fn run(engine: &impl Engine, tok: &Tokenizer, prompt: &[u32], draft: Draft, temp: f32) -> Outcome {
    run_n(engine, tok, prompt, draft, temp, 64)
}

fn run_n(
    engine: &impl Engine,
    tok: &Tokenizer,
    prompt: &[u32],
    draft: Draft,
    temp: f32,
    n: usize,
) -> Outcome {
    let params = GenerationParams {
        max_tokens: Some(n),
        sampler: SamplerParams {
            temperature: temp,
            seed: 7,
            ..SamplerParams::default()
        },
        ignore_eog: true,
        draft,
        ..GenerationParams::default()
    };
    let mut state = engine.new_state().unwrap();
    generate(engine, &mut state, 0, tok, prompt, &params, |_| true).unwrap()
}

/// Checks every prompt; returns the tokens drafted and accepted in all.
fn check(engine: &impl Engine, tok: &Tokenizer, prompts: &[Vec<u32>]) -> (usize, usize) {
    let draft = Draft::NGram { min: 1, max: 8 };
    let (mut drafted, mut accepted) = (0, 0);
    for prompt in prompts {
        for temp in [0.0, 0.8] {
            let plain = run(engine, tok, prompt, Draft::None, temp);
            let with = run(engine, tok, prompt, draft, temp);
            assert_eq!(plain.tokens, with.tokens, "temperature {temp}");
            assert_eq!(plain.text, with.text);
            assert_eq!(plain.timings.drafted_tokens, 0);
            drafted += with.timings.drafted_tokens;
            accepted += with.timings.accepted_tokens;
        }
    }
    eprintln!("drafted {drafted} tokens, accepted {accepted}");
    (drafted, accepted)
}

#[test]
fn drafting_changes_no_token_on_the_default_model() {
    let engine = common::gemma_decoder(512, 2);
    let tok = common::gemma_tokenizer();
    let code = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n\
                # The same functions again:\ndef add(a, b):";
    let prompts: Vec<Vec<u32>> = [code, "Once upon a time, in a small village by the sea,"]
        .iter()
        .map(|p| tok.encode(p, true, false))
        .collect();
    let (drafted, accepted) = check(&engine, tok, &prompts);
    assert!(
        accepted > 0 && drafted > accepted,
        "{drafted} drafted, {accepted} accepted"
    );
}

/// Twenty prompts of every kind (code to repeat, lists, dialogue, prose, questions), 128
/// greedy tokens each: prompt lookup gives the tokens plain decoding gives.
#[test]
fn twenty_prompts_decode_the_same_with_prompt_lookup() {
    let engine = common::gemma_decoder(512, 2);
    let tok = common::gemma_tokenizer();
    let prompts = [
        "def add(a, b):\n    return a + b\n\n# Again, with a docstring:\ndef add(a, b):",
        "fn main() {\n    let xs = vec![1, 2, 3];\n    for x in &xs {\n        println!(\"{x}\");\n    }\n}\n// The same in Python:\n",
        "<ul>\n  <li>apples</li>\n  <li>pears</li>\n  <li>plums</li>\n</ul>\nThe same list with prices:\n<ul>\n",
        "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. Monday, Tuesday,",
        "1. Preheat the oven.\n2. Mix the flour and the eggs.\n3. Bake for 20 minutes.\nRepeat the steps:\n1.",
        "Q: What is the capital of France?\nA: Paris.\nQ: What is the capital of Italy?\nA:",
        "Alice: Hello, Bob!\nBob: Hello, Alice! How are you?\nAlice:",
        "Once upon a time, in a small village by the sea,",
        "The mitochondria is the powerhouse of the cell because",
        "Write a haiku about the winter moon.\n",
        "SELECT name, age FROM users WHERE age > 30 ORDER BY name;\n-- Now only the names:\nSELECT",
        "{\"name\": \"Ada\", \"born\": 1815, \"field\": \"mathematics\"}\nThe same record for Alan Turing:\n{",
        "To be, or not to be, that is the question:",
        "The quick brown fox jumps over the lazy dog. The quick brown fox",
        "Translate to French: Good morning, my friend.\n",
        "Here is a story about a robot who learns to paint.",
        "import numpy as np\n\ndef mean(xs):\n    return np.mean(xs)\n\ndef std(xs):",
        "Dear team,\n\nThank you for your hard work this quarter.",
        "a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p,",
        "The three laws of thermodynamics are",
    ];
    let draft = Draft::NGram { min: 1, max: 16 };
    let (mut drafted, mut accepted) = (0, 0);
    for text in prompts {
        let prompt = tok.encode(text, true, false);
        let plain = run_n(&engine, tok, &prompt, Draft::None, 0.0, 128);
        let with = run_n(&engine, tok, &prompt, draft, 0.0, 128);
        assert_eq!(plain.tokens.len(), 128, "{text:?}");
        assert_eq!(plain.tokens, with.tokens, "{text:?}");
        drafted += with.timings.drafted_tokens;
        accepted += with.timings.accepted_tokens;
    }
    eprintln!("drafted {drafted} tokens, accepted {accepted}");
    assert!(
        accepted > 0 && drafted > accepted,
        "{drafted} drafted, {accepted} accepted"
    );
}

#[test]
fn drafting_changes_no_token_on_an_mla_model() {
    let gguf = Gguf::from_bytes(synthetic::gguf_bytes("deepseek2")).unwrap();
    let options = EngineOptions {
        n_ctx: 256,
        threads: 2,
        ..EngineOptions::default()
    };
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let engine = AnyEngine::from_gguf(Arc::new(gguf), &options).unwrap();
    let ids = synthetic::token_ids("deepseek2");
    // A prompt that repeats itself, so that drafts are proposed and some accepted.
    let mut repeated = ids[..20].to_vec();
    repeated.extend_from_slice(&ids[1..20]);
    let (drafted, _) = check(&engine, &tok, &[repeated, ids[..30].to_vec()]);
    assert!(drafted > 0);
}

/// DeepSeek-V4 keeps its window and compressor inputs in rings that drop rejected draft
/// tokens; decoding past the first 128x row (position 127) with drafts of up to 8 tokens.
#[test]
fn drafting_changes_no_token_on_deepseek4() {
    let gguf = Gguf::from_bytes(synthetic::deepseek4::gguf_bytes()).unwrap();
    let options = EngineOptions {
        n_ctx: 256,
        threads: 2,
        ..EngineOptions::default()
    };
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let engine = AnyEngine::from_gguf(Arc::new(gguf), &options).unwrap();
    let ids = synthetic::deepseek4::token_ids(100);
    let mut repeated = ids[..50].to_vec();
    repeated.extend_from_slice(&ids[1..50]);
    let (drafted, accepted) = check(&engine, &tok, &[repeated, ids.clone()]);
    assert!(
        drafted > 0 && accepted > 0,
        "{drafted} drafted, {accepted} accepted"
    );
}

#[test]
fn lookup_proposes_what_followed_the_latest_match() {
    let mut out = Vec::new();
    // "5 6" occurred twice before; the latest is followed by 9 9.
    lookup_draft(&[1, 5, 6, 7, 8, 5, 6, 9, 9, 2, 5, 6], 3, &mut out);
    assert_eq!(out, [9, 9, 2]);
    lookup_draft(&[1, 2, 3, 4], 3, &mut out);
    assert!(out.is_empty());
    // The longest n-gram wins: "3 4" matches at the start, "4" alone later.
    lookup_draft(&[3, 4, 10, 4, 11, 3, 4], 2, &mut out);
    assert_eq!(out, [10, 4]);
}
