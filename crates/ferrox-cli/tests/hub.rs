//! `-hf`, `ferrox pull`, `list` and `rm` against a local server that answers the Hugging Face
//! Hub's model routes (tests/hub/mock_hub.py) from repositories built here: the cache layout,
//! quantization choice, split checkpoints, reuse, resuming an interrupted download, checksum
//! rejection, gated repositories, offline use, and the errors a user can fix (exit 2). Then a
//! hostile mirror (path-like ETags, commits and file names, redirects to another host, a
//! redirect loop, wrong answers to a resumed transfer) and a hostile cache (links leading out
//! of it): nothing is written or removed outside the cache, and the token stays with the
//! endpoint.

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
    port: u16,
    /// The port of the mock's second listener: another origin, as a CDN's host would be.
    other_port: u16,
    /// A directory beside the cache that hostile answers aim at; nothing may land there.
    outside: PathBuf,
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
    // A model with vision projectors, as multimodal repositories ship them.
    let vision = common::repo_root().join("fixtures/vision");
    let copy = |from: &str, to: &str| {
        write(
            &repo("vision-GGUF").join(to),
            &std::fs::read(vision.join(from)).unwrap(),
        );
    };
    copy("gemma3.gguf", "gemma3-F32.gguf");
    copy("gemma3.mmproj.gguf", "mmproj-gemma3-F32.gguf");
    copy("gemma3.f16.mmproj.gguf", "mmproj-gemma3-F16.gguf");
    write(
        &repo("gated-GGUF").join("g-Q4_K_M.gguf"),
        &synthetic::gguf_bytes("llama"),
    );
    write(&repo("corrupt-GGUF").join("c-Q4_K_M.gguf"), &[7u8; 4096]);
    write(
        &repo("flaky-GGUF").join("f-Q4_K_M.gguf"),
        &synthetic::gguf_bytes("llama"),
    );
    // Hostile repositories: each holds one GGUF named after it.
    let hostile = [
        "etag",
        "etag-nolfs",
        "commit",
        "names",
        "loop",
        "cdn",
        "full",
        "shifted",
        "long",
        "exact",
    ];
    for name in hostile {
        write(
            &repo(&format!("{name}-GGUF")).join(format!("{name}-Q4_K_M.gguf")),
            &synthetic::gguf_bytes("llama"),
        );
    }
    // Paths that climb out of any cache directory into `outside`.
    let outside = root.parent().unwrap().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let climb = |leaf: &str| {
        let up = "../".repeat(40);
        let target = outside.join(leaf);
        format!("{up}{}", target.to_str().unwrap().trim_start_matches('/'))
    };
    let interrupt = |name: &str| serde_json::json!([format!("{name}-Q4_K_M.gguf")]);
    let config = serde_json::json!({
        "test-org/gated-GGUF": {"gated": true},
        "test-org/corrupt-GGUF": {"corrupt": ["c-Q4_K_M.gguf"]},
        "test-org/flaky-GGUF": {"interrupt": ["f-Q4_K_M.gguf"]},
        "test-org/etag-GGUF": {"etag": climb("pwned")},
        "test-org/etag-nolfs-GGUF": {"etag": climb("pwned"), "nolfs": true},
        "test-org/commit-GGUF": {"commit": climb("evil")},
        "test-org/names-GGUF": {"extra": [format!("{}-Q8_0.gguf", climb("named"))]},
        "test-org/loop-GGUF": {"redirect_loop": true},
        "test-org/cdn-GGUF": {"gated": true, "other_host": true},
        "test-org/full-GGUF": {"interrupt": interrupt("full"), "ignore_range": true},
        "test-org/shifted-GGUF": {"interrupt": interrupt("shifted"), "bad_range": true},
        "test-org/long-GGUF": {"interrupt": interrupt("long")},
        "test-org/exact-GGUF": {"interrupt": interrupt("exact")},
    });
    write(&root.join("_config.json"), config.to_string().as_bytes());
    let script = common::repo_root().join("crates/ferrox-cli/tests/hub/mock_hub.py");
    let mut child = Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
        .arg(&script)
        .arg(root)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs the mock Hub");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut port = || {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        line.trim()
            .parse::<u16>()
            .expect("the mock Hub prints its ports")
    };
    let (port, other_port) = (port(), port());
    MockHub {
        child,
        root: root.to_path_buf(),
        endpoint: format!("http://127.0.0.1:{port}"),
        port,
        other_port,
        outside,
    }
}

