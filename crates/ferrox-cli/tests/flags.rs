//! llama.cpp's habits on the command line: its multi-letter short flags (`-np`, `-hf`,
//! `-sys`), every flag settable from a `FERROX_*` variable, `--no-auth` for a public address.

mod common;

use std::process::{Command, Output};

fn ferrox(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrox"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.env_remove("FERROX_API_KEY");
    cmd.output().expect("run ferrox")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn flags_come_from_the_environment_and_the_command_line_wins() {
    let model = common::default_model();
    let m = model.to_str().unwrap();
    let tokens = |out: &Output| {
        assert!(out.status.success(), "{}", stderr(out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["tokens"].as_array().unwrap().len()
    };
    let env = [("FERROX_N_PREDICT", "3"), ("FERROX_PROMPT", "Once upon")];
    assert_eq!(tokens(&ferrox(&["run", "-m", m, "--json"], &env)), 3);
    assert_eq!(
        tokens(&ferrox(&["run", "-m", m, "--json", "-n", "2"], &env)),
        2
    );
}

#[test]
fn a_public_address_needs_a_key_or_no_auth() {
    let serve = ["serve", "--port", "0", "-m", "/nonexistent/model.gguf"];
    // From the environment as from the command line: refused without a key.
    let out = ferrox(&serve, &[("FERROX_HOST", "0.0.0.0")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("loopback"), "{}", stderr(&out));
    // `--no-auth` (or FERROX_NO_AUTH) lets it through: what fails next is the model.
    for (args, env) in [
        (vec!["--host", "0.0.0.0", "--no-auth"], vec![]),
        (
            vec![],
            vec![("FERROX_HOST", "0.0.0.0"), ("FERROX_NO_AUTH", "1")],
        ),
    ] {
        let mut all = serve.to_vec();
        all.extend(args);
        let out = ferrox(&all, &env);
        let err = stderr(&out);
        assert_ne!(out.status.code(), Some(0), "{err}");
        assert!(!err.contains("loopback"), "{err}");
        assert!(err.contains("/nonexistent/model.gguf"), "{err}");
    }
    // A key and --no-auth contradict each other.
    let mut both = serve.to_vec();
    both.extend(["--host", "0.0.0.0", "--no-auth", "--api-key", "k"]);
    assert_eq!(ferrox(&both, &[]).status.code(), Some(2));
}

#[test]
fn llama_cpp_short_flags_are_understood() {
    let out = ferrox(&["serve", "-np", "0", "-m", "/nonexistent/model.gguf"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--parallel must be at least 1"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn run_takes_a_prompt_file_and_a_short_seed_and_chat_a_template() {
    let model = common::default_model();
    let m = model.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompt.txt");
    std::fs::write(&file, "Once upon a time").unwrap();
    let json = |out: &Output| -> serde_json::Value {
        assert!(out.status.success(), "{}", stderr(out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let from_file = json(&ferrox(
        &[
            "run",
            "-m",
            m,
            "-f",
            file.to_str().unwrap(),
            "-n",
            "4",
            "-s",
            "7",
            "--json",
        ],
        &[],
    ));
    let inline = json(&ferrox(
        &[
            "run",
            "-m",
            m,
            "-p",
            "Once upon a time",
            "-n",
            "4",
            "--seed",
            "7",
            "--json",
        ],
        &[],
    ));
    assert_eq!(from_file["prompt_tokens"], inline["prompt_tokens"]);
    assert_eq!(from_file["tokens"], inline["tokens"]);
    let missing = ferrox(&["run", "-m", m, "-f", "/nonexistent/prompt.txt"], &[]);
    assert_eq!(missing.status.code(), Some(2), "{}", stderr(&missing));
    let bad = ferrox(
        &["chat", "-m", m, "--chat-template", "/nonexistent.jinja"],
        &[],
    );
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("--chat-template"), "{}", stderr(&bad));
}
