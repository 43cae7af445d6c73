//! The HTTP endpoints.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{FromRequest, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrox_generate::generate::FinishReason;
use ferrox_generate::media::{MediaPrompt, PlacedImage};
use ferrox_tokenizer::chat_template::{prompt_for_tokenizer, ChatTemplateError};
use ferrox_tokenizer::tokenizer::TokenId;
use futures::StreamExt;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::api::{self, GenRequest, Prompt};
use crate::error::ApiError;
use crate::scheduler::{Event, Job, SubmitError, Summary, TokenEvent};
use crate::{AppState, Ready};
use ferrox_agent::{Delta, OutputParser, ReasoningSplitter};

/// Bodies larger than this are not even drained before the 413 (the connection is closed).
const MAX_DRAIN: usize = 256 << 20;

/// A JSON request body read under the configured size limit. Every failure (body too large,
/// invalid JSON) is an [`ApiError`] in OpenAI's shape. The content type is not checked.
pub struct JsonBody(pub Value);

impl FromRequest<Arc<AppState>> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        if !crate::guard::is_json_content_type(req.headers()) {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_request_error",
                "the request body must be JSON sent with 'Content-Type: application/json'",
            )
            .with_code("unsupported_media_type"));
        }
        let limit = state.config.body_limit;
        let too_large = |n: usize| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!("the request body ({n} bytes or more) exceeds the limit of {limit} bytes"),
            )
            .with_code("request_too_large")
        };
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if let Some(n) = declared.filter(|&n| n > MAX_DRAIN) {
            return Err(too_large(n));
        }
        // Read to the end even past the limit (up to MAX_DRAIN), so the client, which is
        // still sending, gets to read the 413 instead of a reset connection.
        let mut stream = req.into_body().into_data_stream();
        let mut buf = Vec::new();
        let mut total = 0usize;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk
                .map_err(|e| ApiError::invalid(format!("cannot read the request body: {e}")))?;
            total += chunk.len();
            if total <= limit {
                buf.extend_from_slice(&chunk);
            } else if total > MAX_DRAIN {
                break;
            }
        }
        if total > limit {
            return Err(too_large(total));
        }
        if buf.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::invalid(
                "the request body is empty; expected a JSON object",
            ));
        }
        serde_json::from_slice(&buf).map(JsonBody).map_err(|e| {
            ApiError::invalid(format!("invalid JSON in the request body: {e}"))
                .with_code("invalid_json")
        })
    }
}

/// The `model` a request body names, if any.
pub(crate) fn requested_model(body: &Value) -> Option<&str> {
    body.get("model").and_then(Value::as_str)
}

pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    // With many models the server is ready once it listens: models load on demand.
    let serving = state.router.is_some() || state.ready.get().is_some();
    match serving.then_some(()) {
        Some(_) if state.shutting_down.load(Ordering::Relaxed) => {
            ApiError::unavailable("shutting_down", "the server is shutting down").into_response()
        }
        Some(_) => Json(json!({"status": "ok"})).into_response(),
        None => ApiError::unavailable("loading_model", "Loading model").into_response(),
    }
}

pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let mut text = state
        .metrics
        .render(state.router.is_some() || state.ready.get().is_some());
    if let Some(router) = &state.router {
        text.push_str(&router.metrics());
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

fn model_object(ready: &Ready) -> Value {
    json!({
        "id": ready.model_id,
        "object": "model",
        "created": ready.created,
        "owned_by": "ferrox",
        "architecture": architecture(ready),
        "meta": {
            "n_ctx": ready.n_ctx,
            "n_vocab": ready.n_vocab,
            "slots": ready.slots,
            "path": ready.model_path,
        }
    })
}

/// What a model takes and writes, as llama-server's `/v1/models` says it:
/// `{"input_modalities": ["text", "image"], "output_modalities": ["text"]}`, `"image"` when
/// the server has a vision projector (`--mmproj`). The chat page reads it to offer images.
pub(crate) fn architecture(ready: &Ready) -> Value {
    let mut input = vec!["text"];
    if ready.vision.is_some() {
        input.push("image");
    }
    json!({"input_modalities": input, "output_modalities": ["text"]})
}

/// SGLang's `GET /get_model_info`, which SGLang's router reads.
pub async fn model_info(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let ready = state.ready()?;
    Ok(Json(json!({
        "model_path": ready.model_path,
        // The GGUF file carries its tokenizer.
        "tokenizer_path": ready.model_path,
        "is_generation": true,
        "preferred_sampling_params": null,
        "weight_version": "default",
    })))
}

/// SGLang's `GET /get_server_info`: the fields SGLang's router and clients read (model,
/// limits, version) under SGLang's names.
pub async fn server_info(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let ready = state.ready()?;
    let kv_tokens = ready.kv_blocks * crate::kv::BLOCK_TOKENS;
    Ok(Json(json!({
        "model_path": ready.model_path,
        "tokenizer_path": ready.model_path,
        "served_model_name": ready.model_id,
        "model_id": ready.model_id,
        "is_embedding": false,
        "context_length": ready.n_ctx,
        "max_req_input_len": ready.n_ctx.saturating_sub(1),
        "max_running_requests": ready.slots,
        "max_total_num_tokens": kv_tokens,
        "max_total_tokens": kv_tokens,
        "page_size": crate::kv::BLOCK_TOKENS,
        "kv_cache_dtype": ready.cache_dtype,
        "max_queued_requests": state.config.max_queue,
        "chunked_prefill_size": state.config.prefill_chunk,
        "dp_size": 1,
        "tp_size": 1,
        "version": env!("CARGO_PKG_VERSION"),
    })))
}

pub async fn list_models(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    if let Some(router) = &state.router {
        return Ok(Json(json!({"object": "list", "data": router.list()})));
    }
    let ready = state.ready()?;
    Ok(Json(
        json!({"object": "list", "data": [model_object(ready)]}),
    ))
}

pub async fn get_model(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if let Some(router) = &state.router {
        return router
            .list()
            .into_iter()
            .find(|m| m["id"] == id.as_str())
            .map(Json)
            .ok_or_else(|| {
                ApiError::not_found(format!("The model `{id}` does not exist"))
                    .with_code("model_not_found")
            });
    }
    let ready = state.ready()?;
    ready.check_model(Some(&id))?;
    Ok(Json(model_object(ready)))
}

/// `POST /models/load` (many models): loads the model the body names.
pub async fn load_model(
    State(state): State<Arc<AppState>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    if state.router.is_none() {
        return Err(one_model_only());
    }
    let ready = state.model(requested_model(&body)).await?;
    Ok(Json(json!({"success": true, "model": ready.model_id})))
}

/// `POST /models/unload` (many models): unloads the model the body names once its
/// requests finish.
pub async fn unload_model(
    State(state): State<Arc<AppState>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let Some(router) = &state.router else {
        return Err(one_model_only());
    };
    let unloaded = router.unload(requested_model(&body), state.config.shutdown_grace)?;
    Ok(Json(json!({"success": unloaded})))
}

fn one_model_only() -> ApiError {
    ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        "not_supported_error",
        "this server serves one model: start it with --models-dir to load and unload models",
    )
}

pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let ready = state.model(requested_model(&body)).await?;
    let req = api::parse_tokenize(&body)?;
    let tokens = blocking(move || {
        let tok = &ready.tokenizer;
        let ids = tok.encode(&req.content, req.add_special, req.parse_special);
        if !req.with_pieces {
            return json!({"tokens": ids});
        }
        let pieces: Vec<Value> = ids
            .iter()
            .map(|&id| {
                let bytes = tok.token_to_piece(id);
                let piece = match std::str::from_utf8(bytes) {
                    Ok(s) => json!(s),
                    Err(_) => json!(bytes),
                };
                json!({"id": id, "piece": piece})
            })
            .collect();
        json!({"tokens": pieces})
    })
    .await?;
    Ok(Json(tokens))
}

pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let ready = state.model(requested_model(&body)).await?;
    let ids = api::parse_detokenize(&body)?;
    Ok(Json(json!({"content": ready.tokenizer.decode(&ids)})))
}

pub async fn fallback(req: Request) -> ApiError {
    ApiError::not_found(format!(
        "Invalid URL ({} {})",
        req.method(),
        req.uri().path()
    ))
}

pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("a worker task failed: {e}")))
}

