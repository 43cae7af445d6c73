//! Loading a model whose metadata holds an absurd count fails fast and cleanly.
//!
//! For every synthetic architecture (the encoder models too) and every integer key under `{arch}.` (each element of
//! an integer array too), the file is rewritten with the value set to 2^29, 2^31-1 and
//! 2^32-1. Each case loads the tokenizer and the engine with the file's own context length
//! and, if the engine loads, runs one token. Every case must end within a second without a
//! panic, abort or large allocation: with an error, or (only for the keys in [`HARMLESS`],
//! whose size sizes nothing) with logits. At the end the process's peak resident memory must
//! be under 1 GiB. The per-layer counts are also tried stored as one value per layer.

mod synthetic;

#[path = "synthetic/hostile.rs"]
mod hostile;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrox_gguf::{Gguf, OwnedValue};
use ferrox_models::EngineExt;
use ferrox_models::{AnyEngine, Engine, EngineOptions, LogitsFor, Output};
use ferrox_tokenizer::tokenizer::Tokenizer;

/// Keys whose value sizes nothing: a huge one may load and run.
const HARMLESS: &[&str] = &[
    "attention.sliding_window",
    "rope.scaling.original_context_length",
    "attention.temperature_length",
];

/// Whether a huge `key_name` (element `index` of it, for an array) may load and run: it
/// sizes nothing ([`HARMLESS`]), or this model does not use it, as llama.cpp does not.
fn harmless(gguf: &Gguf, arch: &str, key_name: &str, index: Option<usize>) -> bool {
    let meta = gguf.metadata();
    let has = |name: &str| meta.contains(&format!("{arch}.{name}"));
    if HARMLESS.contains(&key_name) {
        return true;
    }
    let moe = has("expert_count");
    let mla = has("kv_lora_rank") || has("attention.kv_lora_rank");
    // An encoder keeps nothing per position: a huge context sizes nothing unless positions
    // are learned (then `position_embd` must have that many rows).
    let encoder = ["nomic-bert", "nomic-bert-moe", "jina-bert-v2"].contains(&arch);
    match key_name {
        "context_length" if encoder => true,
        // Read only when embeddings are pooled (an unknown id is refused there).
        "pooling_type" => true,
        // MoE layers are sized by `expert_feed_forward_length` where it is given.
        "feed_forward_length" if moe && !mla => has("expert_feed_forward_length"),
        // MLA: only the leading dense layers have a dense FFN.
        "feed_forward_length" if mla => {
            let n_dense = meta
                .get_usize(&format!("{arch}.leading_dense_block_count"))
                .unwrap_or(0);
            index.map_or(n_dense == 0, |il| il >= n_dense)
        }
        // MLA caches one latent row per position whatever the KV head count, and with the
        // `*_mla` head sizes the plain ones describe only that row, which is computed from
        // the latent rank instead.
        "attention.head_count_kv" if mla => true,
        "attention.key_length" | "attention.value_length" if mla => has("attention.key_length_mla"),
        _ => false,
    }
}

/// Per-layer counts that may be stored as one value per layer.
const PER_LAYER: &[&str] = &[
    "attention.head_count",
    "attention.head_count_kv",
    "feed_forward_length",
];

/// How long one case may take (an unoptimised build gets more).
fn time_limit() -> Duration {
    if cfg!(debug_assertions) {
        Duration::from_secs(20)
    } else {
        Duration::from_secs(1)
    }
}

enum Outcome {
    /// The engine refused the file or the step (the message).
    Error(String),
    /// The engine loaded and produced logits.
    Ran,
}

