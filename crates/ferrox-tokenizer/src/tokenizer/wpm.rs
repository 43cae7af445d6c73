//! WordPiece (`bert`), as llama.cpp's `llm_tokenizer_wpm`: BERT's basic normalization and
//! word splitting, then greedy longest-match-first over the vocabulary.
//!
//! The converter stores word-initial pieces with a `▁` prefix and continuation pieces
//! ("##ing" in Hugging Face's vocabulary) bare, so a word is matched as `▁word`.

use super::spm::sentencepiece_piece;
use super::trie::ByteTrie;
use super::unicode::{Category, CharFlags};
use super::{Fragment, NormalizerOptions, TokenId, TokenizerError, TokenizerModel, Vocab};

/// The word-initial marker of the converted vocabulary.
const WORD_PREFIX: &str = "\u{2581}";

pub(crate) struct Wpm {
    /// Every token text (llama.cpp looks words up in the full text-to-id map).
    tokens: ByteTrie,
    unk: TokenId,
    options: NormalizerOptions,
}

impl Wpm {
    pub(crate) fn new(vocab: &Vocab) -> Result<Self, TokenizerError> {
        let unk = vocab.unk().ok_or_else(|| {
            TokenizerError::Invalid("bert vocabulary has no unknown token".into())
        })?;
        let tokens = ByteTrie::new((0..vocab.len()).map(|id| {
            let id = id as TokenId;
            (vocab.text(id).as_bytes(), id)
        }));
        Ok(Wpm {
            tokens,
            unk,
            options: vocab.normalizer(),
        })
    }

    /// Normalizes `text` and tokenizes it word by word into `out`.
    fn tokenize(&self, text: &str, out: &mut Vec<TokenId>) {
        let mut word = String::from(WORD_PREFIX);
        for c in text.chars() {
            let c = if self.options.strip_accents {
                first_of_nfd(c)
            } else {
                c
            };
            let flags = CharFlags::of(c);
            if flags.is_whitespace() {
                self.flush_word(&mut word, out);
                continue;
            }
            if c == '\0' || c == '\u{FFFD}' || flags.category() == Some(Category::Control) {
                continue;
            }
            if self.options.strip_accents && flags.is_mark() {
                continue;
            }
            let mapped = if self.options.lowercase {
                to_lower(c, flags)
            } else {
                c
            };
            // Punctuation, ASCII symbols and CJK ideographs are words of their own.
            if flags.is_punctuation() || (c < '\x7F' && flags.is_symbol()) || is_cjk_ideograph(c) {
                self.flush_word(&mut word, out);
                word.push(mapped);
                self.flush_word(&mut word, out);
            } else {
                word.push(mapped);
            }
        }
        self.flush_word(&mut word, out);
    }

    /// Tokenizes the word in `word` (after its `▁`), if any, and empties it.
    fn flush_word(&self, word: &mut String, out: &mut Vec<TokenId>) {
        if word.len() > WORD_PREFIX.len() {
            self.tokenize_word(word.as_bytes(), out);
            word.truncate(WORD_PREFIX.len());
        }
    }

    /// Longest match first from the start of the word; a word with any unmatched position
    /// becomes a single unknown token.
    fn tokenize_word(&self, word: &[u8], out: &mut Vec<TokenId>) {
        let start = out.len();
        let mut pos = 0;
        while pos < word.len() {
            match self.tokens.longest_prefix(&word[pos..]) {
                Some((len, id)) => {
                    out.push(id);
                    pos += len;
                }
                None => {
                    out.truncate(start);
                    break;
                }
            }
        }
        if out.len() == start {
            out.push(self.unk);
        }
    }
}

impl TokenizerModel for Wpm {
    fn encode(
        &self,
        vocab: &Vocab,
        fragments: &[Fragment<'_>],
        add_special: bool,
        out: &mut Vec<TokenId>,
    ) {
        // llama.cpp adds CLS (its BOS) and SEP whatever the add_bos/add_sep flags say.
        if add_special {
            out.extend(vocab.bos());
        }
        for fragment in fragments {
            match *fragment {
                Fragment::Text(text) => self.tokenize(text, out),
                Fragment::Token(id) => out.push(id),
            }
        }
        if add_special {
            out.extend(vocab.sep());
        }
    }

    fn token_to_piece(&self, vocab: &Vocab, id: TokenId, special: bool, out: &mut Vec<u8>) {
        sentencepiece_piece(vocab, id, special, out);
    }
}

/// The first codepoint of the canonical decomposition: llama.cpp's "NFD" maps each
/// codepoint to that alone (so "é" becomes "e" and the accent is already gone), and only
/// for codepoints assigned in its Unicode version.
fn first_of_nfd(c: char) -> char {
    if c < '\u{C0}' || CharFlags::of(c).category() == Some(Category::Undefined) {
        return c;
    }
    let mut first = None;
    unicode_normalization::char::decompose_canonical(c, |d| {
        first.get_or_insert(d);
    });
    first.unwrap_or(c)
}

/// Unicode's simple lowercase mapping (UnicodeData.txt), which llama.cpp uses: the first
/// char of the full mapping (they differ only for U+0130, whose full mapping is "i̇"), for
/// codepoints assigned in llama.cpp's Unicode version.
fn to_lower(c: char, flags: CharFlags) -> char {
    if c.is_ascii() {
        return c.to_ascii_lowercase();
    }
    if flags.category() == Some(Category::Undefined) {
        return c;
    }
    c.to_lowercase().next().unwrap_or(c)
}

/// The ideograph blocks BERT treats as Chinese characters. The Extension E range starts
/// at U+2B920 rather than U+2B820, as in Hugging Face's implementation that llama.cpp
/// follows.
fn is_cjk_ideograph(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nfd_keeps_only_the_base_letter() {
        assert_eq!(first_of_nfd('é'), 'e');
        assert_eq!(first_of_nfd('Å'), 'A');
        assert_eq!(first_of_nfd('\u{212B}'), 'A'); // ANGSTROM SIGN
        assert_eq!(first_of_nfd('한'), '\u{1112}'); // Hangul: the leading jamo only
        assert_eq!(first_of_nfd('a'), 'a');
        assert_eq!(first_of_nfd('\u{FB01}'), '\u{FB01}'); // compatibility only: unchanged
    }

    #[test]
    fn lowercase_is_simple_mapping() {
        let lower = |c: char| to_lower(c, CharFlags::of(c));
        assert_eq!(lower('A'), 'a');
        assert_eq!(lower('\u{130}'), 'i');
        assert_eq!(lower('Σ'), 'σ');
        assert_eq!(lower('ß'), 'ß');
        // U+1C89 was assigned (with a lowercase) after Unicode 15.1: left alone.
        assert_eq!(lower('\u{1C89}'), '\u{1C89}');
    }
}
