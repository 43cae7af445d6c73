//! Request parsing and validation for the OpenAI endpoints.
//!
//! Bodies are parsed as plain JSON and read field by field, so a wrong type or an
//! out-of-range value is a 400 that names the field (`param`). Unknown fields are ignored;
//! known fields that would change the meaning of the request but are not supported (`best_of` > 1,
//! `echo`, `suffix`, ...) are a 400 naming them.
//!
//! Constrained output: `response_format` `{"type": "json_object"}` or `{"type":
//! "json_schema", "json_schema": {"name", "schema", "strict"}}`, and llama-server's
//! `json_schema` (a schema) and `grammar` (GBNF) fields; at most one of them. Tools (chat
//! only): `tools`, `tool_choice` (`none`, `auto`, `required`, a named function) and
//! `parallel_tool_calls`.
//!
//! Sampling defaults are llama.cpp's (as llama-server's): temperature 0.8, top_k 40,
//! top_p 0.95, min_p 0.05, no penalties (repeat_penalty 1, presence and frequency 0, over the
//! last 64 tokens). Without `seed` each request draws a random one. Without `max_tokens` /
//! `max_completion_tokens` a request generates until an end-of-generation token or a full
//! context.

use ferrox_agent::{GrammarSpec, Tool, ToolChoice, ToolSpec};
use ferrox_generate::generate::GenerationParams;
use ferrox_generate::sampling::SamplerParams;
use ferrox_tokenizer::tokenizer::TokenId;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// What every generating endpoint takes besides the prompt.
#[derive(Clone, Debug)]
pub struct GenRequest {
    pub model: Option<String>,
    pub params: GenerationParams,
    /// Choices to generate for the prompt (`n`).
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// The grammar or schema the output must follow.
    pub grammar: Option<GrammarSpec>,
    /// llama-server's per-request `reasoning_format`.
    pub reasoning_format: Option<ferrox_agent::ReasoningFormat>,
    /// vLLM's `cache_salt`: cached prompt prefixes are shared only between requests with
    /// the same salt (tenants that must not learn what others' prompts hold).
    pub cache_salt: Option<String>,
}

/// The longest `cache_salt` taken.
pub const MAX_CACHE_SALT_BYTES: usize = 1024;

/// Most choices one request may ask for.
pub const MAX_CHOICES: usize = 16;

/// `/v1/chat/completions`.
#[derive(Clone, Debug)]
pub struct ChatRequest {
    pub gen: GenRequest,
    /// The messages as the template sees them (content parts flattened to text).
    pub messages: Value,
    /// `chat_template_kwargs`: extra template variables.
    pub template_kwargs: Map<String, Value>,
    /// `tools` and how to use them (None: no tools given).
    pub tools: Option<ToolSpec>,
    /// The images of `image_url` parts, in order: each part's place in its message's text
    /// holds the media marker.
    pub images: Vec<ImageInput>,
}

/// The largest image (decoded bytes of its data URL) taken in a request.
pub const MAX_IMAGE_BYTES: usize = 32 << 20;

/// The most images one request may hold (each is decoded in full: this bounds a request's
/// memory).
pub const MAX_IMAGES: usize = 16;

/// The longest `http(s)://` image URL taken.
pub const MAX_IMAGE_URL: usize = 8 << 10;

/// An image as a request gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageInput {
    /// The file's bytes (a `data:` URL's, a base64 block's).
    Bytes(Vec<u8>),
    /// An `http://` or `https://` URL, fetched only with `--allow-remote-images`.
    Url(String),
}

/// An `image_url` part's image: a base64 `data:` URL's bytes, or an `http(s)://` URL.
fn image_url_input(at: &str, part: &Map<String, Value>) -> Result<ImageInput, ApiError> {
    use base64::Engine as _;
    let url = match part.get("image_url") {
        Some(Value::String(u)) => u.as_str(),
        Some(Value::Object(o)) => match o.get("url") {
            Some(Value::String(u)) => u.as_str(),
            _ => {
                return Err(ApiError::param(
                    &format!("{at}.image_url.url"),
                    format!("'{at}.image_url.url' must be a string"),
                ))
            }
        },
        _ => {
            return Err(ApiError::param(
                &format!("{at}.image_url"),
                format!("'{at}.image_url' must be an object with a 'url'"),
            ))
        }
    };
    let param = format!("{at}.image_url.url");
    if let Some(url) = remote_image_url(url) {
        if url.len() > MAX_IMAGE_URL {
            return Err(ApiError::param(
                &param,
                format!("the image URL is longer than {MAX_IMAGE_URL} bytes"),
            ));
        }
        return Ok(ImageInput::Url(url.to_string()));
    }
    let Some(rest) = url.strip_prefix("data:") else {
        return Err(ApiError::param(
            &param,
            "an image URL must be a data: URL (base64) or an http:// or https:// URL",
        ));
    };
    let Some((meta, payload)) = rest.split_once(',') else {
        return Err(ApiError::param(
            &param,
            "the data URL has no ',' before its data",
        ));
    };
    if !meta.ends_with(";base64") {
        return Err(ApiError::param(
            &param,
            "the image's data URL must be base64 (';base64,')",
        ));
    }
    if payload.len() / 4 * 3 > MAX_IMAGE_BYTES {
        return Err(ApiError::param(
            &param,
            format!("the image is larger than {MAX_IMAGE_BYTES} bytes"),
        ));
    }
    base64::engine::general_purpose::STANDARD
        .decode(payload.trim())
        .map(ImageInput::Bytes)
        .map_err(|e| ApiError::param(&param, format!("the image's base64 data is invalid: {e}")))
}

