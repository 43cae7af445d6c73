//! Fixtures recorded from llama.cpp's `llama-tokenize` (scripts/gen-llama-tokenize-fixtures.py),
//! in the layout of llama.cpp's vocab suite, over vocab-only files of that suite.

use std::path::{Path, PathBuf};

use ferrox_gguf::Gguf;
use ferrox_tokenizer::tokenizer::{TokenId, Tokenizer};

/// Where `scripts/fetch-vocab-suite.sh` puts llama.cpp's vocab-only files.
fn suite_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FERROX_VOCAB_SUITE_DIR") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    Path::new(&home).join(".cache/ferrox/vocab-suite")
}

/// The tokenizer of the suite's `ggml-vocab-NAME.gguf`.
pub fn suite_tokenizer(name: &str) -> Tokenizer {
    let path = suite_dir().join(format!("ggml-vocab-{name}.gguf"));
    assert!(
        path.is_file(),
        "{} is missing: run scripts/fetch-vocab-suite.sh (or point FERROX_VOCAB_SUITE_DIR at it)",
        path.display()
    );
    let gguf = Gguf::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf(&gguf).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Reads `tests/fixtures/PREFIX.inp` / `.out`: inputs each followed by
/// "\n__ggml_vocab_test__\n", one line of space-separated ids per input.
pub fn read_fixture(prefix: &str) -> Vec<(String, Vec<TokenId>)> {
    let base = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(prefix);
    let read = |ext: &str| {
        let path = base.with_extension(ext);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let (inp, out) = (read("inp"), read("out"));
    let inputs: Vec<String> = inp
        .split_inclusive("\n__ggml_vocab_test__\n")
        .map(|s| {
            s.strip_suffix("\n__ggml_vocab_test__\n")
                .unwrap_or(s)
                .to_string()
        })
        .collect();
    let ids: Vec<Vec<TokenId>> = out
        .lines()
        .map(|line| {
            line.split_whitespace()
                .map(|t| {
                    t.parse()
                        .unwrap_or_else(|e| panic!("{prefix}.out: id {t:?}: {e}"))
                })
                .collect()
        })
        .collect();
    assert_eq!(
        inputs.len(),
        ids.len(),
        "{prefix}: inputs and outputs differ in number"
    );
    inputs.into_iter().zip(ids).collect()
}

/// Tokenizes every input of the fixture and fails listing the inputs that differ.
pub fn check_fixture(tokenizer: &Tokenizer, prefix: &str, add_special: bool, parse_special: bool) {
    let cases = read_fixture(prefix);
    let mut failures = Vec::new();
    for (text, expected) in &cases {
        let got = tokenizer.encode(text, add_special, parse_special);
        if &got != expected {
            failures.push(format!(
                "  {text:?}\n    expected {expected:?}\n    got      {got:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{prefix}: {} of {} inputs differ from llama.cpp:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// Inputs that must neither panic nor take quadratic time: 256 KiB words,
/// whitespace runs, repeated unknown codepoints, and every byte sequence the lossy UTF-8
/// decoding of pseudo-random bytes gives.
pub fn check_hostile_inputs(tokenizer: &Tokenizer) {
    const LEN: usize = 1 << 18;
    let long = [
        "a".repeat(LEN),
        " ".repeat(LEN),
        "\n \t".repeat(LEN / 3),
        "é".repeat(LEN / 2),
        "中".repeat(LEN / 3),
        "🦙".repeat(LEN / 4),
        "\u{10FFFF}".repeat(LEN / 4),
        "a\u{301}".repeat(LEN / 3),
        "!?".repeat(LEN / 2),
    ];
    for text in &long {
        let ids = tokenizer.encode(text, true, true);
        let _ = tokenizer.decode(&ids);
    }
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut bytes = vec![0u8; 64 * 1024];
    for _ in 0..4 {
        for b in &mut bytes {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *b = state as u8;
        }
        let text = String::from_utf8_lossy(&bytes);
        for parse_special in [false, true] {
            let ids = tokenizer.encode(&text, true, parse_special);
            let _ = tokenizer.decode(&ids);
        }
    }
}
