//! A Messages API body parsed in one pass into the chat route's [`ChatRequest`]: the
//! messages in the shape chat templates take (OpenAI's roles, `tool_calls`, `tool`
//! results, `reasoning_content`), the sampler, stop strings, constraint and tools.
//! Errors name the field as Anthropic's API does (`messages.0.content.1.id: ...`).

use std::collections::HashSet;

use ferrox_agent::{GrammarSpec, Tool, ToolChoice, ToolSpec};
use ferrox_generate::generate::GenerationParams;
use ferrox_generate::sampling::SamplerParams;
use serde_json::{json, Map, Value};

use super::{invalid, AnthropicError};
use crate::api::{self, ChatRequest, Fields, GenRequest};

/// Parses a Messages API body (`counting`: a `count_tokens` body, which has no
/// `max_tokens`) into the request the chat route serves.
pub fn parse_messages(
    body: &Value,
    n_vocab: usize,
    counting: bool,
) -> Result<ChatRequest, AnthropicError> {
    let obj = body
        .as_object()
        .ok_or_else(|| invalid("the request body must be a JSON object"))?;
    let f = Fields(obj);
    let mut images = Vec::new();
    let messages = parse_conversation(obj, &mut images)?;
    let tools = parse_tools(obj)?;
    let gen = GenRequest {
        model: None,
        params: GenerationParams {
            max_tokens: parse_max_tokens(obj, counting)?,
            stop: api::parse_stop(&f, "stop_sequences")?,
            sampler: parse_sampler(obj, n_vocab)?,
            ..GenerationParams::default()
        },
        n: 1,
        stream: f.boolean("stream")?.unwrap_or(false),
        include_usage: false,
        grammar: parse_constraint(&f)?,
        reasoning_format: None,
        cache_salt: None,
    };
    api::check_forced_tools(&gen, tools.as_ref())?;
    let mut template_kwargs = Map::new();
    if let Some(thinking) = f.get("thinking") {
        let enabled = thinking.get("type").and_then(Value::as_str) == Some("enabled");
        template_kwargs.insert("enable_thinking".into(), json!(enabled));
    }
    Ok(ChatRequest {
        gen,
        messages: Value::Array(messages),
        template_kwargs,
        tools,
        images,
    })
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

/// A string field of a block, required.
fn required_str<'a>(block: &'a Value, key: &str, at: &str) -> Result<&'a str, AnthropicError> {
    block
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(format!("{at}.{key}: Field required")))
}

/// `system` and `messages` as the template's messages: the system prompt first, each
/// `tool_result` block as a `tool` message of its own before the user's text.
fn parse_conversation(
    obj: &Map<String, Value>,
    images: &mut Vec<crate::api::ImageInput>,
) -> Result<Vec<Value>, AnthropicError> {
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
        parse_message(m, &format!("messages.{i}"), &mut messages, images)?;
    }
    Ok(messages)
}

/// One message's blocks, appended to `messages` as the template takes them; an `image`
/// block's bytes go to `images`, the media marker in its place in the text.
fn parse_message(
    m: &Value,
    at: &str,
    messages: &mut Vec<Value>,
    images: &mut Vec<crate::api::ImageInput>,
) -> Result<(), AnthropicError> {
    let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
    if role != "user" && role != "assistant" {
        return Err(invalid(format!(
            "{at}.role: Input should be 'user' or 'assistant'"
        )));
    }
    let one_text;
    let blocks: &[Value] = match m.get("content").unwrap_or(&Value::Null) {
        Value::String(s) => {
            one_text = [json!({"type": "text", "text": s})];
            &one_text
        }
        Value::Array(b) => b,
        _ => {
            return Err(invalid(format!(
                "{at}.content: a string or an array of blocks is required"
            )))
        }
    };
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    let mut results = 0;
    for (j, b) in blocks.iter().enumerate() {
        let bat = format!("{at}.content.{j}");
        match b.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(required_str(b, "text", &bat)?),
            Some("thinking") if role == "assistant" => reasoning.push_str(
                b.get("thinking")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
            ),
            Some("redacted_thinking") => {}
            Some("image") if role == "user" => {
                if images.len() == crate::api::MAX_IMAGES {
                    return Err(invalid(format!(
                        "{bat}: at most {} images in a request",
                        crate::api::MAX_IMAGES
                    )));
                }
                images.push(image_bytes(b, &bat)?);
                text.push_str(ferrox_generate::media::MEDIA_MARKER);
            }
            Some("tool_use") if role == "assistant" => {
                let id = required_str(b, "id", &bat)?;
                let name = required_str(b, "name", &bat)?;
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                // Templates print the arguments with `tojson`: an object, not its text.
                calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}));
            }
            Some("tool_result") if role == "user" => {
                let id = required_str(b, "tool_use_id", &bat)?;
                let content = b.get("content").unwrap_or(&Value::Null);
                let result = text_of(content, &format!("{bat}.content"))?;
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
                results += 1;
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
    } else if !text.is_empty() || results == 0 {
        messages.push(json!({"role": "user", "content": text}));
    }
    Ok(())
}

