//! Tool calls: the request side (`tools`, `tool_choice`), the format a model family writes
//! its calls in (chosen from its chat template, as llama.cpp's `common_chat_templates`
//! does), a streaming parser per format that splits the model's text into content and
//! calls, and the grammar that forces a valid call when one is required.
//!
//! Formats, one module each: [`hermes`] (`<tool_call>{"name", "arguments"}</tool_call>`:
//! Hermes 2/3, Qwen 2.5 and Qwen 3), [`qwen3_coder`] (`<tool_call><function=...>` XML),
//! [`llama3`] (a bare `{"name", "parameters"}` object, optionally after
//! `<|python_tag|>`: Llama 3.1 to 3.3), [`mistral`] (`[TOOL_CALLS][{"name", "arguments"},
//! ...]`: Mistral Nemo, Small, Ministral), [`deepseek`] (V3, R1, V3.1+), [`kimi`] (Kimi
//! K2) and [`glm`] (GLM-4.5+ `<arg_key>` / `<arg_value>` pairs).
//!
//! Control tokens a format's markers are made of (`[TOOL_CALLS]`, `<|tool_call_begin|>`)
//! must be rendered in the text the parser reads: [`ToolFormat::markers`] lists them.

pub mod deepseek;
pub mod glm;
pub mod hermes;
mod json_scan;
pub mod kimi;
pub mod llama3;
pub mod mistral;
pub mod qwen3_coder;
pub mod tagged;

use std::collections::HashSet;

use serde_json::{json, Value};

use crate::GrammarSpec;

/// One function the model may call (`tools[i].function`).
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// The arguments' JSON schema (`{"type": "object"}` when the tool gave none).
    pub parameters: Value,
}

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// Never call a tool (the template still sees the tools).
    None,
    /// The model decides.
    #[default]
    Auto,
    /// At least one call, of any tool.
    Required,
    /// One call of this function.
    Named(String),
}

/// A request's tools and how they may be used.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    /// More than one call per turn (`parallel_tool_calls`, default true).
    pub parallel: bool,
}

impl Tool {
    /// A tool from its name, description and arguments' schema as a request gives them:
    /// no schema (or null) is `{"type": "object"}`; `None` when the schema is not an object.
    pub fn new(name: &str, description: Option<&Value>, schema: Option<&Value>) -> Option<Tool> {
        let parameters = match schema {
            None | Some(Value::Null) => json!({"type": "object"}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => return None,
        };
        Some(Tool {
            name: name.to_string(),
            description: description.and_then(Value::as_str).map(str::to_string),
            parameters,
        })
    }
}

impl ToolSpec {
    /// The spec of a request that gave `tools` (`None` when it gave none).
    pub fn given(tools: Vec<Tool>, choice: ToolChoice, parallel: bool) -> Option<ToolSpec> {
        (!tools.is_empty()).then_some(ToolSpec {
            tools,
            choice,
            parallel,
        })
    }

    /// Parses OpenAI's `tools` array (`[{"type": "function", "function": {"name",
    /// "description", "parameters"}}]`); the error names the offending entry.
    pub fn parse_tools(tools: &Value) -> Result<Vec<Tool>, (String, String)> {
        let Some(items) = tools.as_array() else {
            return Err(("tools".into(), "'tools' must be an array".into()));
        };
        let mut out = Vec::with_capacity(items.len());
        let mut seen = HashSet::new();
        for (i, item) in items.iter().enumerate() {
            let at = format!("tools[{i}]");
            let err = |m: &str| Err((at.clone(), format!("'{at}' {m}")));
            match item.get("type").and_then(Value::as_str) {
                Some("function") => {}
                Some(other) => {
                    return err(&format!(
                        "has type '{other}'; only 'function' tools are supported"
                    ))
                }
                None => return err("needs \"type\": \"function\""),
            }
            let Some(f) = item.get("function").and_then(Value::as_object) else {
                return err("needs a 'function' object");
            };
            let Some(name) = f.get("name").and_then(Value::as_str) else {
                return err("needs 'function.name'");
            };
            if let Err(m) = Self::check_name(name, &mut seen) {
                return err(&m);
            }
            let Some(tool) = Tool::new(name, f.get("description"), f.get("parameters")) else {
                return err("has 'function.parameters' that is not an object");
            };
            out.push(tool);
        }
        Ok(out)
    }