/// `url` if it is an `http://` or `https://` URL (scheme in any case).
pub(crate) fn remote_image_url(url: &str) -> Option<&str> {
    let (scheme, _) = url.split_once("://")?;
    (scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")).then_some(url)
}

/// The prompt of `/v1/completions`.
#[derive(Clone, Debug)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<TokenId>),
}

/// `/v1/completions`.
#[derive(Clone, Debug)]
pub struct CompletionRequest {
    pub gen: GenRequest,
    pub prompt: Prompt,
}

/// Typed access to a request object's fields; a `null` field counts as absent.
pub(crate) struct Fields<'a>(pub(crate) &'a Map<String, Value>);

impl<'a> Fields<'a> {
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    pub(crate) fn number(&self, key: &str) -> Result<Option<f64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                ApiError::param(key, format!("'{key}' must be a number, got {}", kind(v)))
            }),
        }
    }

    /// A number within `lo..=hi`.
    pub(crate) fn ranged(&self, key: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
        match self.number(key)? {
            None => Ok(None),
            Some(x) if (lo..=hi).contains(&x) => Ok(Some(x as f32)),
            Some(x) => Err(ApiError::param(
                key,
                format!("'{key}' must be between {lo} and {hi}, got {x}"),
            )),
        }
    }

    pub(crate) fn integer(&self, key: &str) -> Result<Option<i64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match (v.as_i64(), v.as_u64()) {
                (Some(i), _) => Ok(Some(i)),
                (None, Some(u)) => Ok(Some(u.min(i64::MAX as u64) as i64)),
                _ => Err(ApiError::param(
                    key,
                    format!("'{key}' must be an integer, got {}", kind(v)),
                )),
            },
        }
    }

    /// An integer of at least `min`.
    pub(crate) fn at_least(&self, key: &str, min: i64) -> Result<Option<u64>, ApiError> {
        match self.integer(key)? {
            None => Ok(None),
            Some(i) if i >= min => Ok(Some(i as u64)),
            Some(i) => Err(ApiError::param(
                key,
                format!("'{key}' must be at least {min}, got {i}"),
            )),
        }
    }

    pub(crate) fn boolean(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(ApiError::param(
                key,
                format!("'{key}' must be a boolean, got {}", kind(v)),
            )),
        }
    }

    pub(crate) fn string(&self, key: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(ApiError::param(
                key,
                format!("'{key}' must be a string, got {}", kind(v)),
            )),
        }
    }

    pub(crate) fn object(&self, key: &str) -> Result<Option<&'a Map<String, Value>>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(o)) => Ok(Some(o)),
            Some(v) => Err(ApiError::param(
                key,
                format!("'{key}' must be an object, got {}", kind(v)),
            )),
        }
    }
}

/// A JSON value's type, as error messages name it.
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(crate) fn as_object(body: &Value) -> Result<&Map<String, Value>, ApiError> {
    body.as_object().ok_or_else(|| {
        ApiError::invalid(format!(
            "the request body must be a JSON object, got {}",
            kind(body)
        ))
    })
}

/// Which endpoint a request is for (the two differ in `logprobs` and a few fields).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Completion,
}

