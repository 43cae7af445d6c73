//! Mistral calls (Nemo, Small 3.x, Ministral): `[TOOL_CALLS]` then a JSON array of
//! `{"name": ..., "arguments": {...}}` objects. Text before the marker is content, streamed
//! as it comes; from the marker on the reply is held to the end and is calls if the array
//! parses, content otherwise. A reply that opens with the array itself (`[{"name"...`, when
//! the marker token is not shown) counts too.

use super::json_scan::whole_call;
use super::llama3::json_values;
use super::{partial_suffix, ParseEvent, ToolCallParser};

pub const MARKER: &str = "[TOOL_CALLS]";
const ARGS: &[&str] = &["arguments", "parameters"];

#[derive(Default)]
pub struct Parser {
    /// Holding a possible call array (from the marker on).
    holding: bool,
    /// Nothing but whitespace has been released yet.
    at_start: bool,
    started: bool,
    buf: String,
    calls: usize,
}

impl Parser {
    fn release(&mut self, text: String, out: &mut Vec<ParseEvent>) {
        if !text.is_empty() {
            out.push(ParseEvent::Content(text));
        }
    }
}

impl ToolCallParser for Parser {
    fn push(&mut self, text: &str, out: &mut Vec<ParseEvent>) {
        if !self.started {
            self.started = true;
            self.at_start = true;
        }
        self.buf.push_str(text);
        if self.holding {
            return;
        }
        if let Some(p) = self.buf.find(MARKER) {
            let before: String = self.buf.drain(..p).collect();
            self.release(before, out);
            self.holding = true;
            return;
        }
        if self.at_start {
            let t = self.buf.trim_start();
            if t.is_empty() || "[{".starts_with(t) || MARKER.starts_with(t) {
                return;
            }
            if t.starts_with("[{") {
                self.holding = true;
                return;
            }
            self.at_start = false;
        }
        let keep = partial_suffix(&self.buf, MARKER);
        let emit: String = self.buf.drain(..self.buf.len() - keep).collect();
        self.release(emit, out);
    }

    fn finish(&mut self, out: &mut Vec<ParseEvent>) {
        let text = std::mem::take(&mut self.buf);
        if self.holding {
            let body = text
                .trim_start()
                .strip_prefix(MARKER)
                .unwrap_or(text.trim_start());
            let calls: Option<Vec<(String, String)>> = json_values(body).and_then(|vs| {
                let mut calls = Vec::new();
                for v in vs {
                    match v {
                        serde_json::Value::Array(items) => {
                            for item in items {
                                calls.push(whole_call(&item, ARGS)?);
                            }
                        }
                        v => calls.push(whole_call(&v, ARGS)?),
                    }
                }
                Some(calls)
            });
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
        self.release(text, out);
    }

    fn calls(&self) -> usize {
        self.calls
    }
}
