//! The commands on a Multi-head Latent Attention model (a tiny synthetic `deepseek2` file):
//! run, bench and perplexity work, and a file's multi-token-prediction block drafts
//! (serve: tests/serve.rs).

mod common;
#[path = "../../ferrox-models/tests/synthetic/mod.rs"]
mod synthetic;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use common::ferrox;
use serde_json::{json, Value};

fn model(dir: &Path) -> PathBuf {
    let path = dir.join("deepseek2-v3.gguf");
    std::fs::write(&path, synthetic::gguf_bytes("deepseek2-v3")).unwrap();
    path
}

fn ok(args: &[&OsStr]) -> String {
    let out = ferrox(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn run_bench_and_perplexity_work() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let m = m.as_os_str();
    let s = OsStr::new;

    let run: Value = serde_json::from_str(&ok(&[
        s("run"),
        s("-m"),
        m,
        s("-p"),
        s("ba ce"),
        s("-n"),
        s("6"),
        s("--temp"),
        s("0"),
        s("--json"),
        s("-t"),
        s("1"),
    ]))
    .unwrap();
    assert_eq!(run["tokens"].as_array().unwrap().len(), 6, "{run}");

    let bench: Value = serde_json::from_str(&ok(&[
        s("bench"),
        s("-m"),
        m,
        s("-p"),
        s("16"),
        s("-n"),
        s("4"),
        s("-r"),
        s("1"),
        s("-t"),
        s("1"),
        s("--json"),
    ]))
    .unwrap();
    assert_eq!(bench.as_array().unwrap().len(), 2, "{bench}");
    assert_eq!(bench[0]["repack"], true, "llama-bench's field: {bench}");

    let text = dir.path().join("text.txt");
    std::fs::write(&text, "ba ce di fo gu ".repeat(40)).unwrap();
    let ppl = ok(&[
        s("perplexity"),
        s("-m"),
        m,
        s("-f"),
        text.as_os_str(),
        s("-c"),
        s("32"),
        s("--chunks"),
        s("2"),
        s("-t"),
        s("1"),
    ]);
    assert!(ppl.contains("Final estimate: PPL = "), "{ppl}");
}

/// `bench --compare`: each peer's result beside ferrox's, the peers taking turns with
/// ferrox repetition by repetition, and each engine's share of the decode bound that the
/// read bandwidth measured beside its runs sets.
#[cfg(unix)]
#[test]
fn bench_compares_with_a_peer_and_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let log = dir.path().join("calls.log");
    // A llama-bench that answers `rate` t/s to whatever test it is asked for and logs its
    // name and arguments. Written here, made executable by a child process: a file this
    // process held open for writing could be inherited by another test's child for a
    // moment, and not be executable then.
    let fake_peer = |name: &str, rate: f64| {
        let script = dir.path().join(format!("{name}.sh"));
        let peer = dir.path().join(name);
        std::fs::write(
            &script,
            format!(
                r#"#!/bin/sh
echo "{name} $*" >> '{log}'
while [ $# -gt 0 ]; do case $1 in -p) p=$2;; -n) n=$2;; esac; shift; done
echo "[{{\"n_prompt\": $p, \"n_gen\": $n, \"n_depth\": 0, \"avg_ts\": {rate:.1}}}]"
"#,
                log = log.display()
            ),
        )
        .unwrap();
        let installed = std::process::Command::new("install")
            .arg("-m755")
            .args([&script, &peer])
            .status()
            .unwrap();
        assert!(installed.success());
        peer
    };
    let peer = fake_peer("llama-bench", 50.0);
    let second = fake_peer("other-bench", 25.0);
    let second_arg = format!("second={}", second.display());
    let s = OsStr::new;
    let args = |json: bool| {
        let mut a = vec![
            s("bench"),
            s("-m"),
            m.as_os_str(),
            s("-p"),
            s("8"),
            s("-n"),
            s("4"),
            s("-r"),
            s("2"),
            s("-t"),
            s("1"),
            s("--compare"),
            peer.as_os_str(),
            s("--compare"),
            s(&second_arg),
        ];
        if json {
            a.push(s("--json"));
        }
        a
    };
    let rows: Value = serde_json::from_str(&ok(&args(true))).unwrap();
    let (pp, tg) = (&rows[0], &rows[1]);
    for row in [pp, tg] {
        let ratio = row["avg_ts"].as_f64().unwrap() / 50.0;
        assert_eq!(row["llama_cpp_avg_ts"], 50.0, "{row}");
        assert!(
            (row["ratio"].as_f64().unwrap() - ratio).abs() < 1e-9 * ratio,
            "{row}"
        );
        let peers = row["peers"].as_array().unwrap();
        assert_eq!(peers.len(), 2, "{row}");
        assert_eq!(peers[0]["name"], "llama.cpp", "{row}");
        assert_eq!(peers[1]["name"], "second", "{row}");
        assert_eq!(peers[1]["samples_ts"], json!([25.0, 25.0]), "{row}");
        let ratio = row["avg_ts"].as_f64().unwrap() / 25.0;
        assert!(
            (peers[1]["ratio"].as_f64().unwrap() - ratio).abs() < 1e-9 * ratio,
            "{row}"
        );
    }
    // Each repetition ran each peer once, in turn: pp's two, then tg's two.
    let calls = std::fs::read_to_string(&log).unwrap();
    let order: Vec<&str> = calls
        .lines()
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(order, ["llama-bench", "other-bench"].repeat(4), "{calls}");
    assert!(calls.lines().all(|l| l.contains(" -r 1 ")), "{calls}");
    assert!(
        pp.get("bound_share").is_none(),
        "prefill has no bound: {pp}"
    );
    let bytes = tg["weight_bytes_per_token"].as_f64().unwrap();
    assert!(bytes > 0.0, "{tg}");
    for (share, bandwidth) in [
        ("bound_share", "read_bandwidth_gbs"),
        ("llama_cpp_bound_share", "llama_cpp_read_bandwidth_gbs"),
    ] {
        assert!(tg[bandwidth].as_f64().unwrap() > 0.1, "{tg}");
        let share = tg[share].as_f64().unwrap();
        assert!(share > 0.0 && share.is_finite(), "{tg}");
    }
    // The peer's share: its speed over the mean bandwidth measured beside its run.
    let peer_bw = tg["llama_cpp_read_bandwidth_gbs"].as_f64().unwrap() * 1e9;
    let share = tg["llama_cpp_bound_share"].as_f64().unwrap();
    assert!(
        (share - 50.0 * bytes / peer_bw).abs() < 1e-6 * share,
        "{tg}"
    );
    let text = ok(&args(false));
    assert!(text.contains("| tg4 | "), "{text}");
    assert!(text.contains("| ferrox / second |"), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("tg4: ferrox at ")
            && l.contains("% of the bound, llama.cpp at ")
            && l.contains(", second at ")),
        "{text}"
    );
}

