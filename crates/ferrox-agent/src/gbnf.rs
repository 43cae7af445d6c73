//! llama.cpp's GBNF grammars, translated into the Lark-like syntax llguidance compiles.
//!
//! GBNF (`grammars/README.md` in llama.cpp): `name ::= alternatives` rules, one per line
//! unless inside parentheses; `"literals"`, `[character classes]` (`^` negates), `.` (any
//! character), rule references, `( groups )`, the postfix operators `*`, `+`, `?`,
//! `{m}`, `{m,}`, `{m,n}`, `{,n}`, `#` comments, and token references `<...>`. The start
//! rule is `root`. llguidance has no GBNF front end of its own, so this module parses the
//! grammar (reporting errors with their line and column) and writes it out as Lark: rules
//! become lowercase Lark rules, literals JSON strings, classes regular expressions.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

/// A GBNF grammar could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GbnfError {
    pub message: String,
    pub line: usize,
    pub column: usize,
}

impl std::fmt::Display for GbnfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GBNF grammar, line {} column {}: {}",
            self.line, self.column, self.message
        )
    }
}

impl std::error::Error for GbnfError {}

#[derive(Debug, Clone)]
enum Item {
    Literal(String),
    /// Negated, then the character ranges.
    Class(bool, Vec<(char, char)>),
    Any,
    Ref(String, usize),
    Token(String),
    /// Alternatives, and how deeply groups nest inside (1: no group inside).
    Group(Vec<Vec<Element>>, usize),
}

impl Item {
    /// Groups nested in this item, itself included.
    fn depth(&self) -> usize {
        match self {
            Item::Group(_, depth) => *depth,
            _ => 0,
        }
    }
}

#[derive(Debug, Clone)]
struct Element {
    item: Item,
    /// Minimum and maximum (None: unbounded) repetitions.
    repeat: (u32, Option<u32>),
}

struct Parser<'s> {
    src: &'s str,
    pos: usize,
    /// Groups open around the current position.
    depth: usize,
}

type Alternatives = Vec<Vec<Element>>;

/// The most repetitions a `{m,n}` may ask for (a guard against grammars that would expand
/// to millions of rules).
const MAX_REPEAT: u32 = 10_000;

/// The deepest groups may nest (parentheses, and stacked repetition operators, which
/// wrap what they repeat in a group). The grammar is read, checked and written by recursion
/// over groups, so this bounds the stack a hostile grammar can take; llguidance itself
/// refuses Lark nested about 30 deep.
pub const MAX_NESTING: usize = 64;

fn group_depth(alts: &Alternatives) -> usize {
    1 + alts
        .iter()
        .flatten()
        .map(|e| e.item.depth())
        .max()
        .unwrap_or(0)
}

impl<'s> Parser<'s> {
    fn error(&self, message: impl Into<String>) -> GbnfError {
        self.error_at(self.pos, message)
    }

