//! A Responses API body turned into the chat route's body, so that it is checked and served
//! by the same parser, template, tools and constraints: `instructions` become a system
//! message, `input` (a string or items: messages, `function_call`, `function_call_output`)
//! the conversation after the previous response's, flat function `tools` the chat route's
//! nested ones, `text.format` its `response_format`, `max_output_tokens` its `max_tokens`.

use serde_json::{json, Map, Value};

use crate::api::{as_object, Fields};
use crate::error::ApiError;

/// What a Responses request asks beyond the chat body.
#[derive(Debug)]
pub struct ResponsesRequest {
    /// The chat route's body.
    pub chat: Value,
    /// The conversation this request adds (its instructions excluded), in chat messages.
    pub input_messages: Vec<Value>,
    pub stream: bool,
    pub store: bool,
    pub previous_response_id: Option<String>,
    /// The fields a response echoes (`instructions`, `tools`, `tool_choice`, `text`...).
    pub echo: Map<String, Value>,
}

fn param(name: &str, message: impl Into<String>) -> ApiError {
    ApiError::param(name, message)
}

/// The text of a content that is a string or a list of `input_text` / `output_text` parts.
fn content_text(content: &Value, at: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for (i, part) in parts.iter().enumerate() {
                match part.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => text.push_str(
                        part.get("text")
                            .and_then(Value::as_str)
                            .ok_or_else(|| param(at, format!("{at}[{i}].text must be a string")))?,
                    ),
                    Some(other) => {
                        return Err(param(
                            at,
                            format!(
                                "{at}[{i}]: content of type '{other}' is not supported (text only)"
                            ),
                        ))
                    }
                    None => return Err(param(at, format!("{at}[{i}].type is required"))),
                }
            }
            Ok(text)
        }
        _ => Err(param(
            at,
            format!("{at} must be a string or a list of parts"),
        )),
    }
}

/// A message's content for the chat request: its text, or, when it holds `input_image`
/// parts, chat content parts (`text` and `image_url`) in order.
fn message_content(content: &Value, at: &str) -> Result<Value, ApiError> {
    let Value::Array(parts) = content else {
        return content_text(content, at).map(Value::String);
    };
    let is_image = |p: &Value| p.get("type").and_then(Value::as_str) == Some("input_image");
    if !parts.iter().any(is_image) {
        return content_text(content, at).map(Value::String);
    }
    parts
        .iter()
        .enumerate()
        .map(|(i, part)| {
            if !is_image(part) {
                let text = content_text(&Value::Array(vec![part.clone()]), at)?;
                return Ok(json!({"type": "text", "text": text}));
            }
            match part.get("image_url").and_then(Value::as_str) {
                Some(url) => Ok(json!({"type": "image_url", "image_url": {"url": url}})),
                None => Err(param(
                    at,
                    format!(
                        "{at}[{i}].image_url must be a data: or http(s):// URL (file ids are not taken)"
                    ),
                )),
            }
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}

/// `input` as chat messages: consecutive function calls join one assistant message.
fn input_messages(input: &Value) -> Result<Vec<Value>, ApiError> {
    let items = match input {
        Value::String(s) => return Ok(vec![json!({"role": "user", "content": s})]),
        Value::Array(items) if !items.is_empty() => items,
        _ => {
            return Err(param(
                "input",
                "'input' must be a string or a non-empty list of items",
            ))
        }
    };
    let mut messages: Vec<Value> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        match kind {
            "message" => {
                let role = match item.get("role").and_then(Value::as_str) {
                    Some("developer" | "system") => "system",
                    Some(r @ ("user" | "assistant")) => r,
                    _ => {
                        return Err(param(
                            "input",
                            format!("{at}.role must be user, assistant, system or developer"),
                        ))
                    }
                };
                let content = item.get("content").unwrap_or(&Value::Null);
                let content = message_content(content, &format!("{at}.content"))?;
                messages.push(json!({"role": role, "content": content}));
            }
            "function_call" => {
                let field = |k: &str| {
                    item.get(k)
                        .and_then(Value::as_str)
                        .ok_or_else(|| param("input", format!("{at}.{k} must be a string")))
                };
                let call = json!({"id": field("call_id")?, "type": "function",
                    "function": {"name": field("name")?, "arguments": field("arguments")?}});
                match messages.last_mut() {
                    Some(m) if m["role"] == "assistant" && m.get("tool_calls").is_some() => {
                        if let Some(calls) = m["tool_calls"].as_array_mut() {
                            calls.push(call);
                        }
                    }
                    _ => messages
                        .push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
                }
            }
            "function_call_output" => {
                let call_id = item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| param("input", format!("{at}.call_id must be a string")))?;
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => content_text(v, &format!("{at}.output"))?,
                    _ => return Err(param("input", format!("{at}.output must be a string"))),
                };
                messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
            }
            // Earlier reasoning is not fed back (templates drop it from past turns).
            "reasoning" => {}
            other => {
                return Err(param(
                    "input",
                    format!("{at}: items of type '{other}' are not supported"),
                ))
            }
        }
    }
    Ok(messages)
}

/// Flat Responses function tools as the chat route's nested ones.
fn chat_tools(tools: &Value) -> Result<Value, ApiError> {
    let Value::Array(tools) = tools else {
        return Err(param("tools", "'tools' must be a list"));
    };
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            match t.get("type").and_then(Value::as_str) {
                Some("function") => {}
                Some(other) => {
                    return Err(param(
                        "tools",
                        format!(
                            "tools[{i}]: tools of type '{other}' are not supported (function only)"
                        ),
                    ))
                }
                None => return Err(param("tools", format!("tools[{i}].type is required"))),
            }
            let mut function = Map::new();
            for key in ["name", "description", "parameters", "strict"] {
                if let Some(v) = t.get(key).filter(|v| !v.is_null()) {
                    function.insert(key.into(), v.clone());
                }
            }
            Ok(json!({"type": "function", "function": function}))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}

