//! Llama 3.1-3.3 calls: the whole reply is a JSON object `{"name": ..., "parameters":
//! {...}}` (after `<|python_tag|>`, a control token the text never shows), several
//! separated by `;`. A reply that starts with anything but `{` is content, streamed as it
//! comes; one that starts with `{` is held to the end and is calls if it parses as calls,
//! content otherwise.

use super::json_scan::whole_call;
use super::{ParseEvent, ToolCallParser};

const ARGS: &[&str] = &["parameters", "arguments"];
const PYTHON_TAG: &str = "<|python_tag|>";

#[derive(Default)]
pub struct Parser {
    /// None: nothing but whitespace yet; Some(true): holding a possible call.
    calls_mode: Option<bool>,
    buf: String,
    calls: usize,
}

/// Splits `text` into consecutive JSON values separated by whitespace or `;`.
pub(crate) fn json_values(text: &str) -> Option<Vec<serde_json::Value>> {
    let mut values = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<serde_json::Value>();
        let value = stream.next()?.ok()?;
        let used = stream.byte_offset();
        values.push(value);
        rest = rest[used..]
            .trim_start()
            .trim_start_matches(';')
            .trim_start();
    }
    Some(values)
}

impl ToolCallParser for Parser {
    fn push(&mut self, text: &str, out: &mut Vec<ParseEvent>) {
        match self.calls_mode {
            Some(false) => out.push(ParseEvent::Content(text.to_string())),
            Some(true) => self.buf.push_str(text),
            None => {
                self.buf.push_str(text);
                let trimmed = self.buf.trim_start();
                if let Some(rest) = trimmed.strip_prefix(PYTHON_TAG) {
                    self.buf = rest.to_string();
                    self.calls_mode = Some(true);
                    return;
                }
                if PYTHON_TAG.starts_with(trimmed) && !trimmed.is_empty() {
                    return;
                }
                if let Some(c) = trimmed.chars().next() {
                    if c == '{' {
                        self.calls_mode = Some(true);
                    } else {
                        self.calls_mode = Some(false);
                        out.push(ParseEvent::Content(std::mem::take(&mut self.buf)));
                    }
                }
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<ParseEvent>) {
        let text = std::mem::take(&mut self.buf);
        if self.calls_mode == Some(true) {
            let calls: Option<Vec<(String, String)>> =
                json_values(&text).and_then(|vs| vs.iter().map(|v| whole_call(v, ARGS)).collect());
            if let Some(calls) = calls.filter(|c| !c.is_empty()) {
                for (name, arguments) in calls {
                    out.push(ParseEvent::CallStart {
                        index: self.calls,
                        name,
                    });
                    out.push(ParseEvent::CallArgs {
                        index: self.calls,
                        text: arguments,
                    });
                    self.calls += 1;
                }
                return;
            }
        }
        if !text.is_empty() {
            out.push(ParseEvent::Content(text));
        }
    }

    fn calls(&self) -> usize {
        self.calls
    }
}
