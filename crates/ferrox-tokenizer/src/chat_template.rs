//! Chat templates: the Jinja program a model ships in `tokenizer.chat_template` that turns a
//! list of chat messages into the prompt text the model was trained on.
//!
//! Rendering matches Hugging Face transformers' `apply_chat_template`, which runs the template
//! in jinja2's `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with the
//! `loopcontrols` extension and these additions:
//!
//! * `raise_exception(msg)` aborts rendering ([`ChatTemplateError::Raised`]);
//! * `strftime_now(fmt)` formats the current local time (or [`RenderOptions::now`]);
//! * the `tojson` filter is `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
//!   sort_keys=False)`: `", "` / `": "` separators, non-ASCII kept, `<>&'` not escaped;
//! * `{% generation %}...{% endgeneration %}` (transformers' assistant-mask tag) renders its
//!   body unchanged.
//!
//! The context holds `messages`, `tools` (`none` unless given), `documents` (`none`),
//! `add_generation_prompt`, `bos_token`, `eos_token` and `strftime_now`, then every entry of
//! [`RenderOptions::extra`] (which may override any of them). Python's string, dict and list
//! methods (`.strip()`, `.split()`, `.startswith()`, `.items()`, `.get()`, ...) come from
//! minijinja-contrib's `pycompat`; values print as Python's `str()` does (`None`, `True`,
//! `['a', 1]`, `1e+20`). Undefined values follow jinja2's default `Undefined`: they print as
//! nothing, iterate as empty and are falsy, but looking up an attribute of one is an error.
//!
//! Known differences from jinja2 (none affects the templates of llama.cpp's `models/templates`
//! in normal use): iterating `none` yields nothing where jinja2 raises; filters such as `map`
//! return lists, not generators (so `tojson` accepts them); `"..." | safe + text` does not
//! HTML-escape `text`; `~` formats floats the Rust way (`{{ 1e20 ~ '' }}`); an unknown filter is
//! a render error rather than a parse error; lists are immutable, so `.append()` / `.pop()` fail
//! (as they do in transformers' immutable sandbox).
//!
//! Messages, tools and extra context come from HTTP clients and are plain data: nothing in them
//! is evaluated. Every render runs under a fuel limit ([`DEFAULT_FUEL`]: an instruction and
//! allocation budget, so no input can make a template loop or allocate without bound),
//! a recursion limit and an output size limit. A template that fails to parse or render yields
//! a [`ChatTemplateError`] naming minijinja's reason and the template line, never a panic. The
//! template itself comes from the model file or the operator; a deliberately hostile one can
//! still outrun the fuel through minijinja 3.1 internals that do not charge it (a list doubled
//! onto itself more than 32 times with `+`, or `~` / `join` on a list nested into itself), so
//! templates should come from trusted model files.
//!
//! # BOS handling
//!
//! Many templates print `bos_token` themselves. The server tokenizes the rendered prompt with
//! `add_special` as the model asks (`Vocab::add_bos`), so a prompt that already starts with the
//! BOS text would get two BOS tokens. llama-server avoids that by removing the leading BOS text
//! (and a trailing EOS text when the vocabulary adds EOS) from the rendered prompt before
//! tokenizing it; [`prompt_for_tokenizer`] does the same:
//!
//! ```no_run
//! # use ferrox_tokenizer::chat_template::*;
//! # fn demo(meta: &ferrox_gguf::Metadata<'_>, tok: &ferrox_tokenizer::tokenizer::Tokenizer)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! let template = ChatTemplate::from_metadata(meta)?.unwrap_or_else(ChatTemplate::chatml);
//! let options = RenderOptions {
//!     add_generation_prompt: true,
//!     bos_token: "<|begin_of_text|>".into(),
//!     eos_token: "<|eot_id|>".into(),
//!     ..Default::default()
//! };
//! let prompt = template.render(&[ChatMessage::new("user", "Hello!")], &options)?;
//! let text = prompt_for_tokenizer(&prompt, &options, tok.vocab().add_bos(), false);
//! let ids = tok.encode(text, true, true);
//! # let _ = ids; Ok(()) }
//! ```

use std::fmt::{self, Write as _};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Serde, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State, UndefinedBehavior};
use serde::{Deserialize, Serialize};

pub use chrono::NaiveDateTime;

/// The GGUF key of a model's default chat template.
pub const METADATA_KEY: &str = "tokenizer.chat_template";

/// The GGUF key listing the names of a model's extra templates (`tokenizer.chat_template.NAME`).
pub const METADATA_NAMES_KEY: &str = "tokenizer.chat_templates";

