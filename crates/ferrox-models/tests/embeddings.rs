//! Embeddings against llama.cpp: sweep models (every matrix F32; a grouped-query decoder of
//! three families and an MLA model) and the encoder models (`synthetic/bert.rs`: bert,
//! nomic-bert) embed token sequences of 1 to 61 tokens with every pooling type, as
//! llama.cpp's `llama_get_embeddings_seq` / `_ith` give them (flash attention off, an f32
//! cache: only the order of summation differs). The decoders' sequences also run in chunks
//! of 7 tokens, and several sequences share each step, as the server runs them: the same
//! numbers either way. The encoders' Q8_0 twins run at the defaults (an f16 cache) against
//! llama.cpp's defaults, within its own flash-attention on/off spread. A reranker
//! (bert-reranker) also gives its classification head's score (rank pooling).
//!
//! The reference is `fixtures/embeddings/` (made by
//! `scripts/reference/gen-embedding-refs.sh`); the test rebuilds each model with the same
//! generator and checks its sha256 first.

mod synthetic;

use std::path::PathBuf;
use std::sync::Arc;

use ferrox_core::KvStorage;
use ferrox_generate::embedding::{embed_tokens, Pooler, Pooling};
use ferrox_gguf::{GgmlType, Gguf};
use ferrox_memory::{MemoryShape, SequenceMemory};
use ferrox_models::{
    step_sequences, AnyEngine, Engine, EngineExt, EngineOptions, LogitsFor, Output, SeqWork,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Largest accepted |ours - llama.cpp| of an embedding value, relative to the vector's
/// largest magnitude: summation order only.
const TOLERANCE: f32 = 1e-4;

/// gemma3 and BERT compute GELU through ggml's f16 table (see `length_sweep.rs`): an input
/// that moves across an f16 boundary moves that activation by an f16 step.
const GELU_TOLERANCE: f32 = 1e-3;

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/embeddings")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// The largest difference, relative to the reference's largest magnitude.
fn relative_diff(ours: &[f32], reference: &[f32]) -> f32 {
    assert_eq!(ours.len(), reference.len());
    let scale = reference
        .iter()
        .fold(0.0f32, |m, x| m.max(x.abs()))
        .max(1e-6);
    ours.iter()
        .zip(reference)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
        / scale
}

/// A fixture's model: an encoder model (`bert`, `nomic-bert`, or their `.q8_0` twins), or a
/// sweep model.
fn model_bytes(name: &str) -> Vec<u8> {
    let (base, ty) = match name.strip_suffix(".q8_0") {
        Some(base) => (base, GgmlType::Q8_0),
        None => (name, GgmlType::F32),
    };
    match base {
        "qwen3-reranker" => synthetic::qwen3_reranker_bytes(),
        _ if synthetic::bert::ENCODER_MODELS.contains(&base) => {
            synthetic::bert::gguf_bytes_with(base, ty)
        }
        _ => synthetic::sweep_gguf_bytes(name),
    }
}

/// The fixture's cache: f16 for the runs at llama.cpp's defaults, else f32.
fn kv_storage(fx: &Value) -> KvStorage {
    match fx["settings"]["type_k"].as_str() {
        Some("f16") => KvStorage::F16,
        _ => KvStorage::F32,
    }
}

fn load(name: &str, fx: &Value) -> AnyEngine {
    let bytes = model_bytes(name);
    let sha: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        sha,
        fx["gguf_sha256"].as_str().unwrap(),
        "{name}: the model is not the file llama.cpp ran"
    );
    let options = EngineOptions {
        n_ctx: 256,
        threads: 2,
        kv_storage: kv_storage(fx),
        ..EngineOptions::default()
    };
    AnyEngine::from_gguf(Arc::new(Gguf::from_bytes(bytes).unwrap()), &options).unwrap()
}

