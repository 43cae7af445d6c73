//! Prompt-lookup speculation changes nothing but speed: with drafting, `generate` gives the
//! same tokens as without, greedy and sampled (the same seed), on the default model and on an
//! MLA model, with prompts that make drafts right (repeated text) and wrong (free text); and
//! twenty prompts of 128 greedy tokens on the default model.

mod common;
mod synthetic;

use std::sync::Arc;

use ferrox_generate::generate::{generate, lookup_draft, Draft, GenerationParams, Outcome};
use ferrox_generate::sampling::SamplerParams;
use ferrox_gguf::Gguf;
use ferrox_models::{AnyEngine, Engine, EngineExt, EngineOptions};
use ferrox_tokenizer::tokenizer::Tokenizer;

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

/// Checks every prompt with prompt lookup; returns the tokens drafted and accepted in all.
fn check(engine: &impl Engine, tok: &Tokenizer, prompts: &[Vec<u32>]) -> (usize, usize) {
    check_with(engine, tok, prompts, Draft::NGram { min: 1, max: 8 })
}

/// Checks every prompt with `draft`, greedy and sampled; returns the tokens drafted and
/// accepted in all.
fn check_with(
    engine: &impl Engine,
    tok: &Tokenizer,
    prompts: &[Vec<u32>],
    draft: Draft,
) -> (usize, usize) {
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

/// A synthetic model of 256 positions, and its tokenizer.
fn synthetic_engine(bytes: Vec<u8>) -> (AnyEngine, Tokenizer) {
    synthetic_engine_with(bytes, false)
}

/// [`synthetic_engine`], with its multi-token-prediction block loaded when `mtp`.
fn synthetic_engine_with(bytes: Vec<u8>, mtp: bool) -> (AnyEngine, Tokenizer) {
    let gguf = Gguf::from_bytes(bytes).unwrap();
    let options = EngineOptions {
        n_ctx: 256,
        threads: 2,
        mtp,
        ..EngineOptions::default()
    };
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    (AnyEngine::from_gguf(Arc::new(gguf), &options).unwrap(), tok)
}

#[test]
fn drafting_changes_no_token_on_an_mla_model() {
    let (engine, tok) = synthetic_engine(synthetic::gguf_bytes("deepseek2"));
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
    let (engine, tok) = synthetic_engine(synthetic::deepseek4::gguf_bytes());
    let ids = synthetic::deepseek4::token_ids(100);
    let mut repeated = ids[..50].to_vec();
    repeated.extend_from_slice(&ids[1..50]);
    let (drafted, accepted) = check(&engine, &tok, &[repeated, ids.clone()]);
    assert!(
        drafted > 0 && accepted > 0,
        "{drafted} drafted, {accepted} accepted"
    );
}

/// An MLA model with a multi-token-prediction block: drafting with the block changes no
/// token, greedy or sampled (and over twenty prompts of 128 greedy tokens), and the block
/// changes nothing of the trunk (the file is
/// deepseek2-v3 with the block appended, and decodes as deepseek2-v3 does).
#[test]
fn drafting_with_the_mtp_block_changes_no_token() {
    let (engine, tok) = synthetic_engine_with(synthetic::gguf_bytes("deepseek2-mtp"), true);
    assert!(engine.has_mtp());
    let (trunk, _) = synthetic_engine(synthetic::gguf_bytes("deepseek2-v3"));
    assert!(!trunk.has_mtp());
    let ids = synthetic::token_ids("deepseek2-v3");
    let prompts = [ids[..30].to_vec(), ids[..5].to_vec()];
    for prompt in &prompts {
        let with_block = run(&engine, &tok, prompt, Draft::None, 0.0);
        assert_eq!(
            with_block.tokens,
            run(&trunk, &tok, prompt, Draft::None, 0.0).tokens
        );
    }
    let draft = Draft::Mtp { min: 1, max: 4 };
    let (drafted, accepted) = check_with(&engine, &tok, &prompts, draft);
    assert!(drafted > 0, "{drafted} drafted, {accepted} accepted");
    // Twenty prompts (1 to 96 tokens, from different places of the reference sequence), 128
    // greedy tokens each.
    let long = synthetic::token_ids_n("deepseek2-v3", 200);
    for i in 0..20 {
        let (start, len) = (i * 5, 1 + i * 5);
        let prompt = &long[start..start + len];
        let plain = run_n(&engine, &tok, prompt, Draft::None, 0.0, 128);
        let drafted = run_n(&engine, &tok, prompt, draft, 0.0, 128);
        assert_eq!(plain.tokens, drafted.tokens, "prompt {i}");
        assert!(drafted.timings.drafted_tokens > 0);
    }
    // A file without the block cannot load it.
    let gguf = Gguf::from_bytes(synthetic::gguf_bytes("deepseek2-v3")).unwrap();
    let options = EngineOptions {
        mtp: true,
        ..EngineOptions::default()
    };
    let Err(err) = AnyEngine::from_gguf(Arc::new(gguf), &options) else {
        panic!("loaded a multi-token-prediction block the file does not have");
    };
    assert!(err.to_string().contains("nextn_predict_layers"), "{err}");
}

/// The deepseek2-mtp file with its block made a pass-through: `eh_proj` keeps the final
/// state and drops the embedding, the attention and expert outputs are zero and the norms
/// unit. The block's logits are then the trunk's at the position it reads, so its greedy
/// drafts repeat the trunk's greedy token there: the token just chosen.
fn pass_through_mtp_file() -> Vec<u8> {
    let original = Gguf::from_bytes(synthetic::gguf_bytes("deepseek2-mtp")).unwrap();
    let mut w = ferrox_gguf::GgufWriter::new();
    for (key, value) in original.metadata().iter() {
        w.set(key, value.to_owned_value());
    }
    let block = "blk.3.";
    for t in original.tensors() {
        let data = original.tensor_data(t).unwrap();
        let name = t.name.strip_prefix(block).unwrap_or("");
        let (ty, shape, data) = match name {
            "attn_output.weight" | "ffn_down_exps.weight" | "ffn_down_shexp.weight" => {
                (t.ty, t.shape.clone(), vec![0u8; data.len()])
            }
            "nextn.hnorm.weight" | "nextn.shared_head_norm.weight" => (
                t.ty,
                t.shape.clone(),
                1f32.to_le_bytes().repeat(data.len() / 4),
            ),
            "nextn.eh_proj.weight" => {
                let e = t.shape[1] as usize;
                let mut m = vec![0f32; 2 * e * e];
                (0..e).for_each(|r| m[r * 2 * e + e + r] = 1.0);
                let bytes = m.iter().flat_map(|v| v.to_le_bytes()).collect();
                (ferrox_gguf::GgmlType::F32, t.shape.clone(), bytes)
            }
            _ => (t.ty, t.shape.clone(), data.to_vec()),
        };
        w.add_tensor(&t.name, ty, &shape, data).unwrap();
    }
    w.to_bytes()
}

/// The block drafts from the right position's state through the right head: a
/// pass-through block drafts the token just chosen, again and again.
#[test]
fn a_pass_through_mtp_block_drafts_the_chosen_token() {
    let (engine, _) = synthetic_engine_with(pass_through_mtp_file(), true);
    let ids = synthetic::token_ids("deepseek2-v3");
    let mut state = engine.new_state().unwrap();
    let logits = engine
        .forward_batch(&ids[..20], 0, &mut state, ferrox_models::LogitsFor::Last)
        .unwrap();
    let chosen = ferrox_generate::sampling::argmax(logits);
    let mut drafts = Vec::new();
    engine
        .draft_mtp_next(&mut state, chosen, 3, &mut drafts)
        .unwrap();
    assert_eq!(drafts, [chosen; 3]);
    // Drafting wrote nothing the sequence holds: it continues as a fresh one would.
    assert_eq!(state.len(), 20);
    let next = engine
        .forward_token(chosen, 20, &mut state)
        .unwrap()
        .to_vec();
    let mut fresh = engine.new_state().unwrap();
    engine
        .forward_batch(&ids[..20], 0, &mut fresh, ferrox_models::LogitsFor::Last)
        .unwrap();
    assert_eq!(engine.forward_token(chosen, 20, &mut fresh).unwrap(), next);
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
