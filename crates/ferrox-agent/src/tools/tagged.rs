//! The shape several formats share: content, then calls each held between an opening and
//! a closing marker (section markers around them dropped), each call read whole by the
//! format's own function once its closing marker arrives.

use super::{partial_suffix, ParseEvent, ToolCallParser};

/// One format's markers and call reader.
pub struct Markers {
    pub open: &'static str,
    pub close: &'static str,
    /// Markers around the calls that carry nothing (`<|tool_calls_section_begin|>`).
    pub ignore: &'static [&'static str],
    /// A call's body (between the markers): its name and arguments as JSON text.
    pub read: fn(&str) -> Option<(String, String)>,
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum State {
    #[default]
    Text,
    Call,
}

pub struct Parser {
    markers: &'static Markers,
    state: State,
    buf: String,
    calls: usize,
    /// Whitespace-only content, held until something else follows (dropped next to calls).
    blank: String,
}

impl Parser {
    pub fn new(markers: &'static Markers) -> Parser {
        Parser {
            markers,
            state: State::Text,
            buf: String::new(),
            calls: 0,
            blank: String::new(),
        }
    }

    fn content(&mut self, text: &str, out: &mut Vec<ParseEvent>) {
        if text.is_empty() {
            return;
        }
        self.blank.push_str(text);
        if !self.blank.trim().is_empty() {
            out.push(ParseEvent::Content(std::mem::take(&mut self.blank)));
        }
    }

    fn call(&mut self, body: &str, closed: bool, out: &mut Vec<ParseEvent>) {
        match (self.markers.read)(body) {
            Some((name, arguments)) => {
                self.blank.clear();
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
                let m = self.markers;
                let text = format!("{}{body}{}", m.open, if closed { m.close } else { "" });
                self.content(&text, out);
            }
        }
    }

    fn parse_next(&mut self, out: &mut Vec<ParseEvent>) -> bool {
        let m = self.markers;
        match self.state {
            State::Text => {
                let found = std::iter::once(m.open)
                    .chain(m.ignore.iter().copied())
                    .filter_map(|k| self.buf.find(k).map(|at| (at, k)))
                    .min_by_key(|&(at, _)| at);
                match found {
                    Some((at, marker)) => {
                        let before: String = self.buf.drain(..at).collect();
                        self.content(&before, out);
                        self.buf.drain(..marker.len());
                        if marker == m.open {
                            self.state = State::Call;
                        } else {
                            self.blank.clear();
                        }
                        true
                    }
                    None => {
                        let keep = std::iter::once(m.open)
                            .chain(m.ignore.iter().copied())
                            .map(|k| partial_suffix(&self.buf, k))
                            .max()
                            .unwrap_or(0);
                        let emit: String = self.buf.drain(..self.buf.len() - keep).collect();
                        self.content(&emit, out);
                        false
                    }
                }
            }
            State::Call => match self.buf.find(m.close) {
                Some(at) => {
                    let body: String = self.buf.drain(..at + m.close.len()).collect();
                    self.call(&body[..at], true, out);
                    self.state = State::Text;
                    true
                }
                None => false,
            },
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
            State::Text => self.content(&rest, out),
            State::Call => self.call(&rest, false, out),
        }
        self.state = State::Text;
        if self.calls == 0 && !self.blank.is_empty() {
            out.push(ParseEvent::Content(std::mem::take(&mut self.blank)));
        }
    }

    fn calls(&self) -> usize {
        self.calls
    }
}

/// A parameter value as written in XML-style formats: JSON when it parses as JSON (numbers,
/// booleans, objects), else the text as a string.
pub fn xml_value(text: &str) -> serde_json::Value {
    let t = text.strip_prefix('\n').unwrap_or(text);
    let t = t.strip_suffix('\n').unwrap_or(t);
    match serde_json::from_str::<serde_json::Value>(t) {
        Ok(v) if !v.is_string() => v,
        _ => serde_json::Value::String(t.to_string()),
    }
}