pub(crate) fn template_error(e: ChatTemplateError) -> ApiError {
    match e {
        ChatTemplateError::Metadata(_) | ChatTemplateError::Syntax { .. } => {
            ApiError::internal(e.to_string())
        }
        e => ApiError::param(
            "messages",
            format!("cannot apply the chat template to these messages: {e}"),
        ),
    }
}

/// Checks that the prompt and the requested tokens fit one sequence's context.
pub(crate) fn check_context(
    prompt: usize,
    max_tokens: Option<usize>,
    n_ctx: usize,
    prompt_param: &str,
) -> Result<(), ApiError> {
    let exceeded =
        |msg: String, param: &str| ApiError::param(param, msg).with_code("context_length_exceeded");
    if prompt == 0 {
        return Err(ApiError::param(
            prompt_param,
            "the prompt is empty (0 tokens)",
        ));
    }
    if prompt >= n_ctx {
        return Err(exceeded(
            format!("the prompt ({prompt} tokens) exceeds the available context size ({n_ctx} tokens); at least one position must be left for generation"),
            prompt_param,
        ));
    }
    if let Some(m) = max_tokens {
        if prompt + m > n_ctx {
            return Err(exceeded(
                format!(
                    "the request ({prompt} prompt tokens + {m} max_tokens = {} tokens) exceeds the available context size ({n_ctx} tokens)",
                    prompt + m
                ),
                "max_tokens",
            ));
        }
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let ready = state.model(requested_model(&body)).await?;
    let req = api::parse_chat(&body, ready.n_vocab)?;
    let prepared = prepare_chat(&state, &ready, req).await?;
    generate(
        state,
        ready,
        Kind::Chat,
        prepared.gen,
        (prepared.prompt, prepared.images),
        prepared.output,
    )
    .await
}

/// A chat request made ready to generate: its prompt, its constraint compiled, and how its
/// output is to be split.
pub(crate) struct PreparedChat {
    pub gen: GenRequest,
    pub prompt: Vec<TokenId>,
    /// The prompt's images (their rows in place of `prompt`'s ids there).
    pub images: Vec<PlacedImage>,
    pub output: OutputConfig,
}

/// Renders a chat request's prompt (tools included), compiles its constraint (a grammar, a
/// schema or a forced tool call) and settles how its output is parsed.
pub(crate) async fn prepare_chat(
    state: &AppState,
    ready: &Arc<Ready>,
    mut req: api::ChatRequest,
) -> Result<PreparedChat, ApiError> {
    ready.check_model(req.gen.model.as_deref())?;
    for stop in &ready.template_stops {
        if !req.gen.params.stop.contains(stop) {
            req.gen.params.stop.push(stop.clone());
        }
    }
    let tools = req
        .tools
        .take()
        .filter(|t| t.choice != ferrox_agent::ToolChoice::None);
    let images = crate::images::encode(ready, std::mem::take(&mut req.images)).await?;
    let (prompt, images, opens_thinking) = {
        let ready = ready.clone();
        let (messages, kwargs) = (req.messages, req.template_kwargs);
        let template_tools = tools.as_ref().map(|t| t.template_tools());
        type Rendered = (Vec<TokenId>, Vec<PlacedImage>, Option<usize>);
        blocking(move || -> Result<Rendered, ApiError> {
            let mut options = ready.render_options.clone();
            options.add_generation_prompt = true;
            options.tools = template_tools;
            options.extra = kwargs;
            let text = ready
                .template
                .render_json(&messages, &options)
                .map_err(template_error)?;
            let opens = ferrox_agent::reasoning::prompt_opens_thinking(&text);
            let vocab = ready.tokenizer.vocab();
            let text = prompt_for_tokenizer(&text, &options, vocab.add_bos(), vocab.add_eos());
            if images.is_empty() {
                return Ok((ready.tokenizer.encode(text, true, true), Vec::new(), opens));
            }
            let media = MediaPrompt::build(&ready.tokenizer, text, images, true)
                .map_err(|e| ApiError::param("messages", e.to_string()))?;
            Ok((media.ids(), media.placed_images(), opens))
        })
        .await??
    };
    let format = ready.tool_format;
    let mut grammar = req.gen.grammar.take().map(|g| (body_kind(&g), g));
    if let Some(forced) = tools
        .as_ref()
        .and_then(|t| t.forced().map(|f| (f, t.parallel)))
    {
        let tokenizer = &ready.tokenizer;
        let is_control = |marker: &str| matches!(tokenizer.encode(marker, false, true).as_slice(), [id] if tokenizer.piece(*id, false).is_empty());
        grammar = Some((
            "tools",
            format.call_grammar(&forced.0, forced.1, &is_control),
        ));
    }
    if tools.is_some() {
        req.gen.params.preserve = ready.tool_markers.clone();
    }
    if let Some((param, spec)) = grammar {
        req.gen.params.constraint = Some(compile(state, ready, spec, param).await?);
    }
    let reasoning_format = req
        .gen
        .reasoning_format
        .unwrap_or(state.config.reasoning_format);
    // As llama-server does, a reply that opens with a thinking block has it split off
    // whatever the template (`reasoning_format: none` keeps it in the content).
    let reasoning =
        (reasoning_format == ferrox_agent::ReasoningFormat::DeepSeek).then_some(opens_thinking);
    Ok(PreparedChat {
        gen: req.gen,
        prompt,
        images,
        output: OutputConfig {
            tools: tools.map(|_| format),
            reasoning,
        },
    })
}

/// Which request field a constraint came from, for error messages.
fn body_kind(g: &ferrox_agent::GrammarSpec) -> &'static str {
    match g {
        ferrox_agent::GrammarSpec::Gbnf(_) => "grammar",
        _ => "response_format",
    }
}