    fn error_at(&self, pos: usize, message: impl Into<String>) -> GbnfError {
        let before = &self.src[..pos.min(self.src.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        GbnfError {
            message: message.into(),
            line,
            column,
        }
    }

    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn rest(&self) -> &'s str {
        &self.src[self.pos..]
    }

    /// Skips spaces, tabs and comments, and newlines when `newlines` is set.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => {
                    self.pos += 1;
                }
                '#' => {
                    while let Some(c) = self.peek() {
                        if c == '\n' {
                            break;
                        }
                        self.bump();
                    }
                }
                '\r' | '\n' if newlines => {
                    self.pos += 1;
                }
                _ => break,
            }
        }
    }

    fn is_name_char(c: char) -> bool {
        c.is_ascii_alphanumeric() || c == '-' || c == '_'
    }

    fn name(&mut self) -> Result<&'s str, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(Self::is_name_char) {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.error(match self.peek() {
                Some(c) => format!("expected a rule name, found {c:?}"),
                None => "expected a rule name, found the end".into(),
            }));
        }
        Ok(&self.src[start..self.pos])
    }

    fn hex(&mut self, digits: usize) -> Result<char, GbnfError> {
        let start = self.pos;
        let mut value = 0u32;
        for _ in 0..digits {
            let d = self
                .peek()
                .and_then(|c| c.to_digit(16))
                .ok_or_else(|| self.error(format!("expected {digits} hex digits")))?;
            self.pos += 1;
            value = value * 16 + d;
        }
        char::from_u32(value)
            .ok_or_else(|| self.error_at(start, format!("U+{value:X} is not a character")))
    }

    /// One character of a literal or class, escapes decoded.
    fn char(&mut self) -> Result<char, GbnfError> {
        let start = self.pos;
        match self.bump() {
            None => Err(self.error("unexpected end of the grammar")),
            Some('\\') => match self.bump() {
                Some('x') => self.hex(2),
                Some('u') => self.hex(4),
                Some('U') => self.hex(8),
                Some('t') => Ok('\t'),
                Some('r') => Ok('\r'),
                Some('n') => Ok('\n'),
                Some(c @ ('\\' | '"' | '[' | ']' | '-' | '^' | '/' | '\'')) => Ok(c),
                Some(c) => Err(self.error_at(start, format!("unknown escape \\{c}"))),
                None => Err(self.error("unexpected end of the grammar")),
            },
            Some('\n') => Err(self.error_at(start, "unexpected end of the line")),
            Some(c) => Ok(c),
        }
    }

    fn alternatives(&mut self, nested: bool) -> Result<Alternatives, GbnfError> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some('|') {
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(alts)
    }

    fn sequence(&mut self, nested: bool) -> Result<Vec<Element>, GbnfError> {
        let mut seq: Vec<Element> = Vec::new();
        loop {
            let start = self.pos;
            let item = match self.peek() {
                Some('"') => {
                    self.pos += 1;
                    let mut text = String::new();
                    loop {
                        match self.peek() {
                            None | Some('\n') => {
                                return Err(self.error_at(start, "unterminated literal"))
                            }
                            Some('"') => {
                                self.pos += 1;
                                break;
                            }
                            Some(_) => text.push(self.char()?),
                        }
                    }
                    Item::Literal(text)
                }
                Some('[') => {
                    self.pos += 1;
                    let negated = self.peek() == Some('^');
                    if negated {
                        self.pos += 1;
                    }
                    let mut ranges = Vec::new();
                    loop {
                        match self.peek() {
                            None | Some('\n') => {
                                return Err(self.error_at(start, "unterminated character class"))
                            }
                            Some(']') => {
                                self.pos += 1;
                                break;
                            }
                            Some(_) => {
                                let lo = self.char()?;
                                let hi = if self.peek() == Some('-')
                                    && !self.rest()[1..].starts_with(']')
                                {
                                    self.pos += 1;
                                    self.char()?
                                } else {
                                    lo
                                };
                                if hi < lo {
                                    return Err(self.error(format!(
                                        "character range {lo:?}-{hi:?} is reversed"
                                    )));
                                }
                                ranges.push((lo, hi));
                            }
                        }
                    }
                    Item::Class(negated, ranges)
                }
                Some('.') => {
                    self.pos += 1;
                    Item::Any
                }
                Some('(') => {
                    if self.depth >= MAX_NESTING {
                        return Err(
                            self.error(format!("groups are nested more than {MAX_NESTING} deep"))
                        );
                    }
                    self.pos += 1;
                    self.space(true);
                    self.depth += 1;
                    let alts = self.alternatives(true);
                    self.depth -= 1;
                    let alts = alts?;
                    if self.peek() != Some(')') {
                        return Err(self.error("expected ')'"));
                    }
                    self.pos += 1;
                    let depth = group_depth(&alts);
                    Item::Group(alts, depth)
                }
                Some('<') => {
                    let end = self.rest().find('>').filter(|&e| e > 1).ok_or_else(|| {
                        self.error("expected a token reference like <|name|> or <[123]>")
                    })?;
                    let token = self.rest()[..=end].to_string();
                    if token.chars().any(char::is_whitespace) {
                        return Err(self.error("a token reference cannot contain spaces"));
                    }
                    self.pos += end + 1;
                    Item::Token(token)
                }
                Some('*' | '+' | '?') | Some('{') => {
                    let Some(last) = seq.last_mut() else {
                        return Err(self.error("a repetition operator needs something before it"));
                    };
                    let repeat = self.repetition()?;
                    if last.repeat != (1, Some(1)) {
                        // `x*+`: apply the second to a group holding the first.
                        let depth = last.item.depth() + 1;
                        if depth + self.depth > MAX_NESTING {
                            return Err(self.error_at(
                                start,
                                format!("groups are nested more than {MAX_NESTING} deep"),
                            ));
                        }
                        let inner = std::mem::replace(
                            last,
                            Element {
                                item: Item::Any,
                                repeat: (1, Some(1)),
                            },
                        );
                        *last = Element {
                            item: Item::Group(vec![vec![inner]], depth),
                            repeat,
                        };
                    } else {
                        last.repeat = repeat;
                    }
                    self.space(nested);
                    continue;
                }
                Some(c) if Self::is_name_char(c) => {
                    let name = self.name()?;
                    Item::Ref(name.to_string(), start)
                }
                _ => break,
            };
            seq.push(Element {
                item,
                repeat: (1, Some(1)),
            });
            self.space(nested);
        }
        Ok(seq)
    }

    fn number(&mut self) -> Result<u32, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let n: u32 = self.src[start..self.pos]
            .parse()
            .map_err(|_| self.error_at(start, "expected a number"))?;
        if n > MAX_REPEAT {
            return Err(self.error_at(
                start,
                format!("repetition count {n} is above the limit of {MAX_REPEAT}"),
            ));
        }
        Ok(n)
    }

    fn repetition(&mut self) -> Result<(u32, Option<u32>), GbnfError> {
        match self.bump() {
            Some('*') => Ok((0, None)),
            Some('+') => Ok((1, None)),
            Some('?') => Ok((0, Some(1))),
            Some('{') => {
                self.space(true);
                let min = if self.peek() == Some(',') {
                    0
                } else {
                    self.number()?
                };
                self.space(true);
                let max = if self.peek() == Some(',') {
                    self.pos += 1;
                    self.space(true);
                    if self.peek() == Some('}') {
                        None
                    } else {
                        Some(self.number()?)
                    }
                } else {
                    Some(min)
                };
                self.space(true);
                if self.bump() != Some('}') {
                    return Err(self.error("expected '}' closing a repetition"));
                }
                if max.is_some_and(|m| m < min) {
                    return Err(self.error("repetition maximum is below its minimum"));
                }
                Ok((min, max))
            }
            _ => unreachable!("called on a repetition operator"),
        }
    }
}

