//! OpenAI's Responses API: `POST /v1/responses`, `GET /v1/responses/{id}`,
//! `DELETE /v1/responses/{id}`.
//!
//! A request is turned into the chat route's ([`request`]) and runs through the same
//! template, tools, constraints and scheduler. The reply comes back as output items
//! (`reasoning` from a thinking block, a `message` of `output_text`, `function_call`s), or,
//! streaming, as the event sequence the official clients read (`response.created`,
//! `response.in_progress`, `response.output_item.added`, `response.content_part.added`,
//! `response.output_text.delta`, `response.output_text.done`, `response.content_part.done`,
//! `response.output_item.done`, the function-call argument and reasoning-text events, and
//! `response.completed` or `response.incomplete`), each with its `sequence_number`.
//!
//! Responses are kept in memory (unless `store: false`) so that `previous_response_id`
//! continues a conversation and `GET` finds them: at most [`MAX_STORED`], each for at most
//! [`MAX_AGE`], the oldest dropped first.

mod request;

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrox_agent::Delta;
use ferrox_generate::generate::FinishReason;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::error::ApiError;
use crate::routes::{self, Choice, JsonBody, OutputConfig, PreparedChat};
use crate::scheduler::{Event, Summary};
use crate::AppState;

/// Most responses kept.
pub const MAX_STORED: usize = 1024;
/// How long a response is kept.
pub const MAX_AGE: Duration = Duration::from_secs(3600);

/// A kept response: the object `GET` returns and the conversation it ends.
struct Stored {
    at: Instant,
    response: Value,
    conversation: Vec<Value>,
}

/// The responses kept for `previous_response_id` and `GET`.
#[derive(Default)]
pub struct ResponseStore {
    inner: Mutex<StoreInner>,
}

#[derive(Default)]
struct StoreInner {
    by_id: HashMap<String, Stored>,
    order: VecDeque<String>,
}

impl StoreInner {
    fn expire(&mut self) {
        while let Some(id) = self.order.front() {
            let stale = self.by_id.get(id).is_none_or(|s| s.at.elapsed() > MAX_AGE);
            if !stale && self.order.len() <= MAX_STORED {
                break;
            }
            let id = self.order.pop_front().expect("front");
            self.by_id.remove(&id);
        }
    }
}

impl ResponseStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, StoreInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn put(&self, id: String, response: Value, conversation: Vec<Value>) {
        let mut s = self.lock();
        s.order.push_back(id.clone());
        s.by_id.insert(
            id,
            Stored {
                at: Instant::now(),
                response,
                conversation,
            },
        );
        s.expire();
    }

    fn get(&self, id: &str) -> Option<(Value, Vec<Value>)> {
        let mut s = self.lock();
        s.expire();
        s.by_id
            .get(id)
            .map(|r| (r.response.clone(), r.conversation.clone()))
    }

    fn remove(&self, id: &str) -> bool {
        let mut s = self.lock();
        s.order.retain(|o| o != id);
        s.by_id.remove(id).is_some()
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("Response with id '{id}' not found.")).with_param("response_id")
}

fn random_id(prefix: &str) -> String {
    use rand::distr::{Alphanumeric, SampleString};
    format!(
        "{prefix}{}",
        Alphanumeric.sample_string(&mut rand::rng(), 32)
    )
}

/// What a response echoes and ends with.
struct Envelope {
    id: String,
    created_at: u64,
    model: String,
    previous_response_id: Option<String>,
    store: bool,
    echo: Map<String, Value>,
}