impl MockHub {
    /// Requests for file contents so far (the `/cdn/` route), with their Range headers.
    fn transfers(&self, file: &str) -> Vec<String> {
        self.log()
            .into_iter()
            .filter(|l| l.starts_with("GET /cdn/") && l.contains(file))
            .collect()
    }

    /// Every request so far: "METHOD PATH RANGE auth=yes|no port=PORT".
    fn log(&self) -> Vec<String> {
        std::fs::read_to_string(self.root.join("_log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The paths under `outside`, where nothing may be written.
    fn written_outside(&self) -> Vec<PathBuf> {
        walk(&self.outside)
    }
}

/// Every path under `dir` (links listed, not followed); none if it does not exist.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                stack.push(path.clone());
            }
            out.push(path);
        }
    }
    out
}

/// The start of a logged request's Range (`bytes=START-`), if it had one.
fn range_start(line: &str) -> Option<u64> {
    let (_, rest) = line.split_once(" bytes=")?;
    rest.split('-').next()?.parse().ok()
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

fn repo_dir(hf_home: &Path, repo: &str) -> PathBuf {
    hf_home
        .join("hub")
        .join(format!("models--{}", repo.replace('/', "--")))
}

fn snapshot(hf_home: &Path, repo: &str) -> PathBuf {
    repo_dir(hf_home, repo).join("snapshots").join(COMMIT)
}

/// Everything under the repository's `snapshots/` (any commit).
fn snapshot_entries(hf_home: &Path, repo: &str) -> Vec<PathBuf> {
    walk(&repo_dir(hf_home, repo).join("snapshots"))
}

/// The one partial download in the repository's blobs.
fn partial_download(hf_home: &Path, repo: &str) -> PathBuf {
    let partials: Vec<PathBuf> = walk(&repo_dir(hf_home, repo).join("blobs"))
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".incomplete"))
        .collect();
    assert_eq!(partials.len(), 1, "{partials:?}");
    partials[0].clone()
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

