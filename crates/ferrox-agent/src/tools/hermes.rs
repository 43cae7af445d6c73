//! Hermes-style calls (Hermes 2 Pro and 3, Qwen 2.5, Qwen 3): each call is a JSON object
//! `{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>` lines.
//! Text outside the tags is content. The name is reported as soon as it is read and the
//! arguments stream as they are written. As llama.cpp's parser does, a reply that opens
//! with a bare call object (no tags; small Qwen 2.5 models often write that) is a call too.

use super::json_scan::{call_head, whole_call, Head, ValueEnd};
use super::{partial_suffix, ParseEvent, ToolCallParser};

pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";
const ARGS: &[&str] = &["arguments", "parameters"];

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    #[default]
    Text,
    /// After `<tool_call>`, reading `{"name": ..., "arguments": `.
    Head,
    /// Streaming the arguments' value.
    Args,
    /// After the arguments, until `</tool_call>`.
    Tail,
    /// A call object of another shape: kept whole until `</tool_call>`.
    Whole,
    /// A reply opening with `{`: a bare call if it reads as one.
    BareHead,
    /// After a bare call's arguments: its closing `}`.
    BareTail,
}

#[derive(Default)]
pub struct Parser {
    state: State,
    buf: String,
    calls: usize,
    args: ValueEnd,
    /// Whitespace-only content, held until something else follows (dropped next to calls).
    blank: String,
    /// Content other than whitespace has been released (no bare call can follow).
    in_content: bool,
    /// The call being read has no tags.
    bare: bool,
}

impl Parser {
    fn content(&mut self, text: &str, out: &mut Vec<ParseEvent>) {
        if text.is_empty() {
            return;
        }
        self.blank.push_str(text);
        if !self.blank.trim().is_empty() {
            self.in_content = true;
            out.push(ParseEvent::Content(std::mem::take(&mut self.blank)));
        }
    }

    fn start_call(&mut self) {
        // Whitespace between content and a call, or between calls, is not content.
        self.blank.clear();
    }

    fn parse_next(&mut self, out: &mut Vec<ParseEvent>) -> bool {
        match self.state {
            State::Text => {
                if !self.in_content {
                    let t = self.buf.trim_start();
                    if t.is_empty() {
                        return false;
                    }
                    if t.starts_with('{') {
                        let skip = self.buf.len() - t.len();
                        let ws: String = self.buf.drain(..skip).collect();
                        self.content(&ws, out);
                        self.state = State::BareHead;
                        return true;
                    }
                }
                if let Some(p) = self.buf.find(OPEN) {
                    let before = self.buf[..p].to_string();
                    self.content(&before, out);
                    self.buf.drain(..p + OPEN.len());
                    self.start_call();
                    self.state = State::Head;
                    true
                } else {
                    let keep = partial_suffix(&self.buf, OPEN);
                    let emit: String = self.buf.drain(..self.buf.len() - keep).collect();
                    self.content(&emit, out);
                    false
                }
            }
            State::BareHead => match call_head(&self.buf, ARGS) {
                Head::Incomplete => false,
                Head::Mismatch => {
                    self.in_content = true;
                    self.state = State::Text;
                    true
                }
                Head::Done(name, used) => {
                    self.start_call();
                    out.push(ParseEvent::CallStart {
                        index: self.calls,
                        name,
                    });
                    self.buf.drain(..used);
                    self.args = ValueEnd::default();
                    self.bare = true;
                    self.state = State::Args;
                    true
                }
            },
            State::BareTail => {
                let t = self.buf.trim_start();
                if t.is_empty() {
                    return false;
                }
                let skip = self.buf.len() - t.len() + usize::from(t.starts_with('}'));
                self.buf.drain(..skip);
                self.calls += 1;
                self.bare = false;
                self.state = State::Text;
                true
            }
            State::Head => match call_head(&self.buf, ARGS) {
                Head::Incomplete => {
                    if self.buf.contains(CLOSE) {
                        self.state = State::Whole;
                        true
                    } else {
                        false
                    }
                }
                Head::Mismatch => {
                    self.state = State::Whole;
                    true
                }
                Head::Done(name, used) => {
                    out.push(ParseEvent::CallStart {
                        index: self.calls,
                        name,
                    });
                    self.buf.drain(..used);
                    self.args = ValueEnd::default();
                    self.bare = false;
                    self.state = State::Args;
                    true
                }
            },
            State::Args => {
                let n = self.args.feed(&self.buf);
                if n > 0 {
                    let text: String = self.buf.drain(..n).collect();
                    out.push(ParseEvent::CallArgs {
                        index: self.calls,
                        text,
                    });
                }
                if self.args.done() {
                    self.state = if self.bare {
                        State::BareTail
                    } else {
                        State::Tail
                    };
                    true
                } else {
                    false
                }
            }
            State::Tail => {
                if let Some(p) = self.buf.find(CLOSE) {
                    self.buf.drain(..p + CLOSE.len());
                    self.calls += 1;
                    self.state = State::Text;
                    true
                } else {
                    let keep = partial_suffix(&self.buf, CLOSE);
                    self.buf.drain(..self.buf.len() - keep);
                    false
                }
            }
            State::Whole => {
                if let Some(p) = self.buf.find(CLOSE) {
                    let body: String = self.buf.drain(..p + CLOSE.len()).collect();
                    self.whole(&body[..p], true, out);
                    self.state = State::Text;
                    true
                } else {
                    false
                }
            }
        }
    }

    /// A call kept whole: a call when it parses, else its text as content.
    fn whole(&mut self, body: &str, closed: bool, out: &mut Vec<ParseEvent>) {
        let parsed = serde_json::from_str(body.trim())
            .ok()
            .and_then(|v| whole_call(&v, ARGS));
        match parsed {
            Some((name, arguments)) => {
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
            None => {
                let text = format!("{OPEN}{body}{}", if closed { CLOSE } else { "" });
                self.content(&text, out);
            }
        }
    }
}

impl ToolCallParser for Parser {
    fn push(&mut self, text: &str, out: &mut Vec<ParseEvent>) {
        self.buf.push_str(text);
        while self.parse_next(out) {}
    }

    fn finish(&mut self, out: &mut Vec<ParseEvent>) {
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Text | State::BareHead => {
                self.in_content = true;
                self.content(&rest, out)
            }
            // Cut off before the arguments: what there is was not a call.
            State::Head => {
                let text = format!("{OPEN}{rest}");
                self.content(&text, out);
            }
            State::Whole => self.whole(&rest, false, out),
            // A call cut short (a token limit) or missing its closing tag: it stands.
            State::Args | State::Tail | State::BareTail => self.calls += 1,
        }
        self.state = State::Text;
        if self.calls == 0 && !self.blank.is_empty() {
            out.push(ParseEvent::Content(std::mem::take(&mut self.blank)));
        }
    }

    fn calls(&self) -> usize {
        self.calls
            + usize::from(matches!(
                self.state,
                State::Args | State::Tail | State::BareTail
            ))
    }
}