impl Envelope {
    /// The response object with `status` and `output` (and usage once known).
    fn object(&self, status: &str, output: Vec<Value>, summary: Option<&Summary>) -> Value {
        let mut r = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": output,
            "error": null,
            "incomplete_details": null,
            "previous_response_id": self.previous_response_id,
            "store": self.store,
            "usage": null,
        });
        for (k, v) in &self.echo {
            r[k] = v.clone();
        }
        for (key, default) in [
            ("tools", json!([])),
            ("tool_choice", json!("auto")),
            ("parallel_tool_calls", json!(true)),
            ("metadata", json!({})),
            ("text", json!({"format": {"type": "text"}})),
        ] {
            if r[key].is_null() {
                r[key] = default;
            }
        }
        if let Some(s) = summary {
            if s.finish == FinishReason::Length {
                r["incomplete_details"] = json!({"reason": "max_output_tokens"});
            }
            r["usage"] = json!({
                "input_tokens": s.prompt_tokens,
                "input_tokens_details": {"cached_tokens": s.cached_tokens},
                "output_tokens": s.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": s.prompt_tokens + s.completion_tokens,
            });
        }
        r
    }
}

fn status(summary: &Summary) -> &'static str {
    match summary.finish {
        FinishReason::Length => "incomplete",
        FinishReason::Stop => "completed",
    }
}

/// A `reasoning` output item.
fn reasoning_item(text: &str, id: &str, status: &str) -> Value {
    json!({"type": "reasoning", "id": id, "status": status, "summary": [],
           "content": [{"type": "reasoning_text", "text": text}]})
}

/// A `message` output item of one `output_text`.
fn message_item(text: &str, id: &str, status: &str) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant",
           "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
}

/// A `function_call` output item.
fn call_item(call_id: &str, name: &str, arguments: &str, id: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name,
           "arguments": arguments, "status": status})
}

/// `POST /v1/responses`.
pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let ready = state.model(routes::requested_model(&body)).await?;
    let previous = match body.get("previous_response_id").and_then(Value::as_str) {
        Some(id) => state.responses.get(id).ok_or_else(|| not_found(id))?.1,
        None => Vec::new(),
    };
    let req = request::parse(&body, &previous)?;
    let chat = crate::api::parse_chat(&req.chat, ready.n_vocab)?;
    let PreparedChat {
        mut gen,
        prompt,
        images,
        output,
    } = routes::prepare_chat(&state, &ready, chat).await?;
    gen.stream = false;
    routes::check_context(prompt.len(), gen.params.max_tokens, ready.n_ctx, "input")?;
    let rx = routes::submit(&state, &ready, &gen, &prompt, &images)?;
    let mut conversation = previous;
    conversation.extend(req.input_messages);
    let envelope = Envelope {
        id: random_id("resp_"),
        created_at: crate::unix_time(),
        model: ready.model_id.clone(),
        previous_response_id: req.previous_response_id,
        store: req.store,
        echo: req.echo,
    };
    let run = Run {
        state,
        envelope,
        conversation,
        output,
    };
    if req.stream {
        Ok(run.stream(rx))
    } else {
        run.collect(rx).await
    }
}

/// One response being generated.
struct Run {
    state: Arc<AppState>,
    envelope: Envelope,
    conversation: Vec<Value>,
    output: OutputConfig,
}

impl Run {
    /// Keeps the finished response (unless `store: false`).
    fn keep(&mut self, response: &Value, choice: &Choice) {
        if !self.envelope.store {
            return;
        }
        let mut conversation = std::mem::take(&mut self.conversation);
        conversation.push(choice.message());
        self.state
            .responses
            .put(self.envelope.id.clone(), response.clone(), conversation);
    }