/// `-hf` fetches the repository's vision projector as llama.cpp does (the one nearest the
/// model's quantization): `run --image` then works without `--mmproj`, with the answer
/// libllama gives; `--no-mmproj` leaves it.
#[test]
fn hf_fetches_the_vision_projector() {
    let dir = tempfile::tempdir().unwrap();
    let hub = start_hub(&dir.path().join("hub-root"));
    let home = dir.path().join("hf");
    let e = hub.endpoint.as_str();
    let image = common::repo_root().join("fixtures/vision/rgb64.png");
    let prompt =
        "<start_of_turn>user\n<__media__>Describe this image.<end_of_turn>\n<start_of_turn>model\n";
    let args = |extra: &[&str]| {
        let mut a = vec![
            "run",
            "-hf",
            "test-org/vision-GGUF:F32",
            "-p",
            prompt,
            "-n",
            "16",
        ];
        a.extend(["--temp", "0", "--kv-f32", "-t", "2", "--json", "--image"]);
        a.push(image.to_str().unwrap());
        a.extend(extra);
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let no_projector = args(&["--no-mmproj"]);
    let no_projector: Vec<&str> = no_projector.iter().map(String::as_str).collect();
    fails(&ferrox(&home, e, &[], &no_projector), 2, "--mmproj");
    let with = args(&[]);
    let with: Vec<&str> = with.iter().map(String::as_str).collect();
    let out: serde_json::Value = serde_json::from_str(&ok(&ferrox(&home, e, &[], &with))).unwrap();
    let reference = common::repo_root().join("fixtures/vision/ref/rgb64.greedy.json");
    let reference: serde_json::Value =
        serde_json::from_slice(&std::fs::read(reference).unwrap()).unwrap();
    assert_eq!(out["tokens"], reference["generated"]);
    let snap = snapshot(&home, "test-org/vision-GGUF");
    assert!(snap.join("mmproj-gemma3-F32.gguf").exists());
    assert!(!snap.join("mmproj-gemma3-F16.gguf").exists());
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
    let published = snapshot_entries(&home, "test-org/corrupt-GGUF");
    assert!(published.is_empty(), "{published:?}");
    assert!(!repo.join("refs/main").exists());

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

#[test]
fn a_hostile_mirror_writes_nothing_outside_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let hub = start_hub(&dir.path().join("hub-root"));
    let home = dir.path().join("hf");
    let e = hub.endpoint.as_str();

    for (repo, needle) in [
        // The ETag names the blob file: `../../..` is refused, whether or not the listing
        // gives the sha256 it should equal.
        ("test-org/etag-GGUF", "as the ETag of etag-Q4_K_M.gguf"),
        (
            "test-org/etag-nolfs-GGUF",
            "as the ETag of etag-nolfs-Q4_K_M.gguf, not a sha256 or git hash",
        ),
        // The commit names the snapshot directory.
        ("test-org/commit-GGUF", "not a 40-digit hex hash"),
        // A listed file name names a path in it.
        ("test-org/names-GGUF", "lists a file named"),
        ("test-org/loop-GGUF", "more than 10 redirects"),
    ] {
        let out = ferrox(&home, e, &[("HF_TOKEN", "secret")], &["pull", repo]);
        fails(&out, 1, needle);
        fails(&out, 1, "refused");
        assert_eq!(hub.written_outside(), Vec::<PathBuf>::new(), "{repo}");
        let published = snapshot_entries(&home, repo);
        assert!(published.is_empty(), "{repo}: {published:?}");
        assert!(!repo_dir(&home, repo).join("refs/main").exists(), "{repo}");
    }
    // The loop was cut at the limit, not before.
    let loops = hub
        .log()
        .iter()
        .filter(|l| l.starts_with("HEAD /test-org/loop-GGUF/resolve/"))
        .count();
    assert_eq!(loops, 11);
    // Nothing landed beside the cache either (`hub/evil`, `hub/pwned`).
    let beside: Vec<PathBuf> = walk(&home.join("hub"))
        .into_iter()
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.contains("evil") || name.contains("pwned") || name.contains("named")
        })
        .collect();
    assert!(beside.is_empty(), "{beside:?}");
}

#[test]
fn the_token_goes_only_to_the_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let hub = start_hub(&dir.path().join("hub-root"));
    let home = dir.path().join("hf");

    // A gated repository whose file the endpoint redirects to another origin.
    let path = ok(&ferrox(
        &home,
        &hub.endpoint,
        &[("HF_TOKEN", "secret")],
        &["pull", "test-org/cdn-GGUF"],
    ));
    assert_eq!(
        std::fs::read(path.trim()).unwrap(),
        synthetic::gguf_bytes("llama")
    );
    let log = hub.log();
    let on = |port: u16| -> Vec<&String> {
        log.iter()
            .filter(|l| l.ends_with(&format!(" port={port}")) && l.contains("cdn-GGUF"))
            .collect()
    };
    // The bytes came from the other origin, which never saw the token...
    let other = on(hub.other_port);
    assert!(other.iter().any(|l| l.starts_with("GET /cdn/")), "{log:?}");
    assert!(other.iter().all(|l| l.contains(" auth=no ")), "{other:?}");
    // ...while the endpoint did (the repository is gated: it had to).
    let own = on(hub.port);
    assert!(own.len() >= 2, "{log:?}");
    assert!(own.iter().all(|l| l.contains(" auth=yes ")), "{own:?}");
}

