//! Hostile requests against a running `ferrox serve` (the default model): each gets its
//! status (400, 403, 415, 429) quickly, and afterwards the server still answers `/health`
//! and an ordinary completion. Grammars built to overflow a stack or to take unbounded time,
//! requests a foreign web page could send (DNS rebinding, CSRF), oversized stop strings, and
//! a request refused part-way, which leaves nothing in the queue.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::default_model;

struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One raw HTTP/1.1 request (headers exactly as given); the status and the body.
fn raw(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out).into_owned();
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

const LOCAL: (&str, &str) = ("Host", "127.0.0.1");
const JSON: (&str, &str) = ("Content-Type", "application/json");

fn post(port: u16, path: &str, body: &str) -> (u16, String) {
    raw(port, "POST", path, &[LOCAL, JSON], body)
}

fn still_serving(port: u16, after: &str) {
    let (status, body) = raw(port, "GET", "/health", &[LOCAL], "");
    assert_eq!(status, 200, "/health after {after}: {body}");
    let (status, body) = post(
        port,
        "/v1/completions",
        r#"{"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}"#,
    );
    assert_eq!(status, 200, "a completion after {after}: {body}");
}

#[test]
fn hostile_requests_get_their_status_and_the_server_keeps_serving() {
    let model = default_model();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = Served(
        Command::new(env!("CARGO_BIN_EXE_ferrox"))
            .args([
                "serve",
                "-m",
                model.to_str().unwrap(),
                "--port",
                &port.to_string(),
            ])
            .args(["--ctx-size", "1024", "--parallel", "2", "--max-queue", "4"])
            .args(["--cors-origins", "http://allowed.example:3000"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ferrox serve"),
    );
    let started = Instant::now();
    while raw_health(port) != 200 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "never healthy"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Grammars: a stack-overflowing nesting, a 20,000-long $ref chain, 65,000 rules.
    let nested = format!(
        "root ::= {}\"a\"{}",
        "(".repeat(200_000),
        ")".repeat(200_000)
    );
    let body = serde_json::json!({"prompt": "x", "max_tokens": 2, "grammar": nested}).to_string();
    let (status, text) = post(port, "/v1/completions", &body);
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("nested more than"), "{text}");
    still_serving(port, "a deeply nested grammar");

    let mut defs = serde_json::Map::new();
    for i in 0..20_000 {
        defs.insert(
            format!("d{i}"),
            serde_json::json!({"$ref": format!("#/$defs/d{}", i + 1)}),
        );
    }
    defs.insert("d20000".into(), serde_json::json!({"type": "string"}));
    let body = serde_json::json!({"prompt": "x", "max_tokens": 2,
        "json_schema": {"$defs": defs, "$ref": "#/$defs/d0"}})
    .to_string();
    let (status, text) = post(port, "/v1/completions", &body);
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("levels deep"), "{text}");
    still_serving(port, "a 20,000-long $ref chain");

    let rules: String = (0..65_000)
        .map(|i| format!("r{i} ::= \"x\" r{}\n", i + 1))
        .collect::<String>()
        + "r65000 ::= \"y\"\nroot ::= r0\n";
    let body = serde_json::json!({"prompt": "x", "max_tokens": 2, "grammar": rules}).to_string();
    let asked = Instant::now();
    let (status, text) = post(port, "/v1/completions", &body);
    assert!(matches!(status, 200 | 400 | 503), "{status}: {text}");
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "{:?}",
        asked.elapsed()
    );
    still_serving(port, "a 65,000-rule grammar");

    // 80,000 tools (under the 4 MiB body limit) whose last name repeats the first, through
    // both APIs: the duplicate check is linear (a quadratic one took 53 s here), and a hang
    // guard bounds it.
    let openai_tools: Vec<_> = (0..80_000)
        .map(|i| serde_json::json!({"type": "function", "function": {"name": format!("t{}", i % 79_999)}}))
        .collect();
    let anthropic_tools: Vec<_> = (0..80_000)
        .map(|i| serde_json::json!({"name": format!("t{}", i % 79_999)}))
        .collect();
    for (path, body) in [
        (
            "/v1/chat/completions",
            serde_json::json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "tools": openai_tools}),
        ),
        (
            "/v1/messages",
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "tools": anthropic_tools}),
        ),
    ] {
        let asked = Instant::now();
        let (status, text) = post(port, path, &body.to_string());
        assert_eq!(status, 400, "{path}: {text}");
        assert!(
            text.contains("repeats the function name 't0'"),
            "{path}: {text}"
        );
        assert!(
            asked.elapsed() < Duration::from_secs(10),
            "{path}: {:?}",
            asked.elapsed()
        );
    }
    still_serving(port, "80,000 tools");

    // What a foreign page can send: text/plain (no preflight), a rebound Host, its Origin.
    let completion = r#"{"prompt": "hi", "max_tokens": 2}"#;
    let (status, text) = raw(
        port,
        "POST",
        "/v1/completions",
        &[LOCAL, ("Content-Type", "text/plain")],
        completion,
    );
    assert_eq!(status, 415, "{text}");
    let (status, text) = raw(port, "GET", "/v1/models", &[("Host", "evil.example")], "");
    assert_eq!(status, 403, "{text}");
    assert!(!text.contains(".gguf"), "{text}");
    let (status, text) = raw(
        port,
        "POST",
        "/v1/completions",
        &[LOCAL, JSON, ("Origin", "http://evil.example")],
        completion,
    );
    assert_eq!(status, 403, "{text}");
    let own = format!("http://127.0.0.1:{port}");
    let host = format!("127.0.0.1:{port}");
    let (status, text) = raw(
        port,
        "GET",
        "/v1/models",
        &[("Host", &host), ("Origin", &own)],
        "",
    );
    assert_eq!(status, 200, "{text}");
    // A listed origin gets its preflight answered.
    let (status, text) = raw(
        port,
        "OPTIONS",
        "/v1/chat/completions",
        &[
            LOCAL,
            ("Origin", "http://allowed.example:3000"),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", "content-type"),
        ],
        "",
    );
    assert_eq!(status, 200, "{text}");
    still_serving(port, "foreign-page requests");

    // Stop strings over the total limit, an empty cache_salt.
    let stops: Vec<String> = (0..8).map(|i| format!("{i}{}", "s".repeat(600))).collect();
    let body = serde_json::json!({"prompt": "x", "max_tokens": 2, "stop": stops}).to_string();
    let (status, text) = post(port, "/v1/completions", &body);
    assert_eq!(status, 400, "{text}");
    let (status, text) = post(
        port,
        "/v1/completions",
        r#"{"prompt": "x", "cache_salt": ""}"#,
    );
    assert_eq!(status, 400, "{text}");

    // 16 choices with room for 4 in the queue: refused whole, nothing left queued.
    let (status, text) = post(
        port,
        "/v1/completions",
        r#"{"prompt": "x", "max_tokens": 4, "n": 16}"#,
    );
    assert_eq!(status, 429, "{text}");
    let (_, metrics) = raw(port, "GET", "/metrics", &[LOCAL], "");
    assert!(metrics.contains("ferrox_requests_waiting 0"), "{metrics}");
    still_serving(port, "a request refused part-way");
    drop(server);
}

fn raw_health(port: u16) -> u16 {
    match TcpStream::connect(("127.0.0.1", port)) {
        Ok(_) => raw(port, "GET", "/health", &[LOCAL], "").0,
        Err(_) => 0,
    }
}