    async fn collect(
        mut self,
        mut rx: UnboundedReceiver<(usize, Event)>,
    ) -> Result<Response, ApiError> {
        let mut choice = routes::new_choice(&self.output);
        // The items in the order they appeared.
        let mut order: Vec<Open> = Vec::new();
        let mut absorb = |choice: &mut Choice, deltas: Vec<Delta>| {
            for d in &deltas {
                let kind = match d {
                    Delta::Reasoning(_) => Open::Reasoning,
                    Delta::Content(_) => Open::Message,
                    Delta::CallStart { index, .. } => Open::Call(*index),
                    Delta::CallArgs { .. } => continue,
                };
                if !order.contains(&kind) {
                    order.push(kind);
                }
            }
            choice.absorb(&deltas);
        };
        while let Some((_, event)) = rx.recv().await {
            match event {
                Event::Started { .. } | Event::Embedding(_) => {}
                Event::Token(t) => {
                    let deltas = choice.deltas(&t.text);
                    absorb(&mut choice, deltas);
                }
                Event::Done(summary) => {
                    let deltas = choice.last_deltas();
                    absorb(&mut choice, deltas);
                    let items = order
                        .iter()
                        .map(|&k| finished_item(&choice, &random_id(k.prefix()), k))
                        .collect();
                    let response = self
                        .envelope
                        .object(status(&summary), items, Some(&summary));
                    self.keep(&response, &choice);
                    return Ok(Json(response).into_response());
                }
                Event::Failed(e) => return Err(e),
            }
        }
        Err(ApiError::internal("the generation ended without a result"))
    }

    fn stream(mut self, mut rx: UnboundedReceiver<(usize, Event)>) -> Response {
        let ping = self.state.config.ping_interval;
        let span = tracing::Span::current();
        let stream = async_stream::stream! {
            let mut seq = 0u64;
            let mut event = |kind: &str, mut data: Value| -> Result<SseEvent, Infallible> {
                data["type"] = json!(kind);
                data["sequence_number"] = json!(seq);
                seq += 1;
                Ok(SseEvent::default().event(kind).data(data.to_string()))
            };
            let initial = self.envelope.object("in_progress", Vec::new(), None);
            yield event("response.created", json!({"response": initial}));
            yield event("response.in_progress", json!({"response": initial}));
            let mut choice = routes::new_choice(&self.output);
            let mut done_items: Vec<Value> = Vec::new();
            // The item being streamed: its id and what it is.
            let mut open: Option<(String, Open)> = None;
            loop {
                let (deltas, finished) = match rx.recv().await {
                    Some((_, Event::Started { .. } | Event::Embedding(_))) => continue,
                    Some((_, Event::Token(t))) => (choice.deltas(&t.text), None),
                    Some((_, Event::Done(summary))) => (choice.last_deltas(), Some(summary)),
                    Some((_, Event::Failed(e))) => {
                        tracing::warn!(parent: &span, "stream failed after it started: {}", e.message);
                        let mut failed = self.envelope.object("failed", done_items.clone(), None);
                        failed["error"] = json!({"code": "server_error", "message": e.message});
                        yield event("response.failed", json!({"response": failed}));
                        break;
                    }
                    None => break,
                };
                choice.absorb(&deltas);
                for d in deltas {
                    let kind = match &d {
                        Delta::Reasoning(_) => Open::Reasoning,
                        Delta::Content(_) => Open::Message,
                        Delta::CallStart { index, .. } | Delta::CallArgs { index, .. } => Open::Call(*index),
                    };
                    let starts = matches!(d, Delta::CallStart { .. }) || open.as_ref().map(|o| o.1) != Some(kind);
                    if starts {
                        if let Some((id, was)) = open.take() {
                            for (name, data) in close(&choice, &id, was, done_items.len()) {
                                yield event(name, data);
                            }
                            done_items.push(finished_item(&choice, &id, was));
                        }
                        let id = random_id(kind.prefix());
                        let index = done_items.len();
                        let item = match kind {
                            Open::Reasoning => reasoning_item("", &id, "in_progress"),
                            Open::Message => json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []}),
                            Open::Call(i) => {
                                let c = &choice.calls[i];
                                call_item(&c.id, &c.name, "", &id, "in_progress")
                            }
                        };
                        yield event("response.output_item.added", json!({"output_index": index, "item": item}));
                        match kind {
                            Open::Message => yield event("response.content_part.added", json!({"item_id": id, "output_index": index, "content_index": 0,
                                "part": {"type": "output_text", "text": "", "annotations": []}})),
                            Open::Reasoning => yield event("response.content_part.added", json!({"item_id": id, "output_index": index, "content_index": 0,
                                "part": {"type": "reasoning_text", "text": ""}})),
                            Open::Call(_) => {}
                        }
                        open = Some((id, kind));
                    }
                    let (id, _) = open.as_ref().expect("an item is open");
                    let index = done_items.len();
                    match d {
                        Delta::Reasoning(t) => yield event("response.reasoning_text.delta", json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t})),
                        Delta::Content(t) => yield event("response.output_text.delta", json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t, "logprobs": []})),
                        Delta::CallStart { .. } => {}
                        Delta::CallArgs { text, .. } => yield event("response.function_call_arguments.delta", json!({"item_id": id, "output_index": index, "delta": text})),
                    }
                }
                if let Some(summary) = finished {
                    if let Some((id, was)) = open.take() {
                        for (name, data) in close(&choice, &id, was, done_items.len()) {
                            yield event(name, data);
                        }
                        done_items.push(finished_item(&choice, &id, was));
                    }
                    let status = status(&summary);
                    let response = self.envelope.object(status, done_items.clone(), Some(&summary));
                    self.keep(&response, &choice);
                    let name = if status == "completed" { "response.completed" } else { "response.incomplete" };
                    yield event(name, json!({"response": response}));
                    break;
                }
            }
        };
        Sse::new(stream)
            .keep_alive(KeepAlive::new().interval(ping))
            .into_response()
    }
}

