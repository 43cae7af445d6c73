//! `-hf`, `ferrox pull`, `list` and `rm` against a local server that answers the Hugging Face
//! Hub's model routes (tests/hub/mock_hub.py) from repositories built here: the cache layout,
//! quantization choice, split checkpoints, reuse, resuming an interrupted download, checksum
//! rejection, gated repositories, offline use, and the errors a user can fix (exit 2).

mod common;
#[path = "../../ferrox-models/tests/synthetic/mod.rs"]
mod synthetic;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

struct MockHub {
    child: Child,
    root: PathBuf,
    endpoint: String,
}

impl Drop for MockHub {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// The repositories: a tiny model in two quantizations, a split checkpoint, a repository
/// without GGUF, a gated one, one whose listed checksum is wrong, one whose transfer breaks.
fn start_hub(root: &Path) -> MockHub {
    let repo = |name: &str| root.join("test-org").join(name);
    write(
        &repo("tiny-GGUF").join("tiny-Q8_0.gguf"),
        &synthetic::gguf_bytes("llama"),
    );
    write(
        &repo("tiny-GGUF").join("tiny-Q4_K_M.gguf"),
        &synthetic::gguf_bytes("qwen2"),
    );
    write(&repo("tiny-GGUF").join("README.md"), b"# tiny\n");
    write(
        &repo("split-GGUF").join("m-Q4_K_M-00001-of-00002.gguf"),
        b"first part",
    );
    write(
        &repo("split-GGUF").join("m-Q4_K_M-00002-of-00002.gguf"),
        b"second part",
    );
    write(&repo("nogguf").join("config.json"), b"{}");
    write(
        &repo("gated-GGUF").join("g-Q4_K_M.gguf"),
        &synthetic::gguf_bytes("llama"),
    );
    write(&repo("corrupt-GGUF").join("c-Q4_K_M.gguf"), &[7u8; 4096]);
    write(
        &repo("flaky-GGUF").join("f-Q4_K_M.gguf"),
        &synthetic::gguf_bytes("llama"),
    );
    write(
        &root.join("_config.json"),
        br#"{"test-org/gated-GGUF": {"gated": true},
            "test-org/corrupt-GGUF": {"corrupt": ["c-Q4_K_M.gguf"]},
            "test-org/flaky-GGUF": {"interrupt": ["f-Q4_K_M.gguf"]}}"#,
    );
    let script = common::repo_root().join("crates/ferrox-cli/tests/hub/mock_hub.py");
    let mut child = Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
        .arg(&script)
        .arg(root)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs the mock Hub");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line.trim().parse().expect("the mock Hub prints its port");
    MockHub {
        child,
        root: root.to_path_buf(),
        endpoint: format!("http://127.0.0.1:{port}"),
    }
}