/// Compiles a constraint on a worker thread (bounded by the compiler's timeout); a bad
/// grammar or schema is a 400 naming the problem.
pub(crate) async fn compile(
    _state: &AppState,
    ready: &Arc<Ready>,
    spec: ferrox_agent::GrammarSpec,
    param: &str,
) -> Result<ferrox_generate::generate::Constraint, ApiError> {
    if !ready.generates {
        // (An encoder has no grammar engine.)
        return Err(not_generative(ready));
    }
    let Some(compiler) = ready.compiler.get() else {
        return Err(ApiError::unsupported(
            param,
            "constrained output is unavailable on this server (its vocabulary could not be prepared)",
        ));
    };
    blocking(move || compiler.compile(&spec))
        .await?
        .map_err(|e| match e {
            ferrox_agent::CompileError::Invalid(message) => {
                ApiError::param(param, message).with_code("invalid_grammar")
            }
            ferrox_agent::CompileError::Busy(message) => {
                ApiError::unavailable("grammar_compiler_busy", message)
            }
        })
}

pub async fn completions(
    State(state): State<Arc<AppState>>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let ready = state.model(requested_model(&body)).await?;
    let mut req = api::parse_completion(&body, ready.n_vocab)?;
    ready.check_model(req.gen.model.as_deref())?;
    if let Some(spec) = req.gen.grammar.take() {
        let param = body_kind(&spec);
        req.gen.params.constraint = Some(compile(&state, &ready, spec, param).await?);
    }
    let prompt = match req.prompt {
        Prompt::Tokens(t) => t,
        Prompt::Text(text) => {
            let ready = ready.clone();
            blocking(move || ready.tokenizer.encode(&text, true, true)).await?
        }
    };
    generate(
        state,
        ready,
        Kind::Completion,
        req.gen,
        (prompt, Vec::new()),
        OutputConfig::default(),
    )
    .await
}

/// How a choice's output is split (chat only).
#[derive(Clone, Copy, Default)]
pub(crate) struct OutputConfig {
    /// Tool calls are parsed in this format.
    pub tools: Option<ferrox_agent::ToolFormat>,
    /// Thinking is split off; `Some(Some(i))`: the prompt opened the block.
    pub reasoning: Option<Option<usize>>,
}

impl OutputConfig {
    fn parser(&self) -> Option<OutputParser> {
        let p = OutputParser::new(
            self.reasoning.map(ReasoningSplitter::new),
            self.tools.map(|f| f.parser()),
        );
        p.is_active().then_some(p)
    }
}

/// Turns generated tokens into response JSON (one request's envelope and logprobs mode).
struct Responder {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    ready: Arc<Ready>,
    logprobs: bool,
    top_logprobs: usize,
}

