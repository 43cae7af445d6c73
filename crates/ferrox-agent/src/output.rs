//! One generation's output split into reasoning, content and tool calls, as it streams.

use crate::reasoning::ReasoningSplitter;
use crate::tools::{ParseEvent, ToolCallParser};

/// A piece of a reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delta {
    Reasoning(String),
    Content(String),
    CallStart { index: usize, name: String },
    CallArgs { index: usize, text: String },
}

/// Reasoning is split off first; what remains goes through the tool-call parser.
pub struct OutputParser {
    reasoning: Option<ReasoningSplitter>,
    tools: Option<Box<dyn ToolCallParser>>,
    events: Vec<ParseEvent>,
}

impl OutputParser {
    pub fn new(
        reasoning: Option<ReasoningSplitter>,
        tools: Option<Box<dyn ToolCallParser>>,
    ) -> OutputParser {
        OutputParser {
            reasoning,
            tools,
            events: Vec::new(),
        }
    }

    /// Whether it does anything (else content passes through unchanged).
    pub fn is_active(&self) -> bool {
        self.reasoning.is_some() || self.tools.is_some()
    }

    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        let mut out = Vec::new();
        let (reasoning, content) = match &mut self.reasoning {
            Some(r) => {
                let s = r.push(text);
                (s.reasoning, s.content)
            }
            None => (String::new(), text.to_string()),
        };
        if !reasoning.is_empty() {
            out.push(Delta::Reasoning(reasoning));
        }
        self.content(&content, false, &mut out);
        out
    }

    pub fn finish(&mut self) -> Vec<Delta> {
        let mut out = Vec::new();
        let (reasoning, content) = match &mut self.reasoning {
            Some(r) => {
                let s = r.finish();
                (s.reasoning, s.content)
            }
            None => (String::new(), String::new()),
        };
        if !reasoning.is_empty() {
            out.push(Delta::Reasoning(reasoning));
        }
        self.content(&content, true, &mut out);
        out
    }

    fn content(&mut self, text: &str, last: bool, out: &mut Vec<Delta>) {
        match &mut self.tools {
            None => {
                if !text.is_empty() {
                    out.push(Delta::Content(text.to_string()));
                }
            }
            Some(parser) => {
                if !text.is_empty() {
                    parser.push(text, &mut self.events);
                }
                if last {
                    parser.finish(&mut self.events);
                }
                out.extend(self.events.drain(..).map(|e| match e {
                    ParseEvent::Content(t) => Delta::Content(t),
                    ParseEvent::CallStart { index, name } => Delta::CallStart { index, name },
                    ParseEvent::CallArgs { index, text } => Delta::CallArgs { index, text },
                }));
            }
        }
    }

    /// Tool calls found so far.
    pub fn calls(&self) -> usize {
        self.tools.as_ref().map_or(0, |t| t.calls())
    }
}
