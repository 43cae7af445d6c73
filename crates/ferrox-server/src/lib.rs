//! ferrox's OpenAI-compatible HTTP server (`ferrox serve`).
//!
//! * Endpoints: `GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions` (also
//!   without the `/v1` prefix), Anthropic's `POST /v1/messages` and
//!   `POST /v1/messages/count_tokens` (the `anthropic` module), llama-server's
//!   `POST /tokenize` and `POST /detokenize`, SGLang's `GET /model_info` and
//!   `GET /server_info` (also under their older `/get_` names), the chat page at `GET /`
//!   (static, see `web/`), `GET /metrics` (Prometheus
//!   text, ferrox's names and vLLM's) and `GET /health` (503 while the model loads, 200 when
//!   ready; never behind the API key).
//! * Every request has an id: a valid `X-Request-Id` it came with, or a fresh UUID. It is
//!   echoed as `X-Request-Id` on every response and is the `request_id` field of the span
//!   every log line about the request is logged in, the scheduler's included.
//! * Errors are always OpenAI's `{"error": {"message", "type", "param", "code"}}`, the
//!   router's and layers' own rejections included; after a stream has started an error is an
//!   SSE `data: {"error": ...}` event.
//! * Scheduling is continuous batching ([`scheduler`]): one thread owns the engine (every
//!   architecture `ferrox run` runs) and advances every active sequence in one engine step,
//!   mixing decode tokens with bounded prefill chunks. Sequence memory is one paged block
//!   pool with prefix reuse ([`kv`]).
//! * Request fields and sampling defaults: see [`api`]. Constrained output (JSON schemas,
//!   GBNF grammars), tool calls and reasoning separation come from `ferrox-agent`; each
//!   sequence of the batch carries its own matcher and output parser.

pub mod anthropic;
pub mod api;
pub mod draft;
mod embeddings;
mod error;
mod guard;
mod images;
pub mod kv;
mod metrics;
mod ready;
mod registry;
mod rerank;
mod responses;
mod routes;
pub mod scheduler;
mod web;

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderName};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use ferrox_generate::embedding::Pooling;
use ferrox_models::AnyEngine;
use ferrox_tokenizer::tokenizer::Tokenizer;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tracing::Instrument;

pub use error::ApiError;
pub use ferrox_agent::ReasoningFormat;
pub use guard::AllowedOrigins;
use metrics::Metrics;
pub use ready::{open_vision, resolve_template};
use ready::{prepare, Ready};
pub use registry::{model_id, ModelDirectory, ModelLoader};
pub use scheduler::Speculation;

/// Reported as `system_fingerprint`.
pub const SYSTEM_FINGERPRINT: &str = concat!("ferrox-", env!("CARGO_PKG_VERSION"));

/// The header a request's id comes in and goes back in.
const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest request id taken from a client.
const MAX_REQUEST_ID_LEN: usize = 128;

/// How log lines are written to stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line, its span (with the `request_id`) included.
    Json,
}

/// How to run the server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    /// Required as `Authorization: Bearer KEY` on every route but `/health`.
    pub api_key: Option<String>,
    /// Listen on a public address without `api_key` (refused otherwise).
    pub no_auth: bool,
    /// Most sequences decoded together.
    pub parallel: usize,
    /// The KV block pool's size in MiB (default: `parallel` full contexts).
    pub kv_memory_mib: Option<usize>,
    /// The model id clients see and send (default: the file name).
    pub alias: Option<String>,
    /// `chatml`, a template name stored in the model (`tokenizer.chat_template.NAME`) or a
    /// file with Jinja source; default: the model's own template, ChatML without one.
    pub chat_template: Option<String>,
    /// Requests that may wait for a slot; more are refused with 429.
    pub max_queue: usize,
    /// Prompt tokens prefilled per step while other sequences are decoding.
    pub prefill_chunk: usize,
    /// Request bodies above this many bytes are refused with 413.
    pub body_limit: usize,
    /// After SIGTERM/SIGINT, how long running requests may go on before they are cancelled.
    pub shutdown_grace: Duration,
    /// SSE comment pings while a stream has nothing to send (long prefills).
    pub ping_interval: Duration,
    /// Text or JSON log lines on stderr.
    pub log_format: LogFormat,
    /// Where thinking goes (`--reasoning-format`): `reasoning_content`, or left in
    /// `content`.
    pub reasoning_format: ReasoningFormat,
    /// Prompt-lookup speculation per sequence (`--spec-type ngram`), if on.
    pub speculation: Option<Speculation>,
    /// Browser origins whose pages may call the API (`--cors-origins`); the server's own
    /// page always may.
    pub cors_origins: AllowedOrigins,
    /// Serve `/v1/embeddings` and `/embedding` (`--embeddings`).
    pub embeddings: bool,
    /// How embeddings are pooled (`--pooling`; default: the file's `pooling_type`).
    pub pooling: Option<Pooling>,
    /// The model's vision projector (`--mmproj`): chat requests may then hold images.
    pub mmproj: Option<std::path::PathBuf>,
    /// Fetch images given by `http(s)://` URLs (`--allow-remote-images`); otherwise only
    /// `data:` URLs are taken.
    pub allow_remote_images: bool,
    /// The fewest and most tokens an image may become with a dynamic-size projector
    /// (`--image-min-tokens` / `--image-max-tokens`); `None`: the projector family's.
    pub image_tokens: (Option<usize>, Option<usize>),
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            no_auth: false,
            parallel: 4,
            kv_memory_mib: None,
            alias: None,
            chat_template: None,
            max_queue: 64,
            prefill_chunk: 128,
            body_limit: 4 << 20,
            shutdown_grace: Duration::from_secs(10),
            ping_interval: Duration::from_secs(15),
            log_format: LogFormat::Text,
            reasoning_format: ReasoningFormat::DeepSeek,
            speculation: None,
            cors_origins: AllowedOrigins::default(),
            embeddings: false,
            pooling: None,
            mmproj: None,
            allow_remote_images: false,
            image_tokens: (None, None),
        }
    }
}