fn parse_common(
    f: &Fields<'_>,
    endpoint: Endpoint,
    n_vocab: usize,
) -> Result<GenRequest, ApiError> {
    refuse_unsupported(f, endpoint)?;
    let (logprobs, top_logprobs) = parse_logprobs(f, endpoint)?;
    Ok(GenRequest {
        model: f.string("model")?.map(str::to_string),
        params: GenerationParams {
            max_tokens: parse_max_tokens(f)?,
            stop: parse_stop(f, "stop")?,
            sampler: parse_sampler(f, n_vocab, SamplerParams::default())?,
            top_logprobs,
            logprobs,
            ..GenerationParams::default()
        },
        n: parse_choices(f)?,
        stream: f.boolean("stream")?.unwrap_or(false),
        include_usage: parse_include_usage(f)?,
        grammar: parse_grammar(f)?,
        cache_salt: parse_cache_salt(f)?,
        reasoning_format: parse_reasoning_format(f)?,
    })
}

/// Fields that would change the meaning of the request: refused, never ignored.
fn refuse_unsupported(f: &Fields<'_>, endpoint: Endpoint) -> Result<(), ApiError> {
    f.string("user")?;
    if let Some(n) = f.integer("best_of")? {
        if n < 1 {
            return Err(ApiError::param(
                "best_of",
                format!("'best_of' must be at least 1, got {n}"),
            ));
        }
        if n > 1 {
            return Err(ApiError::unsupported(
                "best_of",
                "'best_of' > 1 is not supported; use 'n' for several choices",
            ));
        }
    }
    if f.get("functions").is_some() || f.get("function_call").is_some() {
        return Err(ApiError::unsupported(
            "functions",
            "the legacy 'functions' / 'function_call' fields are not supported; use 'tools' and 'tool_choice'",
        ));
    }
    for key in ["prediction", "audio"] {
        if f.get(key).is_some() {
            return Err(ApiError::unsupported(
                key,
                format!("'{key}' is not supported"),
            ));
        }
    }
    if let Some(m) = f.get("modalities") {
        let text_only = m
            .as_array()
            .is_some_and(|a| a.iter().all(|x| x.as_str() == Some("text")));
        if !text_only {
            return Err(ApiError::unsupported(
                "modalities",
                "only the 'text' modality is supported",
            ));
        }
    }
    if endpoint == Endpoint::Completion {
        if f.boolean("echo")? == Some(true) {
            return Err(ApiError::unsupported("echo", "'echo' is not supported"));
        }
        if f.string("suffix")?.is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::unsupported(
                "suffix",
                "'suffix' (fill-in-the-middle) is not supported",
            ));
        }
    }
    Ok(())
}

/// vLLM's `cache_salt`.
fn parse_cache_salt(f: &Fields<'_>) -> Result<Option<String>, ApiError> {
    match f.string("cache_salt")? {
        Some("") => Err(ApiError::param(
            "cache_salt",
            "'cache_salt' must be a non-empty string if provided",
        )),
        Some(salt) if salt.len() > MAX_CACHE_SALT_BYTES => Err(ApiError::param(
            "cache_salt",
            format!("'cache_salt' is longer than {MAX_CACHE_SALT_BYTES} bytes"),
        )),
        salt => Ok(salt.map(str::to_string)),
    }
}

/// `n` (or llama-server's `n_cmpl`): choices are separate sequences sharing the prompt's
/// cached blocks.
fn parse_choices(f: &Fields<'_>) -> Result<usize, ApiError> {
    let mut n_choices = 1;
    for key in ["n", "n_cmpl"] {
        if let Some(n) = f.integer(key)? {
            if n < 1 || n > MAX_CHOICES as i64 {
                return Err(ApiError::param(
                    key,
                    format!("'{key}' must be between 1 and {MAX_CHOICES}, got {n}"),
                ));
            }
            n_choices = n as usize;
        }
    }
    Ok(n_choices)
}

/// `max_completion_tokens`, else `max_tokens`.
fn parse_max_tokens(f: &Fields<'_>) -> Result<Option<usize>, ApiError> {
    let max = match f.at_least("max_completion_tokens", 1)? {
        Some(m) => Some(m),
        None => f.at_least("max_tokens", 1)?,
    };
    Ok(max.map(|m| m as usize))
}