/// `tool_choice`: a mode, or `{"type": "function", "name"}`.
fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(_) => Ok(choice.clone()),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| param("tool_choice", "tool_choice.name must be a string"))?;
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        _ => Err(param(
            "tool_choice",
            "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"name\"}",
        )),
    }
}

/// `text.format` as `response_format`.
fn response_format(text: &Value) -> Result<Option<Value>, ApiError> {
    let Some(format) = text.get("format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut schema = Map::new();
            for key in ["name", "schema", "strict", "description"] {
                if let Some(v) = format.get(key).filter(|v| !v.is_null()) {
                    schema.insert(key.into(), v.clone());
                }
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": schema})))
        }
        _ => Err(param(
            "text.format",
            "text.format.type must be text, json_object or json_schema",
        )),
    }
}

/// Reads a Responses body; `previous` is the conversation of the response it continues.
pub fn parse(body: &Value, previous: &[Value]) -> Result<ResponsesRequest, ApiError> {
    let obj = as_object(body)?;
    let f = Fields(obj);
    // What would change the meaning of the request but is not built.
    for (key, what) in [
        ("background", "background responses"),
        (
            "conversation",
            "stored conversations (use previous_response_id)",
        ),
        ("prompt", "stored prompt templates"),
    ] {
        let given = f.get(key).is_some_and(|v| *v != Value::Bool(false));
        if given {
            return Err(ApiError::unsupported(
                key,
                format!("{what} are not supported"),
            ));
        }
    }
    let input = f
        .get("input")
        .ok_or_else(|| param("input", "'input' is required"))?;
    let new_messages = input_messages(input)?;
    let mut messages = Vec::new();
    if let Some(text) = f.string("instructions")? {
        messages.push(json!({"role": "system", "content": text}));
    }
    messages.extend(previous.iter().cloned());
    messages.extend(new_messages.iter().cloned());

    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    for (from, to) in [
        ("model", "model"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("max_output_tokens", "max_tokens"),
        ("parallel_tool_calls", "parallel_tool_calls"),
        ("seed", "seed"),
    ] {
        if let Some(v) = f.get(from) {
            chat.insert(to.into(), v.clone());
        }
    }
    if let Some(tools) = f.get("tools") {
        chat.insert("tools".into(), chat_tools(tools)?);
    }
    if let Some(choice) = f.get("tool_choice") {
        chat.insert("tool_choice".into(), chat_tool_choice(choice)?);
    }
    if let Some(text) = f.get("text") {
        if let Some(format) = response_format(text)? {
            chat.insert("response_format".into(), format);
        }
    }
    let previous_response_id = f.string("previous_response_id")?.map(str::to_string);
    let mut echo = Map::new();
    for key in [
        "instructions",
        "max_output_tokens",
        "metadata",
        "parallel_tool_calls",
        "temperature",
        "top_p",
        "tool_choice",
        "tools",
        "text",
        "user",
    ] {
        echo.insert(key.into(), obj.get(key).cloned().unwrap_or(Value::Null));
    }
    Ok(ResponsesRequest {
        chat: Value::Object(chat),
        input_messages: new_messages,
        stream: f.boolean("stream")?.unwrap_or(false),
        store: f.boolean("store")?.unwrap_or(true),
        previous_response_id,
        echo,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_with_tools_becomes_a_chat_body() {
        let body = json!({
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "get", "arguments": "{\"a\":1}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            ],
            "tools": [{"type": "function", "name": "get", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "get"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            "max_output_tokens": 9,
        });
        let previous = [json!({"role": "user", "content": "hi"})];
        let r = parse(&body, &previous).unwrap();
        let m = r.chat["messages"].as_array().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(m[1], previous[0]);
        assert_eq!(m[2], json!({"role": "user", "content": "Weather?"}));
        assert_eq!(m[3]["tool_calls"].as_array().unwrap().len(), 2, "{m:?}");
        assert_eq!(m[4]["role"], "tool");
        assert_eq!(r.input_messages.len(), 3);
        assert_eq!(r.chat["tools"][0]["function"]["name"], "get");
        assert_eq!(r.chat["tool_choice"]["function"]["name"], "get");
        assert_eq!(r.chat["response_format"]["json_schema"]["name"], "x");
        assert_eq!(r.chat["max_tokens"], 9);
        assert!(r.store && !r.stream);
    }

    #[test]
    fn unsupported_items_and_tools_are_named() {
        for (body, field) in [
            (json!({}), "input"),
            (json!({"input": []}), "input"),
            (json!({"input": [{"type": "input_image"}]}), "input"),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}),
                "input",
            ),
            (
                json!({"input": "x", "tools": [{"type": "web_search"}]}),
                "tools",
            ),
            (
                json!({"input": "x", "text": {"format": {"type": "yaml"}}}),
                "text.format",
            ),
            (json!({"input": "x", "store": "no"}), "store"),
            (json!({"input": "x", "background": true}), "background"),
            (json!({"input": "x", "conversation": "c1"}), "conversation"),
        ] {
            let e = parse(&body, &[]).unwrap_err();
            assert!(
                e.message.contains(field) || e.param.as_deref() == Some(field),
                "{body}: {}",
                e.message
            );
        }
    }
}