/// The template llama-server falls back to when a model has none (llama.cpp's
/// `CHATML_TEMPLATE_SRC`).
pub const CHATML_SOURCE: &str = "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|im_start|>assistant\\n' -}}\n{%- endif -%}";

/// Gemma's turns (`<start_of_turn>user` / `model`); no system role: system text opens the
/// next user turn, as llama.cpp's built-in `gemma` format does.
pub const GEMMA_SOURCE: &str = "{{- bos_token -}}\n{%- set ns = namespace(system='') -%}\n{%- for message in messages -%}\n  {%- if message.role == 'system' -%}\n    {%- set ns.system = ns.system + message.content | trim + '\\n\\n' -%}\n  {%- else -%}\n    {{- '<start_of_turn>' + ('model' if message.role == 'assistant' else message.role) + '\\n' + (ns.system if message.role == 'user' else '') + message.content | trim + '<end_of_turn>\\n' -}}\n    {%- if message.role == 'user' -%}{%- set ns.system = '' -%}{%- endif -%}\n  {%- endif -%}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<start_of_turn>model\\n' -}}\n{%- endif -%}";

/// Llama 3's header-delimited turns.
pub const LLAMA3_SOURCE: &str = "{{- bos_token -}}\n{%- for message in messages -%}\n  {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n{%- endif -%}";

/// Phi-3's `<|role|>` turns.
pub const PHI3_SOURCE: &str = "{%- for message in messages -%}\n  {{- '<|' + message.role + '|>\\n' + message.content + '<|end|>\\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|assistant|>\\n' -}}\n{%- endif -%}";

/// The built-in formats for a model without a template, with the turn markers (tokens of
/// its vocabulary) that select each, in the order they are tried: llama.cpp's
/// `llm_chat_detect_template` markers. ChatML is the last resort.
const BUILTIN_FORMATS: &[(&str, &[&str], &str)] = &[
    ("chatml", &["<|im_start|>", "<|im_end|>"], CHATML_SOURCE),
    (
        "llama3",
        &["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        LLAMA3_SOURCE,
    ),
    ("gemma", &["<start_of_turn>", "<end_of_turn>"], GEMMA_SOURCE),
    ("phi3", &["<|assistant|>", "<|end|>"], PHI3_SOURCE),
];

/// Default fuel of one render. minijinja charges one unit per instruction and one per 64 bytes
/// of data created (this module's `tojson` and printing do the same), so fuel bounds both time
/// and allocation. Real templates use about 70 per message plus one per ~20 bytes of content
/// (a 500 kB conversation: ~150 k), so this leaves ample room while a runaway loop stops in
/// well under a second (release build) and created data stays under ~640 MB.
pub const DEFAULT_FUEL: u64 = 10_000_000;

/// Default limit on the rendered prompt's size.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 256 << 20;

/// Default limit on nested macro calls and data structures (minijinja's own maximum is 500).
pub const DEFAULT_RECURSION_LIMIT: usize = 200;

const TEMPLATE_NAME: &str = "chat_template";

/// One chat message as the template sees it (`message.role`, `message.content`, ...).
///
/// Optional fields that are `None` are absent from the template's view (`message.name is
/// defined` is false), as in an OpenAI request. Content given as an array of parts must be
/// flattened to text by the caller. `extra` carries any other field (`reasoning_content`,
/// ...) through to the template.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// OpenAI-style tool calls (`[{"id", "type": "function", "function": {"name",
    /// "arguments"}}]`), passed through as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..Default::default()
        }
    }
}

/// What a render needs besides the messages.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// End the prompt with the opening of an assistant turn.
    pub add_generation_prompt: bool,
    /// The model's BOS token text (`""` when it has none).
    pub bos_token: String,
    /// The model's EOS token text.
    pub eos_token: String,
    /// Tool definitions (`tools` in the template; `none` when absent, as transformers does).
    pub tools: Option<serde_json::Value>,
    /// More template variables (`enable_thinking`, `date_string`, ...); they override the
    /// variables above.
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// The time `strftime_now` formats; the current local time when `None`.
    pub now: Option<NaiveDateTime>,
}