/// An `image` block's bytes: a base64 `source` (URL sources are not fetched).
fn image_bytes(block: &Value, at: &str) -> Result<crate::api::ImageInput, AnthropicError> {
    use base64::Engine as _;
    let source = block
        .get("source")
        .ok_or_else(|| invalid(format!("{at}.source: Field required")))?;
    match source.get("type").and_then(Value::as_str) {
        Some("base64") => {}
        Some("url") => {
            let url = required_str(source, "url", &format!("{at}.source"))?;
            return match crate::api::remote_image_url(url) {
                Some(url) if url.len() <= crate::api::MAX_IMAGE_URL => {
                    Ok(crate::api::ImageInput::Url(url.to_string()))
                }
                Some(_) => Err(invalid(format!(
                    "{at}.source.url: longer than {} bytes",
                    crate::api::MAX_IMAGE_URL
                ))),
                None => Err(invalid(format!(
                    "{at}.source.url: an http:// or https:// URL is required"
                ))),
            };
        }
        Some(other) => {
            return Err(invalid(format!(
                "{at}.source.type: '{other}' images are not taken, only 'base64' and 'url'"
            )))
        }
        None => return Err(invalid(format!("{at}.source.type: Field required"))),
    }
    let data = required_str(source, "data", &format!("{at}.source"))?;
    if data.len() / 4 * 3 > crate::api::MAX_IMAGE_BYTES {
        return Err(invalid(format!(
            "{at}.source.data: the image is larger than {} bytes",
            crate::api::MAX_IMAGE_BYTES
        )));
    }
    base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map(crate::api::ImageInput::Bytes)
        .map_err(|e| invalid(format!("{at}.source.data: invalid base64: {e}")))
}

/// `max_tokens`: required, except when counting tokens.
fn parse_max_tokens(
    obj: &Map<String, Value>,
    counting: bool,
) -> Result<Option<usize>, AnthropicError> {
    match obj.get("max_tokens") {
        Some(v) => match v.as_u64().filter(|&n| n >= 1) {
            Some(n) => Ok(Some(n.min(usize::MAX as u64) as usize)),
            None => Err(invalid(
                "max_tokens: Input should be an integer of at least 1",
            )),
        },
        None if counting => Ok(None),
        None => Err(invalid("max_tokens: Field required")),
    }
}

/// `temperature` (0 to 1, Anthropic's default 1), `top_p`, `top_k`; the rest is
/// llama.cpp's defaults with a random seed.
fn parse_sampler(
    obj: &Map<String, Value>,
    n_vocab: usize,
) -> Result<SamplerParams, AnthropicError> {
    if let Some(t) = obj.get("temperature").filter(|v| !v.is_null()) {
        if !t.as_f64().is_some_and(|x| (0.0..=1.0).contains(&x)) {
            return Err(invalid(
                "temperature: Input should be a number between 0 and 1",
            ));
        }
    }
    // Only these fields reach the sampler: an OpenAI field in an Anthropic body is ignored.
    let taken: Map<String, Value> = ["temperature", "top_p", "top_k"]
        .iter()
        .filter_map(|&k| obj.get(k).map(|v| (k.to_string(), v.clone())))
        .collect();
    let defaults = SamplerParams {
        temperature: 1.0,
        ..SamplerParams::default()
    };
    Ok(api::parse_sampler(&Fields(&taken), n_vocab, defaults)?)
}