    /// Parses `tool_choice` against the tools.
    pub fn parse_choice(choice: Option<&Value>, tools: &[Tool]) -> Result<ToolChoice, String> {
        let choice = match choice {
            None | Some(Value::Null) => return Ok(ToolChoice::Auto),
            Some(Value::String(s)) => match s.as_str() {
                "none" => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "required" | "any" => ToolChoice::Required,
                other => {
                    return Err(format!(
                        "'tool_choice' must be 'none', 'auto', 'required' or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got '{other}'"
                    ))
                }
            },
            Some(Value::Object(o)) => {
                let name = o
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .or_else(|| o.get("name"))
                    .and_then(Value::as_str)
                    .ok_or("'tool_choice' names no function ('tool_choice.function.name')")?;
                ToolChoice::Named(name.to_string())
            }
            Some(_) => return Err("'tool_choice' must be a string or an object".into()),
        };
        Self::check_choice(choice, tools)
    }

    /// Checks a tool name (letters, digits, `_`, `-`, `.`, `:`; at most 128) and that no
    /// earlier tool has it (`seen`, which it joins: linear in the number of tools, whatever
    /// a request sends); the error completes "the tool ...".
    pub fn check_name<'a>(name: &'a str, seen: &mut HashSet<&'a str>) -> Result<(), String> {
        if name.is_empty()
            || name.len() > 128
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
        {
            return Err(format!(
                "has an invalid function name {name:?} (letters, digits, '_', '-', '.', ':'; at most 128)"
            ));
        }
        if !seen.insert(name) {
            return Err(format!("repeats the function name '{name}'"));
        }
        Ok(())
    }

    /// Checks a choice against the tools: `Required` needs some, `Named` one of them.
    pub fn check_choice(choice: ToolChoice, tools: &[Tool]) -> Result<ToolChoice, String> {
        match &choice {
            ToolChoice::Required if tools.is_empty() => {
                Err("'tool_choice' is 'required' but no 'tools' were given".into())
            }
            ToolChoice::Named(name) if !tools.iter().any(|t| &t.name == name) => Err(format!(
                "'tool_choice' names the function '{name}', which is not among the 'tools'"
            )),
            _ => Ok(choice),
        }
    }

    /// The tools as the chat template receives them (OpenAI's shape, as HF's
    /// `apply_chat_template` gets them).
    pub fn template_tools(&self) -> Value {
        Value::Array(
            self.tools
                .iter()
                .map(|t| {
                    let mut f = serde_json::Map::new();
                    f.insert("name".into(), json!(t.name));
                    if let Some(d) = &t.description {
                        f.insert("description".into(), json!(d));
                    }
                    f.insert("parameters".into(), t.parameters.clone());
                    json!({"type": "function", "function": f})
                })
                .collect(),
        )
    }

    /// The tools a forced call may use (`None`: the output is not forced).
    pub fn forced(&self) -> Option<Vec<&Tool>> {
        match &self.choice {
            ToolChoice::Required => Some(self.tools.iter().collect()),
            ToolChoice::Named(n) => Some(self.tools.iter().filter(|t| &t.name == n).collect()),
            ToolChoice::None | ToolChoice::Auto => None,
        }
    }
}

/// How a model family writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Qwen3Coder,
    Llama3,
    Mistral,
    /// `fenced`: V3 / R1's `function<sep>NAME` and fenced JSON; else V3.1's `NAME<sep>JSON`.
    DeepSeek {
        fenced: bool,
    },
    Kimi,
    Glm,
}

