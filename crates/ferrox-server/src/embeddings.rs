//! `POST /v1/embeddings` (OpenAI's shape) and llama-server's `/embedding`: each input is
//! embedded as its own sequence through the scheduler, beside the generating ones, pooled as
//! the server was started (`--pooling`) and normalized as llama-server does
//! (`embd_normalize`, Euclidean by default).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use ferrox_generate::embedding::{normalize, Pooling};
use ferrox_generate::generate::GenerationParams;
use ferrox_tokenizer::tokenizer::TokenId;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::api::{as_object, Fields};
use crate::error::ApiError;
use crate::routes::{blocking, JsonBody};
use crate::scheduler::{Event, Job};
use crate::{AppState, Ready};

/// Most inputs one request may embed (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// One input: text to tokenize, or token ids used as given.
#[derive(Debug, PartialEq)]
enum Input {
    Text(String),
    Tokens(Vec<TokenId>),
}

/// A parsed embedding request.
#[derive(Debug)]
struct EmbeddingRequest {
    model: Option<String>,
    inputs: Vec<Input>,
    base64: bool,
    /// Keep the first this many values of each embedding (before it is normalized).
    dimensions: Option<usize>,
    /// llama.cpp's `embd_normalize`.
    normalize: i32,
    /// OpenAI's response shape (else llama-server's `/embedding` list).
    openai: bool,
}

fn parse_inputs(value: &Value, param: &str, n_vocab: usize) -> Result<Vec<Input>, ApiError> {
    let ids = |items: &[Value]| -> Result<Vec<TokenId>, ApiError> {
        items
            .iter()
            .map(|v| {
                v.as_u64()
                    .filter(|&t| (t as usize) < n_vocab)
                    .map(|t| t as TokenId)
                    .ok_or_else(|| {
                        ApiError::param(
                            param,
                            format!("token ids must be integers below {n_vocab}"),
                        )
                    })
            })
            .collect()
    };
    let inputs = match value {
        Value::String(s) => vec![Input::Text(s.clone())],
        Value::Array(items) if items.iter().all(Value::is_number) && !items.is_empty() => {
            vec![Input::Tokens(ids(items)?)]
        }
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(Input::Text(s.clone())),
                Value::Array(inner) => Ok(Input::Tokens(ids(inner)?)),
                _ => Err(ApiError::param(
                    param,
                    format!("'{param}' items must be strings or arrays of token ids"),
                )),
            })
            .collect::<Result<_, _>>()?,
        _ => {
            return Err(ApiError::param(
                param,
                format!("'{param}' must be a string, an array of strings, or token ids"),
            ))
        }
    };
    if inputs.is_empty() {
        return Err(ApiError::param(
            param,
            format!("'{param}' must not be empty"),
        ));
    }
    if inputs.len() > MAX_INPUTS {
        return Err(ApiError::param(
            param,
            format!(
                "{} inputs in one request; at most {MAX_INPUTS} are taken",
                inputs.len()
            ),
        ));
    }
    Ok(inputs)
}

fn parse(
    body: &Value,
    openai_route: bool,
    n_vocab: usize,
    n_embd: usize,
) -> Result<EmbeddingRequest, ApiError> {
    let f = Fields(as_object(body)?);
    // llama-server: `content` (its own field) answers in its own shape even on /v1.
    let (inputs, openai) = match (f.get("input"), f.get("content")) {
        (Some(v), _) => (parse_inputs(v, "input", n_vocab)?, openai_route),
        (None, Some(v)) => (parse_inputs(v, "content", n_vocab)?, false),
        (None, None) => {
            return Err(ApiError::param(
                "input",
                "\"input\" or \"content\" must be provided",
            ))
        }
    };
    let base64 = match f.string("encoding_format")? {
        None | Some("float") => false,
        Some("base64") => true,
        Some(_) => {
            return Err(ApiError::param(
                "encoding_format",
                "the format to return the embeddings in: either float or base64",
            ))
        }
    };
    let dimensions = match f.at_least("dimensions", 1)? {
        Some(d) if d > n_embd as u64 => {
            return Err(ApiError::param(
                "dimensions",
                format!("'dimensions' must be at most the model's {n_embd}, got {d}"),
            ))
        }
        d => d.map(|d| d as usize),
    };
    let normalize = match f.integer("embd_normalize")? {
        None => 2,
        Some(p) => i32::try_from(p).ok().filter(|&p| p >= -1).ok_or_else(|| {
            ApiError::param(
                "embd_normalize",
                "'embd_normalize' must be -1 (none), 0 (int16 range), 1 (taxicab), 2 (Euclidean) or a p-norm",
            )
        })?,
    };
    let model = f.string("model")?.map(str::to_string);
    Ok(EmbeddingRequest {
        model,
        inputs,
        base64,
        dimensions,
        normalize,
        openai,
    })
}

