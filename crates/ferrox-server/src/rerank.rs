//! `POST /v1/rerank` (and `/rerank`, `/v1/reranking`, `/reranking`): a query scored against
//! each document by a reranker's classification head, in Jina's and Cohere's shape
//! (`query`, `documents`, `top_n`, `return_documents`) or TEI's (`texts`, `return_text`), as
//! llama-server answers. Each (query, document) pair is one sequence of the batch, laid out as
//! llama-server lays it out: the file's `rerank` template, else `[BOS] query [EOS] [SEP]
//! document [EOS]` with the special tokens the vocabulary adds.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrox_generate::embedding::Pooling;
use ferrox_tokenizer::tokenizer::{TokenId, Tokenizer};
use serde_json::{json, Value};

use crate::api::{as_object, Fields};
use crate::embeddings::{check_lengths, run_wave, MAX_INPUTS};
use crate::error::ApiError;
use crate::routes::{blocking, JsonBody};
use crate::AppState;

/// A parsed rerank request.
#[derive(Debug)]
struct RerankRequest {
    model: Option<String>,
    query: String,
    documents: Vec<String>,
    top_n: usize,
    return_documents: bool,
    /// TEI's shape (`texts` in, a bare list out).
    tei: bool,
}

fn parse(body: &Value) -> Result<RerankRequest, ApiError> {
    let f = Fields(as_object(body)?);
    let query = f
        .string("query")?
        .ok_or_else(|| ApiError::param("query", "\"query\" must be provided"))?
        .to_string();
    let tei = f.get("texts").is_some() && f.get("documents").is_none();
    let param = if tei { "texts" } else { "documents" };
    let documents: Vec<String> = match f.get(param) {
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .map(|d| match d {
                Value::String(s) => Some(s.clone()),
                // Cohere's and Jina's document objects.
                Value::Object(o) => o.get("text").and_then(Value::as_str).map(str::to_string),
                _ => None,
            })
            .collect::<Option<_>>()
            .ok_or_else(|| {
                ApiError::param(
                    param,
                    format!("\"{param}\" items must be strings (or {{\"text\": ...}})"),
                )
            })?,
        _ => {
            return Err(ApiError::param(
                param,
                format!("\"{param}\" must be a non-empty string array"),
            ))
        }
    };
    if documents.len() > MAX_INPUTS {
        return Err(ApiError::param(
            param,
            format!(
                "{} documents; at most {MAX_INPUTS} are taken",
                documents.len()
            ),
        ));
    }
    let top_n = f
        .at_least("top_n", 1)?
        .map_or(documents.len(), |n| n as usize);
    let flag = if tei {
        "return_text"
    } else {
        "return_documents"
    };
    let return_documents = f.boolean(flag)?.unwrap_or(false);
    let model = f.string("model")?.map(str::to_string);
    Ok(RerankRequest {
        model,
        query,
        documents,
        top_n,
        return_documents,
        tei,
    })
}

/// A (query, document) pair's tokens, as llama-server's `format_prompt_rerank` makes them.
pub(crate) fn pair_tokens(
    tokenizer: &Tokenizer,
    template: Option<&str>,
    query: &str,
    document: &str,
) -> Vec<TokenId> {
    if let Some(template) = template {
        let prompt = template
            .replace("{query}", query)
            .replace("{document}", document);
        return tokenizer.encode(&prompt, false, true);
    }
    let vocab = tokenizer.vocab();
    let eos = vocab.eos().or(vocab.sep());
    let mut tokens = Vec::new();
    if vocab.add_bos() {
        tokens.extend(vocab.bos());
    }
    tokens.extend(tokenizer.encode(query, false, false));
    if vocab.add_eos() {
        tokens.extend(eos);
    }
    if vocab.add_sep() {
        tokens.extend(vocab.sep());
    }
    tokens.extend(tokenizer.encode(document, false, false));
    if vocab.add_eos() {
        tokens.extend(eos);
    }
    tokens
}

/// `POST /v1/rerank`.
pub async fn rerank(
    State(state): State<Arc<AppState>>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let ready = state.model(crate::routes::requested_model(&body)).await?;
    if ready.pooling != Some(Pooling::Rank) {
        return Err(ApiError::new(
            axum::http::StatusCode::NOT_IMPLEMENTED,
            "not_supported_error",
            "this server does not rerank: start it with --reranking (a reranker model)",
        ));
    }
    let req = parse(&body)?;
    ready.check_model(req.model.as_deref())?;
    let prompts = {
        let (r, query, documents) = (ready.clone(), req.query.clone(), req.documents.clone());
        blocking(move || {
            let template = r.rerank_template.as_deref();
            documents
                .iter()
                .map(|d| pair_tokens(&r.tokenizer, template, &query, d))
                .collect::<Vec<_>>()
        })
        .await?
    };
    check_lengths(&ready, &prompts, "documents")?;
    let mut scores = Vec::with_capacity(prompts.len());
    for wave in prompts.chunks(ready.slots.max(1)) {
        for vectors in run_wave(&state, &ready, wave, Pooling::Rank).await? {
            scores.push(
                vectors
                    .first()
                    .and_then(|v| v.first())
                    .copied()
                    .unwrap_or(-1e6),
            );
        }
    }
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    order.truncate(req.top_n);
    let label = if req.tei { "score" } else { "relevance_score" };
    let results: Vec<Value> = order
        .iter()
        .map(|&i| {
            let mut item = json!({"index": i, label: scores[i]});
            if req.return_documents {
                item[if req.tei { "text" } else { "document" }] = match req.tei {
                    true => json!(req.documents[i]),
                    false => json!({"text": req.documents[i]}),
                };
            }
            item
        })
        .collect();
    if req.tei {
        return Ok(Json(Value::Array(results)).into_response());
    }
    let tokens: usize = prompts.iter().map(Vec::len).sum();
    Ok(Json(json!({
        "model": req.model.unwrap_or_else(|| ready.model_id.clone()),
        "object": "list",
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": results,
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_take_jina_cohere_and_tei_shapes() {
        let r = parse(&json!({"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1, "return_documents": true})).unwrap();
        assert_eq!(r.documents, ["a", "b"]);
        assert_eq!((r.top_n, r.return_documents, r.tei), (1, true, false));
        let r = parse(&json!({"query": "q", "texts": ["a"], "return_text": true})).unwrap();
        assert!(r.tei && r.return_documents);
        assert_eq!(r.top_n, 1);
        for bad in [
            json!({"documents": ["a"]}),
            json!({"query": 1, "documents": ["a"]}),
            json!({"query": "q", "documents": []}),
            json!({"query": "q", "documents": [1]}),
            json!({"query": "q", "documents": ["a"], "top_n": 0}),
            json!({"query": "q", "documents": ["a"], "return_documents": "yes"}),
        ] {
            assert!(parse(&bad).is_err(), "{bad}");
        }
    }
}
