//! `ferrox run --grammar / --grammar-file / --json-schema` on the default model: the output
//! follows the grammar or schema, with and without prompt-lookup speculation; a bad grammar
//! is an input error naming the problem.

mod common;

use std::ffi::OsStr;
use std::process::Output;

use common::{ferrox, repo_root};
use serde_json::Value;

fn run(extra: &[&str]) -> Output {
    let model = common::default_model();
    let mut args: Vec<&OsStr> = vec![OsStr::new("run"), OsStr::new("-m"), model.as_os_str()];
    args.extend(extra.iter().map(OsStr::new));
    ferrox(&args)
}

fn text(extra: &[&str]) -> Value {
    let mut args = extra.to_vec();
    args.push("--json");
    let out = run(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn grammars_and_schemas_constrain_the_output() {
    let v = text(&[
        "-p",
        "Is the sky blue? Answer:",
        "-n",
        "10",
        "--temp",
        "0.8",
        "--seed",
        "7",
        "--grammar",
        "root ::= \" \" (\"yes\" | \"no\") \".\"",
    ]);
    assert!(
        [" yes.", " no."].contains(&v["text"].as_str().unwrap()),
        "{v}"
    );
    assert_eq!(v["finish_reason"], "stop");

    let schema = r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["name", "age"], "additionalProperties": false}"#;
    for spec in [&["--spec-type", "none"][..], &["--spec-type", "ngram"]] {
        let mut args = vec![
            "-p",
            "A person as JSON:",
            "-n",
            "60",
            "--temp",
            "0",
            "--json-schema",
            schema,
        ];
        args.extend_from_slice(spec);
        let v = text(&args);
        let value: Value = serde_json::from_str(v["text"].as_str().unwrap())
            .unwrap_or_else(|e| panic!("{v}: {e}"));
        let obj = value.as_object().unwrap();
        assert!(obj["name"].is_string() && obj["age"].is_u64(), "{value}");
        assert_eq!(obj.len(), 2);
    }

    let list = repo_root().join("crates/ferrox-agent/tests/fixtures/grammars/list.gbnf");
    let v = text(&[
        "-p",
        "Groceries:\n",
        "-n",
        "24",
        "--temp",
        "0",
        "--grammar-file",
        list.to_str().unwrap(),
    ]);
    let out = v["text"].as_str().unwrap();
    assert!(out.starts_with("- "), "{out:?}");
    for line in out.split('\n').filter(|l| !l.is_empty()) {
        assert!(line.starts_with("- "), "{out:?}");
    }
}

#[test]
fn bad_grammars_are_input_errors() {
    let out = run(&["-p", "x", "--grammar", "root ::= item"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("undefined rule `item`"), "{err}");
    let out = run(&["-p", "x", "--json-schema", "{not json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--json-schema is not JSON"));
    let out = run(&["-p", "x", "--grammar-file", "/nonexistent.gbnf"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&[
        "-p",
        "x",
        "--grammar",
        "root ::= \"a\"",
        "--json-schema",
        "{}",
    ]);
    assert!(!out.status.success());
}
