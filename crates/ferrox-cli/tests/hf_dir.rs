//! The commands on a Hugging Face checkpoint directory (a tiny `kimi-linear` written from
//! the synthetic GGUF's weights): `run -m DIR` generates; a broken directory exits with the
//! status of other load errors, naming the problem.

mod common;
#[path = "../../ferrox-hf/tests/hf_checkpoint/mod.rs"]
mod hf_checkpoint;
#[path = "../../ferrox-models/tests/synthetic/mod.rs"]
mod synthetic;

use std::ffi::OsStr;
use std::path::Path;

use common::ferrox;
use ferrox_gguf::Gguf;
use serde_json::Value;

fn checkpoint_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let gguf = Gguf::from_bytes(synthetic::kimi::kimi_linear_gguf_bytes()).unwrap();
    hf_checkpoint::write_kimi_linear_dir(dir.path(), &gguf);
    dir
}

fn run(dir: &Path) -> std::process::Output {
    let s = OsStr::new;
    ferrox(&[
        s("run"),
        s("-m"),
        dir.as_os_str(),
        s("-p"),
        s("hello world"),
        s("-n"),
        s("8"),
        s("--temp"),
        s("0"),
        s("--json"),
        s("-t"),
        s("1"),
    ])
}

#[test]
fn run_generates_from_a_checkpoint_directory() {
    let dir = checkpoint_dir();
    let out = run(dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    // The tiktoken vocabulary: "hello" and " world" are single tokens.
    assert_eq!(v["prompt_tokens"], serde_json::json!([259, 264]), "{v}");
    let n = v["tokens"].as_array().unwrap().len();
    match v["finish_reason"].as_str() {
        Some("length") => assert_eq!(n, 8, "{v}"),
        Some("stop") => assert!(n <= 8, "{v}"),
        other => panic!("finish_reason {other:?}"),
    }
}

#[test]
fn broken_directories_are_input_errors() {
    let dir = checkpoint_dir();
    std::fs::remove_file(dir.path().join("model-00001-of-00002.safetensors")).unwrap();
    let out = run(dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("model-00001-of-00002.safetensors"),
        "{stderr}"
    );

    let dir = checkpoint_dir();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"architectures": ["FooLM"]}"#,
    )
    .unwrap();
    let out = run(dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("FooLM"), "{stderr}");

    let empty = tempfile::tempdir().unwrap();
    let out = run(empty.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("config.json"), "{stderr}");
}