/// Why a template could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    #[error("reading the chat template from metadata: {0}")]
    Metadata(#[from] ferrox_gguf::GgufError),
    #[error("chat template syntax error: {message}{}", at_line(*line))]
    Syntax {
        message: String,
        line: Option<usize>,
    },
    #[error("chat template raised an exception: {message}{}", at_line(*line))]
    Raised {
        message: String,
        line: Option<usize>,
    },
    #[error("chat template render error: {message}{}", at_line(*line))]
    Render {
        message: String,
        line: Option<usize>,
    },
    #[error("chat template ran out of fuel after {fuel} instructions{}", at_line(*line))]
    OutOfFuel { fuel: u64, line: Option<usize> },
    #[error("chat template output exceeds {limit} bytes")]
    OutputTooLarge { limit: usize },
    #[error("invalid chat template context: {0}")]
    Context(String),
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!(" (line {l})")).unwrap_or_default()
}

/// A compiled chat template.
#[derive(Clone)]
pub struct ChatTemplate {
    source: Arc<str>,
    env: Environment<'static>,
    fuel: Option<u64>,
    max_output_bytes: usize,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("fuel", &self.fuel)
            .field("max_output_bytes", &self.max_output_bytes)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source`; a syntax error is [`ChatTemplateError::Syntax`].
    pub fn new(source: &str) -> Result<ChatTemplate, ChatTemplateError> {
        let mut env = environment();
        env.set_fuel(Some(DEFAULT_FUEL));
        env.add_template_owned(TEMPLATE_NAME, rewrite_generation_tags(source))
            .map_err(|e| convert_error(&e, DEFAULT_FUEL))?;
        Ok(ChatTemplate {
            source: source.into(),
            env,
            fuel: Some(DEFAULT_FUEL),
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
        })
    }

    /// llama-server's fallback for models without a template ([`CHATML_SOURCE`]).
    pub fn chatml() -> ChatTemplate {
        ChatTemplate::new(CHATML_SOURCE).expect("the ChatML template compiles")
    }

    /// The built-in format for a model without a template: the first whose turn markers are
    /// all tokens of the vocabulary (`has_token`), else ChatML. Returns the template and its
    /// name.
    pub fn for_vocabulary(has_token: impl Fn(&str) -> bool) -> (ChatTemplate, &'static str) {
        let (name, source) = BUILTIN_FORMATS
            .iter()
            .find(|(_, markers, _)| markers.iter().all(|m| has_token(m)))
            .map_or(("chatml", CHATML_SOURCE), |&(name, _, source)| {
                (name, source)
            });
        let template = ChatTemplate::new(source).expect("the built-in templates compile");
        (template, name)
    }

    /// The model's default template, `tokenizer.chat_template`. As llama.cpp does, a model
    /// without one but with a `tool_use` variant gets that; `Ok(None)` when there is neither
    /// (or the value is empty); the caller then usually falls back to [`ChatTemplate::chatml`].
    pub fn from_metadata(
        meta: &ferrox_gguf::Metadata<'_>,
    ) -> Result<Option<ChatTemplate>, ChatTemplateError> {
        match Self::from_metadata_key(meta, METADATA_KEY)? {
            Some(t) => Ok(Some(t)),
            None => Self::from_metadata_named(meta, "tool_use"),
        }
    }

    /// The named variant `tokenizer.chat_template.NAME` (`tool_use`, `rag`, ...), or `None`.
    pub fn from_metadata_named(
        meta: &ferrox_gguf::Metadata<'_>,
        name: &str,
    ) -> Result<Option<ChatTemplate>, ChatTemplateError> {
        Self::from_metadata_key(meta, &format!("{METADATA_KEY}.{name}"))
    }

    /// The names of the variants a model carries: those listed in `tokenizer.chat_templates`
    /// and those with a `tokenizer.chat_template.NAME` key, in file order, without repeats.
    pub fn metadata_names(meta: &ferrox_gguf::Metadata<'_>) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        if let Some(strings) = meta
            .get(METADATA_NAMES_KEY)
            .and_then(|v| v.as_array())
            .and_then(|a| a.strings())
        {
            for s in strings {
                if !s.is_empty() && !names.iter().any(|n| n == s) {
                    names.push(s.to_string());
                }
            }
        }
        let prefix = format!("{METADATA_KEY}.");
        for (key, _) in meta.iter() {
            if let Some(name) = key.strip_prefix(&prefix) {
                if !name.is_empty() && !names.iter().any(|n| n == name) {
                    names.push(name.to_string());
                }
            }
        }
        names
    }

    fn from_metadata_key(
        meta: &ferrox_gguf::Metadata<'_>,
        key: &str,
    ) -> Result<Option<ChatTemplate>, ChatTemplateError> {
        match meta.opt_str(key)? {
            None | Some("") => Ok(None),
            Some("chatml") => Ok(Some(ChatTemplate::chatml())),
            Some(source) => ChatTemplate::new(source).map(Some),
        }
    }

    /// Replaces the instruction budget of each render (`None`: unlimited, for trusted
    /// templates and inputs only).
    pub fn with_fuel(mut self, fuel: Option<u64>) -> ChatTemplate {
        self.fuel = fuel;
        self.env.set_fuel(fuel);
        self
    }

    /// Replaces the limit on the rendered text's size.
    pub fn with_max_output_bytes(mut self, limit: usize) -> ChatTemplate {
        self.max_output_bytes = limit;
        self
    }

    /// The template's source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` into prompt text. The text may start with the BOS token's text (see
    /// [`prompt_for_tokenizer`]).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        options: &RenderOptions,
    ) -> Result<String, ChatTemplateError> {
        self.render_with(Value::from(Serde(messages)), options)
    }

    /// Like [`render`](Self::render), with the messages given as JSON (an array of objects),
    /// so content parts, `null` contents and any other shape reach the template unchanged.
    pub fn render_json(
        &self,
        messages: &serde_json::Value,
        options: &RenderOptions,
    ) -> Result<String, ChatTemplateError> {
        if !messages.is_array() {
            return Err(ChatTemplateError::Context(
                "messages must be an array".into(),
            ));
        }
        self.render_with(Value::from(Serde(messages)), options)
    }

    fn render_with(
        &self,
        messages: Value,
        options: &RenderOptions,
    ) -> Result<String, ChatTemplateError> {
        let now = options
            .now
            .unwrap_or_else(|| chrono::Local::now().naive_local());
        let mut ctx: Vec<(String, Value)> = vec![
            ("messages".into(), messages),
            (
                "tools".into(),
                options
                    .tools
                    .as_ref()
                    .map_or(Value::from(()), |t| Value::from(Serde(t))),
            ),
            ("documents".into(), Value::from(())),
            (
                "add_generation_prompt".into(),
                Value::from(options.add_generation_prompt),
            ),
            ("bos_token".into(), Value::from(options.bos_token.as_str())),
            ("eos_token".into(), Value::from(options.eos_token.as_str())),
            (
                "strftime_now".into(),
                Value::from_function(move |fmt: &str| strftime(now, fmt)),
            ),
        ];
        for (key, value) in &options.extra {
            let value = Value::from(Serde(value));
            match ctx.iter_mut().find(|(k, _)| k == key) {
                Some(slot) => slot.1 = value,
                None => ctx.push((key.clone(), value)),
            }
        }
        let ctx = Value::from_pairs(ctx);

        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| convert_error(&e, self.fuel.unwrap_or(0)))?;
        let overflow = AtomicBool::new(false);
        let mut writer = LimitedWriter {
            buf: Vec::new(),
            limit: self.max_output_bytes,
            overflow: &overflow,
        };
        let result = template.render_captured_to(ctx, &mut writer).map(|_| ());
        if overflow.load(Ordering::Relaxed) {
            return Err(ChatTemplateError::OutputTooLarge {
                limit: self.max_output_bytes,
            });
        }
        result.map_err(|e| convert_error(&e, self.fuel.unwrap_or(0)))?;
        // minijinja only writes whole UTF-8 strings.
        String::from_utf8(writer.buf).map_err(|e| ChatTemplateError::Render {
            message: format!("output is not UTF-8: {e}"),
            line: None,
        })
    }
}