fn finite(lp: f32) -> f32 {
    if lp.is_finite() {
        lp
    } else {
        -9999.0
    }
}

impl Responder {
    fn piece(&self, id: TokenId) -> (String, &[u8]) {
        let bytes = self.ready.tokenizer.token_to_piece(id);
        (String::from_utf8_lossy(bytes).into_owned(), bytes)
    }

    fn wants_logprobs(&self) -> bool {
        self.logprobs || self.top_logprobs > 0
    }

    /// The logprobs of some tokens in this endpoint's shape; `text_offset` is where the
    /// tokens' text starts in the completion (legacy endpoint only).
    fn logprobs_json(&self, tokens: &[TokenEvent], text_offset: usize) -> Value {
        if !self.wants_logprobs() {
            return Value::Null;
        }
        match self.kind {
            Kind::Chat => {
                let content: Vec<Value> = tokens
                    .iter()
                    .map(|t| {
                        let (text, bytes) = self.piece(t.token);
                        let top: Vec<Value> = t
                            .top_logprobs
                            .iter()
                            .map(|&(id, lp)| {
                                let (text, bytes) = self.piece(id);
                                json!({"token": text, "logprob": finite(lp), "bytes": bytes})
                            })
                            .collect();
                        json!({"token": text, "logprob": finite(t.logprob.unwrap_or(0.0)), "bytes": bytes, "top_logprobs": top})
                    })
                    .collect();
                json!({"content": content, "refusal": null})
            }
            Kind::Completion => {
                let mut offset = text_offset;
                let mut texts = Vec::new();
                let mut lps = Vec::new();
                let mut tops = Vec::new();
                let mut offsets = Vec::new();
                for t in tokens {
                    let (text, _) = self.piece(t.token);
                    offsets.push(offset);
                    offset += text.chars().count();
                    texts.push(text);
                    lps.push(finite(t.logprob.unwrap_or(0.0)));
                    let mut top = Map::new();
                    for &(id, lp) in &t.top_logprobs {
                        top.insert(self.piece(id).0, json!(finite(lp)));
                    }
                    tops.push(Value::Object(top));
                }
                json!({"tokens": texts, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
            }
        }
    }

    fn usage(&self, s: &Summary) -> Value {
        json!({
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.completion_tokens,
            "total_tokens": s.prompt_tokens + s.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": s.cached_tokens},
        })
    }

    fn envelope(&self, object: &str, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": crate::SYSTEM_FINGERPRINT,
            "choices": choices,
        })
    }

    /// The whole response: one choice per generated sequence, in index order, and the
    /// request's usage.
    fn full(&self, choices: &[Choice], usage: &Summary) -> Value {
        let choices: Vec<Value> = choices
            .iter()
            .enumerate()
            .map(|(index, c)| {
                let logprobs = self.logprobs_json(&c.tokens, 0);
                let finish = c.summary.as_ref().map(|s| c.finish_reason(s.finish));
                match self.kind {
                    Kind::Chat => json!({
                        "index": index,
                        "message": c.message(),
                        "logprobs": logprobs,
                        "finish_reason": finish,
                    }),
                    Kind::Completion => json!({
                        "index": index, "text": c.text, "logprobs": logprobs, "finish_reason": finish,
                    }),
                }
            })
            .collect();
        let object = match self.kind {
            Kind::Chat => "chat.completion",
            Kind::Completion => "text_completion",
        };
        let mut body = self.envelope(object, Value::Array(choices));
        body["usage"] = self.usage(usage);
        body
    }