fn sequences(fx: &Value) -> Vec<Vec<u32>> {
    fx["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            s.as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}

/// Every sequence of the fixture, each pooling, alone and (a decoder) in chunks of 7: returns
/// the largest relative difference.
fn check_alone(name: &str, engine: &AnyEngine, fx: &Value, tol: f32) -> f32 {
    assert_eq!(
        engine.embedding_size(),
        fx["n_embd"].as_u64().unwrap() as usize
    );
    let mut state = engine.new_state().unwrap();
    let mut worst = 0.0f32;
    let poolings = [
        Pooling::None,
        Pooling::Mean,
        Pooling::Cls,
        Pooling::Last,
        Pooling::Rank,
    ];
    for pooling in poolings {
        let Some(reference) = fx["pooled"][pooling.name()].as_array() else {
            assert_eq!(pooling, Pooling::Rank, "{name}: no {pooling:?} reference");
            continue;
        };
        for (i, (tokens, expected)) in sequences(fx).iter().zip(reference).enumerate() {
            let expected: Vec<Vec<f32>> = expected.as_array().unwrap().iter().map(floats).collect();
            let batches: &[usize] = if engine.is_encoder() {
                &[512]
            } else {
                &[512, 7]
            };
            for &batch in batches {
                let ours = embed_tokens(engine, &mut state, tokens, pooling, batch).unwrap();
                assert_eq!(
                    ours.len(),
                    expected.len(),
                    "{name} {pooling:?} sequence {i}"
                );
                for (row, (a, b)) in ours.iter().zip(&expected).enumerate() {
                    // The reference holds a head's first score (the one llama-server reports).
                    let a = if pooling == Pooling::Rank {
                        &a[..b.len()]
                    } else {
                        a
                    };
                    let d = relative_diff(a, b);
                    assert!(
                        d <= tol,
                        "{name} {pooling:?}, sequence {i} ({} tokens), row {row}, batch {batch}: \
                         relative difference {d:.2e} > {tol:.0e}",
                        tokens.len()
                    );
                    worst = worst.max(d);
                }
            }
        }
    }
    worst
}

/// The fixture's sequences embedded together, one step after another in chunks of 16 (a
/// paged memory, as the server's; an encoder's whole, in one step), each pooled by mean:
/// the same bits as alone.
fn check_together(name: &str, engine: &AnyEngine, fx: &Value) {
    let seqs = sequences(fx);
    let mut memory = SequenceMemory::new(
        engine.memory_spec(),
        MemoryShape {
            n_blocks: 64,
            block_tokens: 16,
            max_sequences: seqs.len(),
            n_ctx: engine.context_size(),
            prefix_cache: false,
        },
    )
    .unwrap();
    let ids: Vec<_> = seqs
        .iter()
        .map(|s| memory.admit(&[], s.len()).unwrap().seq)
        .collect();
    let mut scratch = engine.new_scratch();
    let mut poolers: Vec<Pooler> = seqs
        .iter()
        .map(|_| Pooler::new(Pooling::Mean, engine))
        .collect();
    let mut outs: Vec<Vec<f32>> = vec![Vec::new(); seqs.len()];
    let mut fed = vec![0usize; seqs.len()];
    let chunk = if engine.is_encoder() { usize::MAX } else { 16 };
    while fed.iter().zip(&seqs).any(|(f, s)| f < &s.len()) {
        let live: Vec<usize> = (0..seqs.len())
            .filter(|&i| fed[i] < seqs[i].len())
            .collect();
        let work: Vec<SeqWork<'_>> = live
            .iter()
            .map(|&i| SeqWork {
                seq: ids[i],
                tokens: &seqs[i][fed[i]..fed[i].saturating_add(chunk).min(seqs[i].len())],
                logits: LogitsFor::All,
                output: Output::Embeddings,
                position_shift: 0,
            })
            .collect();
        let mut bufs: Vec<&mut Vec<f32>> = outs
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| live.contains(i))
            .map(|(_, b)| b)
            .collect();
        step_sequences(engine, &mut memory, &mut scratch, &work, &mut bufs).unwrap();
        for (&i, w) in live.iter().zip(&work) {
            poolers[i].push(&outs[i]);
            fed[i] += w.tokens.len();
        }
    }
    let mut state = engine.new_state().unwrap();
    for (i, pooler) in poolers.into_iter().enumerate() {
        let alone = embed_tokens(engine, &mut state, &seqs[i], Pooling::Mean, 512).unwrap();
        assert_eq!(
            pooler.finish(engine).unwrap(),
            alone,
            "{name}: sequence {i} embedded with others differs from alone"
        );
    }
}

fn embeddings_match(name: &str, tol: f32) {
    let fx = fixture(name);
    let engine = load(name, &fx);
    let worst = check_alone(name, &engine, &fx, tol);
    eprintln!("{name}: largest relative difference {worst:.2e}");
    check_together(name, &engine, &fx);
}

#[test]
fn llama_embeddings() {
    embeddings_match("llama.f32", TOLERANCE);
}

#[test]
fn qwen2_embeddings() {
    embeddings_match("qwen2.f32", TOLERANCE);
}

#[test]
fn gemma3_embeddings() {
    embeddings_match("gemma3.f32", GELU_TOLERANCE);
}

#[test]
fn mla_embeddings() {
    embeddings_match("deepseek2-sweep", TOLERANCE);
}

/// BERT's GELU goes through ggml's f16 table, as gemma's does.
#[test]
fn bert_embeddings() {
    embeddings_match("bert", GELU_TOLERANCE);
}

/// ALiBi, q/k LayerNorms, the second post-attention norm, GEGLU (its GELU from ggml's
/// table, as BERT's).
#[test]
fn jina_bert_v2_embeddings() {
    embeddings_match("jina-bert-v2", GELU_TOLERANCE);
}

#[test]
fn jina_bert_v2_embeddings_at_defaults() {
    at_defaults("jina-bert-v2.q8_0");
}

/// Routed ungated GELU experts on every other layer.
#[test]
fn nomic_bert_moe_embeddings() {
    embeddings_match("nomic-bert-moe", GELU_TOLERANCE);
}

#[test]
fn nomic_bert_moe_embeddings_at_defaults() {
    at_defaults("nomic-bert-moe.q8_0");
}

#[test]
fn nomic_bert_embeddings() {
    embeddings_match("nomic-bert", TOLERANCE);
}

/// At the defaults: within twice llama.cpp's own flash-attention on/off spread.
fn at_defaults(name: &str) {
    let fx = fixture(name);
    let band = fx["self_band"]["max_relative"].as_f64().unwrap() as f32;
    embeddings_match(name, 2.0 * band);
}

/// The classification head's score (rank pooling) too.
#[test]
fn bert_reranker_scores() {
    embeddings_match("bert-reranker", GELU_TOLERANCE);
}

/// A decoder's head: the last token's row, the softmax of the two labels.
#[test]
fn qwen3_reranker_scores() {
    embeddings_match("qwen3-reranker", TOLERANCE);
}

#[test]
fn bert_reranker_scores_at_defaults() {
    at_defaults("bert-reranker.q8_0");
}

#[test]
fn bert_embeddings_at_defaults() {
    at_defaults("bert.q8_0");
}

#[test]
fn nomic_bert_embeddings_at_defaults() {
    at_defaults("nomic-bert.q8_0");
}

/// Logits and embeddings rows in one step: each sequence gets what it asked for, the same
/// as when it runs alone.
#[test]
fn logits_and_embeddings_share_a_step() {
    let name = "llama.f32";
    let fx = fixture(name);
    let engine = load(name, &fx);
    let seqs = sequences(&fx);
    let (a, b) = (&seqs[1], &seqs[2]);
    let mut memory = SequenceMemory::new(
        engine.memory_spec(),
        MemoryShape {
            n_blocks: 16,
            block_tokens: 16,
            max_sequences: 2,
            n_ctx: engine.context_size(),
            prefix_cache: false,
        },
    )
    .unwrap();
    let (sa, sb) = (
        memory.admit(&[], a.len()).unwrap().seq,
        memory.admit(&[], b.len()).unwrap().seq,
    );
    let work = [
        SeqWork {
            seq: sa,
            tokens: a,
            logits: LogitsFor::All,
            output: Output::Embeddings,
            position_shift: 0,
        },
        SeqWork {
            seq: sb,
            tokens: b,
            logits: LogitsFor::Last,
            output: Output::Logits,
            position_shift: 0,
        },
    ];
    let (mut embd, mut logits) = (Vec::new(), Vec::new());
    let mut scratch = engine.new_scratch();
    step_sequences(
        &engine,
        &mut memory,
        &mut scratch,
        &work,
        &mut [&mut embd, &mut logits],
    )
    .unwrap();
    assert_eq!(embd.len(), a.len() * engine.embedding_size());
    assert_eq!(logits.len(), engine.vocab_size());
    let mut state = engine.new_state().unwrap();
    let alone = embed_tokens(&engine, &mut state, a, Pooling::None, 512).unwrap();
    assert_eq!(embd, alone.concat());
    let mut state = engine.new_state().unwrap();
    let alone = engine
        .forward_batch(b, 0, &mut state, LogitsFor::Last)
        .unwrap();
    assert_eq!(logits, alone);
}
