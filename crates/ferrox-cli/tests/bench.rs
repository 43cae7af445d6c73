//! `ferrox bench` with several cache types (llama-bench's `-ctk f16,q8_0`): one result per
//! combination and test, each with its own types and sequence memory.

mod common;
#[path = "../../ferrox-models/tests/synthetic/mod.rs"]
mod synthetic;

use std::ffi::OsStr;

use common::ferrox;
use serde_json::Value;

#[test]
fn bench_measures_every_combination_of_the_listed_cache_types() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("llama.gguf");
    std::fs::write(&path, synthetic::gguf_bytes("llama")).unwrap();
    let args = [
        "bench",
        "-m",
        path.to_str().unwrap(),
        "-p",
        "8",
        "-n",
        "4",
        "-d",
        "40",
        "-r",
        "2",
        "-t",
        "1",
        "-ctk",
        "f16,q8_0",
        "-ctv",
        "q8_0",
        "--json",
    ];
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let out = ferrox(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    let seen: Vec<(String, String, u64, u64)> = rows
        .iter()
        .map(|r| {
            assert_eq!(r["samples_ns"].as_array().unwrap().len(), 2, "{r}");
            assert_eq!(r["n_depth"], 40, "{r}");
            (
                r["type_k"].as_str().unwrap().to_string(),
                r["type_v"].as_str().unwrap().to_string(),
                r["n_prompt"].as_u64().unwrap(),
                r["n_gen"].as_u64().unwrap(),
            )
        })
        .collect();
    let expected: Vec<(String, String, u64, u64)> =
        [("f16", 8, 0), ("f16", 0, 4), ("q8_0", 8, 0), ("q8_0", 0, 4)]
            .into_iter()
            .map(|(k, p, n)| (k.to_string(), "q8_0".to_string(), p, n))
            .collect();
    assert_eq!(seen, expected);
    // Two KV heads of 64 in three layers: f16 keys 256 bytes per layer, q8_0 values 136.
    let per_position = |r: &Value| r["kv_bytes_per_position"].as_f64().unwrap();
    assert_eq!(per_position(&rows[0]), (3 * (256 + 136)) as f64);
    assert_eq!(per_position(&rows[2]), (3 * (136 + 136)) as f64);

    // The table names each combination's types.
    let out = ferrox(&args[..args.len() - 1]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("| type_k | type_v |"), "{table}");
    assert!(table.contains("|    f16 |   q8_0 |"), "{table}");
    assert!(table.contains("|   q8_0 |   q8_0 |"), "{table}");
    assert_eq!(table.matches("sequence memory:").count(), 2, "{table}");
}