#[test]
fn resumed_transfers_check_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let hub = start_hub(&dir.path().join("hub-root"));
    let home = dir.path().join("hf");
    let e = hub.endpoint.as_str();
    let expected = synthetic::gguf_bytes("llama");

    // The server answers the resumed range with 200 and the whole file, or with a 206 from
    // another offset than asked: either way the download starts over and ends right.
    for name in ["full", "shifted"] {
        let repo = format!("test-org/{name}-GGUF");
        fails(&ferrox(&home, e, &[], &["pull", &repo]), 1, "resume");
        let partial = partial_download(&home, &repo);
        let kept = std::fs::metadata(&partial).unwrap().len();
        assert!(kept > 0 && kept < expected.len() as u64, "{kept}");
        let path = ok(&ferrox(&home, e, &[], &["pull", &repo]));
        assert_eq!(std::fs::read(path.trim()).unwrap(), expected, "{repo}");
        assert!(!partial.exists());
        let transfers = hub.transfers(&format!("{name}-Q4_K_M"));
        let asked = transfers
            .iter()
            .position(|l| range_start(l) == Some(kept))
            .unwrap_or_else(|| panic!("no resumed range: {transfers:?}"));
        if name == "shifted" {
            // The 206 from elsewhere was not appended: a fresh transfer followed it.
            assert!(
                transfers[asked + 1..]
                    .iter()
                    .any(|l| range_start(l).is_none()),
                "{transfers:?}"
            );
        }
    }

    // A partial file as long as the whole file, or longer, is not a prefix of it: the
    // download starts over instead of failing on every run.
    for (name, extra) in [("long", 7usize), ("exact", 0)] {
        let repo = format!("test-org/{name}-GGUF");
        fails(&ferrox(&home, e, &[], &["pull", &repo]), 1, "resume");
        let partial = partial_download(&home, &repo);
        std::fs::write(&partial, vec![0xAB; expected.len() + extra]).unwrap();
        let path = ok(&ferrox(&home, e, &[], &["pull", &repo]));
        assert_eq!(std::fs::read(path.trim()).unwrap(), expected, "{repo}");
        let transfers = hub.transfers(&format!("{name}-Q4_K_M"));
        assert_eq!(
            transfers.last().map(|l| range_start(l)),
            Some(None),
            "{transfers:?}"
        );
    }
}

#[cfg(unix)]
#[test]
fn rm_removes_nothing_outside_the_cache() {
    use std::os::unix::fs::symlink;

    let dir = tempfile::tempdir().unwrap();
    let hub = start_hub(&dir.path().join("hub-root"));
    let home = dir.path().join("hf");
    let e = hub.endpoint.as_str();
    ok(&ferrox(&home, e, &[], &["pull", "test-org/tiny-GGUF:Q8_0"]));
    ok(&ferrox(&home, e, &[], &["pull", "test-org/tiny-GGUF"]));

    // Files outside the cache that links inside it lead to.
    let victims = hub.outside.join("victims");
    write(&victims.join("tiny-Q8_0.gguf"), b"keep me");
    write(&victims.join("tiny-Q4_K_M.gguf"), b"keep me");
    let victim_blob = hub.outside.join("blob");
    write(&victim_blob, b"keep me too");
    let repo = repo_dir(&home, "test-org/tiny-GGUF");
    // A snapshot directory that is a link out of the cache...
    symlink(
        &victims,
        repo.join("snapshots/ffffffffffffffffffffffffffffffffffffffff"),
    )
    .unwrap();
    // ...and a file link in the current snapshot that points out of it.
    let q8 = snapshot(&home, "test-org/tiny-GGUF").join("tiny-Q8_0.gguf");
    std::fs::remove_file(&q8).unwrap();
    symlink(&victim_blob, &q8).unwrap();

    ok(&ferrox(&home, e, &[], &["rm", "test-org/tiny-GGUF:Q8_0"]));
    let kept = |path: &Path, bytes: &[u8]| {
        assert_eq!(
            std::fs::read(path).ok().as_deref(),
            Some(bytes),
            "{}",
            path.display()
        )
    };
    kept(&victims.join("tiny-Q8_0.gguf"), b"keep me");
    kept(&victim_blob, b"keep me too");
    // The link itself is gone; the other quantization is untouched.
    assert!(std::fs::symlink_metadata(&q8).is_err());
    assert!(snapshot(&home, "test-org/tiny-GGUF")
        .join("tiny-Q4_K_M.gguf")
        .is_file());

    // The whole repository: its links are unlinked, what they point at stays.
    ok(&ferrox(&home, e, &[], &["rm", "test-org/tiny-GGUF"]));
    assert!(std::fs::symlink_metadata(&repo).is_err());
    kept(&victims.join("tiny-Q8_0.gguf"), b"keep me");
    kept(&victims.join("tiny-Q4_K_M.gguf"), b"keep me");
    kept(&victim_blob, b"keep me too");

    // A repository directory that is itself a link out of the cache, laid out as a cached
    // repository would be.
    let moved = hub.outside.join("models--test-org--moved-GGUF");
    let blob = "b".repeat(64);
    write(&moved.join("refs/main"), COMMIT.as_bytes());
    write(&moved.join("blobs").join(&blob), b"outside blob");
    let pointer = moved.join("snapshots").join(COMMIT).join("m-Q8_0.gguf");
    std::fs::create_dir_all(pointer.parent().unwrap()).unwrap();
    symlink(format!("../../blobs/{blob}"), &pointer).unwrap();
    let link = repo_dir(&home, "test-org/moved-GGUF");
    symlink(&moved, &link).unwrap();
    fails(
        &ferrox(&home, e, &[], &["rm", "test-org/moved-GGUF:Q8_0"]),
        2,
        "outside the cache",
    );
    kept(&moved.join("blobs").join(&blob), b"outside blob");
    kept(&pointer, b"outside blob");
    ok(&ferrox(&home, e, &[], &["rm", "test-org/moved-GGUF"]));
    assert!(std::fs::symlink_metadata(&link).is_err());
    kept(&pointer, b"outside blob");
}