/// What the loader hands the server.
pub struct LoadedModel {
    pub path: PathBuf,
    pub engine: AnyEngine,
    pub tokenizer: Tokenizer,
    /// A draft model with the same vocabulary (`--model-draft`), for speculation.
    pub draft: Option<AnyEngine>,
}

pub(crate) struct AppState {
    pub config: ServerConfig,
    pub ready: OnceLock<Arc<Ready>>,
    pub metrics: Arc<Metrics>,
    pub shutting_down: AtomicBool,
    /// Listening on loopback only: requests must name a loopback host (DNS rebinding).
    pub loopback: bool,
    /// Responses kept for the Responses API (`previous_response_id`, `GET`).
    pub responses: responses::ResponseStore,
    /// Many models by name (`--models-dir`); `None`: the one model in `ready`.
    pub router: Option<registry::Router>,
}

impl AppState {
    /// The model a request names: the one model (whatever the name; routes check it), or,
    /// with many, that one, loaded first if it is not.
    pub async fn model(&self, name: Option<&str>) -> Result<Arc<Ready>, ApiError> {
        match &self.router {
            Some(router) => {
                if self.shutting_down.load(Ordering::Relaxed) {
                    return Err(ApiError::unavailable(
                        "shutting_down",
                        "the server is shutting down",
                    ));
                }
                router.get(&self.config, name).await
            }
            None => self.ready().cloned(),
        }
    }

    /// The one model (with many, an error: the request must name one).
    pub fn ready(&self) -> Result<&Arc<Ready>, ApiError> {
        if self.router.is_some() {
            return Err(ApiError::param(
                "model",
                "this server serves several models: name one (GET /v1/models lists them)",
            ));
        }
        if self.shutting_down.load(Ordering::Relaxed) {
            return Err(ApiError::unavailable(
                "shutting_down",
                "the server is shutting down",
            ));
        }
        self.ready
            .get()
            .ok_or_else(|| ApiError::unavailable("loading_model", "Loading model"))
    }
}

pub(crate) fn unix_time() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Resolves `host:port`. A non-loopback address is refused unless an API key is set.
pub fn bind_address(host: &str, port: u16, has_api_key: bool) -> Result<SocketAddr, String> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve --host {host}: {e}"))?
        .collect();
    let Some(first) = addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
    else {
        return Err(format!("--host {host} resolves to no address"));
    };
    if !has_api_key && addrs.iter().any(|a| !a.ip().is_loopback()) {
        return Err(format!(
            "refusing to listen on {host} ({}), which is not a loopback address, without --api-key",
            first.ip()
        ));
    }
    Ok(first)
}

/// Starts logging to stderr (`RUST_LOG` filters; default `info`).
pub fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        // The request's span only (not the list of its parents): its `request_id` sits in
        // the line's `span` object whether the line comes from a handler or the scheduler.
        LogFormat::Json => builder
            .json()
            .with_span_list(false)
            .with_ansi(false)
            .try_init(),
    };
}

/// Where the served models come from.
enum Models {
    /// One model, loaded once the socket listens.
    One(Box<dyn FnOnce() -> anyhow::Result<LoadedModel> + Send>),
    /// A directory's models, loaded by name on demand.
    Directory(ModelDirectory),
}