/// The sampler's fields, each absent one taken from `defaults`; `seed` drawn at random
/// when absent.
pub(crate) fn parse_sampler(
    f: &Fields<'_>,
    n_vocab: usize,
    defaults: SamplerParams,
) -> Result<SamplerParams, ApiError> {
    let repeat_penalty = match f.ranged("repeat_penalty", 0.0, 10.0)? {
        Some(r) => Some(r),
        None => f.ranged("repetition_penalty", 0.0, 10.0)?,
    };
    let seed = match f.get("seed") {
        None => rand::random::<u64>(),
        Some(v) => match (v.as_u64(), v.as_i64()) {
            (Some(u), _) => u,
            (None, Some(i)) => i as u64,
            _ => {
                return Err(ApiError::param(
                    "seed",
                    format!("'seed' must be an integer, got {}", kind(v)),
                ))
            }
        },
    };
    let sampler = SamplerParams {
        temperature: f
            .ranged("temperature", 0.0, 2.0)?
            .unwrap_or(defaults.temperature),
        top_k: f
            .at_least("top_k", 0)?
            .map_or(defaults.top_k, |k| k as usize),
        top_p: f.ranged("top_p", 0.0, 1.0)?.unwrap_or(defaults.top_p),
        min_p: f.ranged("min_p", 0.0, 1.0)?.unwrap_or(defaults.min_p),
        typical_p: f
            .ranged("typical_p", 0.0, 1.0)?
            .unwrap_or(defaults.typical_p),
        repeat_penalty: repeat_penalty.unwrap_or(defaults.repeat_penalty),
        presence_penalty: f
            .ranged("presence_penalty", -2.0, 2.0)?
            .unwrap_or(defaults.presence_penalty),
        frequency_penalty: f
            .ranged("frequency_penalty", -2.0, 2.0)?
            .unwrap_or(defaults.frequency_penalty),
        penalty_last_n: f
            .at_least("repeat_last_n", 0)?
            .map_or(defaults.penalty_last_n, |n| n as usize),
        logit_bias: parse_logit_bias(f, n_vocab)?,
        seed,
    };
    if sampler.repeat_penalty <= 0.0 {
        return Err(ApiError::param(
            "repeat_penalty",
            "'repeat_penalty' must be greater than 0",
        ));
    }
    sampler.validate().map_err(ApiError::invalid)?;
    Ok(sampler)
}

/// Whether to report the chosen tokens' log-probabilities, and how many alternatives:
/// chat's `logprobs` + `top_logprobs`, or the legacy API's `logprobs` count.
fn parse_logprobs(f: &Fields<'_>, endpoint: Endpoint) -> Result<(bool, usize), ApiError> {
    match endpoint {
        Endpoint::Chat => {
            let logprobs = f.boolean("logprobs")?.unwrap_or(false);
            let top = f.at_least("top_logprobs", 0)?.unwrap_or(0);
            if top > 20 {
                return Err(ApiError::param(
                    "top_logprobs",
                    format!("'top_logprobs' must be at most 20, got {top}"),
                ));
            }
            if top > 0 && !logprobs {
                return Err(ApiError::param(
                    "top_logprobs",
                    "'top_logprobs' needs 'logprobs' set to true",
                ));
            }
            Ok((logprobs, top as usize))
        }
        Endpoint::Completion => match f.get("logprobs") {
            Some(Value::Bool(b)) => Ok((*b, 0)),
            _ => match f.at_least("logprobs", 0)? {
                None => Ok((false, 0)),
                Some(n) if n <= 20 => Ok((true, n as usize)),
                Some(n) => Err(ApiError::param(
                    "logprobs",
                    format!("'logprobs' must be at most 20, got {n}"),
                )),
            },
        },
    }
}

fn parse_include_usage(f: &Fields<'_>) -> Result<bool, ApiError> {
    match f.object("stream_options")? {
        None => Ok(false),
        Some(o) => Ok(Fields(o)
            .boolean("include_usage")
            .map_err(|e| e.with_param("stream_options.include_usage"))?
            .unwrap_or(false)),
    }
}

fn parse_reasoning_format(
    f: &Fields<'_>,
) -> Result<Option<ferrox_agent::ReasoningFormat>, ApiError> {
    let Some(r) = f.string("reasoning_format")? else {
        return Ok(None);
    };
    ferrox_agent::ReasoningFormat::parse(r)
        .map(Some)
        .ok_or_else(|| {
            ApiError::param(
                "reasoning_format",
                format!("'reasoning_format' must be 'none', 'auto' or 'deepseek', got '{r}'"),
            )
        })
}

/// `response_format`, `json_schema` and `grammar`: the constraint they ask for.
fn parse_grammar(f: &Fields<'_>) -> Result<Option<GrammarSpec>, ApiError> {
    let mut found = parse_response_format(f)?
        .map(|g| ("response_format", g))
        .into_iter()
        .collect();
    extension_constraints(f, &mut found)?;
    one_constraint(found)
}

