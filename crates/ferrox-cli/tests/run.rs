//! `ferrox run` on the default model.

mod common;

use std::ffi::OsStr;

use common::ferrox;
use serde_json::Value;

fn run_json(extra: &[&str]) -> Value {
    let model = common::default_model();
    let mut args: Vec<&OsStr> = vec![OsStr::new("run"), OsStr::new("-m"), model.as_os_str()];
    args.extend(extra.iter().map(OsStr::new));
    args.push(OsStr::new("--json"));
    let out = ferrox(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        stdout.lines().count(),
        1,
        "one JSON object on one line: {stdout}"
    );
    serde_json::from_str(&stdout).unwrap()
}

#[test]
fn greedy_json_output_has_the_contract_fields() {
    let v = run_json(&[
        "-p",
        "The capital of France is",
        "-n",
        "12",
        "--temp",
        "0",
        "--top-logprobs",
        "3",
    ]);
    let prompt: Vec<u64> = v["prompt_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(prompt[0], 2, "BOS first");
    let tokens = v["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 12);
    assert_eq!(v["finish_reason"], "length");
    assert!(v["text"].as_str().unwrap().starts_with(" the capital of"));
    assert!(v["timings"]["predicted_per_second"].as_f64().unwrap() > 0.0);
    // Top logprobs: 3 alternatives per token, log-probabilities, the greedy pick first.
    let top = v["top_logprobs"].as_array().unwrap();
    assert_eq!(top.len(), 12);
    for (alternatives, token) in top.iter().zip(tokens) {
        let alts = alternatives.as_array().unwrap();
        assert_eq!(alts.len(), 3);
        assert_eq!(&alts[0][0], token);
        let lp: Vec<f64> = alts.iter().map(|a| a[1].as_f64().unwrap()).collect();
        assert!(lp[0] <= 0.0 && lp[0] >= lp[1] && lp[1] >= lp[2]);
    }
}

#[test]
fn seeded_sampling_repeats_and_streams_only_new_text() {
    let a = run_json(&[
        "-p",
        "Once upon a time",
        "-n",
        "16",
        "--temp",
        "1.0",
        "--seed",
        "11",
    ]);
    let b = run_json(&[
        "-p",
        "Once upon a time",
        "-n",
        "16",
        "--temp",
        "1.0",
        "--seed",
        "11",
    ]);
    assert_eq!(a["tokens"], b["tokens"]);
    let c = run_json(&[
        "-p",
        "Once upon a time",
        "-n",
        "16",
        "--temp",
        "1.0",
        "--seed",
        "12",
    ]);
    assert_ne!(a["tokens"], c["tokens"], "another seed, another sample");

    // Plain mode prints only the continuation, the same text as --json reports.
    let model = common::default_model();
    let out = ferrox(&[
        OsStr::new("run"),
        OsStr::new("-m"),
        model.as_os_str(),
        OsStr::new("-p"),
        OsStr::new("Once upon a time"),
        OsStr::new("-n"),
        OsStr::new("16"),
        OsStr::new("--temp"),
        OsStr::new("1.0"),
        OsStr::new("--seed"),
        OsStr::new("11"),
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        text,
        format!("{}\n", a["text"].as_str().unwrap()),
        "the continuation, then one newline"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("t/s"),
        "timings on stderr"
    );
}

#[test]
fn stop_strings_end_generation_without_being_printed() {
    let free = run_json(&["-p", "The capital of France is", "-n", "16", "--temp", "0"]);
    let text = free["text"].as_str().unwrap().to_string();
    // Stop at a word the free run produced, split across tokens or not.
    let stop = "country";
    let at = text
        .find(stop)
        .expect("the greedy text mentions the country");
    let stopped = run_json(&[
        "-p",
        "The capital of France is",
        "-n",
        "16",
        "--temp",
        "0",
        "--stop",
        stop,
    ]);
    assert_eq!(stopped["text"].as_str().unwrap(), &text[..at]);
    assert_eq!(stopped["finish_reason"], "stop");
}

#[test]
fn a_prompt_longer_than_the_context_is_refused() {
    let model = common::default_model();
    let long = "word ".repeat(400);
    let out = ferrox(&[
        OsStr::new("run"),
        OsStr::new("-m"),
        model.as_os_str(),
        OsStr::new("-c"),
        OsStr::new("64"),
        OsStr::new("-p"),
        OsStr::new(&long),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("context") && stderr.contains("64"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"));
}

/// `ferrox run --mmproj --image` on the synthetic Gemma 3 pair of `fixtures/vision`: the
/// greedy ids after each image (f32 cache) equal libllama's, the prompt's positions too; an
/// image without a projector, an unreadable image and a projector of another width exit 2.
#[test]
fn run_with_an_image_matches_libllama() {
    let dir = common::repo_root().join("fixtures/vision");
    let prompt =
        "<start_of_turn>user\n<__media__>Describe this image.<end_of_turn>\n<start_of_turn>model\n";
    let run = |extra: &[&std::ffi::OsStr]| {
        let mut args: Vec<&OsStr> = vec![OsStr::new("run"), OsStr::new("-m")];
        let model = dir.join("gemma3.gguf");
        let mut owned = vec![model.into_os_string()];
        owned.extend(extra.iter().map(|s| s.to_os_string()));
        args.extend(owned.iter().map(|s| s.as_os_str()));
        args.extend(
            [
                "-p", prompt, "-n", "16", "--temp", "0", "--kv-f32", "-t", "2", "--json",
            ]
            .map(OsStr::new),
        );
        ferrox(&args)
    };
    for name in ["rgb64", "rgb100x60", "rgb37x51", "rgba80", "gray48"] {
        let out = run(&[
            OsStr::new("--mmproj"),
            dir.join("gemma3.mmproj.gguf").as_os_str(),
            OsStr::new("--image"),
            dir.join(format!("{name}.png")).as_os_str(),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ours: Value = serde_json::from_slice(&out.stdout).unwrap();
        let path = dir.join("ref").join(format!("{name}.greedy.json"));
        let theirs: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        assert_eq!(ours["tokens"], theirs["generated"], "{name}");
        assert_eq!(
            ours["prompt_tokens"].as_array().unwrap().len() as u64,
            theirs["n_past"].as_u64().unwrap()
        );
    }
    let image = dir.join("rgb64.png");
    let no_projector = run(&[OsStr::new("--image"), image.as_os_str()]);
    assert_eq!(no_projector.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&no_projector.stderr).contains("--mmproj"));
    let mmproj = dir.join("gemma3.mmproj.gguf");
    let not_an_image = run(&[
        OsStr::new("--mmproj"),
        mmproj.as_os_str(),
        OsStr::new("--image"),
        dir.join("README.md").as_os_str(),
    ]);
    assert_eq!(not_an_image.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&not_an_image.stderr).contains("could not be decoded"));
}