/// Runs the server until SIGTERM or SIGINT (then exits cleanly after the grace period).
/// `load` runs on a worker thread once the socket listens; until it returns, `/health`
/// answers 503.
pub fn run(
    config: ServerConfig,
    load: impl FnOnce() -> anyhow::Result<LoadedModel> + Send + 'static,
) -> anyhow::Result<()> {
    run_models(config, Models::One(Box::new(load)))
}

/// Runs the server over a directory of models (`--models-dir`): each is loaded when a
/// request first names it, at most `dir.max_loaded` at once.
pub fn run_directory(config: ServerConfig, dir: ModelDirectory) -> anyhow::Result<()> {
    run_models(config, Models::Directory(dir))
}

fn run_models(config: ServerConfig, models: Models) -> anyhow::Result<()> {
    init_logging(config.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ferrox-http")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(serve(config, models))
}

async fn serve(config: ServerConfig, models: Models) -> anyhow::Result<()> {
    let addr = bind_address(
        &config.host,
        config.port,
        config.api_key.is_some() || config.no_auth,
    )
    .map_err(anyhow::Error::msg)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    let (load, router) = match models {
        Models::One(load) => (Some(load), None),
        Models::Directory(dir) => (None, Some(registry::Router::new(dir))),
    };
    let state = Arc::new(AppState {
        config,
        ready: OnceLock::new(),
        metrics: Arc::new(Metrics::default()),
        shutting_down: AtomicBool::new(false),
        loopback: local.ip().is_loopback(),
        responses: responses::ResponseStore::default(),
        router,
    });
    tracing::info!(
        "listening on http://{local} (API key {}); {}",
        if state.config.api_key.is_some() {
            "required"
        } else {
            "not required"
        },
        match &state.router {
            Some(r) => format!("{} models, loaded on demand", r.len()),
            None => "loading the model".to_string(),
        }
    );

    let load_error: Arc<Mutex<Option<anyhow::Error>>> = Arc::default();
    let (loaded_tx, loaded_rx) = tokio::sync::oneshot::channel::<bool>();
    if let Some(load) = load {
        let state = state.clone();
        let load_error = load_error.clone();
        tokio::task::spawn_blocking(move || {
            if let Some(ms) = std::env::var("FERROX_SERVE_TEST_LOAD_DELAY_MS")
                .ok()
                .and_then(|v| v.parse().ok())
            {
                std::thread::sleep(Duration::from_millis(ms));
            }
            let started = Instant::now();
            let result =
                load().and_then(|model| prepare(&state.config, model, state.metrics.clone()));
            match result {
                Ok(ready) => {
                    let _ = state.ready.set(Arc::new(ready));
                    tracing::info!(
                        "ready in {:.1} s: serving on http://{local}",
                        started.elapsed().as_secs_f64()
                    );
                    let _ = loaded_tx.send(true);
                }
                Err(e) => {
                    tracing::error!("loading the model failed: {e:#}");
                    *load_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                    let _ = loaded_tx.send(false);
                }
            }
        });
    }

    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let app = app(state.clone());
    let mut server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stop_rx.wait_for(|&stop| stop).await;
            })
            .await
    });

    let load_failed = async {
        match loaded_rx.await {
            Ok(false) => (),
            _ => std::future::pending().await,
        }
    };
    tokio::select! {
        signal = shutdown_signal() => tracing::info!("{signal}: shutting down (grace period {:?})", state.config.shutdown_grace),
        () = load_failed => {}
        result = &mut server => {
            result.context("the HTTP server task failed")?.context("the HTTP server failed")?;
            bail!("the HTTP server stopped unexpectedly");
        }
    }
    state.shutting_down.store(true, Ordering::Relaxed);
    let grace = state.config.shutdown_grace;
    let served = || -> Vec<Arc<Ready>> {
        match &state.router {
            Some(router) => router.loaded(),
            None => state.ready.get().cloned().into_iter().collect(),
        }
    };
    for ready in served() {
        ready.scheduler.begin_shutdown(grace);
    }
    let _ = stop_tx.send(true);
    match tokio::time::timeout(grace + Duration::from_secs(3), &mut server).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => tracing::warn!("the HTTP server ended with an error: {e}"),
        Ok(Err(e)) => tracing::warn!("the HTTP server task failed: {e}"),
        Err(_) => {
            tracing::warn!("connections still open after the grace period; closing them");
            server.abort();
        }
    }
    for ready in served() {
        let _ = tokio::task::spawn_blocking(move || ready.scheduler.stop()).await;
    }
    if let Some(e) = load_error.lock().unwrap_or_else(|e| e.into_inner()).take() {
        return Err(e);
    }
    tracing::info!("stopped");
    Ok(())
}