/// OpenAI's `response_format`.
fn parse_response_format(f: &Fields<'_>) -> Result<Option<GrammarSpec>, ApiError> {
    let Some(format) = f.get("response_format") else {
        return Ok(None);
    };
    let Some(obj) = format.as_object() else {
        return Err(ApiError::param(
            "response_format",
            format!("'response_format' must be an object, got {}", kind(format)),
        ));
    };
    match obj.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        // llama-server also takes a schema here.
        Some("json_object") => Ok(Some(match obj.get("schema").filter(|v| !v.is_null()) {
            Some(schema) => GrammarSpec::JsonSchema(schema.clone()),
            None => GrammarSpec::JsonObject,
        })),
        Some("json_schema") => {
            let inner = obj.get("json_schema").unwrap_or(&Value::Null);
            let schema = match inner {
                Value::Object(o) => o
                    .get("schema")
                    .filter(|v| !v.is_null())
                    .cloned()
                    .unwrap_or_else(|| serde_json::json!({})),
                Value::Null => obj
                    .get("schema")
                    .cloned()
                    .ok_or_else(|| ApiError::param("response_format.json_schema", "'response_format.json_schema' is required"))?,
                v => {
                    return Err(ApiError::param(
                        "response_format.json_schema",
                        format!("'response_format.json_schema' must be an object, got {}", kind(v)),
                    ))
                }
            };
            Ok(Some(GrammarSpec::JsonSchema(schema)))
        }
        Some(other) => Err(ApiError::param(
            "response_format",
            format!("'response_format.type' must be 'text', 'json_object' or 'json_schema', got '{other}'"),
        )),
        None => Err(ApiError::param(
            "response_format.type",
            "'response_format.type' is required",
        )),
    }
}

/// llama-server's `json_schema` (a schema) and `grammar` (GBNF), added to `found`.
pub(crate) fn extension_constraints(
    f: &Fields<'_>,
    found: &mut Vec<(&'static str, GrammarSpec)>,
) -> Result<(), ApiError> {
    if let Some(schema) = f.get("json_schema") {
        found.push(("json_schema", GrammarSpec::JsonSchema(schema.clone())));
    }
    if let Some(grammar) = f.string("grammar")? {
        if grammar.trim().is_empty() {
            return Err(ApiError::param("grammar", "'grammar' is empty"));
        }
        found.push(("grammar", GrammarSpec::Gbnf(grammar.to_string())));
    }
    Ok(())
}

/// The one constraint among the fields that ask for one (named by field); two are an
/// error naming both.
pub(crate) fn one_constraint(
    mut found: Vec<(&'static str, GrammarSpec)>,
) -> Result<Option<GrammarSpec>, ApiError> {
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop().map(|(_, g)| g)),
        _ => Err(ApiError::param(
            found[1].0,
            format!(
                "'{}' and '{}' both constrain the output; give only one",
                found[0].0, found[1].0
            ),
        )),
    }
}

/// `tools`, `tool_choice` and `parallel_tool_calls`.
fn parse_tools(f: &Fields<'_>) -> Result<Option<ToolSpec>, ApiError> {
    let tools: Vec<Tool> = match f.get("tools") {
        None => Vec::new(),
        Some(v) => {
            ToolSpec::parse_tools(v).map_err(|(param, message)| ApiError::param(&param, message))?
        }
    };
    let choice = ToolSpec::parse_choice(f.get("tool_choice"), &tools)
        .map_err(|m| ApiError::param("tool_choice", m))?;
    let parallel = f.boolean("parallel_tool_calls")?.unwrap_or(true);
    Ok(ToolSpec::given(tools, choice, parallel))
}

/// The most bytes all of a request's stop sequences may take together.
pub const MAX_STOP_BYTES: usize = 4096;

/// Stop strings from `key` (a string or an array of strings), empty ones dropped.
pub(crate) fn parse_stop(f: &Fields<'_>, key: &str) -> Result<Vec<String>, ApiError> {
    const MAX_STOPS: usize = 16;
    let stops: Vec<String> = match f.get(key) {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    Value::String(s) => out.push(s.clone()),
                    other => {
                        return Err(ApiError::param(
                            key,
                            format!(
                            "'{key}' must be a string or an array of strings; found {} in the array",
                            kind(other)
                        ),
                        ))
                    }
                }
            }
            out
        }
        Some(other) => {
            return Err(ApiError::param(
                key,
                format!(
                    "'{key}' must be a string or an array of strings, got {}",
                    kind(other)
                ),
            ))
        }
    };
    if stops.len() > MAX_STOPS {
        return Err(ApiError::param(
            key,
            format!("at most {MAX_STOPS} stop sequences, got {}", stops.len()),
        ));
    }
    // Each generated token is checked against every stop string, and text is held back
    // while it may begin one: their total length bounds both.
    let total: usize = stops.iter().map(String::len).sum();
    if total > MAX_STOP_BYTES {
        return Err(ApiError::param(
            key,
            format!(
                "the stop sequences are {total} bytes long in all; the limit is {MAX_STOP_BYTES}"
            ),
        ));
    }
    Ok(stops.into_iter().filter(|s| !s.is_empty()).collect())
}

