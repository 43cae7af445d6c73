//! The chat page `ferrox serve` serves at `/`, in a real headless browser (Debian's chromium
//! driven by playwright-core; scripts/test.sh installs both): it loads from the binary under
//! its Content-Security-Policy, names the model, streams a reply, keeps the conversation
//! across a reload, stops on Stop, and shows a server error; a reply with remote images
//! shows them as links and fetches nothing from another origin, and what gets past the
//! renderer is blocked by the policy (crates/ferrox-server/web/tests/browser.mjs). With a
//! server that takes images (`--mmproj`), images attached by button, paste or drop go out as
//! `image_url` parts and get llama-server's answer; files that are not images or too large
//! are refused (tests/images.mjs). Also: the embedded page is what its sources build to.

mod common;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn web_dir() -> PathBuf {
    common::repo_root().join("crates/ferrox-server/web")
}

struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits for `/health` to answer 200; a server that exits first (a port taken between
/// `free_port` and its bind, say) fails at once with its log.
fn wait_healthy(server: &mut Served, port: u16, log: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = server.0.try_wait() {
            panic!(
                "ferrox serve exited ({status}) before it was healthy:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        let ok = Command::new("curl")
            .args(["-sf", &format!("http://127.0.0.1:{port}/health")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!(
        "ferrox serve did not become healthy in 120 s:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

/// Starts `ferrox serve ARGS --port P --api-key page-key`, runs `node SCRIPT URL page-key
/// EXTRA...` in the page's directory against it (headless chromium), and returns the
/// script's report, the one JSON line it prints.
///
/// One page at a time: two servers starting together can be handed the same free port,
/// and the one still loading its model then finds the other's `/health` answering (a page
/// meant for the server without images once drove the one with them).
fn drive_page(serve_args: &[&std::ffi::OsStr], script: &str, extra: &[&str]) -> serde_json::Value {
    static ONE_PAGE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_PAGE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = web_dir();
    assert!(
        dir.join("node_modules/playwright-core").is_dir(),
        "the page's npm packages are missing: npm ci in {} (scripts/test.sh does)",
        dir.display()
    );
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        std::path::Path::new(&chromium).exists(),
        "{chromium} is missing: apt-get install chromium (scripts/test.sh does)"
    );
    let port = free_port();
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("serve.log");
    let mut server = Served(
        Command::new(env!("CARGO_BIN_EXE_ferrox"))
            .arg("serve")
            .args(serve_args)
            .args(["--port", &port.to_string(), "--api-key", "page-key"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_healthy(&mut server, port, &log);
    let out = Command::new("node")
        .current_dir(&dir)
        .arg(script)
        .args([&format!("http://127.0.0.1:{port}/"), "page-key"])
        .args(extra)
        .env("CHROMIUM", &chromium)
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["ok"], true, "{stdout}");
    eprintln!("{stdout}");
    report
}

#[test]
fn the_chat_page_works_in_a_headless_browser() {
    let model = common::default_model();
    let report = drive_page(
        &[std::ffi::OsStr::new("-m"), model.as_os_str()],
        "tests/browser.mjs",
        &[],
    );
    let stdout = report.to_string();
    assert_eq!(
        report["model"].as_str(),
        model.file_name().and_then(|n| n.to_str())
    );
    // The markdown image, the raw <img> and the scheme-relative one became links; nothing
    // reached the other port or left the page's origin.
    assert_eq!(report["remote_image_links"], 3, "{stdout}");
    assert_eq!(report["leaked"], 0, "{stdout}");
    assert_eq!(report["offsite"], 0, "{stdout}");
    let csp = report["csp"].as_str().unwrap_or_default();
    for directive in [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data: blob:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(
            csp.split(';').any(|d| d.trim() == directive),
            "{directive} missing from the CSP: {csp}"
        );
    }
}

/// The page on a server that takes images: the synthetic Gemma 3 pair of `fixtures/vision`
/// with an f32 cache, whose greedy answer for an image llama-server gave
/// (fixtures/vision/ref/server.json; tests/images.mjs compares).
#[test]
fn the_chat_page_sends_images() {
    let fixtures = common::repo_root().join("fixtures/vision");
    let model = fixtures.join("gemma3.gguf");
    let mmproj = fixtures.join("gemma3.mmproj.gguf");
    let args = [
        std::ffi::OsStr::new("-m"),
        model.as_os_str(),
        std::ffi::OsStr::new("--mmproj"),
        mmproj.as_os_str(),
        std::ffi::OsStr::new("--kv-f32"),
        std::ffi::OsStr::new("-t"),
        std::ffi::OsStr::new("2"),
    ];
    let report = drive_page(&args, "tests/images.mjs", &[fixtures.to_str().unwrap()]);
    assert_eq!(report["model"], "gemma3.gguf");
    assert_eq!(report["requests"], 2, "{report}");
}

#[test]
fn the_embedded_page_is_built_from_its_sources() {
    let dir = web_dir();
    assert!(
        dir.join("node_modules/vite").is_dir(),
        "the page's npm packages are missing: npm ci in {} (scripts/test.sh does)",
        dir.display()
    );
    let out_dir = tempfile::tempdir().unwrap();
    let build = Command::new("npx")
        .current_dir(&dir)
        .args(["vite", "build", "--emptyOutDir", "--outDir"])
        .arg(out_dir.path())
        .output()
        .expect("npx runs");
    assert!(
        build.status.success(),
        "{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let fresh = files_under(out_dir.path());
    let committed = files_under(&dir.join("dist"));
    let names =
        |files: &[(PathBuf, Vec<u8>)]| files.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&fresh),
        names(&committed),
        "the build writes other files than crates/ferrox-server/web/dist/ holds: run scripts/build-web.sh"
    );
    assert!(
        fresh
            .iter()
            .any(|(name, _)| name == std::path::Path::new("index.html")),
        "the build wrote no index.html"
    );
    for ((name, fresh), (_, committed)) in fresh.iter().zip(&committed) {
        assert!(
            fresh == committed,
            "crates/ferrox-server/web/dist/{} differs from a fresh build: run scripts/build-web.sh",
            name.display()
        );
    }
}

/// Every file under `root` (relative path, contents), sorted by path.
fn files_under(root: &std::path::Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                files.push((path.strip_prefix(root).unwrap().to_path_buf(), bytes));
            }
        }
    }
    files.sort();
    files
}
