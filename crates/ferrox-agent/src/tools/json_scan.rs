//! Incremental reading of the JSON the tool-call formats share: where a value ends, and the
//! `{"name": "...", "arguments": ` head of a call object.

use serde_json::Value;

/// Finds the end of one JSON value fed in pieces (leading whitespace already removed).
#[derive(Default, Debug, Clone)]
pub struct ValueEnd {
    depth: usize,
    in_string: bool,
    escape: bool,
    started: bool,
    done: bool,
}

impl ValueEnd {
    /// Bytes of `text` that belong to the value (all of it until the value ends).
    pub fn feed(&mut self, text: &str) -> usize {
        for (i, c) in text.char_indices() {
            if self.done {
                return i;
            }
            if !self.started {
                self.started = true;
                match c {
                    '{' | '[' => self.depth = 1,
                    '"' => self.in_string = true,
                    _ => {}
                }
                if self.depth == 0 && !self.in_string {
                    // A number or literal: ends at a delimiter (not part of it).
                    self.depth = 0;
                }
                continue;
            }
            if self.in_string {
                if self.escape {
                    self.escape = false;
                } else if c == '\\' {
                    self.escape = true;
                } else if c == '"' {
                    self.in_string = false;
                    if self.depth == 0 {
                        self.done = true;
                    }
                }
                continue;
            }
            if self.depth == 0 {
                // Inside a bare number or literal.
                if matches!(c, ',' | '}' | ']') || c.is_whitespace() {
                    self.done = true;
                    return i;
                }
                continue;
            }
            match c {
                '"' => self.in_string = true,
                '{' | '[' => self.depth += 1,
                '}' | ']' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        self.done = true;
                    }
                }
                _ => {}
            }
        }
        text.len()
    }

    pub fn done(&self) -> bool {
        self.done
    }
}

/// How far a call object's head has been read.
#[derive(Debug, PartialEq, Eq)]
pub enum Head {
    /// Consistent so far; more text is needed.
    Incomplete,
    /// Not a head of this shape (keys in another order, other keys, ...).
    Mismatch,
    /// The function's name, and the bytes up to the arguments' value.
    Done(String, usize),
}

fn skip_ws(s: &str, i: usize) -> usize {
    i + s[i..].len() - s[i..].trim_start().len()
}

/// Reads `{"name": "<name>", "<args_key>": ` at the start of `s` (whitespace allowed
/// anywhere JSON allows it; `function` is accepted for `name`).
pub fn call_head(s: &str, args_keys: &[&str]) -> Head {
    let mut i = skip_ws(s, 0);
    macro_rules! expect {
        ($lit:expr) => {{
            let lit: &str = $lit;
            let rest = &s[i..];
            if rest.len() < lit.len() {
                return if lit.starts_with(rest) {
                    Head::Incomplete
                } else {
                    Head::Mismatch
                };
            }
            if !rest.starts_with(lit) {
                return Head::Mismatch;
            }
            i += lit.len();
            i = skip_ws(s, i);
        }};
    }
    expect!("{");
    // The "name" key (or "function").
    let rest = &s[i..];
    let key = ["\"name\"", "\"function\""]
        .into_iter()
        .find(|k| rest.starts_with(k) || k.starts_with(rest));
    match key {
        Some(k) if rest.len() >= k.len() => {
            i += k.len();
            i = skip_ws(s, i);
        }
        Some(_) => return Head::Incomplete,
        None => return Head::Mismatch,
    }
    expect!(":");
    // The name: a JSON string.
    if i >= s.len() {
        return Head::Incomplete;
    }
    if !s[i..].starts_with('"') {
        return Head::Mismatch;
    }
    let start = i;
    let mut scan = ValueEnd::default();
    let n = scan.feed(&s[i..]);
    if !scan.done() {
        return Head::Incomplete;
    }
    let name = match serde_json::from_str::<Value>(&s[start..start + n]) {
        Ok(Value::String(name)) => name,
        _ => return Head::Mismatch,
    };
    i = skip_ws(s, start + n);
    expect!(",");
    let rest = &s[i..];
    let mut matched = None;
    for k in args_keys {
        let quoted = format!("\"{k}\"");
        if rest.starts_with(&quoted) {
            matched = Some(quoted.len());
            break;
        }
        if quoted.starts_with(rest) {
            return Head::Incomplete;
        }
    }
    let Some(len) = matched else {
        return Head::Mismatch;
    };
    i = skip_ws(s, i + len);
    expect!(":");
    if i >= s.len() {
        return Head::Incomplete;
    }
    Head::Done(name, i)
}

/// A whole call object: its name and its arguments as JSON text (a string argument is
/// taken as the JSON text it holds).
pub fn whole_call(value: &Value, args_keys: &[&str]) -> Option<(String, String)> {
    let obj = value.as_object()?;
    let name = obj
        .get("name")
        .or_else(|| obj.get("function"))
        .and_then(Value::as_str)?;
    let args = args_keys
        .iter()
        .find_map(|k| obj.get(*k))
        .cloned()
        .unwrap_or(Value::Object(Default::default()));
    let text = match args {
        Value::String(s) => s,
        v => v.to_string(),
    };
    Some((name.to_string(), text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_ends_are_found_in_pieces() {
        let text = r#"{"a": "x}\"", "b": [1, {"c": 2}]}} tail"#;
        for split in 0..text.len() {
            if !text.is_char_boundary(split) {
                continue;
            }
            let mut v = ValueEnd::default();
            let a = v.feed(&text[..split]);
            let b = if v.done() { 0 } else { v.feed(&text[split..]) };
            assert_eq!(a + b, text.find("}} tail").unwrap() + 1, "split {split}");
        }
    }

    #[test]
    fn call_heads() {
        assert_eq!(
            call_head(
                r#" { "name" : "get_weather", "arguments": {"#,
                &["arguments"]
            ),
            Head::Done("get_weather".into(), 40)
        );
        assert_eq!(
            call_head(r#"{"name": "get_"#, &["arguments"]),
            Head::Incomplete
        );
        assert_eq!(call_head(r#"{"na"#, &["arguments"]), Head::Incomplete);
        assert_eq!(
            call_head(r#"{"arguments": {}"#, &["arguments"]),
            Head::Mismatch
        );
        assert_eq!(
            call_head(r#"{"name": "f", "argu"#, &["arguments"]),
            Head::Incomplete
        );
        assert_eq!(call_head(r#"hello"#, &["arguments"]), Head::Mismatch);
    }
}