impl ToolFormat {
    /// The format a chat template teaches its model (`None`: the template shows no tool
    /// calls; ferrox then uses [`ToolFormat::Hermes`], the most common).
    pub fn detect(template: &str) -> Option<ToolFormat> {
        if template.contains("<｜tool▁call▁begin｜>") {
            Some(ToolFormat::DeepSeek {
                fenced: template.contains("```json"),
            })
        } else if template.contains("<|tool_call_begin|>") {
            Some(ToolFormat::Kimi)
        } else if template.contains("<arg_key>") {
            Some(ToolFormat::Glm)
        } else if template.contains("<function=") && template.contains("<parameter=") {
            Some(ToolFormat::Qwen3Coder)
        } else if template.contains("<tool_call>") {
            Some(ToolFormat::Hermes)
        } else if template.contains("[TOOL_CALLS]") {
            Some(ToolFormat::Mistral)
        } else if template.contains("<|python_tag|>")
            || (template.contains("<|start_header_id|>") && template.contains("\"parameters\""))
        {
            Some(ToolFormat::Llama3)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "hermes",
            ToolFormat::Qwen3Coder => "qwen3-coder",
            ToolFormat::Llama3 => "llama3",
            ToolFormat::Mistral => "mistral",
            ToolFormat::DeepSeek { .. } => "deepseek",
            ToolFormat::Kimi => "kimi-k2",
            ToolFormat::Glm => "glm",
        }
    }

