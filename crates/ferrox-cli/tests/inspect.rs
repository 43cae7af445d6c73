mod common;

use std::ffi::OsStr;
use std::process::Command;

use common::{default_model, ferrox};
use serde_json::Value as Json;

/// Floats compare at f32 precision: gguf-py prints an f32's exact binary value
/// (9.999999974752427e-07), we print its shortest form (1e-06).
fn same(a: &Json, b: &Json) -> bool {
    match (a, b) {
        (Json::Number(x), Json::Number(y)) if x.is_f64() || y.is_f64() => {
            x.as_f64().map(|v| v as f32) == y.as_f64().map(|v| v as f32)
        }
        (Json::Array(x), Json::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        _ => a == b,
    }
}

#[test]
fn inspect_matches_gguf_py_on_the_default_model() {
    let model = default_model();
    let out = ferrox(&[
        OsStr::new("inspect"),
        OsStr::new("--json"),
        OsStr::new("--full-arrays"),
        model.as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ours: Json = serde_json::from_slice(&out.stdout).unwrap();

    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let py = Command::new(&python)
        .arg(common::repo_root().join("scripts/gguf-py-dump.py"))
        .arg(&model)
        .output()
        .expect("run python3");
    assert!(
        py.status.success(),
        "gguf-py failed (install it: pip install gguf): {}",
        String::from_utf8_lossy(&py.stderr)
    );
    let theirs: Json = serde_json::from_slice(&py.stdout).unwrap();

    // Same tensor names, types, shapes, offsets and sizes, in the same order.
    let tensors = ours["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 236);
    assert_eq!(ours["tensors"], theirs["tensors"]);

    let (ours, theirs) = (
        ours["metadata"].as_object().unwrap(),
        theirs["metadata"].as_object().unwrap(),
    );
    assert_eq!(ours.len(), theirs.len());
    for (key, value) in theirs {
        assert!(same(&ours[key], value), "metadata `{key}` differs");
    }
    assert_eq!(ours["general.architecture"], "gemma3");
    assert_eq!(
        ours["tokenizer.ggml.tokens"].as_array().unwrap().len(),
        262_144
    );
}

#[test]
fn inspect_text_lists_metadata_tensors_and_totals() {
    let out = ferrox(&[OsStr::new("inspect"), default_model().as_os_str()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("architecture: gemma3"));
    assert!(text.contains("gemma3.context_length"));
    assert!(
        text.contains("[string; 262144] [\"<pad>\", \"<eos>\""),
        "long arrays are summarized"
    );
    assert!(text.contains("token_embd.weight"));
    assert!(text.contains("totals: 236 tensors, 268098176 parameters"));
}

fn assert_clean_failure(what: &str, out: &std::process::Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{what}: stderr: {stderr}");
    assert_eq!(
        stderr.lines().count(),
        1,
        "{what}: one line on stderr: {stderr}"
    );
    assert!(stderr.starts_with("error: "), "{what}: {stderr}");
    assert!(!stderr.contains("panicked"), "{what}");
    assert!(out.stdout.is_empty(), "{what}");
}

#[test]
fn truncated_and_corrupted_models_fail_cleanly() {
    let model = std::fs::read(default_model()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("header only", model[..100].to_vec()),
        ("cut in the metadata", model[..4_000_000].to_vec()),
        ("cut in the tensor data", model[..model.len() / 2].to_vec()),
        ("cut by one byte", model[..model.len() - 1].to_vec()),
        ("huge metadata count", {
            let mut m = model[..1_000_000].to_vec();
            m[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
            m
        }),
        ("bad magic", {
            let mut m = model[..1000].to_vec();
            m[0] = b'X';
            m
        }),
    ];
    for (what, bytes) in cases {
        let path = dir.path().join("bad.gguf");
        std::fs::write(&path, bytes).unwrap();
        let out = ferrox(&[OsStr::new("inspect"), path.as_os_str()]);
        assert_clean_failure(what, &out);
    }
    let out = ferrox(&[OsStr::new("inspect"), OsStr::new("/nonexistent/model.gguf")]);
    assert_clean_failure("missing file", &out);
}
