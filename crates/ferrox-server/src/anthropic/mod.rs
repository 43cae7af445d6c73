//! Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.
//!
//! A request (`system`, `messages` with `text` / `tool_use` / `tool_result` / `thinking`
//! blocks, `tools`, `tool_choice`, `stop_sequences`, `max_tokens`, `temperature`, `top_p`,
//! `top_k`, `thinking`) is parsed into the chat route's request ([`request`]) and runs
//! through the same template, constraint and scheduler; the reply comes back as content blocks
//! (`thinking`, `text`, `tool_use`) with Anthropic's `stop_reason`, or, streaming, as
//! Anthropic's event sequence (`message_start`, `content_block_start`,
//! `content_block_delta`, `content_block_stop`, `message_delta`, `message_stop`, `ping`).
//! Errors are `{"type": "error", "error": {"type", "message"}}`. The model name is echoed,
//! not checked: Anthropic clients send their own model names. llama-server's `grammar` and
//! `json_schema` fields are honoured here too.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{FromRequest, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrox_agent::Delta;
use ferrox_generate::generate::FinishReason;
use serde_json::{json, Value};

mod request;

pub use request::parse_messages;

use crate::error::ApiError;
use crate::routes::{self, Choice, JsonBody, OutputConfig, PreparedChat};
use crate::scheduler::{Event, Summary};
use crate::AppState;

/// An error in Anthropic's shape.
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

/// Anthropic's error type for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 405 | 415 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// The `{"type": "error", "error": {...}}` body.
pub fn error_body(e: &ApiError) -> Value {
    json!({"type": "error", "error": {"type": error_type(e.status), "message": e.message}})
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let mut response = (self.0.status, Json(error_body(&self.0))).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    }
}

fn invalid(message: impl Into<String>) -> AnthropicError {
    AnthropicError(ApiError::invalid(message))
}

fn random_id(prefix: &str) -> String {
    use rand::distr::{Alphanumeric, SampleString};
    format!(
        "{prefix}{}",
        Alphanumeric.sample_string(&mut rand::rng(), 24)
    )
}

/// Reads the body as the OpenAI routes do, errors in Anthropic's shape.
async fn body(req: Request, state: &Arc<AppState>) -> Result<Value, AnthropicError> {
    Ok(JsonBody::from_request(req, state).await?.0)
}

async fn prepare(
    state: &Arc<AppState>,
    body: &Value,
) -> Result<(Arc<crate::Ready>, PreparedChat), AnthropicError> {
    let ready = state.model(routes::requested_model(body)).await?;
    let mut req = parse_messages(body, ready.n_vocab, false)?;
    req.gen.model = None;
    let prepared = routes::prepare_chat(state, &ready, req).await?;
    routes::check_context(
        prepared.prompt.len(),
        prepared.gen.params.max_tokens,
        ready.n_ctx,
        "messages",
    )?;
    Ok((ready, prepared))
}

/// `POST /v1/messages/count_tokens`.
pub(crate) async fn count_tokens(
    State(state): State<Arc<AppState>>,
    req: Request,
) -> Result<Json<Value>, AnthropicError> {
    let body = body(req, &state).await?;
    let ready = state.model(routes::requested_model(&body)).await?;
    let req = parse_messages(&body, ready.n_vocab, true)?;
    let prepared = routes::prepare_chat(&state, &ready, req).await?;
    Ok(Json(json!({"input_tokens": prepared.prompt.len()})))
}

/// Anthropic's `stop_reason`.
fn stop_reason(summary: &Summary, calls: bool) -> &'static str {
    match (summary.finish, &summary.stop) {
        (FinishReason::Length, _) => "max_tokens",
        (FinishReason::Stop, Some(_)) => "stop_sequence",
        (FinishReason::Stop, None) if calls => "tool_use",
        (FinishReason::Stop, None) => "end_turn",
    }
}

fn tool_input(arguments: &str) -> Value {
    serde_json::from_str::<Value>(arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}))
}

/// `POST /v1/messages`.
pub(crate) async fn messages(
    State(state): State<Arc<AppState>>,
    req: Request,
) -> Result<Response, AnthropicError> {
    let body = body(req, &state).await?;
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("model: Field required"))?
        .to_string();
    let (ready, prepared) = prepare(&state, &body).await?;
    let PreparedChat {
        gen,
        prompt,
        images,
        output,
    } = prepared;
    let stream = gen.stream;
    let rx = routes::submit(&state, &ready, &gen, &prompt, &images)?;
    let id = random_id("msg_");
    if stream {
        Ok(stream_messages(state, rx, id, model, prompt.len(), output))
    } else {
        collect_message(rx, id, model, output).await
    }
}