/// `ferrox run --spec-type draft-mtp` on a file with a multi-token-prediction block: the
/// same tokens as plain decoding, with drafted tokens; on a file without one, a clear error.
#[test]
fn run_drafts_with_the_mtp_block() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deepseek2-mtp.gguf");
    std::fs::write(&path, synthetic::gguf_bytes("deepseek2-mtp")).unwrap();
    let run = |m: &Path, spec: &[&str]| greedy_run(m, "ba ce di fo", "16", spec);
    let plain = json_of(run(&path, &[]));
    let mtp = json_of(run(
        &path,
        &["--spec-type", "draft-mtp", "--draft-max", "3"],
    ));
    assert_eq!(plain["tokens"], mtp["tokens"], "{plain}\n{mtp}");
    assert!(mtp["timings"]["draft_n"].as_u64().unwrap() > 0, "{mtp}");

    let without = model(dir.path());
    let out = run(&without, &["--spec-type", "mtp"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nextn_predict_layers"), "{err}");
}

/// DeepSeek-V4 drops rejected draft tokens from rings 32 positions deep: longer drafts are
/// refused with a clear error, shorter ones run.
#[test]
fn deepseek4_drafts_at_most_its_rings_slack() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deepseek4.gguf");
    std::fs::write(&path, synthetic::deepseek4::gguf_bytes()).unwrap();
    let s = OsStr::new;
    let run = |draft_max: &str| {
        ferrox(&[
            s("run"),
            s("-m"),
            path.as_os_str(),
            s("-p"),
            s("ba ce di fo ba ce di fo"),
            s("-n"),
            s("8"),
            s("--temp"),
            s("0"),
            s("-t"),
            s("1"),
            s("--spec-type"),
            s("ngram"),
            s("--draft-max"),
            s(draft_max),
        ])
    };
    let out = run("40");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at most 32"), "{err}");
    assert!(run("32").status.success());
}

/// Kimi-K3 checkpoints its recurrent state after each of a step's last positions when asked
/// to speculate, so drafts of up to 3 tokens run (greedy tokens unchanged) and longer ones
/// are refused with a clear error; Kimi Linear, which rolls back only to block ends, refuses
/// speculation.
#[test]
fn kimi_drafts_only_as_far_as_its_state_rolls_back() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: Vec<u8>| {
        let path = dir.path().join(format!("{name}.gguf"));
        std::fs::write(&path, bytes).unwrap();
        path
    };
    let k3 = write("kimi-k3", synthetic::kimi::gguf_bytes("kimi-k3"));
    let linear = write("kimi-linear", synthetic::kimi::kimi_linear_gguf_bytes());
    let run = |path: &Path, spec: &[&str]| {
        greedy_run(
            path,
            "ba ce di fo ba ce di fo ba ce di fo ba ce",
            "24",
            spec,
        )
    };
    let plain = json_of(run(&k3, &[]));
    let drafted = json_of(run(&k3, &["--spec-type", "ngram", "--draft-max", "3"]));
    assert_eq!(plain["tokens"], drafted["tokens"], "{plain}\n{drafted}");
    assert!(
        drafted["timings"]["draft_n"].as_u64().unwrap() > 0,
        "{drafted}"
    );
    let out = run(&k3, &["--spec-type", "ngram", "--draft-max", "4"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at most 3"), "{err}");
    let out = run(&linear, &["--spec-type", "ngram", "--draft-max", "3"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot forget"), "{err}");
}

/// `ferrox run -m model -p prompt -n n --temp 0 -t 1 --json` plus `extra`.
fn greedy_run(model: &Path, prompt: &str, n: &str, extra: &[&str]) -> std::process::Output {
    let s = OsStr::new;
    let mut args = vec![s("run"), s("-m"), model.as_os_str(), s("-p"), s(prompt)];
    args.extend(["-n", n, "--temp", "0", "-t", "1", "--json"].map(s));
    args.extend(extra.iter().map(|a| s(a)));
    ferrox(&args)
}

/// The JSON a successful `ferrox run --json` printed.
fn json_of(out: std::process::Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