/// Whether `text` begins with the BOS token's text (never for an empty `bos_token`).
pub fn starts_with_bos(text: &str, bos_token: &str) -> bool {
    !bos_token.is_empty() && text.starts_with(bos_token)
}

/// `text` without one leading `bos_token`, for a tokenizer that adds BOS itself.
pub fn strip_leading_bos<'a>(text: &'a str, bos_token: &str) -> &'a str {
    if starts_with_bos(text, bos_token) {
        &text[bos_token.len()..]
    } else {
        text
    }
}

/// `text` without one trailing `eos_token`, for a tokenizer that adds EOS itself.
pub fn strip_trailing_eos<'a>(text: &'a str, eos_token: &str) -> &'a str {
    if !eos_token.is_empty() && text.ends_with(eos_token) {
        &text[..text.len() - eos_token.len()]
    } else {
        text
    }
}

/// The rendered prompt as llama-server hands it to the tokenizer (which then runs with
/// `add_special` set): when the vocabulary adds BOS (`add_bos`) a BOS the template printed is
/// removed so the prompt does not start with two, and likewise a trailing EOS when it adds
/// EOS.
pub fn prompt_for_tokenizer<'a>(
    text: &'a str,
    options: &RenderOptions,
    add_bos: bool,
    add_eos: bool,
) -> &'a str {
    let mut text = text;
    if add_bos {
        text = strip_leading_bos(text, &options.bos_token);
    }
    if add_eos {
        text = strip_trailing_eos(text, &options.eos_token);
    }
    text
}