/// Lark names given so far: GBNF name to Lark name, the names taken, and per lowercased
/// base the next suffix to try (so that many names sharing a base, `a`, `A`, ..., cost
/// linear time, not quadratic).
#[derive(Default)]
struct LarkNames {
    of: HashMap<String, String>,
    used: HashSet<String>,
    next_suffix: HashMap<String, usize>,
}

impl LarkNames {
    /// The Lark rule name for a GBNF rule name (Lark rule names are lowercase).
    fn name(&mut self, gbnf: &str) -> String {
        if let Some(n) = self.of.get(gbnf) {
            return n.clone();
        }
        let base: String = gbnf
            .chars()
            .map(|c| match c {
                'A'..='Z' => c.to_ascii_lowercase(),
                '-' => '_',
                c => c,
            })
            .collect();
        let mut name = format!("r_{base}");
        if self.used.contains(&name) {
            let k = self.next_suffix.entry(base.clone()).or_insert(2);
            loop {
                name = format!("r_{base}_{k}");
                *k += 1;
                if !self.used.contains(&name) {
                    break;
                }
            }
        }
        self.used.insert(name.clone());
        self.of.insert(gbnf.to_string(), name.clone());
        name
    }
}

/// A Lark (JSON) string literal.
fn lark_string(text: &str, out: &mut String) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn class_char(c: char, out: &mut String) {
    if c.is_ascii_alphanumeric() {
        out.push(c);
    } else {
        let _ = write!(out, "\\x{{{:x}}}", c as u32);
    }
}

