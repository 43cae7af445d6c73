//! `ferrox embedding` on the synthetic BERT: texts split by the separator, one normalized
//! vector each (or every token's with `--pooling none`), the file's pooling by default; a
//! pooling the model cannot do and generation with an embedding model exit with status 2.

mod common;
#[path = "../../ferrox-models/tests/synthetic/mod.rs"]
mod synthetic;

use std::ffi::OsStr;

use common::ferrox;

fn embeddings(out: &std::process::Output) -> Vec<Vec<f64>> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            d["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

#[test]
fn embeds_texts_and_refuses_what_the_model_cannot_do() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("bert.gguf");
    std::fs::write(&model, synthetic::bert::gguf_bytes("bert")).unwrap();
    let m = model.as_os_str();
    let run = |extra: &[&str]| {
        let mut args: Vec<&OsStr> = vec![OsStr::new("embedding"), OsStr::new("-m"), m];
        args.extend(["-t", "2", "--embd-output-format", "json"].map(OsStr::new));
        args.extend(extra.iter().map(OsStr::new));
        ferrox(&args)
    };
    let pooled = embeddings(&run(&["-p", "ba ce\nbaba di fo"]));
    assert_eq!(pooled.len(), 2);
    for v in &pooled {
        assert_eq!(v.len(), 128);
        let norm: f64 = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    }
    assert_ne!(pooled[0], pooled[1]);
    // The file pools by CLS: the same as asking for it.
    assert_eq!(
        pooled,
        embeddings(&run(&["-p", "ba ce\nbaba di fo", "--pooling", "cls"]))
    );
    // [CLS] ba ce [SEP]: four tokens, four vectors.
    assert_eq!(
        embeddings(&run(&["-p", "ba ce", "--pooling", "none"])).len(),
        4
    );
    let rank = run(&["-p", "ba", "--pooling", "rank"]);
    assert_eq!(rank.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&rank.stderr).contains("classification head"));
    let generate = ferrox(&[
        OsStr::new("run"),
        OsStr::new("-m"),
        m,
        OsStr::new("-p"),
        OsStr::new("ba"),
    ]);
    assert_eq!(generate.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&generate.stderr).contains("embedding model"));
}
