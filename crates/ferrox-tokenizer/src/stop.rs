//! Stop strings that may span token boundaries: text is held back while it could still
//! turn out to be the start of a stop string, and a matched stop string is never emitted.

/// Watches streamed text for stop strings.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

/// What a piece of text released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Released {
    /// Text that is safe to show.
    pub text: String,
    /// A stop string matched; `text` ends right before it.
    pub stopped: bool,
}

impl StopMatcher {
    pub fn new(stops: impl IntoIterator<Item = String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
        }
    }

    /// Adds generated text; returns what can be shown now.
    pub fn push(&mut self, text: &str) -> Released {
        self.pending.push_str(text);
        let first_match = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = first_match {
            let text = self.pending[..at].to_string();
            self.pending.clear();
            return Released {
                text,
                stopped: true,
            };
        }
        let hold = self.held_back_len();
        let split = self.pending.len() - hold;
        let text = self.pending[..split].to_string();
        self.pending.drain(..split);
        Released {
            text,
            stopped: false,
        }
    }

    /// Releases whatever was held back (generation ended for another reason).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Length of the longest suffix of `pending` that is a proper prefix of a stop string.
    fn held_back_len(&self) -> usize {
        let p = &self.pending;
        let mut best = 0;
        for stop in &self.stops {
            let max = stop.len().saturating_sub(1).min(p.len());
            for len in (best + 1..=max).rev() {
                let start = p.len() - len;
                if p.is_char_boundary(start) && stop.starts_with(&p[start..]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()));
        let mut out = String::new();
        for p in pieces {
            let r = m.push(p);
            out.push_str(&r.text);
            if r.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.flush());
        (out, false)
    }

    #[test]
    fn stops_across_pieces_and_never_emits_the_stop() {
        assert_eq!(
            run(&["</s>"], &["Hello <", "/", "s> more"]),
            ("Hello ".into(), true)
        );
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
        assert_eq!(
            run(&["STOP"], &["no st", "op here"]),
            ("no stop here".into(), false)
        );
        assert_eq!(run(&["ab", "b"], &["xab"]), ("x".into(), true));
        assert_eq!(
            run(&["日本"], &["今日", "は日", "本"]),
            ("今日は".into(), true)
        );
    }

    #[test]
    fn holds_back_only_possible_prefixes() {
        let mut m = StopMatcher::new(["END".to_string()]);
        assert_eq!(m.push("the E").text, "the ");
        assert_eq!(m.push("x").text, "Ex");
        assert_eq!(m.flush(), "");
    }
}