/// Loads the tokenizer and the engine from `bytes` and runs one token.
fn run_case(bytes: Vec<u8>) -> Outcome {
    let gguf = match Gguf::from_bytes(bytes) {
        Ok(g) => g,
        Err(e) => return Outcome::Error(format!("parse: {e}")),
    };
    // The tokenizer reads no `{arch}.` count but `vocab_size`; it must not panic either way.
    let _ = Tokenizer::from_gguf(&gguf);
    let options = EngineOptions {
        n_ctx: 0,
        threads: 1,
        ..EngineOptions::default()
    };
    let engine = match AnyEngine::from_gguf(Arc::new(gguf), &options) {
        Ok(e) => e,
        Err(e) => return Outcome::Error(e.to_string()),
    };
    let mut state = match engine.new_state() {
        Ok(s) => s,
        Err(e) => return Outcome::Error(e.to_string()),
    };
    // An encoder embeds (a sequence of its first two tokens) instead.
    let (tokens, output, width) = match engine.is_encoder() {
        true => (&[0, 1][..], Output::Embeddings, engine.embedding_size()),
        false => (
            &[synthetic::BOS_ID][..],
            Output::Logits,
            engine.vocab_size(),
        ),
    };
    match engine.forward_rows(tokens, 0, &mut state, LogitsFor::Last, output) {
        Ok(rows) => {
            assert_eq!(rows.len(), width);
            Outcome::Ran
        }
        Err(e) => Outcome::Error(e.to_string()),
    }
}

/// Peak resident memory of this process (`VmHWM`), in bytes.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[derive(Default)]
struct Tally {
    keys: usize,
    cases: usize,
    errors: usize,
    ran: usize,
    failures: Vec<String>,
}

impl Tally {
    /// Runs one hostile file and records what happened (success is allowed when
    /// `harmless`).
    fn case(&mut self, name: &str, harmless: bool, bytes: Vec<u8>) {
        self.cases += 1;
        let start = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| run_case(bytes)));
        let took = start.elapsed();
        if took > time_limit() {
            self.failures.push(format!("{name}: took {took:?}"));
        }
        match outcome {
            Err(_) => self.failures.push(format!("{name}: panicked")),
            Ok(Outcome::Error(e)) => {
                self.errors += 1;
                if std::env::var_os("HOSTILE_VERBOSE").is_some() {
                    eprintln!("  {name}: {e}");
                }
            }
            Ok(Outcome::Ran) => {
                self.ran += 1;
                if !harmless {
                    self.failures
                        .push(format!("{name}: loaded and ran, expected an error"));
                }
            }
        }
    }
}