#[cfg(unix)]
#[test]
fn a_hostile_cache_is_not_written_through() {
    use std::os::unix::fs::symlink;

    let dir = tempfile::tempdir().unwrap();
    let hub = start_hub(&dir.path().join("hub-root"));
    let home = dir.path().join("hf");
    let e = hub.endpoint.as_str();
    let repo = repo_dir(&home, "test-org/tiny-GGUF");

    // `refs/main` that is not a commit hash is not a path to follow: offline, nothing is
    // cached.
    let elsewhere = hub.outside.join("snap");
    write(&elsewhere.join("tiny-Q8_0.gguf"), b"not a model");
    write(
        &repo.join("refs/main"),
        format!("../../../../{}", elsewhere.display()).as_bytes(),
    );
    fails(
        &ferrox(
            &home,
            e,
            &[("HF_HUB_OFFLINE", "1")],
            &["pull", "test-org/tiny-GGUF:Q8_0"],
        ),
        2,
        "not in the cache",
    );

    // `snapshots` leading out of the cache: the download is refused before anything is
    // created where it leads, and `refs/main` is not rewritten through its link.
    let target = hub.outside.join("snapshots");
    std::fs::create_dir_all(&target).unwrap();
    symlink(&target, repo.join("snapshots")).unwrap();
    let outside_ref = hub.outside.join("ref");
    write(&outside_ref, b"keep me");
    std::fs::remove_file(repo.join("refs/main")).unwrap();
    symlink(&outside_ref, repo.join("refs/main")).unwrap();
    fails(
        &ferrox(&home, e, &[], &["pull", "test-org/tiny-GGUF:Q8_0"]),
        2,
        "outside the cache",
    );
    assert_eq!(walk(&target), Vec::<PathBuf>::new());
    assert_eq!(std::fs::read(&outside_ref).unwrap(), b"keep me");

    // With the snapshots directory back in place, the download goes through and the link
    // at `refs/main` is replaced, not written through.
    std::fs::remove_file(repo.join("snapshots")).unwrap();
    ok(&ferrox(&home, e, &[], &["pull", "test-org/tiny-GGUF:Q8_0"]));
    assert_eq!(std::fs::read(&outside_ref).unwrap(), b"keep me");
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main")).unwrap(),
        COMMIT
    );
    assert!(!std::fs::symlink_metadata(repo.join("refs/main"))
        .unwrap()
        .file_type()
        .is_symlink());

    // A partial download that is a hard link to a file elsewhere is not resumed into it.
    let long = "test-org/long-GGUF";
    fails(&ferrox(&home, e, &[], &["pull", long]), 1, "resume");
    let partial = partial_download(&home, long);
    let shared = hub.outside.join("shared");
    write(&shared, b"keep me");
    std::fs::remove_file(&partial).unwrap();
    std::fs::hard_link(&shared, &partial).unwrap();
    let path = ok(&ferrox(&home, e, &[], &["pull", long]));
    assert_eq!(
        std::fs::read(path.trim()).unwrap(),
        synthetic::gguf_bytes("llama")
    );
    assert_eq!(std::fs::read(&shared).unwrap(), b"keep me");
}