// ---------------------------------------------------------------------------------------------
// The environment
// ---------------------------------------------------------------------------------------------

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    let syntax = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(false)
        .build()
        .expect("the default delimiters are valid");
    env.set_syntax(syntax);
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_recursion_limit(DEFAULT_RECURSION_LIMIT);
    env.set_debug(false);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(python_formatter);
    env.add_function("raise_exception", raise_exception);
    env.add_filter("tojson", tojson);
    env.add_filter("string", python_string);
    env.add_filter("center", center);
    env.add_filter("indent", indent);
    env.add_test("iterable", is_iterable);
    env.add_test("sequence", is_sequence);
    env.add_filter("truncate", minijinja_contrib::filters::truncate);
    env.add_filter("striptags", minijinja_contrib::filters::striptags);
    env.add_filter("filesizeformat", minijinja_contrib::filters::filesizeformat);
    env.add_function("cycler", minijinja_contrib::globals::cycler);
    env.add_function("joiner", minijinja_contrib::globals::joiner);
    env
}

/// jinja2's `iterable` test (`iter(value)` succeeds): `none` is not iterable.
fn is_iterable(value: &Value) -> bool {
    value.kind() != ValueKind::None && value.try_iter().is_ok()
}

/// jinja2's `sequence` test (`len(value)` and `value.__getitem__` exist): strings, lists,
/// dicts and undefined values.
fn is_sequence(value: &Value) -> bool {
    matches!(
        value.kind(),
        ValueKind::String
            | ValueKind::Seq
            | ValueKind::Map
            | ValueKind::Undefined
            | ValueKind::Bytes
    )
}

/// jinja2's `indent(width=4, first=False, blank=False)`; `width` may be a string (`blank`
/// only as a keyword).
fn indent(
    state: &State,
    value: &Value,
    width: Option<Value>,
    first: Option<bool>,
    kwargs: Kwargs,
) -> Result<String, Error> {
    let width = kwargs.get::<Option<Value>>("width")?.or(width);
    let first = kwargs
        .get::<Option<bool>>("first")?
        .or(first)
        .unwrap_or(false);
    let blank = kwargs.get::<Option<bool>>("blank")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let indention = match width {
        None => "    ".to_string(),
        Some(w) if w.kind() == ValueKind::String => w.as_str().unwrap_or_default().to_string(),
        Some(w) => {
            let n = i64::try_from(w).map_err(|_| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    "indent: width must be an integer or a string",
                )
            })?;
            " ".repeat(n.clamp(0, 1024) as usize)
        }
    };
    let mut s = py_str(state, value)?;
    s.push('\n');
    let lines = py_splitlines(&s);
    state.consume_fuel(((s.len() + lines.len() * indention.len()) / 64) as u64)?;
    let mut rv = String::new();
    if blank {
        rv = lines.join(&format!("\n{indention}"));
    } else {
        for (i, line) in lines.iter().enumerate() {
            if i > 0 {
                rv.push('\n');
                if !line.is_empty() {
                    rv.push_str(&indention);
                }
            }
            rv.push_str(line);
        }
    }
    if first {
        rv.insert_str(0, &indention);
    }
    Ok(rv)
}

/// Python's `str.splitlines()`.
fn py_splitlines(s: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let end = match c {
            '\r' => {
                if let Some((_, '\n')) = chars.peek() {
                    chars.next();
                    i + 2
                } else {
                    i + 1
                }
            }
            '\n' | '\u{b}' | '\u{c}' | '\u{1c}' | '\u{1d}' | '\u{1e}' | '\u{85}' | '\u{2028}'
            | '\u{2029}' => i + c.len_utf8(),
            _ => continue,
        };
        lines.push(&s[start..i]);
        start = end;
    }
    if start < s.len() {
        lines.push(&s[start..]);
    }
    lines
}

/// jinja2's `center(width=80)`: Python's `str.center`.
fn center(state: &State, value: &Value, width: Option<usize>) -> Result<String, Error> {
    let s = py_str(state, value)?;
    let width = width.unwrap_or(80).min(1 << 20);
    let len = s.chars().count();
    if width <= len {
        return Ok(s);
    }
    state.consume_fuel((width / 64) as u64)?;
    let pad = width - len;
    let left = pad / 2 + (pad & width & 1);
    let mut out = " ".repeat(left);
    out.push_str(&s);
    out.push_str(&" ".repeat(pad - left));
    Ok(out)
}