    /// The marker strings of the format (those that are control tokens must be rendered
    /// in the output text for the parser to see them).
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Hermes | ToolFormat::Qwen3Coder => &["<tool_call>", "</tool_call>"],
            ToolFormat::Glm => &[
                "<tool_call>",
                "</tool_call>",
                "<arg_key>",
                "</arg_key>",
                "<arg_value>",
                "</arg_value>",
            ],
            ToolFormat::Llama3 => &["<|python_tag|>"],
            ToolFormat::Mistral => &["[TOOL_CALLS]"],
            ToolFormat::DeepSeek { .. } => &[
                "<｜tool▁calls▁begin｜>",
                "<｜tool▁calls▁end｜>",
                "<｜tool▁call▁begin｜>",
                "<｜tool▁call▁end｜>",
                "<｜tool▁sep｜>",
            ],
            ToolFormat::Kimi => &[
                "<|tool_calls_section_begin|>",
                "<|tool_calls_section_end|>",
                "<|tool_call_begin|>",
                "<|tool_call_argument_begin|>",
                "<|tool_call_end|>",
            ],
        }
    }

    /// A parser for one generation's output.
    pub fn parser(self) -> Box<dyn ToolCallParser> {
        match self {
            ToolFormat::Hermes => Box::new(hermes::Parser::default()),
            ToolFormat::Qwen3Coder => Box::new(tagged::Parser::new(&qwen3_coder::MARKERS)),
            ToolFormat::Llama3 => Box::new(llama3::Parser::default()),
            ToolFormat::Mistral => Box::new(mistral::Parser::default()),
            ToolFormat::DeepSeek { .. } => Box::new(tagged::Parser::new(&deepseek::MARKERS)),
            ToolFormat::Kimi => Box::new(tagged::Parser::new(&kimi::MARKERS)),
            ToolFormat::Glm => Box::new(tagged::Parser::new(&glm::MARKERS)),
        }
    }

    /// The grammar of a forced call: one call (or, with `parallel`, one or more) of the
    /// given tools. JSON formats get arguments valid for each tool's schema; the XML formats
    /// (Qwen3-Coder, GLM) get the tool's parameter names with free text values.
    /// `is_control(marker)`: the marker is a control token (matched by name, not text).
    pub fn call_grammar(
        self,
        tools: &[&Tool],
        parallel: bool,
        is_control: &dyn Fn(&str) -> bool,
    ) -> GrammarSpec {
        let lit = |m: &str| -> String {
            if is_control(m) {
                m.to_string()
            } else {
                serde_json::to_string(m).expect("a string serializes")
            }
        };
        let json_call = || {
            crate::constraint::tool_schema_layout(call_schema(tools, self.arguments_key()))
                .to_string()
        };
        let repeat = |sep: &str| {
            if parallel {
                format!(" ({sep} call)*")
            } else {
                String::new()
            }
        };
        let per_tool = |f: &dyn Fn(usize, &Tool) -> String| -> String {
            let mut rules = String::from("call: ");
            rules.push_str(
                &(0..tools.len())
                    .map(|i| format!("tool{i}"))
                    .collect::<Vec<_>>()
                    .join(" | "),
            );
            rules.push('\n');
            for (i, t) in tools.iter().enumerate() {
                rules.push_str(&f(i, t));
                rules.push('\n');
            }
            rules
        };
        let params = |t: &Tool| -> Vec<String> {
            t.parameters
                .get("properties")
                .and_then(Value::as_object)
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default()
        };
        let lark = match self {
            ToolFormat::Hermes => format!(
                "start: call{}\ncall: {} \"\\n\" %json {} \"\\n\" {}\n",
                repeat("\"\\n\""),
                lit("<tool_call>"),
                json_call(),
                lit("</tool_call>")
            ),
            ToolFormat::Llama3 => format!("start: %json {}\n", json_call()),
            ToolFormat::Mistral => format!(
                "start: {} \"[\" call{} \"]\"\ncall: %json {}\n",
                lit("[TOOL_CALLS]"),
                repeat("\", \""),
                json_call()
            ),
            ToolFormat::DeepSeek { fenced } => {
                let body = per_tool(&|i, t| {
                    let schema = crate::constraint::tool_schema_layout(t.parameters.clone());
                    let name = serde_json::to_string(&t.name).expect("a string serializes");
                    if fenced {
                        format!(
                            "tool{i}: {} \"function\" {} {name} \"\\n```json\\n\" %json {schema} \"\\n```\" {}",
                            lit("<｜tool▁call▁begin｜>"),
                            lit("<｜tool▁sep｜>"),
                            lit("<｜tool▁call▁end｜>")
                        )
                    } else {
                        format!(
                            "tool{i}: {} {name} {} %json {schema} {}",
                            lit("<｜tool▁call▁begin｜>"),
                            lit("<｜tool▁sep｜>"),
                            lit("<｜tool▁call▁end｜>")
                        )
                    }
                });
                format!(
                    "start: {} call{} {}\n{body}",
                    lit("<｜tool▁calls▁begin｜>"),
                    repeat("\"\\n\""),
                    lit("<｜tool▁calls▁end｜>")
                )
            }
            ToolFormat::Kimi => {
                let body = per_tool(&|i, t| {
                    let schema = crate::constraint::tool_schema_layout(t.parameters.clone());
                    let id = serde_json::to_string(&format!("functions.{}:", t.name))
                        .expect("a string serializes");
                    format!(
                        "tool{i}: {} {id} /[0-9]/ {} %json {schema} {}",
                        lit("<|tool_call_begin|>"),
                        lit("<|tool_call_argument_begin|>"),
                        lit("<|tool_call_end|>")
                    )
                });
                format!(
                    "start: {} call{} {}\n{body}",
                    lit("<|tool_calls_section_begin|>"),
                    if parallel { "+" } else { "" },
                    lit("<|tool_calls_section_end|>")
                )
            }
            ToolFormat::Qwen3Coder => {
                let body = per_tool(&|i, t| {
                    let name = serde_json::to_string(&format!("\n<function={}>\n", t.name))
                        .expect("a string serializes");
                    let keys = params(t);
                    let param = if keys.is_empty() {
                        String::new()
                    } else {
                        let names = keys
                            .iter()
                            .map(|k| {
                                serde_json::to_string(&format!("<parameter={k}>\n"))
                                    .expect("a string serializes")
                            })
                            .collect::<Vec<_>>()
                            .join(" | ");
                        format!(" (({names}) /[^<]{{1,200}}/ \"</parameter>\\n\")*")
                    };
                    format!(
                        "tool{i}: {} {name}{param} \"</function>\\n\" {}",
                        lit("<tool_call>"),
                        lit("</tool_call>")
                    )
                });
                format!("start: call{}\n{body}", repeat("\"\\n\""))
            }
            ToolFormat::Glm => {
                let body = per_tool(&|i, t| {
                    let name = serde_json::to_string(&format!("{}\n", t.name))
                        .expect("a string serializes");
                    let keys = params(t);
                    let param = if keys.is_empty() {
                        String::new()
                    } else {
                        let names = keys
                            .iter()
                            .map(|k| serde_json::to_string(k).expect("a string serializes"))
                            .collect::<Vec<_>>()
                            .join(" | ");
                        format!(
                            " ({} ({names}) {} \"\\n\" {} /[^<]{{1,200}}/ {} \"\\n\")*",
                            lit("<arg_key>"),
                            lit("</arg_key>"),
                            lit("<arg_value>"),
                            lit("</arg_value>")
                        )
                    };
                    format!(
                        "tool{i}: {} {name}{param} {}",
                        lit("<tool_call>"),
                        lit("</tool_call>")
                    )
                });
                format!("start: call{}\n{body}", repeat("\"\\n\""))
            }
        };
        GrammarSpec::Lark(lark)
    }

    fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Llama3 => "parameters",
            _ => "arguments",
        }
    }
}

