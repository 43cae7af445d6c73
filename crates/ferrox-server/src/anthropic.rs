//! Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.
//!
//! A request (`system`, `messages` with `text` / `tool_use` / `tool_result` / `thinking`
//! blocks, `tools`, `tool_choice`, `stop_sequences`, `max_tokens`, `temperature`, `top_p`,
//! `top_k`, `thinking`) is translated to its chat-completions equivalent and runs through
//! the same template, constraint and scheduler; the reply comes back as content blocks
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
use serde_json::{json, Map, Value};

use crate::api;
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

/// Text of a `content` that is a string or an array of `text` blocks.
fn text_of(content: &Value, at: &str) -> Result<String, AnthropicError> {
    match content {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut text = String::new();
            for (i, b) in blocks.iter().enumerate() {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        text.push_str(b.get("text").and_then(Value::as_str).ok_or_else(|| {
                            invalid(format!("{at}[{i}].text: a string is required"))
                        })?)
                    }
                    Some(other) => {
                        return Err(invalid(format!(
                            "{at}[{i}]: blocks of type '{other}' are not supported here (text only)"
                        )))
                    }
                    None => return Err(invalid(format!("{at}[{i}].type: Field required"))),
                }
            }
            Ok(text)
        }
        _ => Err(invalid(format!(
            "{at}: a string or an array of blocks is required"
        ))),
    }
}

/// The chat-completions request equivalent to a Messages request.
fn to_chat(body: &Value, counting: bool) -> Result<Value, AnthropicError> {
    let obj = body
        .as_object()
        .ok_or_else(|| invalid("the request body must be a JSON object"))?;
    let mut messages: Vec<Value> = Vec::new();
    if let Some(system) = obj.get("system").filter(|v| !v.is_null()) {
        messages.push(json!({"role": "system", "content": text_of(system, "system")?}));
    }
    let given = match obj.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        Some(Value::Array(_)) => return Err(invalid("messages: at least one message is required")),
        _ => return Err(invalid("messages: Field required")),
    };
    for (i, m) in given.iter().enumerate() {
        let at = format!("messages.{i}");
        let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
        if role != "user" && role != "assistant" {
            return Err(invalid(format!(
                "{at}.role: Input should be 'user' or 'assistant'"
            )));
        }
        let content = m.get("content").unwrap_or(&Value::Null);
        let blocks: Vec<Value> = match content {
            Value::String(s) => vec![json!({"type": "text", "text": s})],
            Value::Array(b) => b.clone(),
            _ => {
                return Err(invalid(format!(
                    "{at}.content: a string or an array of blocks is required"
                )))
            }
        };
        let mut text = String::new();
        let mut reasoning = String::new();
        let mut calls = Vec::new();
        for (j, b) in blocks.iter().enumerate() {
            let bat = format!("{at}.content.{j}");
            match b.get("type").and_then(Value::as_str) {
                Some("text") => text.push_str(
                    b.get("text")
                        .and_then(Value::as_str)
                        .ok_or_else(|| invalid(format!("{bat}.text: Field required")))?,
                ),
                Some("thinking") if role == "assistant" => reasoning.push_str(
                    b.get("thinking")
                        .and_then(Value::as_str)
                        .unwrap_or_default(),
                ),
                Some("redacted_thinking") => {}
                Some("tool_use") if role == "assistant" => {
                    let id = b
                        .get("id")
                        .and_then(Value::as_str)
                        .ok_or_else(|| invalid(format!("{bat}.id: Field required")))?;
                    let name = b
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| invalid(format!("{bat}.name: Field required")))?;
                    let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                    calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input.to_string()}}));
                }
                Some("tool_result") if role == "user" => {
                    let id = b
                        .get("tool_use_id")
                        .and_then(Value::as_str)
                        .ok_or_else(|| invalid(format!("{bat}.tool_use_id: Field required")))?;
                    let result = text_of(
                        b.get("content").unwrap_or(&Value::Null),
                        &format!("{bat}.content"),
                    )?;
                    // A tool's result is its own message, before the user's text.
                    messages.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
                }
                Some(other) => {
                    return Err(invalid(format!(
                        "{bat}: blocks of type '{other}' are not supported in {role} messages"
                    )))
                }
                None => return Err(invalid(format!("{bat}.type: Field required"))),
            }
        }
        if role == "assistant" {
            let mut msg = json!({"role": "assistant", "content": text});
            if !calls.is_empty() {
                msg["tool_calls"] = Value::Array(calls);
            }
            if !reasoning.is_empty() {
                msg["reasoning_content"] = json!(reasoning);
            }
            messages.push(msg);
        } else if !text.is_empty()
            || !blocks
                .iter()
                .any(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
        {
            messages.push(json!({"role": "user", "content": text}));
        }
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    match obj.get("max_tokens") {
        Some(v) if v.as_u64().is_some_and(|n| n >= 1) => {
            chat.insert("max_tokens".into(), v.clone());
        }
        Some(_) => {
            return Err(invalid(
                "max_tokens: Input should be an integer of at least 1",
            ))
        }
        None if counting => {}
        None => return Err(invalid("max_tokens: Field required")),
    }
    if let Some(t) = obj.get("temperature").filter(|v| !v.is_null()) {
        match t.as_f64() {
            Some(x) if (0.0..=1.0).contains(&x) => {
                chat.insert("temperature".into(), t.clone());
            }
            _ => {
                return Err(invalid(
                    "temperature: Input should be a number between 0 and 1",
                ))
            }
        }
    } else {
        // Anthropic's default.
        chat.insert("temperature".into(), json!(1.0));
    }
    // llama-server's extensions pass through (`grammar`, `json_schema`).
    for key in ["top_p", "top_k", "stream", "grammar", "json_schema"] {
        if let Some(v) = obj.get(key).filter(|v| !v.is_null()) {
            chat.insert(key.into(), v.clone());
        }
    }
    if let Some(stops) = obj.get("stop_sequences").filter(|v| !v.is_null()) {
        chat.insert("stop".into(), stops.clone());
    }
    if let Some(Value::Array(tools)) = obj.get("tools") {
        let mut out = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            let name = t
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid(format!("tools.{i}.name: Field required")))?;
            if t.get("type")
                .and_then(Value::as_str)
                .is_some_and(|ty| ty != "custom")
            {
                return Err(invalid(format!(
                    "tools.{i}: server tools ('{}') are not supported",
                    t["type"].as_str().unwrap_or_default()
                )));
            }
            let mut f = json!({"name": name, "parameters": t.get("input_schema").cloned().unwrap_or_else(|| json!({"type": "object"}))});
            if let Some(d) = t.get("description") {
                f["description"] = d.clone();
            }
            out.push(json!({"type": "function", "function": f}));
        }
        chat.insert("tools".into(), Value::Array(out));
    }
    if let Some(choice) = obj.get("tool_choice").filter(|v| !v.is_null()) {
        let mapped = match choice.get("type").and_then(Value::as_str) {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => {
                json!({"type": "function", "function": {"name": choice.get("name").and_then(Value::as_str).ok_or_else(|| invalid("tool_choice.name: Field required"))?}})
            }
            _ => {
                return Err(invalid(
                    "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'",
                ))
            }
        };
        chat.insert("tool_choice".into(), mapped);
        if choice
            .get("disable_parallel_tool_use")
            .and_then(Value::as_bool)
            == Some(true)
        {
            chat.insert("parallel_tool_calls".into(), json!(false));
        }
    }
    // Structured output (`output_config.format`): a JSON schema.
    if let Some(format) = obj
        .get("output_config")
        .and_then(|c| c.get("format"))
        .filter(|v| !v.is_null())
    {
        match format.get("type").and_then(Value::as_str) {
            Some("json_schema") => {
                let schema = format.get("schema").cloned().unwrap_or_else(|| json!({}));
                chat.insert(
                    "response_format".into(),
                    json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}),
                );
            }
            _ => {
                return Err(invalid(
                    "output_config.format.type: Input should be 'json_schema'",
                ))
            }
        }
    }
    if let Some(thinking) = obj.get("thinking").filter(|v| !v.is_null()) {
        let enabled = thinking.get("type").and_then(Value::as_str) == Some("enabled");
        chat.insert(
            "chat_template_kwargs".into(),
            json!({"enable_thinking": enabled}),
        );
    }
    Ok(Value::Object(chat))
}