struct Writer<'a> {
    names: &'a HashMap<String, String>,
}

impl Writer<'_> {
    fn alternatives(&self, alts: &Alternatives, out: &mut String) {
        // Lark has no empty alternative: `a | ` becomes `(a)?`.
        let non_empty: Vec<&Vec<Element>> = alts.iter().filter(|s| !s.is_empty()).collect();
        let optional = non_empty.len() < alts.len();
        if non_empty.is_empty() {
            out.push_str("\"\"");
            return;
        }
        if optional {
            out.push('(');
        }
        for (i, seq) in non_empty.iter().enumerate() {
            if i > 0 {
                out.push_str(" | ");
            }
            self.sequence(seq, out);
        }
        if optional {
            out.push_str(")?");
        }
    }

    fn sequence(&self, seq: &[Element], out: &mut String) {
        let mut first = true;
        for e in seq {
            if e.repeat == (0, Some(0)) {
                continue;
            }
            if !first {
                out.push(' ');
            }
            first = false;
            self.element(e, out);
        }
        if first {
            out.push_str("\"\"");
        }
    }

    fn item(&self, item: &Item, out: &mut String) {
        match item {
            Item::Literal(text) => lark_string(text, out),
            Item::Class(negated, ranges) => {
                out.push_str("/[");
                if *negated {
                    out.push('^');
                }
                for &(lo, hi) in ranges {
                    class_char(lo, out);
                    if hi != lo {
                        out.push('-');
                        class_char(hi, out);
                    }
                }
                out.push_str("]/");
            }
            Item::Any => out.push_str("/(?s:.)/"),
            Item::Ref(name, _) => out.push_str(&self.names[name]),
            Item::Token(t) => out.push_str(t),
            Item::Group(alts, _) => {
                out.push('(');
                self.alternatives(alts, out);
                out.push(')');
            }
        }
    }

    fn element(&self, e: &Element, out: &mut String) {
        let group = |out: &mut String| {
            if matches!(e.item, Item::Group(..)) {
                self.item(&e.item, out);
            } else {
                out.push('(');
                self.item(&e.item, out);
                out.push(')');
            }
        };
        match e.repeat {
            (1, Some(1)) => self.item(&e.item, out),
            (0, None) => {
                group(out);
                out.push('*');
            }
            (1, None) => {
                group(out);
                out.push('+');
            }
            (0, Some(1)) => {
                group(out);
                out.push('?');
            }
            (min, None) => {
                group(out);
                let _ = write!(out, "{{{min}}} ");
                group(out);
                out.push('*');
            }
            (min, Some(max)) => {
                group(out);
                if min == max {
                    let _ = write!(out, "{{{min}}}");
                } else {
                    let _ = write!(out, "{{{min},{max}}}");
                }
            }
        }
    }
}