fn parse_logit_bias(f: &Fields<'_>, n_vocab: usize) -> Result<Vec<(TokenId, f32)>, ApiError> {
    let Some(map) = f.object("logit_bias")? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(map.len());
    for (key, value) in map {
        let id: TokenId = key
            .parse()
            .ok()
            .filter(|&id: &TokenId| (id as usize) < n_vocab)
            .ok_or_else(|| {
                ApiError::param(
                    "logit_bias",
                    format!("'logit_bias' key {key:?} is not a token id below {n_vocab}"),
                )
            })?;
        let bias = value
            .as_f64()
            .filter(|b| (-100.0..=100.0).contains(b))
            .ok_or_else(|| {
                ApiError::param(
                    "logit_bias",
                    format!(
                        "'logit_bias' value for token {key} must be a number between -100 and 100"
                    ),
                )
            })?;
        out.push((id, bias as f32));
    }
    Ok(out)
}

pub fn parse_chat(body: &Value, n_vocab: usize) -> Result<ChatRequest, ApiError> {
    let f = Fields(as_object(body)?);
    let gen = parse_common(&f, Endpoint::Chat, n_vocab)?;
    let messages = match f.get("messages") {
        None => return Err(ApiError::param("messages", "'messages' is required")),
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::param("messages", "'messages' must not be empty"))
        }
        Some(Value::Array(a)) => a,
        Some(v) => {
            return Err(ApiError::param(
                "messages",
                format!("'messages' must be an array, got {}", kind(v)),
            ))
        }
    };
    let mut normalized = Vec::with_capacity(messages.len());
    let mut images = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        normalized.push(normalize_message(i, message, &mut images)?);
    }
    let template_kwargs = f
        .object("chat_template_kwargs")?
        .cloned()
        .unwrap_or_default();
    let tools = parse_tools(&f)?;
    check_forced_tools(&gen, tools.as_ref())?;
    Ok(ChatRequest {
        gen,
        messages: Value::Array(normalized),
        template_kwargs,
        tools,
        images,
    })
}

/// A forced tool call is a constraint of its own: refused beside another.
pub(crate) fn check_forced_tools(
    gen: &GenRequest,
    tools: Option<&ToolSpec>,
) -> Result<(), ApiError> {
    let forced =
        tools.is_some_and(|t| t.choice != ToolChoice::None && t.choice != ToolChoice::Auto);
    if gen.grammar.is_some() && forced {
        return Err(ApiError::param(
            "tool_choice",
            "a forced 'tool_choice' cannot be combined with 'response_format', 'json_schema' or 'grammar'",
        ));
    }
    Ok(())
}

/// Checks one message and flattens content parts to text; an image part becomes the media
/// marker, its bytes appended to `images`.
fn normalize_message(
    i: usize,
    message: &Value,
    images: &mut Vec<ImageInput>,
) -> Result<Value, ApiError> {
    let param = format!("messages[{i}]");
    let Some(obj) = message.as_object() else {
        return Err(ApiError::param(
            &param,
            format!("'{param}' must be an object, got {}", kind(message)),
        ));
    };
    match obj.get("role") {
        Some(Value::String(_)) => {}
        None | Some(Value::Null) => {
            return Err(ApiError::param(
                &format!("{param}.role"),
                format!("'{param}.role' is required"),
            ))
        }
        Some(v) => {
            return Err(ApiError::param(
                &format!("{param}.role"),
                format!("'{param}.role' must be a string, got {}", kind(v)),
            ))
        }
    }
    let content = match obj.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let at = format!("{param}.content[{j}]");
                match part {
                    Value::String(s) => text.push_str(s),
                    Value::Object(p) => match p.get("type").and_then(Value::as_str) {
                        Some("text") => match p.get("text") {
                            Some(Value::String(s)) => text.push_str(s),
                            _ => {
                                return Err(ApiError::param(
                                    &at,
                                    format!("'{at}.text' must be a string"),
                                ))
                            }
                        },
                        Some("image_url") => {
                            if images.len() == MAX_IMAGES {
                                return Err(ApiError::param(
                                    &at,
                                    format!("at most {MAX_IMAGES} images in a request"),
                                ));
                            }
                            images.push(image_url_input(&at, p)?);
                            text.push_str(ferrox_generate::media::MEDIA_MARKER);
                        }
                        Some(other) => {
                            return Err(ApiError::unsupported(
                                &at,
                                format!(
                                    "content parts of type '{other}' are not supported (text and image_url only)"
                                ),
                            ))
                        }
                        None => {
                            return Err(ApiError::param(&at, format!("'{at}.type' is required")))
                        }
                    },
                    other => {
                        return Err(ApiError::param(
                            &at,
                            format!("'{at}' must be an object, got {}", kind(other)),
                        ))
                    }
                }
            }
            text
        }
        Some(v) => {
            return Err(ApiError::param(
                &format!("{param}.content"),
                format!(
                    "'{param}.content' must be a string or an array of parts, got {}",
                    kind(v)
                ),
            ))
        }
    };
    let mut out = Value::Object(obj.clone());
    out["content"] = Value::String(content);
    ferrox_agent::tools::arguments_as_objects(&mut out);
    Ok(out)
}