async fn shutdown_signal() -> &'static str {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => "SIGINT",
        () = terminate => "SIGTERM",
    }
}

fn app(state: Arc<AppState>) -> Router {
    let cors = guard::cors_layer(&state.config.cors_origins);
    Router::new()
        .route("/health", get(routes::health))
        .route("/v1/health", get(routes::health))
        .route("/metrics", get(routes::metrics))
        .route("/v1/models", get(routes::list_models))
        .route("/models", get(routes::list_models))
        .route("/v1/models/{*id}", get(routes::get_model))
        .route("/v1/chat/completions", post(routes::chat_completions))
        .route("/chat/completions", post(routes::chat_completions))
        .route("/v1/completions", post(routes::completions))
        .route("/completions", post(routes::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/embeddings", post(embeddings::openai))
        .route("/embedding", post(embeddings::native))
        .route("/embeddings", post(embeddings::native))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::get).delete(responses::delete),
        )
        .route("/v1/rerank", post(rerank::rerank))
        .route("/rerank", post(rerank::rerank))
        .route("/v1/reranking", post(rerank::rerank))
        .route("/reranking", post(rerank::rerank))
        .route("/models/load", post(routes::load_model))
        .route("/models/unload", post(routes::unload_model))
        .route("/tokenize", post(routes::tokenize))
        .route("/detokenize", post(routes::detokenize))
        .route("/get_model_info", get(routes::model_info))
        .route("/get_server_info", get(routes::server_info))
        .route("/model_info", get(routes::model_info))
        .route("/server_info", get(routes::server_info))
        .merge(web::routes())
        .fallback(routes::fallback)
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        // Preflights from listed origins are answered here, before the key is asked for.
        .layer(cors)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            guard::browser_guard,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        // Outermost last: a client's id is checked, kept or replaced, then echoed on
        // whatever the inner layers answer (errors and streams included).
        .layer(PropagateRequestIdLayer::new(X_REQUEST_ID))
        .layer(SetRequestIdLayer::new(X_REQUEST_ID, MakeRequestUuid))
        .layer(middleware::from_fn(drop_invalid_request_id))
        .with_state(state)
}

fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let what = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("unknown cause");
    tracing::error!("a request handler panicked: {what}");
    ApiError::internal(format!("internal error: {what}")).into_response()
}

async fn authorize(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.config.api_key {
        // As vLLM's key guards only its API: health checks, Prometheus and the inference
        // gateway's endpoint picker scrape without credentials, and the metrics carry counts
        // and the model's name, no request content.
        // The chat page itself is static; its requests carry the key the user enters.
        let open = matches!(req.uri().path(), "/health" | "/v1/health" | "/metrics")
            || web::is_page_path(req.uri().path());
        if !open {
            let headers = req.headers();
            let given = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| {
                    v.strip_prefix("Bearer ")
                        .or_else(|| v.strip_prefix("bearer "))
                })
                .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
                .map(str::trim);
            let refusal = match given {
                None => Some(ApiError::unauthorized(
                    "missing API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
                )),
                Some(g) if !constant_time_eq(g.as_bytes(), key.as_bytes()) => {
                    Some(ApiError::unauthorized("invalid API key"))
                }
                Some(_) => None,
            };
            if let Some(e) = refusal {
                return if req.uri().path().starts_with("/v1/messages") {
                    anthropic::AnthropicError(e).into_response()
                } else {
                    e.into_response()
                };
            }
        }
    }
    next.run(req).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether a client's request id can be used as is: printable ASCII (it goes into log
/// lines and a response header), 1 to [`MAX_REQUEST_ID_LEN`] characters.
fn valid_request_id(id: &[u8]) -> bool {
    (1..=MAX_REQUEST_ID_LEN).contains(&id.len()) && id.iter().all(|&b| (0x20..0x7f).contains(&b))
}

/// Removes an `X-Request-Id` that is not a valid id, so that one is generated instead; of
/// several, the first is kept.
async fn drop_invalid_request_id(mut req: Request, next: Next) -> Response {
    let headers = req.headers_mut();
    if headers.contains_key(&X_REQUEST_ID) {
        let keep = headers
            .get(&X_REQUEST_ID)
            .filter(|v| valid_request_id(v.as_bytes()))
            .cloned();
        headers.remove(&X_REQUEST_ID);
        if let Some(id) = keep {
            headers.insert(X_REQUEST_ID, id);
        }
    }
    next.run(req).await
}

