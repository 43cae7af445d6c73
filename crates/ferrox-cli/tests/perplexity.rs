//! `ferrox perplexity` against llama-perplexity on the same file, text and context:
//! within 0.5% (fixture: crates/ferrox-models/tests/fixtures/reference/
//! gemma3-270m-perplexity.json, made by scripts/reference/gen-gemma-perplexity.sh; the text
//! comes from scripts/reference/fetch-ppl-text.sh, which scripts/test.sh runs).

mod common;

use std::ffi::OsStr;
use std::path::PathBuf;

fn reference() -> serde_json::Value {
    let path = common::repo_root()
        .join("crates/ferrox-models/tests/fixtures/reference/gemma3-270m-perplexity.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ppl_text() -> PathBuf {
    let dir = std::env::var_os("FERROX_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ferrox")
        });
    let path = dir.join("ppl/botchan.txt");
    assert!(
        path.is_file(),
        "{} is missing: run scripts/reference/fetch-ppl-text.sh",
        path.display()
    );
    path
}

#[test]
fn perplexity_matches_llama_perplexity() {
    let reference = reference();
    let chunks = reference["n_chunks"].as_u64().unwrap().to_string();
    let n_ctx = reference["metadata"]["n_ctx"].as_u64().unwrap().to_string();
    let expected = reference["ppl"].as_f64().unwrap();
    let model = common::default_model();
    let text = ppl_text();
    let out = common::ferrox(&[
        OsStr::new("perplexity"),
        OsStr::new("-m"),
        model.as_os_str(),
        OsStr::new("-f"),
        text.as_os_str(),
        OsStr::new("-c"),
        OsStr::new(&n_ctx),
        OsStr::new("--chunks"),
        OsStr::new(&chunks),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last = stdout.lines().last().unwrap();
    // llama-perplexity's exact final-line format.
    let rest = last
        .strip_prefix("Final estimate: PPL = ")
        .unwrap_or_else(|| panic!("final line: {last}"));
    let (ppl, err) = rest.split_once(" +/- ").unwrap();
    let ppl: f64 = ppl.parse().unwrap();
    let err: f64 = err.parse().unwrap();
    let relative = (ppl - expected).abs() / expected;
    eprintln!(
        "ferrox PPL {ppl} +/- {err}, llama.cpp {expected}: relative difference {:.3}%",
        relative * 100.0
    );
    assert!(
        relative < 0.005,
        "PPL {ppl} vs llama.cpp {expected}: {:.3}% apart",
        relative * 100.0
    );
    assert!(err > 0.0 && err < ppl);
    // The running per-chunk line precedes it, as llama-perplexity prints.
    let running = stdout.lines().rev().nth(1).unwrap();
    assert!(
        running.starts_with("[1]") && running.contains(&format!("[{chunks}]")),
        "{running}"
    );
}
