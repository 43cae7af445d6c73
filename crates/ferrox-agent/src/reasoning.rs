//! Reasoning separation: the thinking a model writes between `<think>` and `</think>`
//! (Qwen3, QwQ, DeepSeek-R1, GLM-4.5+; Kimi's `◁think▷` / `◁/think▷`) goes to
//! `reasoning_content`, the rest to `content`. When the prompt already opened the block
//! (DeepSeek-R1's template ends with `<think>\n`, as Qwen3's does with thinking on), the
//! output starts inside it.

/// `--reasoning-format`, as llama-server names them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// Thinking stays in `content`, tags included.
    None,
    /// Thinking goes to `reasoning_content`.
    #[default]
    DeepSeek,
}

impl ReasoningFormat {
    pub fn parse(s: &str) -> Option<ReasoningFormat> {
        match s {
            "none" => Some(ReasoningFormat::None),
            "deepseek" | "auto" => Some(ReasoningFormat::DeepSeek),
            _ => None,
        }
    }
}

const TAGS: &[(&str, &str)] = &[("<think>", "</think>"), ("◁think▷", "◁/think▷")];

/// Whether a rendered prompt leaves the model inside a thinking block (it ends with an
/// opening tag); the tag pair's index.
pub fn prompt_opens_thinking(prompt: &str) -> Option<usize> {
    let end = prompt.trim_end();
    TAGS.iter().position(|(open, _)| end.ends_with(open))
}

/// Whether a chat template knows thinking blocks at all.
pub fn template_thinks(template: &str) -> bool {
    TAGS.iter().any(|(_, close)| template.contains(close))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: an opening tag may still come.
    Start,
    Thinking(usize),
    /// After the block: whitespace is held until content starts.
    After,
    Content,
}

/// Text released by the splitter.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

/// Splits output text into reasoning and content, piece by piece.
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    state: State,
    buf: String,
}

impl ReasoningSplitter {
    /// `opened`: the prompt opened a block (see [`prompt_opens_thinking`]).
    pub fn new(opened: Option<usize>) -> ReasoningSplitter {
        ReasoningSplitter {
            state: opened.map_or(State::Start, State::Thinking),
            buf: String::new(),
        }
    }

    pub fn push(&mut self, text: &str) -> Split {
        let mut out = Split::default();
        self.buf.push_str(text);
        loop {
            match self.state {
                State::Start => {
                    let t = self.buf.trim_start();
                    if let Some(i) = TAGS.iter().position(|(open, _)| t.starts_with(open)) {
                        let skip = self.buf.len() - t.len() + TAGS[i].0.len();
                        self.buf.drain(..skip);
                        self.state = State::Thinking(i);
                        continue;
                    }
                    if t.is_empty() || TAGS.iter().any(|(open, _)| open.starts_with(t)) {
                        break;
                    }
                    self.state = State::Content;
                }
                State::Thinking(i) => {
                    let close = TAGS[i].1;
                    if let Some(p) = self.buf.find(close) {
                        out.reasoning.extend(self.buf.drain(..p));
                        self.buf.drain(..close.len());
                        self.state = State::After;
                        continue;
                    }
                    let keep = crate::tools::partial_suffix(&self.buf, close);
                    out.reasoning
                        .extend(self.buf.drain(..self.buf.len() - keep));
                    break;
                }
                State::After => {
                    let t = self.buf.trim_start();
                    if t.is_empty() {
                        break;
                    }
                    let skip = self.buf.len() - t.len();
                    self.buf.drain(..skip);
                    self.state = State::Content;
                }
                State::Content => {
                    out.content.push_str(&self.buf);
                    self.buf.clear();
                    break;
                }
            }
        }
        out
    }

    /// The output ended: what was held back.
    pub fn finish(&mut self) -> Split {
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Thinking(_) => Split {
                reasoning: rest,
                content: String::new(),
            },
            State::After => Split::default(),
            State::Start | State::Content => Split {
                reasoning: String::new(),
                content: rest,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(opened: Option<usize>, pieces: &[&str]) -> Split {
        let mut s = ReasoningSplitter::new(opened);
        let mut all = Split::default();
        for p in pieces {
            let o = s.push(p);
            all.reasoning += &o.reasoning;
            all.content += &o.content;
        }
        let o = s.finish();
        all.reasoning += &o.reasoning;
        all.content += &o.content;
        all
    }

    #[test]
    fn splits_at_every_boundary() {
        for (opened, text, reasoning, content) in [
            (
                None,
                "<think>\nhmm, 2+2</think>\n\nIt is 4.",
                "\nhmm, 2+2",
                "It is 4.",
            ),
            (Some(0), "let me see</think>4", "let me see", "4"),
            (None, "No thinking here.", "", "No thinking here."),
            (None, "◁think▷k◁/think▷done", "k", "done"),
            (None, "<think>cut off", "cut off", ""),
            (None, "  <thin", "", "  <thin"),
        ] {
            let whole = run(opened, &[text]);
            assert_eq!(
                (whole.reasoning.as_str(), whole.content.as_str()),
                (reasoning, content),
                "{text}"
            );
            for (i, _) in text.char_indices().skip(1) {
                assert_eq!(
                    run(opened, &[&text[..i], &text[i..]]),
                    whole,
                    "{text} at {i}"
                );
            }
        }
        assert_eq!(prompt_opens_thinking("<|Assistant|><think>\n"), Some(0));
        assert_eq!(prompt_opens_thinking("<|im_start|>assistant\n"), None);
    }
}