/// llama-server's `grammar` and `json_schema`, or `output_config.format` (a JSON schema).
fn parse_constraint(f: &Fields<'_>) -> Result<Option<GrammarSpec>, AnthropicError> {
    let mut found = Vec::new();
    api::extension_constraints(f, &mut found)?;
    let format = f
        .get("output_config")
        .and_then(|c| c.get("format"))
        .filter(|v| !v.is_null());
    if let Some(format) = format {
        if format.get("type").and_then(Value::as_str) != Some("json_schema") {
            return Err(invalid(
                "output_config.format.type: Input should be 'json_schema'",
            ));
        }
        let schema = format.get("schema").cloned().unwrap_or_else(|| json!({}));
        found.push(("output_config", GrammarSpec::JsonSchema(schema)));
    }
    Ok(api::one_constraint(found)?)
}

/// `tools` (custom tools only) and `tool_choice`.
fn parse_tools(obj: &Map<String, Value>) -> Result<Option<ToolSpec>, AnthropicError> {
    let mut tools: Vec<Tool> = Vec::new();
    let mut seen = HashSet::new();
    if let Some(Value::Array(given)) = obj.get("tools") {
        for (i, t) in given.iter().enumerate() {
            let at = format!("tools.{i}");
            let name = required_str(t, "name", &at)?;
            if let Some(kind) = t.get("type").and_then(Value::as_str) {
                if kind != "custom" {
                    return Err(invalid(format!(
                        "{at}: server tools ('{kind}') are not supported"
                    )));
                }
            }
            ToolSpec::check_name(name, &mut seen).map_err(|m| invalid(format!("{at}: {m}")))?;
            let tool = Tool::new(name, t.get("description"), t.get("input_schema"))
                .ok_or_else(|| invalid(format!("{at}.input_schema: an object is required")))?;
            tools.push(tool);
        }
    }
    let mut choice = ToolChoice::Auto;
    let mut parallel = true;
    if let Some(c) = obj.get("tool_choice").filter(|v| !v.is_null()) {
        choice = match c.get("type").and_then(Value::as_str) {
            Some("auto") => ToolChoice::Auto,
            Some("any") => ToolChoice::Required,
            Some("none") => ToolChoice::None,
            Some("tool") => ToolChoice::Named(required_str(c, "name", "tool_choice")?.to_string()),
            _ => {
                return Err(invalid(
                    "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'",
                ))
            }
        };
        parallel = c.get("disable_parallel_tool_use").and_then(Value::as_bool) != Some(true);
    }
    let choice =
        ToolSpec::check_choice(choice, &tools).map_err(|m| invalid(format!("tool_choice: {m}")))?;
    Ok(ToolSpec::given(tools, choice, parallel))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: Value) -> Result<ChatRequest, AnthropicError> {
        parse_messages(&body, 1000, false)
    }

    #[test]
    fn a_conversation_with_tools_becomes_the_chat_request() {
        let req = parse(json!({
            "model": "claude-x", "max_tokens": 20, "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "Oslo"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]}]}
            ],
            "tools": [{"name": "w", "description": "weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "w", "disable_parallel_tool_use": true},
            "stop_sequences": ["END"], "thinking": {"type": "enabled", "budget_tokens": 100},
            "top_k": 7
        }))
        .ok()
        .unwrap();
        let m = &req.messages;
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(m[1], json!({"role": "user", "content": "Weather?"}));
        assert_eq!(m[2]["content"], "Checking.");
        assert_eq!(
            m[2]["tool_calls"][0]["function"]["arguments"],
            json!({"city": "Oslo"})
        );
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"})
        );
        assert_eq!(m.as_array().unwrap().len(), 4);
        let tools = req.tools.unwrap();
        assert_eq!(tools.choice, ToolChoice::Named("w".into()));
        assert!(!tools.parallel);
        assert_eq!(tools.tools[0].description.as_deref(), Some("weather"));
        let p = &req.gen.params;
        assert_eq!(p.stop, vec!["END".to_string()]);
        assert_eq!(p.max_tokens, Some(20));
        assert_eq!(p.sampler.temperature, 1.0);
        assert_eq!(p.sampler.top_k, 7);
        assert_eq!(req.template_kwargs["enable_thinking"], true);
        assert!(req.gen.grammar.is_none());
    }

    #[test]
    fn the_same_request_as_its_chat_completions_twin() {
        let anthropic = parse(json!({
            "model": "m", "max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "stream": true,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}
        }))
        .ok()
        .unwrap();
        let chat = api::parse_chat(
            &json!({
                "model": "m", "max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "stream": true,
                "messages": [{"role": "user", "content": "ab"}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": {"type": "object"}}},
                "seed": anthropic.gen.params.sampler.seed
            }),
            1000,
        )
        .unwrap();
        assert_eq!(anthropic.messages, chat.messages);
        assert_eq!(
            format!("{:?}", anthropic.gen.params),
            format!("{:?}", chat.gen.params)
        );
        assert_eq!(anthropic.gen.stream, chat.gen.stream);
        assert_eq!(
            format!("{:?}", anthropic.gen.grammar),
            format!("{:?}", chat.gen.grammar)
        );
    }

    #[test]
    fn malformed_requests_name_the_field() {
        let message = |body: Value| match parse(body) {
            Ok(_) => panic!("accepted"),
            Err(e) => e.0.message,
        };
        let user = json!([{"role": "user", "content": "x"}]);
        assert!(message(json!({"model": "m", "messages": user})).starts_with("max_tokens:"));
        assert!(message(
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})
        )
        .starts_with("messages.0.role:"));
        assert!(message(json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]}))
            .starts_with("messages.0.content.0.source: Field required"));
        assert!(message(json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]}))
            .contains("only 'base64' and 'url'"));
        assert!(message(json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "file:///etc/passwd"}}]}]}))
            .contains("http:// or https://"));
        // An http(s) URL is taken here; whether it is fetched is the server's setting.
        let remote = parse(json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}]})).unwrap_or_else(|e| panic!("{}", e.0.message));
        assert_eq!(
            remote.images,
            vec![crate::api::ImageInput::Url("https://x/y.png".into())]
        );
        assert!(message(json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "@@"}}]}]}))
            .contains("invalid base64"));
        let with_image = parse(json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}}, {"type": "text", "text": "What?"}]}]}))
            .unwrap_or_else(|e| panic!("{}", e.0.message));
        assert_eq!(
            with_image.images,
            vec![crate::api::ImageInput::Bytes(b"hi".to_vec())]
        );
        assert_eq!(with_image.messages[0]["content"], "<__media__>What?");
        assert!(message(json!({"model": "m", "max_tokens": 5, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "w"}]}]}))
            .starts_with("messages.0.content.0.id:"));
        assert!(message(
            json!({"model": "m", "max_tokens": 5, "temperature": 1.5, "messages": user})
        )
        .starts_with("temperature:"));
        assert!(message(
            json!({"model": "m", "max_tokens": 5, "messages": user, "tools": [{"name": "a b"}]})
        )
        .starts_with("tools.0:"));
        assert!(message(json!({"model": "m", "max_tokens": 5, "messages": user, "tools": [{"name": "a"}, {"name": "a"}]}))
            .contains("repeats"));
        assert!(message(json!({"model": "m", "max_tokens": 5, "messages": user, "tool_choice": {"type": "tool", "name": "nope"}, "tools": [{"name": "a"}]}))
            .starts_with("tool_choice:"));
        assert!(message(json!({"model": "m", "max_tokens": 5, "messages": user, "grammar": "root ::= \"a\"", "json_schema": {}}))
            .contains("both constrain"));
        // Counting needs no max_tokens.
        assert!(parse_messages(&json!({"model": "m", "messages": user}), 1000, true).is_ok());
    }
}
