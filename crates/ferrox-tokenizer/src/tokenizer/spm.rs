//! SentencePiece BPE (`tokenizer.ggml.model = "llama"`), as llama.cpp's
//! `llm_tokenizer_spm_session`: the text is split into characters, then the adjacent pair
//! whose concatenation is the best-scoring token is merged, again and again; characters
//! that end up in no token are emitted as `<0xAB>` byte tokens.

use super::libstdcxx::PriorityQueue;
use super::{Fragment, TokenAttr, TokenId, TokenizerError, TokenizerModel, Vocab};

/// SentencePiece's whitespace marker, U+2581 LOWER ONE EIGHTH BLOCK.
pub(crate) const SPACE_MARKER: &str = "\u{2581}";
const SPACE_MARKER_CHAR: char = '\u{2581}';

pub(crate) struct Spm {
    /// Characters that some token has right before a whitespace marker (`>` in Gemma's
    /// `>▁</`). Everywhere else, a marker after another character starts a run that no
    /// token can span, which lets long texts be merged word by word (see `word_runs`).
    chars_before_marker: Vec<char>,
}

impl Spm {
    pub(crate) fn new(vocab: &Vocab) -> Result<Self, TokenizerError> {
        let mut chars_before_marker = Vec::new();
        for id in 0..vocab.len() as TokenId {
            let text = vocab.text(id);
            for (prev, c) in text.chars().zip(text.chars().skip(1)) {
                if c == SPACE_MARKER_CHAR && prev != SPACE_MARKER_CHAR {
                    chars_before_marker.push(prev);
                }
            }
        }
        chars_before_marker.sort_unstable();
        chars_before_marker.dedup();
        Ok(Spm {
            chars_before_marker,
        })
    }

    /// Splits escaped text into runs that can be tokenized independently: at each marker
    /// that follows a character no token puts before a marker. No token spans such a cut,
    /// so no bigram crosses it, and llama.cpp's one global best-first merge loop performs,
    /// within each run, exactly the merges a loop over that run alone would: the result is
    /// the same, while the work queue stays small.
    fn word_runs<'t>(&self, text: &'t str) -> impl Iterator<Item = &'t str> + 't {
        let cuts: Vec<usize> = memchr::memmem::find_iter(text.as_bytes(), SPACE_MARKER)
            .filter(|&at| {
                text[..at].chars().next_back().is_some_and(|prev| {
                    prev != SPACE_MARKER_CHAR
                        && self.chars_before_marker.binary_search(&prev).is_err()
                })
            })
            .collect();
        let ends = cuts.into_iter().chain(std::iter::once(text.len()));
        let mut start = 0;
        ends.map(move |end| {
            let run = &text[start..end];
            start = end;
            run
        })
    }
}

impl TokenizerModel for Spm {
    fn encode(
        &self,
        vocab: &Vocab,
        fragments: &[Fragment<'_>],
        add_special: bool,
        out: &mut Vec<TokenId>,
    ) {
        let mut session = Session::default();
        let mut text = String::new();
        // A text fragment gets a space prefix at the start and after every special token.
        let mut prev_is_special = true;
        if add_special && vocab.add_bos() {
            out.extend(vocab.bos());
        }
        for fragment in fragments {
            match *fragment {
                Fragment::Text(raw) => {
                    text.clear();
                    if vocab.add_space_prefix() && prev_is_special {
                        text.push_str(SPACE_MARKER);
                    }
                    escape_whitespace(raw, &mut text);
                    for run in self.word_runs(&text) {
                        session.tokenize(vocab, run, out);
                    }
                    prev_is_special = false;
                }
                Fragment::Token(id) => {
                    out.push(id);
                    prev_is_special = true;
                }
            }
        }
        if add_special && vocab.add_eos() {
            out.extend(vocab.eos());
        }
    }

    fn token_to_piece(&self, vocab: &Vocab, id: TokenId, special: bool, out: &mut Vec<u8>) {
        sentencepiece_piece(vocab, id, special, out);
    }
}

/// Appends `raw` to `out` with every space replaced by the whitespace marker.
pub(crate) fn escape_whitespace(raw: &str, out: &mut String) {
    let mut rest = raw;
    while let Some(at) = rest.find(' ') {
        out.push_str(&rest[..at]);
        out.push_str(SPACE_MARKER);
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
}

/// The bytes of a token as llama.cpp's `token_to_piece` renders SentencePiece-style
/// vocabularies (SPM, UGM, WPM): control, unknown and user-defined tokens as their text
/// (control and unknown only with `special`), normal tokens with the whitespace marker
/// turned back into spaces, byte tokens as their byte, anything else as nothing.
pub(crate) fn sentencepiece_piece(vocab: &Vocab, id: TokenId, special: bool, out: &mut Vec<u8>) {
    let attr = vocab.attr(id);
    let special_attr = TokenAttr::CONTROL | TokenAttr::UNKNOWN;
    if !special && attr.intersects(special_attr) {
        return;
    }
    let text = vocab.text(id);
    if attr.intersects(special_attr | TokenAttr::USER_DEFINED) {
        out.extend_from_slice(text.as_bytes());
    } else if attr.intersects(TokenAttr::NORMAL) {
        unescape_whitespace(text, out);
    } else if attr.intersects(TokenAttr::BYTE) {
        out.push(byte_of_token(text));
    }
}

/// Appends `text` with every whitespace marker turned back into a space.
pub(crate) fn unescape_whitespace(text: &str, out: &mut Vec<u8>) {
    let mut rest = text;
    while let Some(at) = rest.find(SPACE_MARKER) {
        out.extend_from_slice(&rest.as_bytes()[..at]);
        out.push(b' ');
        rest = &rest[at + SPACE_MARKER.len()..];
    }
    out.extend_from_slice(rest.as_bytes());
}

/// The byte a `<0xAB>` token stands for: llama.cpp parses the two characters after `<0x`
/// with `strtol(.., 16)`, which stops at the first non-hex digit (and yields 0 for none).
pub(crate) fn byte_of_token(text: &str) -> u8 {
    let digits = text.as_bytes().get(3..).unwrap_or_default();
    let mut value = 0u8;
    for &c in digits.iter().take(2) {
        let Some(d) = char::from(c).to_digit(16) else {
            break;
        };
        value = value.wrapping_mul(16).wrapping_add(d as u8);
    }
    value
}

/// A run of the text: one character at first, then the union of merged neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of two neighbouring symbols into the token of `score`.
#[derive(Clone, Copy)]
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    len: usize,
}

/// llama.cpp's ordering: best score first, then leftmost.
fn bigram_less(l: &Bigram, r: &Bigram) -> bool {
    l.score < r.score || (l.score == r.score && l.left > r.left)
}

type BigramQueue = PriorityQueue<Bigram, fn(&Bigram, &Bigram) -> bool>;

/// Buffers reused across fragments.
struct Session {
    symbols: Vec<Symbol>,
    queue: BigramQueue,
}

impl Default for Session {
    fn default() -> Self {
        Session {
            symbols: Vec::new(),
            queue: PriorityQueue::new(bigram_less),
        }
    }
}

impl Session {
    fn tokenize(&mut self, vocab: &Vocab, text: &str, out: &mut Vec<TokenId>) {
        self.symbols.clear();
        self.queue.clear();
        let mut chars = text.char_indices().peekable();
        while let Some((start, c)) = chars.next() {
            let index = self.symbols.len();
            self.symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: index.checked_sub(1),
                next: chars.peek().map(|_| index + 1),
            });
        }

