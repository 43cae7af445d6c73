//! The chat page `ferrox serve` serves at `/`, in a real headless browser (Debian's chromium
//! driven by playwright-core; scripts/test.sh installs both): it loads from the binary,
//! names the model, streams a reply, keeps the conversation across a reload, stops on
//! Stop, and shows a server error (crates/ferrox-server/web/tests/browser.mjs). Also: the
//! embedded page is what its sources build to.

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

#[test]
fn the_chat_page_works_in_a_headless_browser() {
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
    let model = common::default_model();
    let port = free_port();
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("serve.log");
    let mut server = Served(
        Command::new(env!("CARGO_BIN_EXE_ferrox"))
            .args(["serve", "-m"])
            .arg(&model)
            .args(["--port", &port.to_string(), "--api-key", "page-key"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_healthy(&mut server, port, &log);
    let out = Command::new("node")
        .current_dir(&dir)
        .args([
            "tests/browser.mjs",
            &format!("http://127.0.0.1:{port}/"),
            "page-key",
        ])
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
    assert_eq!(
        report["model"].as_str(),
        model.file_name().and_then(|n| n.to_str())
    );
    eprintln!("{stdout}");
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
    let fresh = std::fs::read(out_dir.path().join("index.html")).unwrap();
    let committed = std::fs::read(dir.join("dist/index.html")).unwrap();
    assert!(
        fresh == committed,
        "crates/ferrox-server/web/dist/index.html differs from a fresh build: run scripts/build-web.sh"
    );
}