/// What an open streamed item is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Open {
    Reasoning,
    Message,
    Call(usize),
}

impl Open {
    fn prefix(self) -> &'static str {
        match self {
            Open::Reasoning => "rs_",
            Open::Message => "msg_",
            Open::Call(_) => "fc_",
        }
    }
}

/// An item as it ends.
fn finished_item(choice: &Choice, id: &str, kind: Open) -> Value {
    match kind {
        Open::Reasoning => reasoning_item(&choice.reasoning, id, "completed"),
        Open::Message => message_item(&choice.text, id, "completed"),
        Open::Call(i) => {
            let c = &choice.calls[i];
            call_item(&c.id, &c.name, &c.arguments, id, "completed")
        }
    }
}

/// The events that close an item (at `index` of the output).
fn close(choice: &Choice, id: &str, kind: Open, index: usize) -> Vec<(&'static str, Value)> {
    let item = finished_item(choice, id, kind);
    let mut events = match kind {
        Open::Reasoning => vec![
            (
                "response.reasoning_text.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "text": choice.reasoning}),
            ),
            (
                "response.content_part.done",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                "part": {"type": "reasoning_text", "text": choice.reasoning}}),
            ),
        ],
        Open::Message => vec![
            (
                "response.output_text.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "text": choice.text, "logprobs": []}),
            ),
            (
                "response.content_part.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": item["content"][0]}),
            ),
        ],
        Open::Call(i) => vec![(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "name": choice.calls[i].name, "arguments": choice.calls[i].arguments}),
        )],
    };
    events.push((
        "response.output_item.done",
        json!({"output_index": index, "item": item}),
    ));
    events
}

/// `GET /v1/responses/{id}`.
pub(crate) async fn get(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    state
        .responses
        .get(&id)
        .map(|(r, _)| Json(r))
        .ok_or_else(|| not_found(&id))
}

/// `DELETE /v1/responses/{id}`.
pub(crate) async fn delete(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    match state.responses.remove(&id) {
        true => Ok(Json(
            json!({"id": id, "object": "response.deleted", "deleted": true}),
        )),
        false => Err(not_found(&id)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_is_bounded_and_forgets_what_is_deleted() {
        let store = ResponseStore::default();
        for i in 0..MAX_STORED + 5 {
            store.put(format!("r{i}"), json!({"i": i}), Vec::new());
        }
        assert!(store.get("r0").is_none(), "the oldest went first");
        assert!(store.get(&format!("r{}", MAX_STORED + 4)).is_some());
        assert_eq!(store.lock().by_id.len(), MAX_STORED);
        assert!(store.remove("r10"));
        assert!(!store.remove("r10"));
        assert!(store.get("r10").is_none());
    }
}