    /// The first chunk of a chat stream's choice: the assistant role.
    fn role_chunk(&self, index: usize) -> Value {
        self.envelope(
            "chat.completion.chunk",
            json!([{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]),
        )
    }

    fn chunk(
        &self,
        index: usize,
        text: Option<&str>,
        tokens: &[TokenEvent],
        text_offset: usize,
        finish: Option<FinishReason>,
    ) -> Value {
        let logprobs = if tokens.is_empty() {
            Value::Null
        } else {
            self.logprobs_json(tokens, text_offset)
        };
        let finish = finish.map(FinishReason::as_str);
        match self.kind {
            Kind::Chat => {
                let delta = match text {
                    Some(t) => json!({"content": t}),
                    None => json!({}),
                };
                self.envelope("chat.completion.chunk", json!([{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]))
            }
            Kind::Completion => self.envelope(
                "text_completion",
                json!([{"index": index, "text": text.unwrap_or(""), "logprobs": logprobs, "finish_reason": finish}]),
            ),
        }
    }

    /// A chat chunk carrying one piece of a reply (`delta`), with the logprobs of the
    /// tokens that produced it.
    fn delta_chunk(&self, index: usize, delta: Value, tokens: &[TokenEvent]) -> Value {
        let logprobs = if tokens.is_empty() {
            Value::Null
        } else {
            self.logprobs_json(tokens, 0)
        };
        self.envelope(
            "chat.completion.chunk",
            json!([{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": null}]),
        )
    }

    fn usage_chunk(&self, s: &Summary) -> Value {
        let object = match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Completion => "text_completion",
        };
        let mut body = self.envelope(object, json!([]));
        body["usage"] = self.usage(s);
        body
    }
}

fn random_id(prefix: &str) -> String {
    use rand::distr::{Alphanumeric, SampleString};
    format!(
        "{prefix}{}",
        Alphanumeric.sample_string(&mut rand::rng(), 29)
    )
}

async fn generate(
    state: Arc<AppState>,
    ready: Arc<Ready>,
    kind: Kind,
    gen: GenRequest,
    (prompt, images): (Vec<TokenId>, Vec<PlacedImage>),
    output: OutputConfig,
) -> Result<Response, ApiError> {
    let prompt_param = if kind == Kind::Chat {
        "messages"
    } else {
        "prompt"
    };
    check_context(
        prompt.len(),
        gen.params.max_tokens,
        ready.n_ctx,
        prompt_param,
    )?;
    let responder = Responder {
        kind,
        id: random_id(if kind == Kind::Chat {
            "chatcmpl-"
        } else {
            "cmpl-"
        }),
        created: crate::unix_time(),
        model: ready.model_id.clone(),
        logprobs: gen.params.logprobs,
        top_logprobs: gen.params.top_logprobs,
        ready: ready.clone(),
    };
    let rx = submit(&state, &ready, &gen, &prompt, &images)?;
    if gen.stream {
        Ok(stream_response(
            responder,
            rx,
            gen.n,
            gen.include_usage,
            state.config.ping_interval,
            output,
        ))
    } else {
        collect_response(responder, rx, gen.n, output).await
    }
}

/// The refusal of a generation request by a model that only embeds.
fn not_generative(ready: &Ready) -> ApiError {
    ApiError::invalid(format!(
        "`{}` is an embedding model: it cannot generate text (use /v1/embeddings)",
        ready.model_id
    ))
    .with_code("model_not_generative")
}

/// Queues one sequence per choice, all sending to one channel, each event tagged by its
/// choice. Each choice samples with its own seed (the request's plus its index).
pub(crate) fn submit(
    state: &AppState,
    ready: &Ready,
    gen: &GenRequest,
    prompt: &[TokenId],
    images: &[PlacedImage],
) -> Result<mpsc::UnboundedReceiver<(usize, Event)>, ApiError> {
    if !ready.generates {
        return Err(not_generative(ready));
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let submitted = Instant::now();
    let jobs = (0..gen.n)
        .map(|choice| {
            let mut params = gen.params.clone();
            params.sampler.seed = params.sampler.seed.wrapping_add(choice as u64);
            Job {
                prompt: prompt.to_vec(),
                images: images.to_vec(),
                params,
                choice,
                cache_salt: gen.cache_salt.clone(),
                embed: None,
                events: tx.clone(),
                submitted,
                span: tracing::Span::current(),
            }
        })
        .collect();
    ready
        .scheduler
        .submit(jobs)
        .map_err(|e| submit_error(state, e))?;
    Ok(rx)
}

pub(crate) fn submit_error(state: &AppState, e: SubmitError) -> ApiError {
    match e {
        SubmitError::QueueFull => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!(
                "the server is busy: {} requests are already waiting; retry later",
                state.config.max_queue
            ),
        )
        .with_code("queue_full"),
        SubmitError::ShuttingDown => {
            ApiError::unavailable("shutting_down", "the server is shutting down")
        }
    }
}

/// What one choice has produced so far.
#[derive(Default)]
pub(crate) struct Choice {
    pub text: String,
    pub tokens: Vec<TokenEvent>,
    pub summary: Option<Summary>,
    /// Splits reasoning and tool calls off the text (chat with tools or a thinking model).
    pub parser: Option<OutputParser>,
    pub reasoning: String,
    pub calls: Vec<CallOut>,
}

/// One tool call of a reply.
pub(crate) struct CallOut {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// A choice that splits its output as `output` says.
pub(crate) fn new_choice(output: &OutputConfig) -> Choice {
    Choice::new(output)
}

impl Choice {
    fn new(output: &OutputConfig) -> Choice {
        Choice {
            parser: output.parser(),
            ..Choice::default()
        }
    }

    /// The pieces a token's text makes (content only without a parser).
    pub fn deltas(&mut self, text: &str) -> Vec<Delta> {
        match &mut self.parser {
            Some(p) => p.push(text),
            None if text.is_empty() => Vec::new(),
            None => vec![Delta::Content(text.to_string())],
        }
    }

    /// What the parser held back, at the end.
    pub fn last_deltas(&mut self) -> Vec<Delta> {
        self.parser.as_mut().map(|p| p.finish()).unwrap_or_default()
    }

    /// Adds pieces to the reply; a call started gets its id.
    pub fn absorb(&mut self, deltas: &[Delta]) {
        for d in deltas {
            match d {
                Delta::Reasoning(t) => self.reasoning.push_str(t),
                Delta::Content(t) => self.text.push_str(t),
                Delta::CallStart { name, .. } => self.calls.push(CallOut {
                    id: ferrox_agent::tools::call_id(),
                    name: name.clone(),
                    arguments: String::new(),
                }),
                Delta::CallArgs { index, text } => {
                    if let Some(c) = self.calls.get_mut(*index) {
                        c.arguments.push_str(text);
                    }
                }
            }
        }
    }

    /// `finish_reason`: `tool_calls` when the reply ended normally with calls.
    pub fn finish_reason(&self, finish: FinishReason) -> &'static str {
        if !self.calls.is_empty() && finish == FinishReason::Stop {
            "tool_calls"
        } else {
            finish.as_str()
        }
    }

    /// The chat message of a whole reply.
    pub(crate) fn message(&self) -> Value {
        let mut m = json!({"role": "assistant", "content": self.text, "refusal": null});
        if !self.reasoning.is_empty() {
            m["reasoning_content"] = json!(self.reasoning);
        }
        if !self.calls.is_empty() {
            if self.text.is_empty() {
                m["content"] = Value::Null;
            }
            m["tool_calls"] = self
                .calls
                .iter()
                .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
                .collect();
        }
        m
    }

    /// A streaming delta object for one piece (the call id comes from the call absorbed).
    fn delta_json(&self, d: &Delta) -> Value {
        match d {
            Delta::Reasoning(t) => json!({"reasoning_content": t}),
            Delta::Content(t) => json!({"content": t}),
            Delta::CallStart { index, name } => json!({"tool_calls": [{
                "index": index,
                "id": self.calls.get(*index).map(|c| c.id.as_str()),
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }]}),
            Delta::CallArgs { index, text } => {
                json!({"tool_calls": [{"index": index, "function": {"arguments": text}}]})
            }
        }
    }
}

/// The request's usage: the prompt once, the completions of every choice.
fn total_usage(choices: &[Choice]) -> Option<Summary> {
    let first = choices.first()?.summary.clone()?;
    let mut total = first;
    total.completion_tokens = choices
        .iter()
        .filter_map(|c| c.summary.as_ref().map(|s| s.completion_tokens))
        .sum();
    Some(total)
}

async fn collect_response(
    responder: Responder,
    mut rx: mpsc::UnboundedReceiver<(usize, Event)>,
    n: usize,
    output: OutputConfig,
) -> Result<Response, ApiError> {
    let mut choices: Vec<Choice> = (0..n).map(|_| Choice::new(&output)).collect();
    let mut done = 0;
    while let Some((index, event)) = rx.recv().await {
        let choice = &mut choices[index];
        match event {
            // Generation jobs get no embedding.
            Event::Started { .. } | Event::Embedding(_) => {}
            Event::Token(t) => {
                let deltas = choice.deltas(&t.text);
                choice.absorb(&deltas);
                if responder.wants_logprobs() && !t.eog {
                    choice.tokens.push(t);
                }
            }
            Event::Done(summary) => {
                let deltas = choice.last_deltas();
                choice.absorb(&deltas);
                choice.summary = Some(summary);
                done += 1;
                if done == n {
                    let usage = total_usage(&choices).expect("every choice is done");
                    return Ok(Json(responder.full(&choices, &usage)).into_response());
                }
            }
            Event::Failed(e) => return Err(e),
        }
    }
    Err(ApiError::internal("the generation ended without a result"))
}

fn sse_json(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

fn stream_response(
    responder: Responder,
    mut rx: mpsc::UnboundedReceiver<(usize, Event)>,
    n: usize,
    include_usage: bool,
    ping: std::time::Duration,
    output: OutputConfig,
) -> Response {
    // The body is sent after the handler has returned, outside the request's span.
    let span = tracing::Span::current();
    let stream = async_stream::stream! {
        if responder.kind == Kind::Chat {
            for index in 0..n {
                yield Ok::<_, Infallible>(sse_json(&responder.role_chunk(index)));
            }
        }
        // Per choice: logprobs not yet sent, characters sent, and the summary once done.
        let mut choices: Vec<Choice> = (0..n).map(|_| Choice::new(&output)).collect();
        let mut offsets = vec![0usize; n];
        let mut done = 0;
        loop {
            match rx.recv().await {
                Some((_, Event::Started { .. } | Event::Embedding(_))) => {}
                Some((index, Event::Token(mut t))) => {
                    let text = std::mem::take(&mut t.text);
                    let choice = &mut choices[index];
                    if responder.wants_logprobs() && !t.eog {
                        choice.tokens.push(t);
                    }
                    if responder.kind == Kind::Chat && choice.parser.is_some() {
                        let deltas = choice.deltas(&text);
                        choice.absorb(&deltas);
                        for d in &deltas {
                            let chunk = responder.delta_chunk(index, choice.delta_json(d), &choice.tokens);
                            choice.tokens.clear();
                            yield Ok(sse_json(&chunk));
                        }
                    } else if !text.is_empty() {
                        let chunk = responder.chunk(index, Some(&text), &choice.tokens, offsets[index], None);
                        choice.tokens.clear();
                        offsets[index] += text.chars().count();
                        yield Ok(sse_json(&chunk));
                    }
                }
                Some((index, Event::Done(summary))) => {
                    let choice = &mut choices[index];
                    let deltas = choice.last_deltas();
                    choice.absorb(&deltas);
                    for d in &deltas {
                        let chunk = responder.delta_chunk(index, choice.delta_json(d), &choice.tokens);
                        choice.tokens.clear();
                        yield Ok(sse_json(&chunk));
                    }
                    let mut chunk = responder.chunk(index, None, &choice.tokens, offsets[index], Some(summary.finish));
                    if responder.kind == Kind::Chat {
                        chunk["choices"][0]["finish_reason"] = json!(choice.finish_reason(summary.finish));
                    }
                    choice.tokens.clear();
                    choice.summary = Some(summary);
                    yield Ok(sse_json(&chunk));
                    done += 1;
                    if done == n {
                        if include_usage {
                            if let Some(usage) = total_usage(&choices) {
                                yield Ok(sse_json(&responder.usage_chunk(&usage)));
                            }
                        }
                        yield Ok(SseEvent::default().data("[DONE]"));
                        break;
                    }
                }
                Some((_, Event::Failed(e))) => {
                    tracing::warn!(parent: &span, "stream failed after it started: {}", e.message);
                    yield Ok(sse_json(&e.body()));
                    break;
                }
                None => {
                    yield Ok(sse_json(&ApiError::internal("the generation ended without a result").body()));
                    break;
                }
            }
        }
    };
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(ping).text("ping"))
        .into_response()
}

/// Answers an error status produced outside our handlers (a layer, the router) in OpenAI's
/// shape, keeping the layer's text as the message.
pub async fn wrap_error(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (_, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10)
        .await
        .unwrap_or_else(|_| Bytes::new());
    ApiError::from_status(status, &String::from_utf8_lossy(&text)).into_response()
}
