//! `ferrox serve` end to end: a real server on a free loopback port with the default model,
//! driven through the official `openai` Python client (tests/serve/client.py), then stopped
//! with SIGTERM while a stream is running; and the same server on Multi-head Latent Attention
//! models (tests/serve/mla_client.py).

mod common;
#[path = "../../ferrox-models/tests/synthetic/mod.rs"]
mod synthetic;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{default_model, repo_root};
use ferrox_models::plan::{ExpertPlacement, MemoryPlan};

const API_KEY: &str = "test-key-123";
const N_CTX: usize = 2048;

/// A running `ferrox serve` and its log.
struct Server {
    child: Child,
    port: u16,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// Starts the server on port 0 and waits for the port it reports.
    fn start(args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrox"));
        cmd.arg("serve")
            .args(["--host", "127.0.0.1", "--port", "0"])
            .args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start ferrox serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(rest) = line.split("listening on http://127.0.0.1:").nth(1) {
                        let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
                        let _ = tx.send(port.parse::<u16>().unwrap());
                    }
                    log.lock().unwrap().push(line);
                }
            });
        }
        let port = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(p) => p,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "ferrox serve did not report its port; log:\n{}",
                    log.lock().unwrap().join("\n")
                );
            }
        };
        Server { child, port, log }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    fn wait_ready(&self, timeout: Duration) {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if http(self.port, "GET", "/health", None, None).0 == 200 {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the server did not become ready; log:\n{}", self.log());
    }

    fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to end; its exit status.
    fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if start.elapsed() > timeout {
                let _ = self.child.kill();
                panic!(
                    "ferrox serve did not exit within {timeout:?}; log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A minimal HTTP/1.1 request; the status and the whole body.
fn http(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&str>,
    key: Option<&str>,
) -> (u16, String) {
    let auth = key.map(|k| format!("Bearer {k}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| ("Authorization", a))
        .into_iter()
        .collect();
    let (status, _, body) = http_with_headers(port, method, path, body, &headers);
    (status, body)
}

/// A minimal HTTP/1.1 request with extra headers; the status, the response's head (status
/// line and headers) and its whole body.
fn http_with_headers(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> (u16, String, String) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new(), String::new());
    };
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.unwrap_or("");
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    if s.write_all(req.as_bytes()).is_err() {
        return (0, String::new(), String::new());
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (status, head.to_string(), body.to_string())
}

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Runs a client script of `tests/serve/` against `server` with `args` and asserts that its
/// checks passed (printing their lines, and the server's log on failure).
fn run_client(server: &Server, script: &str, args: &[&str], label: &str) {
    let out = Command::new(python())
        .arg(
            repo_root()
                .join("crates/ferrox-cli/tests/serve")
                .join(script),
        )
        .args(["--base-url", &format!("http://127.0.0.1:{}", server.port)])
        .args(args)
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{label}:\n{stdout}");
    assert!(
        out.status.success(),
        "{label}: client checks failed:\n{stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
}

fn require_openai() {
    let ok = Command::new(python())
        .args(["-c", "import openai, httpx"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "the `openai` Python package is not installed: run `python3 -m pip install openai httpx` (scripts/test.sh does)"
    );
}

#[test]
fn serve_end_to_end_through_the_openai_client() {
    let model = default_model();
    require_openai();
    let root = repo_root();
    let template = root.join("crates/ferrox-cli/tests/serve/gemma-3-it.jinja");
    let mut server = Server::start(
        &[
            "-m",
            model.to_str().unwrap(),
            "--ctx-size",
            &N_CTX.to_string(),
            "--parallel",
            "8",
            "--api-key",
            API_KEY,
            "--chat-template",
            template.to_str().unwrap(),
            "--shutdown-grace",
            "2",
            "--sse-ping",
            "1",
        ],
        &[],
    );
    server.wait_ready(Duration::from_secs(120));
    let log = server.log();
    assert!(
        log.contains("loaded") && log.contains("up to 8 sequences of 2048 positions"),
        "{log}"
    );

    let n_ctx = N_CTX.to_string();
    run_client(
        &server,
        "client.py",
        &["--api-key", API_KEY, "--n-ctx", &n_ctx],
        "default model",
    );

    // SIGTERM with a stream running: the server stops taking requests, cancels the stream
    // after the grace period (an SSE error event, never content) and exits 0.
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let body = r#"{"prompt": "Tell me a long story.", "max_tokens": 1800, "temperature": 0, "stream": true}"#;
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(stream);
    let mut first = String::new();
    while !first.starts_with("data: ") {
        first.clear();
        reader.read_line(&mut first).unwrap();
    }
    server.terminate();
    let started = Instant::now();
    let mut rest = String::new();
    let _ = reader.read_to_string(&mut rest);
    assert!(
        rest.contains("shutting down") || rest.contains("[DONE]"),
        "{rest}"
    );
    let status = server.wait_exit(Duration::from_secs(20));
    assert!(
        status.success(),
        "exit status {status:?}; log:\n{}",
        server.log()
    );
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(server.log().contains("SIGTERM"), "{}", server.log());
}

/// The synthetic `deepseek2` (V3 routing, YaRN), `mistral4`, `deepseek32`, `glm-dsa`,
/// `deepseek4`, `kimi-linear` and `kimi-k3` models served
/// with continuous batching: every check of mla_client.py, with the memory figures of each
/// engine (the latent row, `kv_lora_rank + rope dims` values per MLA layer in f16, and for
/// the Kimi models each KDA layer's recurrent state per sequence).
#[test]
fn serve_runs_mla_and_kimi_models() {
    require_openai();
    let dir = tempfile::tempdir().unwrap();
    let parallel = 8;
    let mla = |name: &str| {
        let spec = synthetic::spec(name);
        let mla = spec.mla.clone().unwrap();
        let per_position = (mla.kv_lora_rank + mla.qk_rope) * spec.n_layer * 2;
        (synthetic::gguf_bytes(name), per_position as f64, 0)
    };
    // Q8_0 bytes of `values` values (whole blocks of 32).
    let q8_0 = |values: usize| values / 32 * 34;
    // kimi-linear: one MLA layer of latent 32 + 16 rope dims; three KDA layers of 2 heads of
    // 32 with a convolution of 4 (three windows of 3 inputs, one 32x32 state per head).
    let kda_state = 3 * (3 * 3 * 64 + 2 * 32 * 32) * 4;
    let models = [
        ("deepseek2-v3", mla("deepseek2-v3")),
        ("mistral4", mla("mistral4")),
        // DeepSeek Sparse Attention: the latent row (64 + 16) and the indexer's key row (64)
        // per position and layer.
        (
            "deepseek32",
            (
                synthetic::dsa::gguf_bytes("deepseek32"),
                ((3 * 80 + 3 * 64) * 2) as f64,
                0,
            ),
        ),
        (
            "glm-dsa",
            (
                synthetic::dsa::gguf_bytes("glm-dsa"),
                ((4 * 80 + 2 * 64) * 2) as f64,
                0,
            ),
        ),
        // deepseek4: per block of 16 positions, each 4x layer's 4 compressed rows (64) and
        // indexer keys (128), the 128x layer's one row slot, in f16; per sequence, in f32,
        // the rings: every layer's window (32) and slack (32) of raw rows, each 4x layer's
        // 8 + 32 entries of 4·(64 + 128), the 128x layer's 128 + 32 entries of 2·64.
        (
            "deepseek4",
            (
                synthetic::deepseek4::gguf_bytes(),
                ((2 * 4 * (64 + 128) + 64) * 2 / 16) as f64,
                (4 * 64 * 64 + 2 * 40 * 4 * 192 + 160 * 2 * 64) * 4,
            ),
        ),
        (
            "kimi-linear",
            (
                synthetic::kimi::kimi_linear_gguf_bytes(),
                ((32 + 16) * 2) as f64,
                kda_state,
            ),
        ),
        // kimi-k3: two MLA layers and three KDA layers of the same shapes.
        (
            "kimi-k3",
            (
                synthetic::kimi::gguf_bytes("kimi-k3"),
                (2 * (32 + 16) * 2) as f64,
                kda_state,
            ),
        ),
    ];
    // `-ctk q8_0`: DeepSeek-V4's compressed rows and indexer keys as Q8_0 blocks (a 64-value
    // row 68 bytes), its rings of raw rows too (each row's blocks in 17 f32 slots); the DSA
    // model with whole-block latent rows (64 + 32) and its indexer keys (64); Kimi-K3's two
    // MLA layers' latent rows (32 + 32) beside the same f32 KDA states.
    let quantized = [
        (
            "deepseek4",
            synthetic::deepseek4::gguf_bytes(),
            (2 * 4 * (q8_0(64) + q8_0(128)) + q8_0(64)) as f64 / 16.0,
            4 * 64 * q8_0(64) + (2 * 40 * 4 * 192 + 160 * 2 * 64) * 4,
        ),
        (
            "deepseek32-blocks",
            synthetic::dsa::gguf_bytes("deepseek32-blocks"),
            (3 * (q8_0(96) + q8_0(64))) as f64,
            0,
        ),
        (
            "kimi-k3-blocks",
            synthetic::kimi::gguf_bytes("kimi-k3-blocks"),
            (2 * q8_0(64)) as f64,
            kda_state,
        ),
    ];
    // deepseek2-v3 again with its routed experts streamed through a cache of 6 (of 32: two
    // MoE layers of 16, 4 used per token).
    let streamed = {
        let (bytes, per_position, recurrent) = mla("deepseek2-v3");
        let gguf = ferrox_gguf::Gguf::from_bytes(bytes.clone()).unwrap();
        let plan = MemoryPlan::for_budget(gguf.tensors(), 0, false, true).unwrap();
        let ExpertPlacement::Streamed { slot_bytes, .. } = plan.experts else {
            panic!("{plan:?}");
        };
        let budget = plan.dense_bytes + 6 * slot_bytes;
        (bytes, per_position, recurrent, budget)
    };
    let runs = models
        .into_iter()
        .map(|(name, (bytes, per_position, recurrent))| {
            (name, bytes, per_position, recurrent, None, None)
        })
        .chain([(
            "deepseek2-v3",
            streamed.0,
            streamed.1,
            streamed.2,
            Some(streamed.3),
            None,
        )])
        .chain(quantized.map(|(name, bytes, per_position, recurrent)| {
            (name, bytes, per_position, recurrent, None, Some("q8_0"))
        }));
    for (name, bytes, per_position, recurrent, budget, cache) in runs {
        let path = dir.path().join(format!("{name}.gguf"));
        std::fs::write(&path, bytes).unwrap();
        let mut flags = vec![
            "-m".to_string(),
            path.to_str().unwrap().to_string(),
            "--ctx-size".into(),
            "256".into(),
            "--parallel".into(),
            parallel.to_string(),
            "-t".into(),
            "2".into(),
        ];
        if let Some(b) = budget {
            flags.extend(["--memory-budget".to_string(), b.to_string()]);
        }
        if let Some(cache) = cache {
            flags.extend(["-ctk".to_string(), cache.to_string()]);
        }
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let server = Server::start(&flags, &[]);
        server.wait_ready(Duration::from_secs(60));
        let slots = if budget.is_some() { 6 } else { 0 };
        let numbers = [
            per_position.to_string(),
            recurrent.to_string(),
            parallel.to_string(),
            slots.to_string(),
        ];
        run_client(
            &server,
            "mla_client.py",
            &[
                "--bytes-per-position",
                &numbers[0],
                "--recurrent-bytes",
                &numbers[1],
                "--parallel",
                &numbers[2],
                "--expert-slots",
                &numbers[3],
            ],
            &format!("{name} (memory budget {budget:?}, cache {cache:?})"),
        );
        assert!(server.log().contains(name.split('-').next().unwrap()));
    }
}

#[test]
fn serve_refuses_a_public_address_without_an_api_key() {
    let out = Command::new(env!("CARGO_BIN_EXE_ferrox"))
        .args([
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "-m",
            "/nonexistent.gguf",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--api-key") && err.contains("loopback"),
        "{err}"
    );
}

#[test]
fn serve_health_is_503_while_loading_and_errors_are_openai_shaped() {
    let model = default_model();
    let mut server = Server::start(
        &[
            "-m",
            model.to_str().unwrap(),
            "--ctx-size",
            "256",
            "--parallel",
            "1",
            "--max-queue",
            "1",
        ],
        &[("FERROX_SERVE_TEST_LOAD_DELAY_MS", "1500")],
    );
    let (status, body) = http(server.port, "GET", "/health", None, None);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains(r#""type":"unavailable_error""#), "{body}");
    let (status, body) = http(
        server.port,
        "POST",
        "/v1/completions",
        Some(r#"{"prompt": "x"}"#),
        None,
    );
    assert_eq!(status, 503, "{body}");
    server.wait_ready(Duration::from_secs(60));
    let (status, body) = http(server.port, "GET", "/health", None, None);
    assert_eq!((status, body.as_str()), (200, r#"{"status":"ok"}"#));
    // No key configured: requests need none. The prompt does not fit 256 positions.
    let long = format!(
        r#"{{"prompt": "{}", "max_tokens": 4}}"#,
        "word ".repeat(400)
    );
    let (status, body) = http(server.port, "POST", "/v1/completions", Some(&long), None);
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("256") && body.contains(r#""param":"prompt""#),
        "{body}"
    );
    let (status, body) = http(
        server.port,
        "POST",
        "/v1/completions",
        Some(r#"{"prompt": "One, two,", "max_tokens": 2, "temperature": 0}"#),
        None,
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""completion_tokens":2"#), "{body}");

    // One slot, a queue of one: a third request at once is refused with 429, the other two
    // complete.
    let port = server.port;
    let busy: Vec<_> = (0..2)
        .map(|i| {
            std::thread::sleep(Duration::from_millis(150));
            std::thread::spawn(move || {
                let body = format!(r#"{{"prompt": "Story {i}:", "max_tokens": 120, "temperature": 0, "logit_bias": {{"1": -100, "106": -100}}}}"#);
                http(port, "POST", "/v1/completions", Some(&body), None)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let (status, body) = http(
        port,
        "POST",
        "/v1/completions",
        Some(r#"{"prompt": "x", "max_tokens": 2}"#),
        None,
    );
    assert_eq!(status, 429, "{body}");
    assert!(body.contains(r#""type":"rate_limit_error""#), "{body}");
    for b in busy {
        let (status, body) = b.join().unwrap();
        assert_eq!(status, 200, "{body}");
    }
    let (_, metrics) = http(port, "GET", "/metrics", None, None);
    assert!(
        metrics.contains("ferrox_requests_deferred_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"ferrox_requests_total{route="/v1/completions",status="429"} 1"#),
        "{metrics}"
    );
    server.terminate();
    assert!(server.wait_exit(Duration::from_secs(20)).success());
}

/// A KV pool with room for about one context: concurrent requests wait for blocks instead
/// of failing, each still gets exactly its solo output, and every block comes back.
#[test]
fn serve_queues_requests_for_kv_memory() {
    let model = default_model();
    let mut server = Server::start(
        &[
            "-m",
            model.to_str().unwrap(),
            "--ctx-size",
            "256",
            "--parallel",
            "4",
            "--kv-memory",
            "5",
        ],
        &[],
    );
    server.wait_ready(Duration::from_secs(60));
    let log = server.log();
    assert!(log.contains("KV pool: 17 blocks of 16 positions"), "{log}");
    let port = server.port;
    let request = |i: usize| {
        let body = format!(
            r#"{{"prompt": "Story {i}:", "max_tokens": 100, "temperature": 0, "logit_bias": {{"1": -100, "106": -100}}}}"#
        );
        let (status, body) = http(port, "POST", "/v1/completions", Some(&body), None);
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 100, "{body}");
        v["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let solo: Vec<String> = (0..4).map(request).collect();
    // Each request may need 7 blocks: two run at a time, the others wait.
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4).map(|i| s.spawn(move || request(i))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, solo);
    let (_, metrics) = http(port, "GET", "/metrics", None, None);
    assert!(metrics.contains("ferrox_kv_blocks_used 0"), "{metrics}");
    assert!(metrics.contains("ferrox_kv_blocks_total 17"), "{metrics}");
    server.terminate();
    assert!(server.wait_exit(Duration::from_secs(20)).success());
}

/// `--log-format json`: every line on stderr is one JSON object, and the lines logged while
/// handling a request, the scheduler's included, carry the request's `X-Request-Id`.
#[test]
fn serve_logs_json_lines_with_request_ids() {
    let model = default_model();
    let mut server = Server::start(
        &[
            "-m",
            model.to_str().unwrap(),
            "--ctx-size",
            "256",
            "--parallel",
            "1",
            "--log-format",
            "json",
        ],
        &[],
    );
    server.wait_ready(Duration::from_secs(60));
    let (status, head, body) = http_with_headers(
        server.port,
        "POST",
        "/v1/completions",
        Some(r#"{"prompt": "One, two,", "max_tokens": 3, "temperature": 0}"#),
        &[("X-Request-Id", "test-req-42")],
    );
    assert_eq!(status, 200, "{body}");
    assert!(
        head.to_ascii_lowercase()
            .contains("\r\nx-request-id: test-req-42\r\n"),
        "{head}"
    );
    let (status, head, body) = http_with_headers(
        server.port,
        "GET",
        "/v1/nothing",
        None,
        &[("X-Request-Id", "test-req-43")],
    );
    assert_eq!(status, 404, "{body}");
    assert!(
        head.to_ascii_lowercase()
            .contains("\r\nx-request-id: test-req-43\r\n"),
        "{head}"
    );
    server.terminate();
    assert!(server.wait_exit(Duration::from_secs(20)).success());
    // The reader thread may still be draining the pipe.
    let start = Instant::now();
    while !server.log().contains(r#""message":"stopped""#)
        && start.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(50));
    }

    let log = server.log();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}\nlog:\n{log}"));
            assert!(v.is_object() && v["level"].is_string(), "{line}");
            v
        })
        .collect();
    assert!(lines.len() >= 5, "{log}");
    assert!(log.contains(r#""request_id":"test-req-42""#), "{log}");
    let of = |id: &str| -> Vec<&serde_json::Value> {
        lines
            .iter()
            .filter(|v| v["span"]["request_id"] == id)
            .collect()
    };
    // The scheduler thread logs the finished sequence inside the request's span.
    let finished = of("test-req-42");
    assert!(
        finished.iter().any(|v| v["target"]
            .as_str()
            .is_some_and(|t| t.starts_with("ferrox_server::scheduler"))
            && v["fields"]["message"] == "sequence finished"
            && v["fields"]["completion_tokens"] == 3),
        "{log}"
    );
    assert!(
        of("test-req-43").iter().any(|v| v["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("/v1/nothing -> 404"))),
        "{log}"
    );
}

/// `--spec-type ngram`: eight concurrent greedy streams with prompt-lookup drafts checked
/// inside the batch give the same text as each request alone on a server without
/// speculation, and `/metrics` counts the drafted and accepted tokens.
#[test]
fn serve_speculative_streams_equal_their_solo_outputs() {
    // Prompts that repeat themselves (prompt lookup has something to propose) and one that
    // does not.
    let prompts: Vec<String> = (0..8)
        .map(|i| match i % 3 {
            0 => format!(
                "def f{i}(x):\n    return x + {i}\n\ndef g{i}(x):\n    return x * {i}\n\n# The same two functions again:\ndef f{i}(x):"
            ),
            1 => format!("Count: {i}, {}, {}, {}, {}, {}, {},", i + 1, i + 2, i + 3, i + 4, i + 5, i + 6),
            _ => format!("Story {i}: once upon a time"),
        })
        .collect();
    let lookup = ["--spec-type", "ngram", "--draft-max", "8"];
    let model = default_model();
    let (drafted, accepted) = speculative_streams_equal_solo(&model, "1024", &lookup, &prompts);
    assert!(accepted > 0.0 && drafted >= accepted);
    // The model as its own draft model: its greedy drafts are kept.
    let draft = ["-md", model.to_str().unwrap(), "--draft-max", "4"];
    let (drafted, accepted) = speculative_streams_equal_solo(&model, "1024", &draft, &prompts);
    assert!(accepted > 0.0 && drafted >= accepted);
}

/// A draft model that is often wrong (two unrelated synthetic models with one vocabulary):
/// eight concurrent streams still equal their solo runs, the rejected drafts rolled back in
/// both models' memories.
#[test]
fn serve_draft_model_streams_equal_their_solo_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str| {
        let path = dir.path().join(format!("{name}.gguf"));
        std::fs::write(&path, synthetic::gguf_bytes(name)).unwrap();
        path
    };
    let (target, draft) = (write("deepseek2"), write("qwen2moe"));
    let (drafted, accepted) = draft_model_streams_equal_solo(&target, &draft, "4");
    assert!(drafted > accepted, "{drafted} drafted, {accepted} accepted");
}

/// [`speculative_streams_equal_solo`] with `draft` as the draft model (`--draft-max
/// draft_max`, every draft token kept until the target rejects it), on eight short prompts
/// of the synthetic vocabulary.
fn draft_model_streams_equal_solo(target: &Path, draft: &Path, draft_max: &str) -> (f64, f64) {
    let syllables = ["ba", "ce", "di", "fo", "gu", "ha", "ki", "lo"];
    let prompts: Vec<String> = (0..8)
        .map(|i| {
            (0..6 + i)
                .map(|k| syllables[(i * k + k) % 8])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let args = [
        "--spec-type",
        "draft",
        "-md",
        draft.to_str().unwrap(),
        "--draft-max",
        draft_max,
        "--draft-p-min",
        "0",
    ];
    speculative_streams_equal_solo(target, "256", &args, &prompts)
}

/// The same on DeepSeek-V4, whose window and compressor inputs live in rings that drop the
/// rejected draft tokens (up to 32 positions), prompts long enough to pass the first 128x
/// compressed row while drafting.
#[test]
fn serve_speculative_deepseek4_streams_equal_their_solo_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deepseek4.gguf");
    std::fs::write(&path, synthetic::deepseek4::gguf_bytes()).unwrap();
    let prompts = repeated_phrases(5, |i| 7 + (i * 5) / 7);
    let lookup = ["--spec-type", "ngram", "--draft-max", "8"];
    let (drafted, _) = speculative_streams_equal_solo(&path, "512", &lookup, &prompts);
    assert!(drafted > 0.0);
}

/// The same on Kimi-K3, whose recurrent state is checkpointed after each of a step's last
/// three positions when the server speculates, so that rejected draft tokens roll back.
#[test]
fn serve_speculative_kimi_k3_streams_equal_their_solo_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kimi-k3.gguf");
    std::fs::write(&path, synthetic::kimi::gguf_bytes("kimi-k3")).unwrap();
    let prompts = repeated_phrases(4, |i| 3 + i % 4);
    let lookup = ["--spec-type", "ngram", "--draft-max", "3"];
    let (drafted, _) = speculative_streams_equal_solo(&path, "256", &lookup, &prompts);
    assert!(drafted > 0.0);
}

/// Eight prompts of the synthetic vocabulary for n-gram lookup: prompt `i` is a phrase of
/// `words` syllables of its own, said `repeats(i)` times.
fn repeated_phrases(words: usize, repeats: impl Fn(usize) -> usize) -> Vec<String> {
    let syllables = ["ba", "ce", "di", "fo", "gu", "ha", "ki", "lo"];
    (0..8)
        .map(|i| {
            let phrase: Vec<&str> = (0..words).map(|k| syllables[(i + 3 * k) % 8]).collect();
            vec![phrase.join(" "); repeats(i)].join(" ")
        })
        .collect()
}

/// Kimi-K3 drafted for by Kimi Linear, whose recurrent state rolls back only to block ends:
/// the draft's sequences start again from the whole text where they cannot roll back, and
/// the streams still equal their solo runs.
#[test]
fn serve_recurrent_draft_model_streams_equal_their_solo_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("kimi-k3.gguf");
    std::fs::write(&target, synthetic::kimi::gguf_bytes("kimi-k3")).unwrap();
    let draft = dir.path().join("kimi-linear.gguf");
    std::fs::write(&draft, synthetic::kimi::kimi_linear_gguf_bytes()).unwrap();
    let (drafted, _) = draft_model_streams_equal_solo(&target, &draft, "3");
    assert!(drafted > 0.0);
}

/// The synthetic MLA model with a multi-token-prediction block, drafting with it
/// (`--spec-type draft-mtp`): eight concurrent streams whose prompts share a prefix (its
/// blocks shared, the block's rows behind them kept) equal their solo runs.
#[test]
fn serve_mtp_streams_equal_their_solo_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deepseek2-mtp.gguf");
    std::fs::write(&path, synthetic::gguf_bytes("deepseek2-mtp")).unwrap();
    let syllables = ["ba", "ce", "di", "fo", "gu", "ha", "ki", "lo"];
    let shared: Vec<&str> = (0..30).map(|k| syllables[(3 * k) % 8]).collect();
    let prompts: Vec<String> = (0..8)
        .map(|i| {
            let tail: Vec<&str> = (0..2 + i).map(|k| syllables[(i + k) % 8]).collect();
            format!("{} {}", shared.join(" "), tail.join(" "))
        })
        .collect();
    let args = ["--spec-type", "draft-mtp", "--draft-max", "3"];
    let (drafted, _) = speculative_streams_equal_solo(&path, "256", &args, &prompts);
    assert!(drafted > 0.0);
}

/// Eight concurrent greedy streams of 64 tokens on a server speculating as `spec` says, each
/// equal to the request alone on a server without; returns the drafted and accepted tokens
/// `/metrics` counted (checked against each other and the plain server's zero).
fn speculative_streams_equal_solo(
    model: &Path,
    ctx: &str,
    spec: &[&str],
    prompts: &[String],
) -> (f64, f64) {
    let start = |extra: &[&str]| {
        let mut args = vec![
            "-m",
            model.to_str().unwrap(),
            "--ctx-size",
            ctx,
            "--parallel",
            "8",
        ];
        args.extend_from_slice(extra);
        let server = Server::start(&args, &[]);
        server.wait_ready(Duration::from_secs(120));
        server
    };
    let mut speculative = start(spec);
    let mut plain = start(&[]);
    let request = |port: u16, prompt: &str| {
        let body = serde_json::json!({
            "prompt": prompt,
            "max_tokens": 64,
            "temperature": 0,
        })
        .to_string();
        let (status, body) = http(port, "POST", "/v1/completions", Some(&body), None);
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| s.spawn(|| request(speculative.port, p)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let solo: Vec<String> = prompts.iter().map(|p| request(plain.port, p)).collect();
    for (i, (a, b)) in together.iter().zip(&solo).enumerate() {
        assert_eq!(a, b, "prompt {i}: {:?}", prompts[i]);
    }
    let value = |metrics: &str, name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing:\n{metrics}"))
    };
    let (_, metrics) = http(speculative.port, "GET", "/metrics", None, None);
    let drafted = value(&metrics, "vllm:spec_decode_num_draft_tokens_total");
    let accepted = value(&metrics, "vllm:spec_decode_num_accepted_tokens_total");
    eprintln!("drafted {drafted} tokens, accepted {accepted}");
    assert!(drafted >= accepted, "{metrics}");
    assert_eq!(
        value(&metrics, "vllm:spec_decode_num_drafts_total") > 0.0,
        drafted > 0.0
    );
    assert_eq!(
        value(&metrics, "ferrox_spec_decode_accepted_tokens_total"),
        accepted
    );
    let (_, metrics) = http(plain.port, "GET", "/metrics", None, None);
    assert_eq!(
        value(&metrics, "ferrox_spec_decode_draft_tokens_total"),
        0.0
    );
    // Drafting never failed (which would leave the step without drafts).
    let log = speculative.log();
    assert!(!log.contains("drafting failed"), "{log}");
    for server in [&mut speculative, &mut plain] {
        server.terminate();
        assert!(server.wait_exit(Duration::from_secs(20)).success());
    }
    (drafted, accepted)
}

/// An embedding fixture (`crates/ferrox-models/tests/fixtures/embeddings/NAME.json`) and its
/// model, written into a temporary directory after checking it is the file llama.cpp ran: the
/// directory (removed when dropped), the model's path, the fixture's path and the fixture.
fn embedding_fixture(
    name: &str,
    bytes: Vec<u8>,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    std::path::PathBuf,
    serde_json::Value,
) {
    use sha2::Digest;
    let fixture_path = repo_root()
        .join("crates/ferrox-models/tests/fixtures/embeddings")
        .join(format!("{name}.json"));
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&fixture_path).unwrap()).unwrap();
    let sha: String = sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        sha,
        fixture["gguf_sha256"].as_str().unwrap(),
        "{name}: not the file llama.cpp ran"
    );
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join(format!("{name}.gguf"));
    std::fs::write(&model, bytes).unwrap();
    (dir, model, fixture_path, fixture)
}

/// `serve --embeddings` on the synthetic llama.f32 sweep model (f32 cache) against llama.cpp's
/// embeddings of the same file: every check of embeddings_client.py with mean pooling; then
/// with `--pooling none`, `/embedding` gives every token's vector (and `/v1/embeddings`,
/// which cannot hold them, a 400); without `--embeddings` both answer 501.
#[test]
fn serve_embeddings_equal_llama_cpp() {
    require_openai();
    let (_dir, model, fixture_path, fixture) =
        embedding_fixture("llama.f32", synthetic::sweep_gguf_bytes("llama.f32"));
    let n_ctx = "256";
    let base = [
        "-m",
        model.to_str().unwrap(),
        "-c",
        n_ctx,
        "-ctk",
        "f32",
        "-ctv",
        "f32",
        "-t",
        "2",
        "--parallel",
        "4",
    ];
    let serve = |extra: &[&str]| {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let server = Server::start(&args, &[]);
        server.wait_ready(Duration::from_secs(60));
        server
    };

    let server = serve(&["--embeddings", "--pooling", "mean"]);
    assert!(
        server.log().contains("embeddings: mean pooling"),
        "{}",
        server.log()
    );
    run_client(
        &server,
        "embeddings_client.py",
        &[
            "--fixture",
            fixture_path.to_str().unwrap(),
            "--n-ctx",
            n_ctx,
        ],
        "embeddings",
    );
    drop(server);

    let server = serve(&["--embeddings", "--pooling", "none"]);
    let seqs = fixture["sequences"].as_array().unwrap();
    let per_token = fixture["pooled"]["none"].as_array().unwrap();
    for (seq, expected) in seqs.iter().zip(per_token) {
        let body = serde_json::json!({ "content": seq }).to_string();
        let (status, reply) = http(server.port, "POST", "/embedding", Some(&body), None);
        assert_eq!(status, 200, "{reply}");
        let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
        let rows = reply[0]["embedding"].as_array().unwrap();
        let expected = expected.as_array().unwrap();
        assert_eq!(rows.len(), expected.len(), "one vector per token");
        for (ours, theirs) in rows.iter().zip(expected) {
            let (ours, theirs) = (ours.as_array().unwrap(), theirs.as_array().unwrap());
            let scale = theirs
                .iter()
                .map(|x| x.as_f64().unwrap().abs())
                .fold(0.0, f64::max);
            for (a, b) in ours.iter().zip(theirs) {
                let d = (a.as_f64().unwrap() - b.as_f64().unwrap()).abs() / scale;
                assert!(d <= 1e-4, "pooling none: relative difference {d:.2e}");
            }
        }
    }
    let (status, reply) = http(
        server.port,
        "POST",
        "/v1/embeddings",
        Some(r#"{"input": "x"}"#),
        None,
    );
    assert_eq!(status, 400, "{reply}");
    assert!(reply.contains("--pooling"), "{reply}");
    drop(server);

    let server = serve(&[]);
    for path in ["/v1/embeddings", "/embedding"] {
        let (status, reply) = http(server.port, "POST", path, Some(r#"{"input": "x"}"#), None);
        assert_eq!(status, 501, "{path}: {reply}");
        assert!(reply.contains("--embeddings"), "{reply}");
    }
}

/// `serve --embeddings` on the synthetic BERT (an encoder, the file's CLS pooling, f32 cache):
/// three inputs in one request (embedded together, each whole) equal llama.cpp's embeddings
/// of the same file, and generation is refused with a 400, constrained or not.
#[test]
fn serve_embeds_with_an_encoder() {
    let (_dir, model, _, fixture) = embedding_fixture("bert", synthetic::bert::gguf_bytes("bert"));
    let server = Server::start(
        &[
            "-m",
            model.to_str().unwrap(),
            "--embeddings",
            "-ctk",
            "f32",
            "-ctv",
            "f32",
            "-t",
            "2",
        ],
        &[],
    );
    server.wait_ready(Duration::from_secs(60));
    assert!(
        server.log().contains("embeddings: cls pooling"),
        "{}",
        server.log()
    );
    let seqs = fixture["sequences"].clone();
    let body = serde_json::json!({ "input": seqs }).to_string();
    let (status, reply) = http(server.port, "POST", "/v1/embeddings", Some(&body), None);
    assert_eq!(status, 200, "{reply}");
    let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
    let expected = fixture["pooled"]["cls"].as_array().unwrap();
    for (item, reference) in reply["data"].as_array().unwrap().iter().zip(expected) {
        let reference: Vec<f64> = reference[0]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let norm = reference.iter().map(|x| x * x).sum::<f64>().sqrt();
        let ours = item["embedding"].as_array().unwrap();
        assert_eq!(ours.len(), reference.len());
        for (a, b) in ours.iter().zip(&reference) {
            let d = (a.as_f64().unwrap() - b / norm).abs();
            assert!(d <= 1e-4, "input {}: |diff| {d:.2e}", item["index"]);
        }
    }
    let (status, reply) = http(
        server.port,
        "POST",
        "/v1/completions",
        Some(r#"{"prompt": "ba", "max_tokens": 2}"#),
        None,
    );
    assert_eq!(status, 400, "{reply}");
    assert!(reply.contains("embedding model"), "{reply}");
    // A constrained one too (an encoder has no grammar engine): refused for what it is.
    let (status, reply) = http(
        server.port,
        "POST",
        "/v1/completions",
        Some(r#"{"prompt": "ba", "max_tokens": 2, "response_format": {"type": "json_object"}}"#),
        None,
    );
    assert_eq!(status, 400, "{reply}");
    assert!(reply.contains("model_not_generative"), "{reply}");
}

/// `serve --reranking` on the synthetic BERT reranker (f32 cache): `/v1/rerank` scores a
/// query against documents as llama.cpp scores the same pairs (llama-server's layout:
/// `[CLS] query [SEP] document`), sorted, cut to `top_n`, with the documents when asked; TEI's
/// shape too; and a server started without it answers 501.
#[test]
fn serve_reranks_as_llama_cpp() {
    let (_dir, model, _, fixture) = embedding_fixture(
        "bert-reranker",
        synthetic::bert::gguf_bytes("bert-reranker"),
    );
    let base = [
        "-m",
        model.to_str().unwrap(),
        "-ctk",
        "f32",
        "-ctv",
        "f32",
        "-t",
        "2",
    ];
    let args: Vec<&str> = base.iter().copied().chain(["--reranking"]).collect();
    let server = Server::start(&args, &[]);
    server.wait_ready(Duration::from_secs(60));
    let rr = &fixture["rerank"];
    let expected: Vec<f64> = rr["scores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_f64().unwrap())
        .collect();
    let body = serde_json::json!({
        "query": rr["query"],
        "documents": rr["documents"],
        "top_n": 3,
        "return_documents": true,
    })
    .to_string();
    let (status, reply) = http(server.port, "POST", "/v1/rerank", Some(&body), None);
    assert_eq!(status, 200, "{reply}");
    let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
    let results = reply["results"].as_array().unwrap();
    assert_eq!(results.len(), 3, "{reply}");
    let mut order: Vec<usize> = (0..expected.len()).collect();
    order.sort_by(|&a, &b| expected[b].total_cmp(&expected[a]));
    for (item, &want) in results.iter().zip(&order) {
        let index = item["index"].as_u64().unwrap() as usize;
        assert_eq!(index, want, "{reply}");
        let score = item["relevance_score"].as_f64().unwrap();
        assert!(
            (score - expected[index]).abs() <= 1e-4 * expected[index].abs().max(1.0),
            "document {index}: {score} vs llama.cpp {}",
            expected[index]
        );
        assert_eq!(item["document"]["text"], rr["documents"][index]);
    }
    let pairs: usize = rr["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_array().unwrap().len())
        .sum();
    assert_eq!(
        reply["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
        pairs,
        "{reply}"
    );
    let body = serde_json::json!({"query": rr["query"], "texts": rr["documents"]}).to_string();
    let (status, reply) = http(server.port, "POST", "/rerank", Some(&body), None);
    assert_eq!(status, 200, "{reply}");
    let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(reply.as_array().unwrap().len(), expected.len(), "{reply}");
    assert_eq!(
        reply[0]["index"].as_u64().unwrap() as usize,
        order[0],
        "{reply}"
    );
    let (status, reply) = http(
        server.port,
        "POST",
        "/v1/rerank",
        Some(r#"{"query": "x"}"#),
        None,
    );
    assert_eq!(status, 400, "{reply}");
    drop(server);

    let args: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--embeddings", "--pooling", "cls"])
        .collect();
    let server = Server::start(&args, &[]);
    server.wait_ready(Duration::from_secs(60));
    let (status, reply) = http(server.port, "POST", "/v1/rerank", Some(&body), None);
    assert_eq!(status, 501, "{reply}");
}

/// Resident memory of a process, in bytes (`VmRSS`).
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

fn greedy_completion(port: u16, model: Option<&str>) -> String {
    let mut body = serde_json::json!({"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0});
    if let Some(m) = model {
        body["model"] = serde_json::json!(m);
    }
    let (status, reply) = http(
        port,
        "POST",
        "/v1/completions",
        Some(&body.to_string()),
        None,
    );
    assert_eq!(status, 200, "{reply}");
    let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
    reply["choices"][0]["text"].as_str().unwrap().to_string()
}

/// `serve --models-dir` with Gemma-3-270M and Qwen2.5-Coder-0.5B (and a Hugging Face cache
/// holding Gemma under a repository's name) and `--models-max 1`:
/// alternating requests load each model in turn (the other unloaded), with the outputs of
/// single-model servers; two requests for an unloaded model both wait for its one load;
/// `/v1/models` and `/metrics` show the states; an unknown model is a 404 naming the others;
/// `/models/unload` frees the memory.
#[test]
fn serve_models_dir_loads_and_unloads_on_demand() {
    let gemma = default_model();
    let qwen = gemma.with_file_name("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    assert!(
        qwen.is_file(),
        "{} is missing: run scripts/fetch-model.sh qwen-0.5b",
        qwen.display()
    );
    let solo = |path: &Path| {
        let server = Server::start(&["-m", path.to_str().unwrap(), "-c", "512", "-t", "2"], &[]);
        server.wait_ready(Duration::from_secs(120));
        greedy_completion(server.port, None)
    };
    let (gemma_text, qwen_text) = (solo(&gemma), solo(&qwen));
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(&gemma, dir.path().join("gemma.gguf")).unwrap();
    std::os::unix::fs::symlink(&qwen, dir.path().join("qwen.gguf")).unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not a model").unwrap();
    // A Hugging Face cache holding one model (Gemma again, under a repository's name).
    let hub = tempfile::tempdir().unwrap();
    let repo = hub.path().join("models--ferrox-test--tiny-GGUF");
    let commit = "0123456789abcdef0123456789abcdef01234567";
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    let snapshot = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snapshot).unwrap();
    std::os::unix::fs::symlink(&gemma, snapshot.join("tiny-Q4_K_M.gguf")).unwrap();
    let server = Server::start(
        &[
            "--models-dir",
            dir.path().to_str().unwrap(),
            "--models-max",
            "1",
            "-c",
            "512",
            "-t",
            "2",
            "--shutdown-grace",
            "2",
        ],
        &[("HF_HUB_CACHE", hub.path().to_str().unwrap())],
    );
    server.wait_ready(Duration::from_secs(30));
    let models = |port: u16| -> Vec<(String, String)> {
        let (status, reply) = http(port, "GET", "/v1/models", None, None);
        assert_eq!(status, 200, "{reply}");
        let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
        reply["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let id = m["id"].as_str().unwrap().to_string();
                (id, m["status"]["value"].as_str().unwrap().to_string())
            })
            .collect()
    };
    let state = |want: &[(&str, &str)]| {
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let started = Instant::now();
        while models(server.port) != want {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{:?}",
                models(server.port)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let cached = "ferrox-test/tiny-GGUF/tiny-Q4_K_M";
    state(&[
        ("gemma", "unloaded"),
        ("qwen", "unloaded"),
        (cached, "unloaded"),
    ]);
    // Two requests for the unloaded model at once: one load, both answered.
    let port = server.port;
    let waiting: Vec<_> = (0..2)
        .map(|_| std::thread::spawn(move || greedy_completion(port, Some("gemma"))))
        .collect();
    for w in waiting {
        assert_eq!(w.join().unwrap(), gemma_text);
    }
    assert_eq!(
        server.log().matches("model gemma loaded").count(),
        1,
        "{}",
        server.log()
    );
    for (model, text) in [
        ("qwen", &qwen_text),
        (cached, &gemma_text),
        ("gemma", &gemma_text),
        ("qwen", &qwen_text),
    ] {
        assert_eq!(
            &greedy_completion(server.port, Some(model)),
            text,
            "{model}"
        );
    }
    state(&[
        ("gemma", "unloaded"),
        ("qwen", "loaded"),
        (cached, "unloaded"),
    ]);
    let (_, metrics) = http(server.port, "GET", "/metrics", None, None);
    assert!(
        metrics.contains("ferrox_model_loaded{model=\"qwen\"} 1"),
        "{metrics}"
    );
    let (status, reply) = http(
        server.port,
        "POST",
        "/v1/completions",
        Some(r#"{"model": "llama", "prompt": "x"}"#),
        None,
    );
    assert_eq!(status, 404, "{reply}");
    assert!(reply.contains("gemma, qwen, ferrox-test"), "{reply}");
    // Unloading gives the memory back.
    let loaded = rss_bytes(server.child.id());
    let (status, reply) = http(
        server.port,
        "POST",
        "/models/unload",
        Some(r#"{"model": "qwen"}"#),
        None,
    );
    assert_eq!(status, 200, "{reply}");
    state(&[
        ("gemma", "unloaded"),
        ("qwen", "unloaded"),
        (cached, "unloaded"),
    ]);
    let started = Instant::now();
    let freed = loop {
        let freed = loaded.saturating_sub(rss_bytes(server.child.id()));
        if freed > 200 << 20 || started.elapsed() > Duration::from_secs(10) {
            break freed;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!(
        "unloading Qwen freed {} MiB of {} MiB resident",
        freed >> 20,
        loaded >> 20
    );
    assert!(
        freed > 200 << 20,
        "unloading Qwen freed {} MiB of {} MiB resident",
        freed >> 20,
        loaded >> 20
    );
}

/// `architecture.input_modalities` of the one model `/v1/models` and `/v1/models/{id}` list
/// (the two must agree).
fn input_modalities(port: u16, key: Option<&str>) -> Vec<String> {
    let (status, body) = http(port, "GET", "/v1/models", None, key);
    assert_eq!(status, 200, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let model = &list["data"][0];
    let id = model["id"].as_str().unwrap();
    let (status, one) = http(port, "GET", &format!("/v1/models/{id}"), None, key);
    assert_eq!(status, 200, "{one}");
    let one: serde_json::Value = serde_json::from_str(&one).unwrap();
    assert_eq!(one["architecture"], model["architecture"], "{body}");
    assert_eq!(
        model["architecture"]["output_modalities"],
        serde_json::json!(["text"]),
        "{body}"
    );
    model["architecture"]["input_modalities"]
        .as_array()
        .unwrap_or_else(|| panic!("no architecture.input_modalities: {body}"))
        .iter()
        .map(|m| m.as_str().unwrap().to_string())
        .collect()
}

/// Images: `ferrox serve --mmproj` on the synthetic Gemma 3 pair of `fixtures/vision`, f32
/// cache (the f32 comparison), driven through the official `openai` client
/// (tests/serve/vision_client.py: llama-server's answers, 8 concurrent images equal their solo
/// runs, bad images refused); and a server without a projector refuses images with a 400.
/// `/v1/models` says which of the two takes images.
#[test]
fn serve_takes_images_as_llama_server_does() {
    require_openai();
    let fixtures = repo_root().join("fixtures/vision");
    let model = fixtures.join("gemma3.gguf");
    let server = vision_server(&fixtures, "gemma3.gguf", "gemma3.mmproj.gguf");
    assert!(
        server.log().contains("16 tokens per image"),
        "{}",
        server.log()
    );
    // The model list says the server takes images (llama-server's field, which the chat
    // page reads to offer them).
    assert_eq!(
        input_modalities(server.port, Some(API_KEY)),
        ["text", "image"]
    );
    run_client(
        &server,
        "vision_client.py",
        &[
            "--api-key",
            API_KEY,
            "--fixtures",
            fixtures.to_str().unwrap(),
        ],
        "images",
    );
    // Five distinct images, each sent three times or more: each encoded once.
    let encoded = server.log().matches("encoded in").count();
    assert_eq!(encoded, 5, "{}", server.log());
    drop(server);

    let text_only = Server::start(&["-m", model.to_str().unwrap(), "-t", "2"], &[]);
    text_only.wait_ready(Duration::from_secs(60));
    assert_eq!(input_modalities(text_only.port, None), ["text"]);
    let body = r#"{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}], "max_tokens": 2}"#;
    let (status, reply) = http(
        text_only.port,
        "POST",
        "/v1/chat/completions",
        Some(body),
        None,
    );
    assert_eq!(status, 400, "{reply}");
    assert!(
        reply.contains("images_not_supported") && reply.contains("--mmproj"),
        "{reply}"
    );
}

/// Qwen-VL images: `ferrox serve --mmproj` on the synthetic Qwen2.5-VL and Qwen3-VL pairs, f32 cache,
/// prompts fed five positions at a time, through the official `openai` client: each image's
/// answer (images of 3x3 to 7x5 tokens, whose tokens take M-RoPE grid positions and shift the
/// text after them), the conversations with two images and two turns, and 8 concurrent
/// requests against llama-server's (fixtures/vision/ref/qwen25vl-server.json). A Qwen
/// projector with a model that has no M-RoPE is refused at start.
#[test]
fn serve_takes_qwen_vl_images_as_llama_server_does() {
    require_openai();
    let fixtures = repo_root().join("fixtures/vision");
    for (model, projector) in [("qwen2vl", "qwen25vl"), ("qwen3vl", "qwen3vl")] {
        serve_vision_pair(&fixtures, model, projector);
    }
    assert_mmproj_refused(&fixtures, ("gemma3", "qwen25vl"), "M-RoPE");
}

/// `ferrox serve` with `<model>.gguf` and `<projector>.mmproj.gguf` of `fixtures` refuses to
/// start, saying `why`.
fn assert_mmproj_refused(fixtures: &std::path::Path, (model, projector): (&str, &str), why: &str) {
    let model = fixtures.join(format!("{model}.gguf"));
    let mmproj = fixtures.join(format!("{projector}.mmproj.gguf"));
    let out = Command::new(env!("CARGO_BIN_EXE_ferrox"))
        .args(["serve", "-m", model.to_str().unwrap(), "--mmproj"])
        .arg(&mmproj)
        .args(["--port", "0", "-t", "2"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(why), "{stderr}");
}

#[test]
fn serve_takes_kimi_images_as_llama_server_does() {
    // The deepseek2 (MLA) text model with Kimi-VL's and Kimi-K2.5's projectors: answers
    // equal to llama-server's on eight images and three conversations, eight concurrent
    // requests equal to their solo answers.
    require_openai();
    let fixtures = repo_root().join("fixtures/vision");
    for projector in ["kimivl", "kimik25"] {
        serve_vision_pair(&fixtures, "kimi", projector);
    }
    // Gemma 3's image tokens attend both ways: the MLA engine's attention cannot.
    assert_mmproj_refused(&fixtures, ("kimi", "gemma3"), "both ways");
}

/// `ferrox serve` on a pair of `fixtures/vision` with an f32 cache (the f32 comparisons), 8
/// sequences, prompts fed five positions at a time (text chunks end at every image), ready.
fn vision_server(fixtures: &std::path::Path, model: &str, mmproj: &str) -> Server {
    let (model, mmproj) = (fixtures.join(model), fixtures.join(mmproj));
    let server = Server::start(
        &[
            "-m",
            model.to_str().unwrap(),
            "--mmproj",
            mmproj.to_str().unwrap(),
            "--kv-f32",
            "--parallel",
            "8",
            "--prefill-chunk",
            "5",
            "-t",
            "2",
            "--api-key",
            API_KEY,
        ],
        &[],
    );
    server.wait_ready(Duration::from_secs(60));
    server
}

/// The answers of `ferrox serve` on `<model>.gguf` with `<projector>.mmproj.gguf` against
/// llama-server's (`ref/<projector>-server.json`), through the official client.
fn serve_vision_pair(fixtures: &std::path::Path, model: &str, projector: &str) {
    let model_file = format!("{model}.gguf");
    let reference = format!("{projector}-server.json");
    let server = vision_server(fixtures, &model_file, &format!("{projector}.mmproj.gguf"));
    run_client(
        &server,
        "vision_client.py",
        &[
            "--api-key",
            API_KEY,
            "--fixtures",
            fixtures.to_str().unwrap(),
            "--reference",
            &reference,
            "--model",
            &model_file,
        ],
        projector,
    );
}

/// A one-file HTTP server on a free port, serving until the test ends: `GET /image.png`
/// gets `png`, `GET /big.png` a response that declares 64 MiB, anything else a 404.
fn image_server(png: Vec<u8>) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap_or(0);
            let request = String::from_utf8_lossy(&buf[..n]).into_owned();
            let head = |status: &str, length: usize| {
                format!("HTTP/1.1 {status}\r\nContent-Type: image/png\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n")
            };
            let _ = match request.split(' ').nth(1).unwrap_or("") {
                "/image.png" => s
                    .write_all(head("200 OK", png.len()).as_bytes())
                    .and_then(|_| s.write_all(&png)),
                "/big.png" => s.write_all(head("200 OK", 64 << 20).as_bytes()),
                _ => s.write_all(head("404 Not Found", 0).as_bytes()),
            };
        }
    });
    port
}

/// The first choice's text of a chat completion reply, or the reply itself.
fn chat_text(reply: &str) -> String {
    serde_json::from_str::<serde_json::Value>(reply)
        .ok()
        .and_then(|v| {
            v["choices"][0]["message"]["content"]
                .as_str()
                .map(String::from)
        })
        .unwrap_or_else(|| panic!("no chat text in {reply}"))
}

#[test]
fn serve_fetches_image_urls_only_when_allowed() {
    use base64::Engine as _;
    let fixtures = repo_root().join("fixtures/vision");
    let model = fixtures.join("gemma3.gguf");
    let mmproj = fixtures.join("gemma3.mmproj.gguf");
    let png = std::fs::read(fixtures.join("rgb100x60.png")).unwrap();
    let data_url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&png)
    );
    let images = image_server(png);
    let chat = |url: &str| {
        format!(
            r#"{{"messages": [{{"role": "user", "content": [{{"type": "text", "text": "Describe:"}}, {{"type": "image_url", "image_url": {{"url": "{url}"}}}}]}}], "max_tokens": 8, "temperature": 0}}"#
        )
    };
    let args = |extra: &'static [&'static str]| {
        let mut a = vec![
            "-m".to_string(),
            model.to_str().unwrap().to_string(),
            "--mmproj".into(),
            mmproj.to_str().unwrap().to_string(),
            "--kv-f32".into(),
            "-t".into(),
            "2".into(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };

    let server = Server::start(
        &args(&["--allow-remote-images"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        &[],
    );
    server.wait_ready(Duration::from_secs(60));
    let post = |body: &str| {
        http(
            server.port,
            "POST",
            "/v1/chat/completions",
            Some(body),
            None,
        )
    };
    let (status, reply) = post(&chat(&data_url));
    assert_eq!(status, 200, "{reply}");
    let want = chat_text(&reply);
    assert!(!want.is_empty());
    // The same image by URL: fetched, the same answer.
    let (status, reply) = post(&chat(&format!("http://127.0.0.1:{images}/image.png")));
    assert_eq!(status, 200, "{reply}\n{}", server.log());
    assert_eq!(chat_text(&reply), want);
    assert!(server.log().contains("fetched"), "{}", server.log());
    // Anthropic's url source.
    let body = format!(
        r#"{{"model": "m", "max_tokens": 8, "temperature": 0, "messages": [{{"role": "user", "content": [{{"type": "text", "text": "Describe:"}}, {{"type": "image", "source": {{"type": "url", "url": "http://127.0.0.1:{images}/image.png"}}}}]}}]}}"#
    );
    let (status, reply) = http(server.port, "POST", "/v1/messages", Some(&body), None);
    assert_eq!(status, 200, "{reply}");
    // Failures are the client's, each named; the server goes on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    for (url, says) in [
        (
            format!("http://127.0.0.1:{images}/missing.png"),
            "HTTP status 404",
        ),
        (format!("http://127.0.0.1:{images}/big.png"), "larger than"),
        (
            format!("http://127.0.0.1:{closed_port}/image.png"),
            "fetching",
        ),
        (
            "ftp://127.0.0.1/image.png".to_string(),
            "http:// or https://",
        ),
    ] {
        let (status, reply) = post(&chat(&url));
        assert_eq!(status, 400, "{url}: {reply}");
        assert!(reply.contains(says), "{url}: {reply}");
    }
    let (status, reply) = post(&chat(&data_url));
    assert_eq!((status, chat_text(&reply)), (200, want));
    drop(server);

    // Without the flag a URL is refused, saying how to allow it.
    let server = Server::start(
        &args(&[]).iter().map(String::as_str).collect::<Vec<_>>(),
        &[],
    );
    server.wait_ready(Duration::from_secs(60));
    let body = chat(&format!("http://127.0.0.1:{images}/image.png"));
    let (status, reply) = http(
        server.port,
        "POST",
        "/v1/chat/completions",
        Some(&body),
        None,
    );
    assert_eq!(status, 400, "{reply}");
    assert!(
        reply.contains("remote_images_disabled") && reply.contains("--allow-remote-images"),
        "{reply}"
    );
    assert!(!server.log().contains("fetched"), "{}", server.log());
}
