//! Encoding ~1 MB of mixed English and code with llama.cpp's suite vocabularies
//! (llama-spm: SentencePiece BPE; llama-bpe: byte-level BPE). Needs the vocab suite
//! (scripts/fetch-vocab-suite.sh); a vocabulary whose tokenizer is missing is skipped.

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ferrox_gguf::Gguf;
use ferrox_tokenizer::tokenizer::Tokenizer;

const TARGET_BYTES: usize = 1 << 20;

/// English prose and Rust code from this repository, interleaved and repeated to ~1 MB.
fn mixed_text() -> String {
    const PARTS: &[&str] = &[
        include_str!("../../../README.md"),
        include_str!("../../ferrox-gguf/src/parse.rs"),
        include_str!("../../ferrox-gguf/README.md"),
        include_str!("../../ferrox-gguf/src/value.rs"),
        include_str!("../src/tokenizer/vocab.rs"),
    ];
    let mut text = String::with_capacity(TARGET_BYTES + 64 * 1024);
    'fill: loop {
        for part in PARTS {
            if text.len() >= TARGET_BYTES {
                break 'fill;
            }
            text.push_str(part);
            text.push('\n');
        }
    }
    text
}

fn suite_dir() -> PathBuf {
    match std::env::var_os("FERROX_VOCAB_SUITE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/ferrox/vocab-suite"),
    }
}

fn bench_encode(c: &mut Criterion) {
    let text = mixed_text();
    let mut group = c.benchmark_group("encode_1mb");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(text.len() as u64));
    for name in ["llama-spm", "llama-bpe"] {
        let path = suite_dir().join(format!("ggml-vocab-{name}.gguf"));
        let tokenizer = match Gguf::open(&path)
            .map_err(|e| e.to_string())
            .and_then(|g| Tokenizer::from_gguf(&g).map_err(|e| e.to_string()))
        {
            Ok(t) => t,
            Err(e) => {
                eprintln!("skipping {name}: {e} (scripts/fetch-vocab-suite.sh fetches the suite)");
                continue;
            }
        };
        group.bench_function(name, |b| {
            b.iter(|| black_box(tokenizer.encode(black_box(&text), false, false)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_encode);
criterion_main!(benches);