#[test]
fn hostile_counts_fail_fast_and_cleanly() {
    let mut failures = Vec::new();
    let models = synthetic::FAMILIES
        .iter()
        .map(|&arch| (arch, synthetic::gguf_bytes(arch)))
        .chain(
            synthetic::bert::ENCODER_MODELS
                .iter()
                .map(|&name| (name, synthetic::bert::gguf_bytes(name))),
        );
    for (arch, bytes) in models {
        let gguf = Gguf::from_bytes(bytes).unwrap();
        let file_arch = gguf.metadata().architecture().unwrap().to_string();
        let mut tally = Tally::default();
        for ck in hostile::count_keys(&gguf) {
            tally.keys += 1;
            let key_name = ck.key[file_arch.len() + 1..].to_string();
            let indices: Vec<Option<usize>> = match ck.array_len {
                Some(n) => (0..n).map(Some).collect(),
                None => vec![None],
            };
            for index in indices {
                for &value in hostile::HOSTILE_VALUES {
                    let bytes = hostile::with_count(&gguf, &ck.key, index, value);
                    let at = index.map_or(String::new(), |i| format!("[{i}]"));
                    let ok = harmless(&gguf, &file_arch, &key_name, index);
                    tally.case(&format!("{arch} {}{at}={value}", ck.key), ok, bytes);
                }
            }
        }
        // The per-layer counts as arrays: the unchanged array must load, then each element
        // is made hostile in turn.
        let n_layer = gguf
            .metadata()
            .get_usize(&format!("{file_arch}.block_count"))
            .unwrap();
        for name in PER_LAYER {
            let key = format!("{file_arch}.{name}");
            let Some(bytes) = hostile::as_per_layer_array(&gguf, &key, n_layer) else {
                continue;
            };
            let as_array = Gguf::from_bytes(bytes).unwrap();
            tally.keys += 1;
            for il in 0..n_layer {
                for &value in hostile::HOSTILE_VALUES {
                    let bytes = hostile::with_count(&as_array, &key, Some(il), value);
                    let ok = harmless(&gguf, &file_arch, name, Some(il));
                    tally.case(&format!("{arch} {key}[{il}]={value}"), ok, bytes);
                }
            }
            match catch_unwind(AssertUnwindSafe(|| {
                run_case(hostile::with_value(
                    &as_array,
                    "general.name",
                    OwnedValue::from("per-layer arrays"),
                ))
            })) {
                Ok(Outcome::Ran) => {}
                Ok(Outcome::Error(e)) => {
                    failures.push(format!("{arch} {key} as an array does not load: {e}"))
                }
                Err(_) => failures.push(format!("{arch} {key} as an array panicked")),
            }
        }
        println!(
            "{arch}: {} keys, {} cases: {} errors, {} loaded and ran",
            tally.keys, tally.cases, tally.errors, tally.ran
        );
        failures.extend(tally.failures);
    }
    let peak = peak_rss();
    if let Some(peak) = peak {
        println!("peak RSS: {} MiB", peak >> 20);
        if peak >= 1 << 30 {
            failures.push(format!("peak RSS {} MiB is over 1 GiB", peak >> 20));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A file without a vocabulary sizes its placeholder tokens by `{arch}.vocab_size`.
#[test]
fn placeholder_vocabulary_is_bounded() {
    let gguf = Gguf::from_bytes(synthetic::gguf_bytes("llama")).unwrap();
    let none = Gguf::from_bytes(hostile::with_value(
        &gguf,
        "tokenizer.ggml.model",
        OwnedValue::from("none"),
    ))
    .unwrap();
    for &value in hostile::HOSTILE_VALUES {
        let bytes = hostile::with_value(&none, "llama.vocab_size", OwnedValue::from(value as u32));
        let file = Gguf::from_bytes(bytes).unwrap();
        let start = Instant::now();
        let err = Tokenizer::from_gguf(&file).expect_err("placeholder count is refused");
        assert!(start.elapsed() < time_limit());
        assert!(err.to_string().contains("llama.vocab_size"), "{err}");
    }
    let bytes = hostile::with_value(&none, "llama.vocab_size", OwnedValue::from(300u32));
    let tokenizer = Tokenizer::from_gguf(&Gguf::from_bytes(bytes).unwrap()).unwrap();
    assert_eq!(tokenizer.vocab().len(), 300);
}

#[test]
fn mrope_sections_are_checked() {
    use ferrox_gguf::OwnedArray;
    for arch in ["qwen2vl", "qwen3vl"] {
        let gguf = Gguf::from_bytes(synthetic::gguf_bytes(arch)).unwrap();
        let key = format!("{arch}.rope.dimension_sections");
        let sections = |v: Vec<i32>| OwnedValue::Array(OwnedArray::I32(v));
        for (value, says) in [
            (sections(vec![-1, 12, 12, 0]), "none negative"),
            (sections(vec![0, 0, 0, 0]), "not all zero"),
            (sections(vec![8, 12, 12, 0, 4]), "at most four"),
            (sections(vec![40, 40, 0, 0]), "more pairs than"),
            (sections(vec![i32::MAX, 0, 0, 0]), "more pairs than"),
            (OwnedValue::String("8,12,12,0".into()), "dimension_sections"),
        ] {
            let bytes = hostile::with_value(&gguf, &key, value.clone());
            let file = Arc::new(Gguf::from_bytes(bytes).unwrap());
            let err = AnyEngine::from_gguf(file, &EngineOptions::default())
                .err()
                .unwrap_or_else(|| panic!("{arch}: {value:?} loaded"));
            assert!(err.to_string().contains(says), "{arch} {value:?}: {err}");
        }
    }
}