/// The JSON schema of one call object `{"name": ..., "<arguments>": ...}` of any of `tools`.
fn call_schema(tools: &[&Tool], arguments: &str) -> Value {
    let one = |t: &Tool| {
        json!({
            "type": "object",
            "properties": {
                "name": {"const": t.name},
                arguments: t.parameters,
            },
            "required": ["name", arguments],
            "additionalProperties": false,
        })
    };
    match tools {
        [t] => one(t),
        _ => json!({"anyOf": tools.iter().map(|t| one(t)).collect::<Vec<_>>()}),
    }
}

/// What a parser found in the text it was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParseEvent {
    /// Ordinary reply text.
    Content(String),
    /// A call begins: its index (0, 1, ...) and function name.
    CallStart { index: usize, name: String },
    /// More of a call's arguments (JSON text; the pieces concatenate to the arguments).
    CallArgs { index: usize, text: String },
}

/// Splits a model's output into content and tool calls, text piece by text piece.
pub trait ToolCallParser: Send {
    /// Takes the next piece of output.
    fn push(&mut self, text: &str, out: &mut Vec<ParseEvent>);
    /// The output ended: releases what was held back.
    fn finish(&mut self, out: &mut Vec<ParseEvent>);
    /// Calls started so far.
    fn calls(&self) -> usize;
}

/// One call, assembled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: String,
}

/// A whole output, parsed: its content and its calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub content: String,
    pub calls: Vec<ParsedCall>,
}

impl Parsed {
    /// Adds events to the result.
    pub fn absorb(&mut self, events: &[ParseEvent]) {
        for e in events {
            match e {
                ParseEvent::Content(t) => self.content.push_str(t),
                ParseEvent::CallStart { index, name } => {
                    debug_assert_eq!(*index, self.calls.len());
                    self.calls.push(ParsedCall {
                        name: name.clone(),
                        arguments: String::new(),
                    });
                }
                ParseEvent::CallArgs { index, text } => {
                    if let Some(c) = self.calls.get_mut(*index) {
                        c.arguments.push_str(text);
                    }
                }
            }
        }
    }
}

/// Parses a whole output at once.
pub fn parse_all(format: ToolFormat, text: &str) -> Parsed {
    let mut parser = format.parser();
    let mut events = Vec::new();
    parser.push(text, &mut events);
    parser.finish(&mut events);
    let mut parsed = Parsed::default();
    parsed.absorb(&events);
    parsed
}

/// The longest suffix of `text` that is a proper prefix of `marker` (held back in case the
/// marker completes in the next piece); its byte length.
pub(crate) fn partial_suffix(text: &str, marker: &str) -> usize {
    let max = marker.len().saturating_sub(1).min(text.len());
    (1..=max)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

/// An OpenAI tool call id: `call_` and 24 letters and digits.
pub fn call_id() -> String {
    use rand::distr::{Alphanumeric, SampleString};
    format!("call_{}", Alphanumeric.sample_string(&mut rand::rng(), 24))
}

/// The arguments of an assistant message's `tool_calls` as templates expect them: OpenAI
/// sends `function.arguments` as a JSON string, templates print it with `tojson` and
/// expect an object (as llama-server does, a string that parses as JSON is replaced by
/// its value).
pub fn arguments_as_objects(message: &mut Value) {
    let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut) else {
        return;
    };
    for call in calls {
        if let Some(args) = call
            .get_mut("function")
            .and_then(|f| f.get_mut("arguments"))
        {
            if let Value::String(s) = args {
                if let Ok(v) = serde_json::from_str::<Value>(s) {
                    *args = v;
                }
            }
        }
    }
}