pub fn parse_completion(body: &Value, n_vocab: usize) -> Result<CompletionRequest, ApiError> {
    let f = Fields(as_object(body)?);
    let gen = parse_common(&f, Endpoint::Completion, n_vocab)?;
    let token = |v: &Value| -> Option<TokenId> {
        v.as_u64()
            .filter(|&t| (t as usize) < n_vocab)
            .map(|t| t as TokenId)
    };
    let tokens = |items: &[Value]| -> Result<Vec<TokenId>, ApiError> {
        items
            .iter()
            .map(|v| {
                token(v).ok_or_else(|| {
                    ApiError::param(
                        "prompt",
                        format!("prompt token ids must be integers below {n_vocab}"),
                    )
                })
            })
            .collect()
    };
    let one = |n: usize| -> Result<(), ApiError> {
        if n == 1 {
            Ok(())
        } else {
            Err(ApiError::unsupported(
                "prompt",
                format!("a batch of {n} prompts is not supported: one prompt per request"),
            ))
        }
    };
    let prompt = match f.get("prompt") {
        None => return Err(ApiError::param("prompt", "'prompt' is required")),
        Some(Value::String(s)) => Prompt::Text(s.clone()),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::param("prompt", "'prompt' must not be empty"))
        }
        Some(Value::Array(items)) => match &items[0] {
            Value::String(s) => {
                one(items.len())?;
                Prompt::Text(s.clone())
            }
            Value::Number(_) => Prompt::Tokens(tokens(items)?),
            Value::Array(inner) => {
                one(items.len())?;
                Prompt::Tokens(tokens(inner)?)
            }
            other => {
                return Err(ApiError::param(
                    "prompt",
                    format!(
                        "'prompt' must be a string, an array of strings or token ids; found {}",
                        kind(other)
                    ),
                ))
            }
        },
        Some(v) => {
            return Err(ApiError::param(
                "prompt",
                format!("'prompt' must be a string or an array, got {}", kind(v)),
            ))
        }
    };
    Ok(CompletionRequest { gen, prompt })
}

/// `POST /tokenize` (llama-server's shape).
pub struct TokenizeRequest {
    pub content: String,
    pub add_special: bool,
    pub parse_special: bool,
    pub with_pieces: bool,
}

pub fn parse_tokenize(body: &Value) -> Result<TokenizeRequest, ApiError> {
    let f = Fields(as_object(body)?);
    Ok(TokenizeRequest {
        content: f
            .string("content")?
            .ok_or_else(|| ApiError::param("content", "'content' is required"))?
            .to_string(),
        add_special: f.boolean("add_special")?.unwrap_or(false),
        parse_special: f.boolean("parse_special")?.unwrap_or(true),
        with_pieces: f.boolean("with_pieces")?.unwrap_or(false),
    })
}