/// Marks an error raised by the template's `raise_exception`.
#[derive(Debug)]
struct RaisedException(String);

impl fmt::Display for RaisedException {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

fn raise_exception(state: &State, message: Option<Value>) -> Result<Value, Error> {
    let message = match message {
        Some(m) => py_str(state, &m)?,
        None => String::new(),
    };
    Err(Error::new(ErrorKind::InvalidOperation, message.clone())
        .with_source(RaisedException(message)))
}

fn strftime(now: NaiveDateTime, format: &str) -> Result<String, Error> {
    let items: Vec<_> = chrono::format::StrftimeItems::new(format).collect();
    if items
        .iter()
        .any(|i| matches!(i, chrono::format::Item::Error))
    {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format string {format:?}"),
        ));
    }
    let mut out = String::new();
    write!(out, "{}", now.format_with_items(items.into_iter())).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: cannot format {format:?}"),
        )
    })?;
    Ok(out)
}

fn python_formatter(
    out: &mut minijinja::Output,
    state: &mut State,
    value: &Value,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::String | ValueKind::Undefined => minijinja::escape_formatter(out, state, value),
        _ => out.write_str(&py_str(state, value)?).map_err(Error::from),
    }
}

/// jinja2's `string` filter: Python's `str()`.
fn python_string(state: &State, value: &Value) -> Result<Value, Error> {
    if value.kind() == ValueKind::String {
        Ok(value.clone())
    } else {
        Ok(Value::from(py_str(state, value)?))
    }
}

/// Python's `str(value)`. Walking a value charges fuel per element and per 64 bytes, so a
/// structure that shares itself (`[x, x]` nested 60 deep) cannot make this run away.
fn py_str(state: &State, value: &Value) -> Result<String, Error> {
    match value.kind() {
        ValueKind::String => Ok(value.as_str().unwrap_or_default().to_string()),
        ValueKind::Undefined => Ok(String::new()),
        _ => {
            let mut out = String::new();
            py_repr(state, value, &mut out, 0)?;
            Ok(out)
        }
    }
}

/// Python's `repr(value)` for the value kinds a template meets.
fn py_repr(state: &State, value: &Value, out: &mut String, depth: usize) -> Result<(), Error> {
    if depth > DEFAULT_RECURSION_LIMIT {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "value nested too deeply to print",
        ));
    }
    state.consume_fuel(1)?;
    match value.kind() {
        ValueKind::Undefined => out.push_str("Undefined"),
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => push_py_number(value, out),
        ValueKind::String => {
            let s = value.as_str().unwrap_or_default();
            state.consume_fuel((s.len() / 64) as u64)?;
            push_py_str_repr(s, out);
        }
        ValueKind::Seq => {
            let tuple = value.is_tuple();
            out.push(if tuple { '(' } else { '[' });
            let mut n = 0;
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(state, &item, out, depth + 1)?;
                n += 1;
            }
            if tuple && n == 1 {
                out.push(',');
            }
            out.push(if tuple { ')' } else { ']' });
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(state, &key, out, depth + 1)?;
                out.push_str(": ");
                let item = value.get_item(&key).unwrap_or_default();
                py_repr(state, &item, out, depth + 1)?;
            }
            out.push('}');
        }
        _ => out.push_str(&value.to_string()),
    }
    Ok(())
}

fn push_py_number(value: &Value, out: &mut String) {
    if value.is_integer() {
        out.push_str(&value.to_string());
    } else {
        match f64::try_from(value.clone()) {
            Ok(f) => out.push_str(&py_float_repr(f)),
            Err(_) => out.push_str(&value.to_string()),
        }
    }
}

/// Python's `repr(float)`: the shortest round-tripping digits, in scientific notation when the
/// decimal exponent is below -4 or at least 16.
fn py_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f < 0.0 { "-inf".into() } else { "inf".into() };
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` has an exponent");
    let exp: i32 = exp.parse().expect("`{:e}` has an integer exponent");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut out = String::from(sign);
    if (-4..16).contains(&exp) {
        if exp < 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-exp - 1) as usize));
            out.push_str(&digits);
        } else {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                out.extend(std::iter::repeat_n('0', int_len - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    out
}

/// Python's `repr(str)`.
fn push_py_str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !py_printable(c) => {
                let cp = c as u32;
                let _ = if cp < 0x100 {
                    write!(out, "\\x{cp:02x}")
                } else if cp < 0x10000 {
                    write!(out, "\\u{cp:04x}")
                } else {
                    write!(out, "\\U{cp:08x}")
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable()` for one character.
fn py_printable(c: char) -> bool {
    use unicode_general_category::{get_general_category, GeneralCategory as G};
    if c == ' ' {
        return true;
    }
    !matches!(
        get_general_category(c),
        G::Control
            | G::Format
            | G::Surrogate
            | G::PrivateUse
            | G::Unassigned
            | G::LineSeparator
            | G::ParagraphSeparator
            | G::SpaceSeparator
    )
}