async fn collect_message(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<(usize, Event)>,
    id: String,
    model: String,
    output: OutputConfig,
) -> Result<Response, AnthropicError> {
    let mut choice = routes::new_choice(&output);
    let mut blocks: Vec<Value> = Vec::new();
    let push = |blocks: &mut Vec<Value>, choice: &mut Choice, deltas: Vec<Delta>| {
        choice.absorb(&deltas);
        for d in deltas {
            let last = blocks.last_mut();
            match d {
                Delta::Reasoning(t) => match last {
                    Some(b) if b["type"] == "thinking" => {
                        b["thinking"] = json!(format!("{}{t}", b["thinking"].as_str().unwrap_or_default()))
                    }
                    _ => blocks.push(json!({"type": "thinking", "thinking": t, "signature": ""})),
                },
                Delta::Content(t) => match last {
                    Some(b) if b["type"] == "text" => {
                        b["text"] = json!(format!("{}{t}", b["text"].as_str().unwrap_or_default()))
                    }
                    _ => blocks.push(json!({"type": "text", "text": t})),
                },
                Delta::CallStart { index, name } => blocks.push(
                    json!({"type": "tool_use", "id": tool_id(&choice.calls[index].id), "name": name, "input": {}, "index": index}),
                ),
                Delta::CallArgs { .. } => {}
            }
        }
    };
    while let Some((_, event)) = rx.recv().await {
        match event {
            // Generation jobs get no embedding.
            Event::Started { .. } | Event::Embedding(_) => {}
            Event::Token(t) => {
                let deltas = choice.deltas(&t.text);
                push(&mut blocks, &mut choice, deltas);
            }
            Event::Done(summary) => {
                let deltas = choice.last_deltas();
                push(&mut blocks, &mut choice, deltas);
                for b in &mut blocks {
                    if let Some(index) = b.get("index").and_then(Value::as_u64) {
                        b["input"] = tool_input(&choice.calls[index as usize].arguments);
                        b.as_object_mut().map(|o| o.remove("index"));
                    }
                }
                let body = json!({
                    "id": id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": blocks,
                    "stop_reason": stop_reason(&summary, !choice.calls.is_empty()),
                    "stop_sequence": summary.stop,
                    "usage": {"input_tokens": summary.prompt_tokens, "output_tokens": summary.completion_tokens,
                              "cache_read_input_tokens": summary.cached_tokens},
                });
                return Ok(Json(body).into_response());
            }
            Event::Failed(e) => return Err(AnthropicError(e)),
        }
    }
    Err(AnthropicError(ApiError::internal(
        "the generation ended without a result",
    )))
}

/// A `toolu_` id for a call (Anthropic's spelling of the OpenAI `call_` id).
fn tool_id(call_id: &str) -> String {
    format!("toolu_{}", call_id.trim_start_matches("call_"))
}

fn sse(event: &str, data: Value) -> Result<SseEvent, Infallible> {
    Ok(SseEvent::default().event(event).data(data.to_string()))
}

fn stream_messages(
    state: Arc<AppState>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<(usize, Event)>,
    id: String,
    model: String,
    prompt_tokens: usize,
    output: OutputConfig,
) -> Response {
    let span = tracing::Span::current();
    let ping = state.config.ping_interval;
    let stream = async_stream::stream! {
        yield sse("message_start", json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 0},
        }}));
        yield sse("ping", json!({"type": "ping"}));
        let mut choice = routes::new_choice(&output);
        // The open block: its index and type.
        let mut open: Option<(usize, &'static str)> = None;
        let mut next_index = 0usize;
        loop {
            let (deltas, done) = match rx.recv().await {
                Some((_, Event::Started { .. } | Event::Embedding(_))) => continue,
                Some((_, Event::Token(t))) => (choice.deltas(&t.text), None),
                Some((_, Event::Done(summary))) => (choice.last_deltas(), Some(summary)),
                Some((_, Event::Failed(e))) => {
                    tracing::warn!(parent: &span, "stream failed after it started: {}", e.message);
                    yield sse("error", error_body(&e));
                    break;
                }
                None => {
                    yield sse("error", error_body(&ApiError::internal("the generation ended without a result")));
                    break;
                }
            };
            choice.absorb(&deltas);
            for d in deltas {
                let kind = match &d {
                    Delta::Reasoning(_) => "thinking",
                    Delta::Content(_) => "text",
                    Delta::CallStart { .. } => "tool_use",
                    Delta::CallArgs { .. } => "tool_use",
                };
                let starts = matches!(d, Delta::CallStart { .. }) || open.map(|(_, k)| k) != Some(kind);
                if starts {
                    if let Some((index, k)) = open.take() {
                        if k == "thinking" {
                            yield sse("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": ""}}));
                        }
                        yield sse("content_block_stop", json!({"type": "content_block_stop", "index": index}));
                    }
                    let block = match &d {
                        Delta::Reasoning(_) => json!({"type": "thinking", "thinking": "", "signature": ""}),
                        Delta::Content(_) => json!({"type": "text", "text": ""}),
                        Delta::CallStart { index, name } | Delta::CallArgs { index, text: name } => {
                            let call = &choice.calls[*index];
                            let name = if matches!(d, Delta::CallStart { .. }) { name.clone() } else { call.name.clone() };
                            json!({"type": "tool_use", "id": tool_id(&call.id), "name": name, "input": {}})
                        }
                    };
                    yield sse("content_block_start", json!({"type": "content_block_start", "index": next_index, "content_block": block}));
                    open = Some((next_index, kind));
                    next_index += 1;
                }
                let index = open.map_or(0, |(i, _)| i);
                let delta = match d {
                    Delta::Reasoning(t) => json!({"type": "thinking_delta", "thinking": t}),
                    Delta::Content(t) => json!({"type": "text_delta", "text": t}),
                    Delta::CallStart { .. } => continue,
                    Delta::CallArgs { text, .. } => json!({"type": "input_json_delta", "partial_json": text}),
                };
                yield sse("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": delta}));
            }
            if let Some(summary) = done {
                if let Some((index, k)) = open.take() {
                    if k == "thinking" {
                        yield sse("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": ""}}));
                    }
                    yield sse("content_block_stop", json!({"type": "content_block_stop", "index": index}));
                }
                yield sse("message_delta", json!({"type": "message_delta",
                    "delta": {"stop_reason": stop_reason(&summary, !choice.calls.is_empty()), "stop_sequence": summary.stop},
                    "usage": {"output_tokens": summary.completion_tokens}}));
                yield sse("message_stop", json!({"type": "message_stop"}));
                break;
            }
        }
    };
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(ping).text("ping"))
        .into_response()
}