fn random_id(prefix: &str) -> String {
    use rand::distr::{Alphanumeric, SampleString};
    format!(
        "{prefix}{}",
        Alphanumeric.sample_string(&mut rand::rng(), 24)
    )
}

/// Parses a Messages API body (`counting`: a `count_tokens` body, which has no `max_tokens`)
/// into the request the chat route serves.
pub fn parse_messages(
    body: &Value,
    n_vocab: usize,
    counting: bool,
) -> Result<api::ChatRequest, AnthropicError> {
    Ok(api::parse_chat(&to_chat(body, counting)?, n_vocab)?)
}

/// Reads the body as the OpenAI routes do, errors in Anthropic's shape.
async fn body(req: Request, state: &Arc<AppState>) -> Result<Value, AnthropicError> {
    Ok(JsonBody::from_request(req, state).await?.0)
}

async fn prepare(
    state: &Arc<AppState>,
    body: &Value,
) -> Result<(Arc<crate::Ready>, PreparedChat), AnthropicError> {
    let ready = state.ready()?.clone();
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
    let ready = state.ready()?.clone();
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
        output,
    } = prepared;
    let stream = gen.stream;
    let rx = routes::submit(&state, &ready, &gen, &prompt)?;
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
            Event::Started { .. } => {}
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
                Some((_, Event::Started { .. })) => continue,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_translate_to_chat() {
        let chat = to_chat(
            &json!({
                "model": "claude-x", "max_tokens": 20, "system": [{"type": "text", "text": "Be brief."}],
                "messages": [
                    {"role": "user", "content": "Weather?"},
                    {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "Oslo"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]}]}
                ],
                "tools": [{"name": "w", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "tool", "name": "w", "disable_parallel_tool_use": true},
                "stop_sequences": ["END"], "thinking": {"type": "enabled", "budget_tokens": 100}
            }),
            false,
        )
        .ok()
        .unwrap();
        assert_eq!(
            chat["messages"][0],
            json!({"role": "system", "content": "Be brief."})
        );
        assert_eq!(
            chat["messages"][2]["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Oslo\"}"
        );
        assert_eq!(
            chat["messages"][3],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"})
        );
        assert_eq!(chat["messages"].as_array().unwrap().len(), 4);
        assert_eq!(chat["tool_choice"]["function"]["name"], "w");
        assert_eq!(chat["parallel_tool_calls"], false);
        assert_eq!(chat["stop"], json!(["END"]));
        assert_eq!(chat["temperature"], 1.0);
        assert_eq!(chat["chat_template_kwargs"]["enable_thinking"], true);
        assert!(to_chat(
            &json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
            false
        )
        .is_err());
        assert!(to_chat(&json!({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}), false).is_err());
        assert!(to_chat(&json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]}), false).is_err());
    }
}
