//! The agent-facing API end to end: a server on a free loopback port serving
//! Qwen2.5-Coder-0.5B-Instruct (fetched by `scripts/fetch-model.sh qwen-0.5b`), driven by
//! the official `openai` client (constrained output, tool calls: tests/agent/openai_client.py)
//! and the official `anthropic` client (the Messages API: tests/agent/anthropic_client.py),
//! and the Responses API through the `openai` client (tests/agent/responses_client.py).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ferrox_models::{AnyEngine, EngineOptions};
use ferrox_server::{LoadedModel, ServerConfig};
use ferrox_tokenizer::tokenizer::Tokenizer;

const QWEN_FILE: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
pub const API_KEY: &str = "agent-test-key";

fn qwen_model() -> PathBuf {
    let path = ferrox_models::default_model_path().with_file_name(QWEN_FILE);
    assert!(
        path.is_file(),
        "the Qwen2.5-Coder-0.5B model is not at {}: run scripts/fetch-model.sh qwen-0.5b",
        path.display()
    );
    path
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn get(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

/// One server for the whole test binary (tests share it, as clients share a real one).
fn server(api_key: Option<&str>) -> u16 {
    static PORT: OnceLock<u16> = OnceLock::new();
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    *PORT.get_or_init(|| {
        let path = qwen_model();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = ServerConfig {
            port,
            parallel: 8,
            api_key: api_key.map(str::to_string),
            ..ServerConfig::default()
        };
        std::thread::spawn(move || {
            let result = ferrox_server::run(config, move || {
                let gguf = Arc::new(ferrox_gguf::Gguf::open(&path)?);
                let tokenizer = Tokenizer::from_gguf(&gguf)?;
                let options = EngineOptions {
                    n_ctx: 2048,
                    ..EngineOptions::default()
                };
                let engine = AnyEngine::from_gguf(gguf, &options)?;
                Ok(LoadedModel {
                    path,
                    engine,
                    tokenizer,
                    draft: None,
                })
            });
            if let Err(e) = result {
                eprintln!("the server failed: {e:#}");
            }
        });
        let started = Instant::now();
        while get(port, "/health") != Some(200) {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "the server did not become ready"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        port
    })
}

fn python(script: &str, args: &[String]) {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/agent")
        .join(script);
    let out = Command::new(python)
        .arg(&script)
        .args(args)
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.trim_end().ends_with("OK"),
        "{} failed:\n{stdout}\n{stderr}",
        script.display()
    );
}

#[test]
fn openai_client_constrained_output_and_tools() {
    let port = server(Some(API_KEY));
    let grammars = repo().join("crates/ferrox-agent/tests/fixtures/grammars");
    python(
        "openai_client.py",
        &[
            format!("http://127.0.0.1:{port}"),
            grammars.display().to_string(),
            API_KEY.into(),
        ],
    );
}

#[test]
fn anthropic_client_messages_api() {
    let port = server(Some(API_KEY));
    python(
        "anthropic_client.py",
        &[format!("http://127.0.0.1:{port}"), API_KEY.into()],
    );
}

#[test]
fn openai_client_responses_api() {
    let port = server(Some(API_KEY));
    python(
        "responses_client.py",
        &[format!("http://127.0.0.1:{port}"), API_KEY.into()],
    );
}