/// Counts every answer by route and status, logs errors, and puts error statuses produced
/// by the router or a layer into OpenAI's shape. The request is handled inside a span
/// carrying its id.
async fn observe(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let request_id = req
        .headers()
        .get(&X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    // Text lines show the id quoted (escaped), so that one with spaces or `}` cannot pass
    // for other fields; JSON lines carry it as a plain string.
    let span = match state.config.log_format {
        LogFormat::Text => tracing::info_span!("request", request_id = ?request_id),
        LogFormat::Json => tracing::info_span!("request", request_id = %request_id),
    };
    observed(state, req, next).instrument(span).await
}

async fn observed(state: Arc<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let started = Instant::now();
    let response = routes::wrap_error(next.run(req).await).await;
    let status = response.status();
    state.metrics.count_request(&route, status.as_u16());
    if status.is_client_error() || status.is_server_error() {
        tracing::info!(
            "{method} {path} -> {} ({:.0?})",
            status.as_u16(),
            started.elapsed()
        );
    } else {
        tracing::debug!(
            "{method} {path} -> {} ({:.0?})",
            status.as_u16(),
            started.elapsed()
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{HeaderValue, StatusCode};
    use tower::ServiceExt;

    /// The router of a server whose model is still loading.
    fn loading_app() -> Router {
        app(Arc::new(AppState {
            config: ServerConfig::default(),
            ready: OnceLock::new(),
            metrics: Arc::new(Metrics::default()),
            shutting_down: AtomicBool::new(false),
            loopback: true,
            responses: responses::ResponseStore::default(),
            router: None,
        }))
    }

    /// The status and the `X-Request-Id` values of the answer to `GET path` sent with
    /// `ids`.
    async fn answer(path: &str, ids: &[&[u8]]) -> (StatusCode, Vec<String>) {
        let mut req = Request::builder().uri(path);
        for id in ids {
            req = req.header(X_REQUEST_ID, HeaderValue::from_bytes(id).unwrap());
        }
        let response = loading_app()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let echoed = response
            .headers()
            .get_all(X_REQUEST_ID)
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect();
        (response.status(), echoed)
    }

    fn is_uuid(id: &str) -> bool {
        id.len() == 36
            && id.char_indices().all(|(i, c)| match i {
                8 | 13 | 18 | 23 => c == '-',
                _ => c.is_ascii_hexdigit(),
            })
    }

    #[test]
    fn request_ids_are_printable_ascii_up_to_128_characters() {
        assert!(valid_request_id(b"test-req-42"));
        assert!(valid_request_id(b"a b/c:d=e"));
        assert!(valid_request_id(&[b'x'; 128]));
        assert!(!valid_request_id(&[b'x'; 129]));
        assert!(!valid_request_id(b""));
        assert!(!valid_request_id(b"tab\there"));
        assert!(!valid_request_id("caf\u{e9}".as_bytes()));
        assert!(!valid_request_id(b"del\x7f"));
    }

    #[tokio::test]
    async fn every_answer_echoes_the_request_id() {
        // Kept as given, on successes and errors alike (404, 503 while loading).
        for path in [
            "/health",
            "/v1/models",
            "/nothing",
            "/metrics",
            "/get_server_info",
        ] {
            let (_, ids) = answer(path, &[b"client-7"]).await;
            assert_eq!(ids, ["client-7"], "{path}");
        }
        assert_eq!(
            answer("/v1/models", &[b"client-7"]).await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(answer("/nothing", &[b"x"]).await.0, StatusCode::NOT_FOUND);
        let longest = [b'r'; 128];
        assert_eq!(
            answer("/health", &[&longest]).await.1,
            [String::from_utf8(longest.to_vec()).unwrap()]
        );
        // Missing or unusable: a fresh UUID, a different one each time.
        let mut seen = Vec::new();
        for ids in [
            &[][..],
            &[&[b'r'; 129][..]],
            &[b"tab\there"],
            &["caf\u{e9}".as_bytes()],
        ] {
            let (_, echoed) = answer("/nothing", ids).await;
            assert_eq!(echoed.len(), 1, "{ids:?}");
            assert!(is_uuid(&echoed[0]), "{echoed:?}");
            assert!(!seen.contains(&echoed[0]));
            seen.push(echoed[0].clone());
        }
        // Several: the first, if it is valid.
        assert_eq!(answer("/health", &[b"first", b"second"]).await.1, ["first"]);
        assert!(is_uuid(&answer("/health", &[b"", b"second"]).await.1[0]));
    }
}