        for right in 1..self.symbols.len() {
            self.try_add_bigram(vocab, text, Some(right - 1), Some(right));
        }

        while let Some(bigram) = self.queue.pop() {
            let left = self.symbols[bigram.left];
            let right = self.symbols[bigram.right];
            // Skip candidates made stale by an earlier merge of either side.
            if left.len == 0 || right.len == 0 || left.len + right.len != bigram.len {
                continue;
            }
            self.symbols[bigram.left].len += right.len;
            self.symbols[bigram.right].len = 0;
            self.symbols[bigram.left].next = right.next;
            if let Some(next) = right.next {
                self.symbols[next].prev = Some(bigram.left);
            }
            self.try_add_bigram(vocab, text, left.prev, Some(bigram.left));
            self.try_add_bigram(vocab, text, Some(bigram.left), right.next);
        }

        // Every merged symbol is a token (merges only happen into tokens), so llama.cpp's
        // `rev_merge` re-splitting never triggers: a symbol is a token or a lone character.
        let mut at = if self.symbols.is_empty() {
            None
        } else {
            Some(0)
        };
        while let Some(i) = at {
            let symbol = self.symbols[i];
            let piece = &text[symbol.start..symbol.start + symbol.len];
            match vocab.id(piece) {
                Some(id) => out.push(id),
                None => {
                    for &byte in piece.as_bytes() {
                        // llama.cpp throws when a byte token is missing; we fall back on
                        // the unknown token (and drop the byte where there is none).
                        out.extend(vocab.byte_token(byte).or(vocab.unk()));
                    }
                }
            }
            at = symbol.next;
        }
    }

    fn try_add_bigram(
        &mut self,
        vocab: &Vocab,
        text: &str,
        left: Option<usize>,
        right: Option<usize>,
    ) {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let start = self.symbols[left].start;
        let len = self.symbols[left].len + self.symbols[right].len;
        let Some(id) = vocab.id(&text[start..start + len]) else {
            return;
        };
        self.queue.push(Bigram {
            left,
            right,
            score: vocab.score(id),
            len,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whitespace_escaping_round_trips() {
        let mut escaped = String::new();
        escape_whitespace(" a  b ", &mut escaped);
        assert_eq!(escaped, "▁a▁▁b▁");
        let mut back = Vec::new();
        unescape_whitespace(&escaped, &mut back);
        assert_eq!(back, b" a  b ");
    }

    #[test]
    fn byte_tokens_parse_like_strtol() {
        assert_eq!(byte_of_token("<0x0A>"), 0x0a);
        assert_eq!(byte_of_token("<0xFF>"), 0xff);
        assert_eq!(byte_of_token("<0xG1>"), 0);
        assert_eq!(byte_of_token("<0x"), 0);
        assert_eq!(byte_of_token("<0x4G>"), 4);
    }
}