/// `POST /v1/embeddings`.
pub async fn openai(state: State<Arc<AppState>>, body: JsonBody) -> Result<Response, ApiError> {
    embeddings(state, body, true).await
}

/// `POST /embedding` (llama-server's).
pub async fn native(state: State<Arc<AppState>>, body: JsonBody) -> Result<Response, ApiError> {
    embeddings(state, body, false).await
}

async fn embeddings(
    State(state): State<Arc<AppState>>,
    JsonBody(body): JsonBody,
    openai_route: bool,
) -> Result<Response, ApiError> {
    let ready = state.model(crate::routes::requested_model(&body)).await?;
    let Some(pooling) = ready.pooling else {
        return Err(ApiError::new(
            axum::http::StatusCode::NOT_IMPLEMENTED,
            "not_supported_error",
            "this server does not embed: start it with --embeddings",
        ));
    };
    let req = parse(&body, openai_route, ready.n_vocab, ready.n_embd)?;
    ready.check_model(req.model.as_deref())?;
    if req.openai && pooling == Pooling::None {
        return Err(ApiError::invalid(
            "pooling type 'none' gives one embedding per token, which OpenAI's shape cannot hold: start the server with --pooling mean, cls or last, or use /embedding",
        ));
    }
    let prompts = tokenize(&ready, req.inputs).await?;
    let mut results = Vec::with_capacity(prompts.len());
    // Waves of at most the server's sequences, so a long list never fills the queue.
    for wave in prompts.chunks(ready.slots.max(1)) {
        results.extend(run_wave(&state, &ready, wave, pooling).await?);
    }
    let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    for vectors in results.iter_mut() {
        for v in vectors.iter_mut() {
            if let Some(d) = req.dimensions {
                v.truncate(d);
            }
            // Token vectors and a head's scores stay as they are.
            if !matches!(pooling, Pooling::None | Pooling::Rank) {
                normalize(v, req.normalize);
            }
        }
    }
    let encode = |v: &[f32]| -> Value {
        match req.base64 {
            true => {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            }
            false => json!(v),
        }
    };
    let body = if req.openai {
        let data: Vec<Value> = results
            .iter()
            .enumerate()
            .map(|(index, vectors)| {
                json!({"object": "embedding", "index": index, "embedding": encode(&vectors[0])})
            })
            .collect();
        json!({
            "object": "list",
            "data": data,
            "model": req.model.unwrap_or_else(|| ready.model_id.clone()),
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        })
    } else {
        let items: Vec<Value> = results
            .iter()
            .enumerate()
            .map(|(index, vectors)| {
                let vectors: Vec<Value> = vectors.iter().map(|v| encode(v)).collect();
                json!({"index": index, "embedding": vectors})
            })
            .collect();
        json!(items)
    };
    Ok(Json(body).into_response())
}

/// Each input's tokens (text as llama-server tokenizes it: special tokens added and parsed),
/// refused when empty or longer than a sequence's context.
async fn tokenize(ready: &Arc<Ready>, inputs: Vec<Input>) -> Result<Vec<Vec<TokenId>>, ApiError> {
    let r = ready.clone();
    let prompts = blocking(move || {
        inputs
            .into_iter()
            .map(|input| match input {
                Input::Text(text) => r.tokenizer.encode(&text, true, true),
                Input::Tokens(ids) => ids,
            })
            .collect::<Vec<_>>()
    })
    .await?;
    check_lengths(ready, &prompts, "input")?;
    Ok(prompts)
}

