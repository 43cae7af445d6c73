//! Replicas behind an existing cache-aware router: three `ferrox serve` processes behind
//! SGLang's router (`sglang-router` from PyPI, which scripts/test.sh installs), driven by
//! tests/router/replicas.py: prefix affinity seen in the replicas' prefix-hit counters, load
//! spread, and a replica killed mid-load routed around with no request lost beyond those it
//! was serving.

mod common;

use std::process::Command;

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

#[test]
fn three_replicas_behind_sglang_router() {
    let model = common::default_model();
    let probe = Command::new(python())
        .args(["-c", "import sglang_router"])
        .output()
        .expect("python3 runs");
    assert!(
        probe.status.success(),
        "the sglang_router package is missing: pip install sglang-router (scripts/test.sh does)"
    );
    let script = common::repo_root().join("crates/ferrox-cli/tests/router/replicas.py");
    let out = Command::new(python())
        .arg(&script)
        .arg(env!("CARGO_BIN_EXE_ferrox"))
        .arg(&model)
        .output()
        .expect("run the replica script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["ok"], true, "{stdout}");
    eprintln!("{stdout}");
}
