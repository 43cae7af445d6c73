//! `ferrox perplexity --kl-divergence-base / --kl-divergence` against llama-perplexity's own
//! base file (crates/ferrox-cli/tests/fixtures/kl/, made by
//! scripts/reference/gen-kl-divergence-base.sh) for the synthetic `llama` model with F32
//! matrices: the files are interchangeable both ways, and the comparison shows the two
//! engines agreeing to summation order (F32 weights, f32 cache).

mod common;
#[path = "../../ferrox-models/tests/synthetic/mod.rs"]
mod synthetic;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use ferrox_gguf::GgmlType;
use sha2::{Digest, Sha256};

fn fixture_dir() -> PathBuf {
    common::repo_root().join("crates/ferrox-cli/tests/fixtures/kl")
}

fn fixture() -> serde_json::Value {
    let text = std::fs::read_to_string(fixture_dir().join("llama-f32.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The model llama-perplexity ran, rebuilt and checked byte for byte.
fn model(dir: &Path) -> PathBuf {
    let bytes = synthetic::gguf_bytes_with("llama", Some(GgmlType::F32));
    let sha = format!("{:x}", Sha256::digest(&bytes));
    assert_eq!(
        sha,
        fixture()["gguf_sha256"].as_str().unwrap(),
        "the synthetic llama model changed: regenerate the fixture \
         (scripts/reference/gen-kl-divergence-base.sh)"
    );
    let path = dir.join("llama-f32.gguf");
    std::fs::write(&path, bytes).unwrap();
    path
}

fn run_ok(args: &[&OsStr]) -> String {
    let out = common::ferrox(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The number after `label` on its summary line (`Mean    KLD:  0.000001 ± ...`).
fn figure(stdout: &str, label: &str) -> f64 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no `{label}` line in\n{stdout}"));
    line[label.len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .trim_end_matches('%')
        .parse()
        .unwrap()
}

fn compare(model: &Path, base: &Path) -> String {
    let s = OsStr::new;
    run_ok(&[
        s("perplexity"),
        s("-m"),
        model.as_os_str(),
        s("--kv-f32"),
        s("--kl-divergence"),
        s("--kl-divergence-base"),
        base.as_os_str(),
    ])
}

#[test]
fn matches_a_llama_perplexity_base_file() {
    let dir = tempfile::tempdir().unwrap();
    let model = model(dir.path());
    let stdout = compare(&model, &fixture_dir().join("llama-f32.base.bin"));
    for header in [
        "chunk             PPL               ln(PPL(Q)/PPL(base))",
        "====== Perplexity statistics ======",
        "====== KL divergence statistics ======",
        "====== Token probability statistics ======",
    ] {
        assert!(stdout.contains(header), "{header} missing:\n{stdout}");
    }
    let chunks = fixture()["n_chunks"].as_u64().unwrap() as usize;
    assert!(stdout.contains(&format!("\n{chunks:4}    ")), "{stdout}");
    // The base stores log-probabilities in 16 bits over 16 nats: a KL divergence of 1e-5 is
    // that rounding; a real difference between the engines would show far above it.
    let kld = figure(&stdout, "Mean    KLD:");
    assert!(kld.abs() < 1e-5, "mean KLD {kld}\n{stdout}");
    assert!(figure(&stdout, "Maximum KLD:") < 1e-4, "{stdout}");
    assert_eq!(figure(&stdout, "Same top p:"), 100.0, "{stdout}");
    let ppl = figure(&stdout, "Mean PPL(Q)                   :");
    let expected = fixture()["ppl"].as_f64().unwrap();
    assert!(
        (ppl / expected - 1.0).abs() < 1e-5,
        "PPL {ppl} vs {expected}"
    );
}

/// Decodes a base file's records into log-probabilities (after the header and tokens).
fn log_probs(bytes: &[u8], header: usize, n_vocab: usize) -> Vec<f32> {
    let words: Vec<u16> = bytes[header..]
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect();
    let record = 2 * n_vocab.div_ceil(2) + 4;
    let mut out = Vec::new();
    for r in words.chunks_exact(record) {
        let f = |i: usize| f32::from_bits(u32::from(r[i]) | (u32::from(r[i + 1]) << 16));
        let (scale, min) = (f(0), f(2));
        out.extend(
            r[4..4 + n_vocab]
                .iter()
                .map(|&c| scale * f32::from(c) + min),
        );
    }
    out
}

#[test]
fn writes_the_base_file_llama_perplexity_writes() {
    let dir = tempfile::tempdir().unwrap();
    let model = model(dir.path());
    let ours = dir.path().join("ours.bin");
    let fx = fixture();
    let (n_ctx, chunks) = (fx["n_ctx"].to_string(), fx["n_chunks"].to_string());
    let s = OsStr::new;
    let text = fixture_dir().join("text.txt");
    run_ok(&[
        s("perplexity"),
        s("-m"),
        model.as_os_str(),
        s("--kv-f32"),
        s("-f"),
        text.as_os_str(),
        s("-c"),
        s(&n_ctx),
        s("--chunks"),
        s(&chunks),
        s("--kl-divergence-base"),
        ours.as_os_str(),
    ]);
    let ours_bytes = std::fs::read(&ours).unwrap();
    let theirs = std::fs::read(fixture_dir().join("llama-f32.base.bin")).unwrap();
    assert_eq!(ours_bytes.len(), theirs.len());
    let n_vocab = u32::from_le_bytes(theirs[12..16].try_into().unwrap()) as usize;
    let n_ctx: usize = n_ctx.parse().unwrap();
    let chunks: usize = chunks.parse().unwrap();
    // Magic, sizes and the evaluated tokens (the same tokenization) are identical.
    let header = 20 + 4 * n_ctx * chunks;
    assert_eq!(ours_bytes[..header], theirs[..header]);
    let (a, b) = (
        log_probs(&ours_bytes, header, n_vocab),
        log_probs(&theirs, header, n_vocab),
    );
    let worst = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    // One quantization step over 16 nats is 2.4e-4.
    assert!(worst < 1e-3, "largest log-probability difference {worst}");
    // And llama-perplexity's own comparison reads our file the same way.
    let stdout = compare(&model, &ours);
    assert!(figure(&stdout, "Mean    KLD:").abs() < 1e-6, "{stdout}");
}

#[test]
fn a_damaged_base_file_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let model = model(dir.path());
    let mut bytes = std::fs::read(fixture_dir().join("llama-f32.base.bin")).unwrap();
    bytes.truncate(bytes.len() - 100);
    let cut = dir.path().join("cut.bin");
    std::fs::write(&cut, &bytes).unwrap();
    let junk = dir.path().join("junk.bin");
    std::fs::write(&junk, b"not a logits file").unwrap();
    for (path, message) in [(&cut, "bytes, but 4 chunks"), (&junk, "log-probabilities")] {
        let s = OsStr::new;
        let out = common::ferrox(&[
            s("perplexity"),
            s("-m"),
            model.as_os_str(),
            s("--kl-divergence"),
            s("--kl-divergence-base"),
            path.as_os_str(),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(message), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