// ---------------------------------------------------------------------------------------------
// tojson: Python's json.dumps
// ---------------------------------------------------------------------------------------------

struct JsonStyle {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, which is `json.dumps` with those arguments.
fn tojson(
    state: &State,
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let ensure_ascii = match kwargs
        .get::<Option<Value>>("ensure_ascii")?
        .or(ensure_ascii)
    {
        Some(v) => v.is_true(),
        None => false,
    };
    let indent = match kwargs.get::<Option<Value>>("indent")?.or(indent) {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) if v.kind() == ValueKind::String => {
            Some(v.as_str().unwrap_or_default().to_string())
        }
        Some(v) => match i64::try_from(v.clone()) {
            Ok(n) => Some(" ".repeat(n.clamp(0, 64) as usize)),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                ))
            }
        },
    };
    let (item_sep, key_sep) = match kwargs.get::<Option<Value>>("separators")? {
        Some(v) if !v.is_none() && !v.is_undefined() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => (
                    a.as_str().unwrap().to_string(),
                    b.as_str().unwrap().to_string(),
                ),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ))
                }
            }
        }
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let sort_keys = kwargs
        .get::<Option<Value>>("sort_keys")?
        .is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let style = JsonStyle {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    let mut out = String::new();
    json_dump(state, value, &style, 0, &mut out)?;
    Ok(Value::from(out))
}

/// Writes `value` as `json.dumps` does, charging fuel like [`py_repr`].
fn json_dump(
    state: &State,
    value: &Value,
    style: &JsonStyle,
    level: usize,
    out: &mut String,
) -> Result<(), Error> {
    if level > DEFAULT_RECURSION_LIMIT {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: value nested too deeply",
        ));
    }
    state.consume_fuel(1)?;
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if value.is_integer() {
                out.push_str(&value.to_string());
            } else {
                let f = f64::try_from(value.clone())?;
                if f.is_nan() {
                    out.push_str("NaN");
                } else if f.is_infinite() {
                    out.push_str(if f < 0.0 { "-Infinity" } else { "Infinity" });
                } else {
                    out.push_str(&py_float_repr(f));
                }
            }
        }
        ValueKind::String => {
            let s = value.as_str().unwrap_or_default();
            state.consume_fuel((s.len() / 64) as u64)?;
            json_string(s, style.ensure_ascii, out);
        }
        ValueKind::Seq => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                json_newline(style, level + 1, out);
                json_dump(state, item, style, level + 1, out)?;
            }
            json_newline(style, level, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                let key = match key.kind() {
                    ValueKind::String => key.as_str().unwrap_or_default().to_string(),
                    ValueKind::None => "null".into(),
                    ValueKind::Bool => if key.is_true() { "true" } else { "false" }.into(),
                    ValueKind::Number => {
                        let mut s = String::new();
                        json_dump(state, &key, style, level + 1, &mut s)?;
                        s
                    }
                    other => {
                        return Err(Error::new(
                            ErrorKind::InvalidOperation,
                            format!(
                                "tojson: keys must be str, int, float, bool or None, not {other}"
                            ),
                        ))
                    }
                };
                entries.push((key, item));
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                json_newline(style, level + 1, out);
                json_string(key, style.ensure_ascii, out);
                out.push_str(&style.key_sep);
                json_dump(state, item, style, level + 1, out)?;
            }
            json_newline(style, level, out);
            out.push('}');
        }
        ValueKind::Undefined => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "Object of type Undefined is not JSON serializable",
            ))
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("Object of type {other} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

fn json_newline(style: &JsonStyle, level: usize, out: &mut String) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

fn json_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

// ---------------------------------------------------------------------------------------------
// Errors, output limit, `{% generation %}`
// ---------------------------------------------------------------------------------------------

fn convert_error(err: &Error, fuel: u64) -> ChatTemplateError {
    let line = err.line();
    if let Some(raised) = find_source::<RaisedException>(err) {
        return ChatTemplateError::Raised {
            message: raised.0.clone(),
            line,
        };
    }
    if err.kind() == ErrorKind::OutOfFuel {
        return ChatTemplateError::OutOfFuel { fuel, line };
    }
    let mut message = match err.detail() {
        Some(detail) => format!("{}: {detail}", err.kind()),
        None => err.kind().to_string(),
    };
    let mut source = std::error::Error::source(err);
    while let Some(inner) = source {
        let _ = write!(message, ": {inner}");
        source = inner.source();
    }
    if err.kind() == ErrorKind::SyntaxError {
        ChatTemplateError::Syntax { message, line }
    } else {
        ChatTemplateError::Render { message, line }
    }
}

fn find_source<T: std::error::Error + 'static>(err: &Error) -> Option<&T> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(inner) = source {
        if let Some(found) = inner.downcast_ref::<T>() {
            return Some(found);
        }
        if let Some(mj) = inner.downcast_ref::<Error>() {
            if let Some(found) = find_source::<T>(mj) {
                return Some(found);
            }
        }
        source = inner.source();
    }
    None
}