/// Refuses an empty prompt, or one longer than a sequence's context (naming `param`).
pub(crate) fn check_lengths(
    ready: &Ready,
    prompts: &[Vec<TokenId>],
    param: &str,
) -> Result<(), ApiError> {
    for (i, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(ApiError::param(
                param,
                format!("{param} {i} is empty (0 tokens)"),
            ));
        }
        if p.len() > ready.n_ctx {
            return Err(ApiError::param(
                param,
                format!(
                    "{param} {i} ({} tokens) exceeds the context size ({} tokens)",
                    p.len(),
                    ready.n_ctx
                ),
            )
            .with_code("context_length_exceeded"));
        }
    }
    Ok(())
}

/// Embeds a few prompts together: one job each, their results in order.
pub(crate) async fn run_wave(
    state: &AppState,
    ready: &Ready,
    prompts: &[Vec<TokenId>],
    pooling: Pooling,
) -> Result<Vec<Vec<Vec<f32>>>, ApiError> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let submitted = Instant::now();
    let jobs = prompts
        .iter()
        .enumerate()
        .map(|(choice, prompt)| Job {
            images: Vec::new(),
            prompt: prompt.clone(),
            params: GenerationParams::default(),
            choice,
            cache_salt: None,
            embed: Some(pooling),
            events: tx.clone(),
            submitted,
            span: tracing::Span::current(),
        })
        .collect();
    drop(tx);
    ready
        .scheduler
        .submit(jobs)
        .map_err(|e| crate::routes::submit_error(state, e))?;
    let mut results: Vec<Option<Vec<Vec<f32>>>> = vec![None; prompts.len()];
    while let Some((index, event)) = rx.recv().await {
        match event {
            Event::Embedding(vectors) => results[index] = Some(vectors),
            Event::Failed(e) => return Err(e),
            Event::Started { .. } | Event::Token(_) | Event::Done(_) => {}
        }
    }
    results
        .into_iter()
        .map(|r| r.ok_or_else(|| ApiError::internal("an embedding job ended without a result")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_take_every_openai_shape() {
        let p = |v: Value| parse_inputs(&v, "input", 100);
        assert_eq!(p(json!("a")).unwrap(), vec![Input::Text("a".into())]);
        assert_eq!(p(json!([1, 2])).unwrap(), vec![Input::Tokens(vec![1, 2])]);
        assert_eq!(
            p(json!(["a", [3], "b"])).unwrap(),
            vec![
                Input::Text("a".into()),
                Input::Tokens(vec![3]),
                Input::Text("b".into())
            ]
        );
        assert!(p(json!([])).is_err());
        assert!(p(json!([100])).is_err(), "ids outside the vocabulary");
        assert!(p(json!([{"x": 1}])).is_err());
        assert!(p(json!(7)).is_err());
        let many: Vec<Value> = (0..=MAX_INPUTS).map(|_| json!("x")).collect();
        assert!(p(Value::Array(many)).is_err());
    }

    #[test]
    fn fields_are_checked() {
        let p = |v: Value| parse(&v, true, 100, 8);
        assert!(p(json!({})).is_err());
        let r = p(json!({"input": "a", "encoding_format": "base64", "dimensions": 4})).unwrap();
        assert!(r.base64 && r.openai);
        assert_eq!(r.dimensions, Some(4));
        assert_eq!(r.normalize, 2);
        assert!(p(json!({"input": "a", "encoding_format": "hex"})).is_err());
        assert!(p(json!({"input": "a", "dimensions": 9})).is_err());
        assert!(p(json!({"input": "a", "dimensions": 0})).is_err());
        assert!(p(json!({"input": "a", "embd_normalize": -2})).is_err());
        assert_eq!(
            p(json!({"input": "a", "embd_normalize": -1}))
                .unwrap()
                .normalize,
            -1
        );
        assert!(!p(json!({"content": "a"})).unwrap().openai);
    }
}