/// `POST /detokenize`: the token ids.
pub fn parse_detokenize(body: &Value) -> Result<Vec<TokenId>, ApiError> {
    let f = Fields(as_object(body)?);
    match f.get("tokens") {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_u64()
                    .filter(|&t| t <= u32::MAX as u64)
                    .map(|t| t as TokenId)
                    .ok_or_else(|| {
                        ApiError::param("tokens", "'tokens' must be an array of token ids")
                    })
            })
            .collect(),
        Some(v) => Err(ApiError::param(
            "tokens",
            format!("'tokens' must be an array, got {}", kind(v)),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wrong_types_and_ranges_name_the_field() {
        let e = parse_chat(
            &json!({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}),
            100,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = parse_chat(
            &json!({"messages": [{"role": "user", "content": "hi"}], "top_p": 1.5}),
            100,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_p"));
        let e = parse_chat(&json!({"messages": []}), 100).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = parse_chat(
            &json!({"messages": [{"role": "user", "content": "hi"}], "n": 17}),
            100,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("n"));
        let ok = parse_chat(
            &json!({"messages": [{"role": "user", "content": "hi"}], "n": 3}),
            100,
        )
        .unwrap();
        assert_eq!(ok.gen.n, 3);
        let e = parse_chat(
            &json!({"messages": [{"role": "user", "content": "hi"}], "best_of": 2}),
            100,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("best_of"));
        let e = parse_chat(&json!({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}), 100).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0]"));
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        let e = parse_chat(&json!({"messages": [{"role": "user", "content": "hi"}], "tools": tools, "tool_choice": {"type": "function", "function": {"name": "g"}}}), 100).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        assert!(e.message.contains("'g'"), "{}", e.message);
        let e = parse_chat(&json!({"messages": [{"role": "user", "content": "hi"}], "grammar": "root ::= \"a\"", "json_schema": {}}), 100).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("grammar"));
        let e = parse_chat(&json!({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "yaml"}}), 100).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("response_format"));
        let ok = parse_chat(&json!({"messages": [{"role": "user", "content": "hi"}], "tools": tools, "tool_choice": "required", "parallel_tool_calls": false}), 100).unwrap();
        let spec = ok.tools.unwrap();
        assert_eq!((spec.choice, spec.parallel), (ToolChoice::Required, false));
        let ok = parse_chat(&json!({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": true}}}), 100).unwrap();
        assert_eq!(
            ok.gen.grammar,
            Some(GrammarSpec::JsonSchema(json!({"type": "object"})))
        );
        let e = parse_chat(
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}),
            100,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        let e =
            parse_completion(&json!({"prompt": "x", "logit_bias": {"100": 1}}), 100).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logit_bias"));
    }

    #[test]
    fn image_parts_become_markers_and_their_bytes() {
        let png = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}});
        let r = parse_chat(&json!({"messages": [{"role": "user", "content": [png, {"type": "text", "text": "x"}]}]}), 100).unwrap();
        assert_eq!(r.images, vec![ImageInput::Bytes(b"hi".to_vec())]);
        assert_eq!(r.messages[0]["content"], "<__media__>x");
        let many = vec![png; MAX_IMAGES + 1];
        let e = parse_chat(
            &json!({"messages": [{"role": "user", "content": many}]}),
            100,
        )
        .unwrap_err();
        assert!(e.to_string().contains("at most 16 images"), "{e}");
        let remote = json!({"type": "image_url", "image_url": {"url": "HTTPS://x/y.png"}});
        let r = parse_chat(
            &json!({"messages": [{"role": "user", "content": [remote]}]}),
            100,
        )
        .unwrap();
        assert_eq!(r.images, vec![ImageInput::Url("HTTPS://x/y.png".into())]);
        for (url, needle) in [
            ("file:///etc/passwd", "http:// or https://"),
            ("gopher://x/y.png", "data: URL"),
            (
                &format!("https://x/{}", "a".repeat(MAX_IMAGE_URL)),
                "longer than",
            ),
            ("data:image/png,abc", "base64"),
            ("data:image/png;base64,@@", "invalid"),
        ] {
            let part = json!({"type": "image_url", "image_url": {"url": url}});
            let e = parse_chat(
                &json!({"messages": [{"role": "user", "content": [part]}]}),
                100,
            )
            .unwrap_err();
            assert!(e.to_string().contains(needle), "{e}");
        }
    }

    #[test]
    fn accepts_openai_shapes_and_ignores_unknown_fields() {
        let r = parse_chat(
            &json!({
                "model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                "max_completion_tokens": 5, "stop": "x", "seed": -1, "stream": true,
                "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 2,
                "logit_bias": {"5": -100}, "whatever": {"x": 1}, "user": "u", "n": 1, "response_format": {"type": "text"}
            }),
            100,
        )
        .unwrap();
        assert_eq!(r.messages[0]["content"], "ab");
        assert_eq!(r.gen.params.max_tokens, Some(5));
        assert_eq!(r.gen.params.stop, vec!["x".to_string()]);
        assert!(r.gen.stream && r.gen.include_usage && r.gen.params.logprobs);
        assert_eq!(r.gen.params.top_logprobs, 2);
        assert_eq!(r.gen.params.sampler.logit_bias, vec![(5, -100.0)]);
        let c = parse_completion(&json!({"prompt": [[1, 2, 3]], "logprobs": 3}), 100).unwrap();
        assert!(matches!(c.prompt, Prompt::Tokens(ref t) if t == &[1, 2, 3]));
        assert_eq!(c.gen.params.top_logprobs, 3);
        assert_eq!(c.gen.params.max_tokens, None);
    }
}