struct LimitedWriter<'a> {
    buf: Vec<u8>,
    limit: usize,
    overflow: &'a AtomicBool,
}

impl io::Write for LimitedWriter<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > self.limit {
            self.overflow.store(true, Ordering::Relaxed);
            return Err(io::Error::other("chat template output limit reached"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Rewrites transformers' `{% generation %}` / `{% endgeneration %}` tags (which only mark
/// assistant text for training masks) as `{% if true %}` / `{% endif %}`, keeping their
/// whitespace-control markers so the output is unchanged.
fn rewrite_generation_tags(source: &str) -> String {
    if !source.contains("generation") {
        return source.to_string();
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        match parse_generation_tag(tag) {
            Some((len, open_marker, keyword, close_marker)) => {
                let body = if keyword == "generation" {
                    "if true"
                } else {
                    "endif"
                };
                let _ = write!(out, "{{%{open_marker} {body} {close_marker}%}}");
                rest = &tag[len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Parses `{%[-+]? generation|endgeneration [-+]?%}` at the start of `s`: (length, opening
/// marker, keyword, closing marker).
fn parse_generation_tag(s: &str) -> Option<(usize, &str, &str, &str)> {
    let mut i = 2;
    let open = match s.as_bytes().get(i) {
        Some(b'-') | Some(b'+') => {
            i += 1;
            &s[2..3]
        }
        _ => "",
    };
    let after_ws = s[i..].trim_start();
    i = s.len() - after_ws.len();
    let keyword = if after_ws.starts_with("endgeneration") {
        "endgeneration"
    } else if after_ws.starts_with("generation") {
        "generation"
    } else {
        return None;
    };
    i += keyword.len();
    let after_kw = &s[i..];
    let trimmed = after_kw.trim_start();
    if trimmed.len() == after_kw.len() && !trimmed.starts_with(['-', '+', '%']) {
        return None; // `{% generation_x %}` is another name
    }
    i = s.len() - trimmed.len();
    let close = match s.as_bytes().get(i) {
        Some(b'-') | Some(b'+') => {
            i += 1;
            &s[i - 1..i]
        }
        _ => "",
    };
    if s[i..].starts_with("%}") {
        Some((i + 2, open, keyword, close))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        for (f, want) in [
            (1.0, "1.0"),
            (2.5, "2.5"),
            (1e20, "1e+20"),
            (1.5e-7, "1.5e-07"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (-0.0, "-0.0"),
            (-0.5, "-0.5"),
            (0.1, "0.1"),
            (1e100, "1e+100"),
            (f64::NAN, "nan"),
            (f64::NEG_INFINITY, "-inf"),
        ] {
            assert_eq!(py_float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn str_repr_matches_python() {
        let cases = [
            ("it's", "\"it's\""),
            ("say \"hi\"", "'say \"hi\"'"),
            ("both ' \"", "'both \\' \"'"),
            ("tab\tnl\n", "'tab\\tnl\\n'"),
            ("é\u{7f}\u{2028}\u{a0}", "'é\\x7f\\u2028\\xa0'"),
        ];
        for (s, want) in cases {
            let mut out = String::new();
            push_py_str_repr(s, &mut out);
            assert_eq!(out, want);
        }
    }

    #[test]
    fn generation_tags_are_rewritten() {
        assert_eq!(
            rewrite_generation_tags("a{% generation %}b{%- endgeneration -%}c{% generations %}"),
            "a{% if true %}b{%- endif -%}c{% generations %}"
        );
        assert_eq!(
            rewrite_generation_tags("{%+generation+%}"),
            "{%+ if true +%}"
        );
    }
}
