//! Prompt-lookup speculation changes nothing but speed: with drafting, `generate` gives the
//! same tokens as without, greedy and sampled (the same seed), on the default model and on an
//! MLA model, with prompts that make drafts right (repeated text) and wrong (free text).

mod common;
mod synthetic;

use std::sync::Arc;

use ferrox_gguf::Gguf;
use ferrox_models::generate::{generate, lookup_draft, Draft, GenerationParams, Outcome};
use ferrox_models::sampling::SamplerParams;
use ferrox_models::tokenizer::Tokenizer;
use ferrox_models::{AnyEngine, Engine, EngineExt, EngineOptions};

fn run(engine: &impl Engine, tok: &Tokenizer, prompt: &[u32], draft: Draft, temp: f32) -> Outcome {
    let params = GenerationParams {
        max_tokens: Some(64),
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