/// Translates a GBNF grammar (start rule `root`) into llguidance's Lark syntax.
pub fn gbnf_to_lark(source: &str) -> Result<String, GbnfError> {
    let mut p = Parser {
        src: source,
        pos: 0,
        depth: 0,
    };
    let mut rules: Vec<(String, usize, Alternatives)> = Vec::new();
    let mut defined: HashSet<&str> = HashSet::new();
    p.space(true);
    while p.pos < source.len() {
        let start = p.pos;
        let name = p.name()?;
        p.space(false);
        if !p.rest().starts_with("::=") {
            return Err(p.error(format!("expected '::=' after the rule name `{name}`")));
        }
        p.pos += 3;
        p.space(true);
        let alts = p.alternatives(false)?;
        match p.peek() {
            None => {}
            Some('\r' | '\n') => {}
            Some(c) => return Err(p.error(format!("expected the end of the line, found {c:?}"))),
        }
        if !defined.insert(name) {
            return Err(p.error_at(start, format!("rule `{name}` is defined twice")));
        }
        rules.push((name.to_string(), start, alts));
        p.space(true);
    }
    if !defined.contains("root") {
        return Err(GbnfError {
            message: "the grammar has no `root` rule".into(),
            line: 1,
            column: 1,
        });
    }
    let mut lark_names = LarkNames::default();
    for (name, _, _) in &rules {
        lark_names.name(name);
    }
    let names = lark_names.of;
    // Every reference must name a rule.
    fn check(alts: &Alternatives, names: &HashMap<String, String>) -> Result<(), (String, usize)> {
        for seq in alts {
            for e in seq {
                match &e.item {
                    Item::Ref(n, at) if !names.contains_key(n) => return Err((n.clone(), *at)),
                    Item::Group(inner, _) => check(inner, names)?,
                    _ => {}
                }
            }
        }
        Ok(())
    }
    for (_, _, alts) in &rules {
        check(alts, &names).map_err(|(n, at)| p.error_at(at, format!("undefined rule `{n}`")))?;
    }
    let writer = Writer { names: &names };
    let mut out = format!("start: {}\n", names["root"]);
    for (name, _, alts) in &rules {
        out.push_str(&names[name]);
        out.push_str(": ");
        writer.alternatives(alts, &mut out);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translates_the_basic_forms() {
        let lark = gbnf_to_lark(
            "root ::= greeting (\" \" name)? [.!]{1,3}\n\
             greeting ::= \"hi\" | \"hello\\n\"  # a comment\n\
             name ::= [A-Z] [a-z-]* | ws\n\
             ws ::= | [ \\t] ws\n",
        )
        .unwrap();
        assert_eq!(
            lark,
            "start: r_root\n\
             r_root: r_greeting (\" \" r_name)? (/[\\x{2e}\\x{21}]/){1,3}\n\
             r_greeting: \"hi\" | \"hello\\u000a\"\n\
             r_name: /[A-Z]/ (/[a-z\\x{2d}]/)* | r_ws\n\
             r_ws: (/[\\x{20}\\x{9}]/ r_ws)?\n"
        );
    }

    #[test]
    fn groups_span_lines_and_repetitions_have_all_forms() {
        let lark = gbnf_to_lark(
            "root ::= (\n  \"a\"\n  | \"b\"\n)+ x{2,} x{,3} x{4} .\nx ::= [^\"\\\\]\n",
        )
        .unwrap();
        assert!(
            lark.contains("r_root: (\"a\" | \"b\")+ (r_x){2} (r_x)* (r_x){0,3} (r_x){4} /(?s:.)/"),
            "{lark}"
        );
        assert!(lark.contains("r_x: /[^\\x{22}\\x{5c}]/"), "{lark}");
    }

    #[test]
    fn errors_name_the_place() {
        let e = gbnf_to_lark("root ::= foo\n").unwrap_err();
        assert_eq!((e.line, e.column), (1, 10));
        assert!(e.message.contains("undefined rule `foo`"));
        let e = gbnf_to_lark("root ::= \"a\"\nother ::= [a-\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(gbnf_to_lark("x ::= \"a\"\n")
            .unwrap_err()
            .message
            .contains("no `root`"));
        assert!(gbnf_to_lark("root ::= \"\\q\"")
            .unwrap_err()
            .message
            .contains("unknown escape"));
        assert!(gbnf_to_lark("root = \"a\"").is_err());
        assert!(gbnf_to_lark("root ::= \"a\"{5,2}").is_err());
        assert!(gbnf_to_lark("root ::= \"a\"{99999999}").is_err());
        assert!(gbnf_to_lark("root ::= (\"a\"").is_err());
    }
}