impl MockHub {
    /// Requests for file contents so far (the `/cdn/` route), with their Range headers.
    fn transfers(&self, file: &str) -> Vec<String> {
        std::fs::read_to_string(self.root.join("_log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("/cdn/") && l.contains(file))
            .map(str::to_string)
            .collect()
    }
}

/// Runs ferrox with the Hub settings of this test (and none from the outside).
fn ferrox(hf_home: &Path, endpoint: &str, extra_env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrox"));
    cmd.args(args)
        .env("HF_HOME", hf_home)
        .env("HF_ENDPOINT", endpoint)
        .env_remove("HF_TOKEN")
        .env_remove("HUGGING_FACE_HUB_TOKEN")
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_HUB_OFFLINE");
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd.output().expect("run ferrox")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// A failure with exit status `code` whose message contains `needle`.
fn fails(out: &Output, code: i32, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    assert!(stderr.contains(needle), "`{needle}` not in: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

fn snapshot(hf_home: &Path, repo: &str) -> PathBuf {
    hf_home
        .join("hub")
        .join(format!("models--{}", repo.replace('/', "--")))
        .join("snapshots")
        .join(COMMIT)
}

#[test]
fn pull_run_list_rm_and_offline() {
    let dir = tempfile::tempdir().unwrap();
    let hub = start_hub(&dir.path().join("hub-root"));
    let home = dir.path().join("hf");
    let e = hub.endpoint.as_str();

    // No quantization named: Q4_K_M, into huggingface_hub's layout.
    let path = ok(&ferrox(&home, e, &[], &["pull", "test-org/tiny-GGUF"]));
    let expected = snapshot(&home, "test-org/tiny-GGUF").join("tiny-Q4_K_M.gguf");
    assert_eq!(PathBuf::from(path.trim()), expected);
    let refs = home.join("hub/models--test-org--tiny-GGUF/refs/main");
    assert_eq!(std::fs::read_to_string(refs).unwrap().trim(), COMMIT);
    assert!(std::fs::canonicalize(&expected).unwrap().starts_with(
        std::fs::canonicalize(home.join("hub/models--test-org--tiny-GGUF/blobs")).unwrap()
    ));
    // A second pull finds it cached: no transfer.
    let before = hub.transfers("tiny-Q4_K_M").len();
    ok(&ferrox(
        &home,
        e,
        &[],
        &["pull", "test-org/tiny-GGUF:Q4_K_M"],
    ));
    assert_eq!(hub.transfers("tiny-Q4_K_M").len(), before);

    // `-hf` on a model command fetches and runs the named quantization.
    let run = ok(&ferrox(
        &home,
        e,
        &[],
        &[
            "run",
            "-hf",
            "test-org/tiny-GGUF:Q8_0",
            "-p",
            "ba",
            "-n",
            "2",
            "--json",
        ],
    ));
    assert!(run.contains("\"tokens\"") || run.contains("text"), "{run}");

    // `list` sees both, with what their headers say.
    let listed = ok(&ferrox(&home, e, &[], &["list", "--json"]));
    let rows: Vec<serde_json::Value> = listed
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let arch = |file: &str| {
        rows.iter()
            .find(|r| r["file"] == file)
            .map(|r| r["architecture"].as_str().unwrap().to_string())
    };
    assert_eq!(arch("tiny-Q4_K_M.gguf").as_deref(), Some("qwen2"));
    assert_eq!(arch("tiny-Q8_0.gguf").as_deref(), Some("llama"));
    assert!(rows.iter().all(|r| r["repo"] == "test-org/tiny-GGUF"));
    assert!(rows.iter().all(|r| r["parameters"].as_u64().unwrap() > 0));

    // Offline, with the Hub gone: what is cached runs, what is not is a clear error.
    let dead = "http://127.0.0.1:9";
    let offline = [("HF_HUB_OFFLINE", "1")];
    ok(&ferrox(
        &home,
        dead,
        &offline,
        &[
            "run",
            "-hf",
            "test-org/tiny-GGUF:Q8_0",
            "-p",
            "ba",
            "-n",
            "1",
        ],
    ));
    fails(
        &ferrox(&home, dead, &offline, &["pull", "test-org/gated-GGUF"]),
        2,
        "not in the cache",
    );
    // Unreachable but cached: the cached copy serves.
    ok(&ferrox(
        &home,
        dead,
        &[],
        &["pull", "test-org/tiny-GGUF:Q8_0"],
    ));

    // `rm` of one quantization, then of the repository.
    ok(&ferrox(&home, e, &[], &["rm", "test-org/tiny-GGUF:Q8_0"]));
    assert!(!snapshot(&home, "test-org/tiny-GGUF")
        .join("tiny-Q8_0.gguf")
        .exists());
    assert!(expected.exists());
    ok(&ferrox(&home, e, &[], &["rm", "test-org/tiny-GGUF"]));
    assert!(!home.join("hub/models--test-org--tiny-GGUF").exists());
    fails(
        &ferrox(&home, e, &[], &["rm", "test-org/tiny-GGUF"]),
        2,
        "is not in",
    );
}

#[test]
fn split_checkpoints_gated_repositories_and_user_errors() {
    let dir = tempfile::tempdir().unwrap();
    let hub = start_hub(&dir.path().join("hub-root"));
    let home = dir.path().join("hf");
    let e = hub.endpoint.as_str();

    let first = ok(&ferrox(&home, e, &[], &["pull", "test-org/split-GGUF"]));
    assert!(
        first.trim().ends_with("m-Q4_K_M-00001-of-00002.gguf"),
        "{first}"
    );
    let second = snapshot(&home, "test-org/split-GGUF").join("m-Q4_K_M-00002-of-00002.gguf");
    assert_eq!(std::fs::read(second).unwrap(), b"second part");

    fails(
        &ferrox(&home, e, &[], &["pull", "test-org/gated-GGUF"]),
        2,
        "HF_TOKEN",
    );
    ok(&ferrox(
        &home,
        e,
        &[("HF_TOKEN", "secret")],
        &["pull", "test-org/gated-GGUF"],
    ));

    fails(
        &ferrox(&home, e, &[], &["pull", "test-org/missing"]),
        2,
        "not found",
    );
    fails(
        &ferrox(&home, e, &[], &["pull", "test-org/nogguf"]),
        2,
        "no GGUF file",
    );
    fails(
        &ferrox(&home, e, &[], &["pull", "test-org/tiny-GGUF:Q2_K"]),
        2,
        "no GGUF file for Q2_K in the repository; it has: Q8_0, Q4_K_M",
    );
    fails(
        &ferrox(&home, e, &[], &["pull", "not-a-reference"]),
        2,
        "ORG/NAME",
    );
}

#[test]
fn checksums_are_verified_and_interrupted_downloads_resume() {
    let dir = tempfile::tempdir().unwrap();
    let hub = start_hub(&dir.path().join("hub-root"));
    let home = dir.path().join("hf");
    let e = hub.endpoint.as_str();

    fails(
        &ferrox(&home, e, &[], &["pull", "test-org/corrupt-GGUF"]),
        2,
        "does not match",
    );
    // Nothing of it is kept: no blob, no snapshot entry.
    let repo = home.join("hub/models--test-org--corrupt-GGUF");
    let blobs: Vec<_> = std::fs::read_dir(repo.join("blobs"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        blobs.iter().all(|n| n.to_string_lossy().ends_with(".lock")),
        "{blobs:?}"
    );
    assert!(!snapshot(&home, "test-org/corrupt-GGUF")
        .join("c-Q4_K_M.gguf")
        .exists());

    // The first transfer breaks half way: an error that says to run again...
    let out = ferrox(&home, e, &[], &["pull", "test-org/flaky-GGUF"]);
    fails(&out, 1, "resume");
    // ...which continues from where it stopped and ends with the right bytes.
    let path = ok(&ferrox(&home, e, &[], &["pull", "test-org/flaky-GGUF"]));
    let expected = synthetic::gguf_bytes("llama");
    assert_eq!(std::fs::read(path.trim()).unwrap(), expected);
    let resumed = hub
        .transfers("f-Q4_K_M")
        .iter()
        .filter_map(|l| l.rsplit_once("bytes=").map(|(_, r)| r.to_string()))
        .filter_map(|r| r.split('-').next().and_then(|s| s.parse::<usize>().ok()))
        .any(|start| start > 0);
    assert!(
        resumed,
        "no ranged request resumed: {:?}",
        hub.transfers("f-Q4_K_M")
    );
}
