//! SentencePiece unigram (`t5`), as llama.cpp's `llm_tokenizer_ugm`: the precompiled
//! charsmap normalizer with SentencePiece's whitespace options, then the Viterbi search for
//! the tokenization with the highest total score.

use super::normalize::PrecompiledCharsmap;
use super::spm::sentencepiece_piece;
use super::trie::ByteTrie;
use super::{Fragment, TokenId, TokenizerError, TokenizerModel, Vocab};

/// SentencePiece's escaped space, U+2581.
const ESCAPED_SPACE: &[u8] = "\u{2581}".as_bytes();

/// What an unknown codepoint costs below the worst normal token's score.
const UNKNOWN_TOKEN_PENALTY: f32 = 10.0;

pub(crate) struct Unigram {
    /// Normal, user-defined and unused tokens: the candidates of the search.
    tokens: ByteTrie,
    /// User-defined tokens, which the normalizer passes through untouched.
    user_defined: Option<ByteTrie>,
    charsmap: Option<PrecompiledCharsmap>,
    unk: TokenId,
    /// Per-token scores as the search uses them (user-defined tokens score 0).
    scores: Vec<f64>,
    unknown_score: f64,
    whitespace: WhitespaceOptions,
}

#[derive(Clone, Copy, Debug)]
struct WhitespaceOptions {
    /// Spaces become U+2581 rather than staying ' '.
    escape: bool,
    /// One space before the text (or after it, with `treat_whitespace_as_suffix`).
    add_prefix: bool,
    as_suffix: bool,
    /// Drop leading and trailing spaces and collapse runs to one.
    remove_extra: bool,
}

impl Unigram {
    pub(crate) fn new(vocab: &Vocab) -> Result<Self, TokenizerError> {
        let unk = vocab
            .unk()
            .ok_or_else(|| TokenizerError::Invalid("t5 vocabulary has no unknown token".into()))?;
        let charsmap = vocab
            .precompiled_charsmap()
            .filter(|blob| !blob.is_empty())
            .map(PrecompiledCharsmap::new)
            .transpose()?;

        let ids = || (0..vocab.len()).map(|id| id as TokenId);
        let mut min_score = f32::MAX;
        for id in ids().filter(|&id| vocab.is_normal(id)) {
            min_score = min_score.min(vocab.score(id));
        }
        let tokens = ByteTrie::new(
            ids()
                .filter(|&id| {
                    vocab.is_normal(id) || vocab.is_user_defined(id) || vocab.is_unused(id)
                })
                .map(|id| (vocab.text(id).as_bytes(), id)),
        );
        let has_user_defined = ids().any(|id| vocab.is_user_defined(id));
        let user_defined = has_user_defined.then(|| {
            ByteTrie::new(
                ids()
                    .filter(|&id| vocab.is_user_defined(id))
                    .map(|id| (vocab.text(id).as_bytes(), id)),
            )
        });
        // Scores are added up in double precision, as SentencePiece does.
        let scores = ids()
            .map(|id| {
                if vocab.is_user_defined(id) {
                    0.0
                } else {
                    f64::from(vocab.score(id))
                }
            })
            .collect();

        Ok(Unigram {
            tokens,
            user_defined,
            charsmap,
            unk,
            scores,
            // The penalty is applied in single precision, like llama.cpp.
            unknown_score: f64::from(min_score - UNKNOWN_TOKEN_PENALTY),
            whitespace: WhitespaceOptions {
                escape: vocab.escape_whitespaces(),
                add_prefix: vocab.add_space_prefix(),
                as_suffix: vocab.treat_whitespace_as_suffix(),
                remove_extra: vocab.remove_extra_whitespaces(),
            },
        })
    }

    /// Normalizes `text` and appends its best tokenization to `out`.
    fn tokenize(&self, text: &str, out: &mut Vec<TokenId>) {
        let normalized = self.normalize(text);
        self.viterbi(&normalized, out);
    }

    /// The charsmap replacements of `input`, with spaces escaped, merged and added as the
    /// whitespace options say. The result is bytes: a malformed charsmap can produce (and a
    /// user-defined token match can leave) invalid UTF-8, which the search handles.
    fn normalize(&self, input: &str) -> Vec<u8> {
        let ws = self.whitespace;
        let space = if ws.escape { ESCAPED_SPACE } else { b" " };
        let prepend_space = ws.add_prefix && !ws.as_suffix;
        let append_space = ws.add_prefix && ws.as_suffix;

        let mut out = Vec::with_capacity(input.len() + input.len() / 2 + space.len());
        let mut space_prepended = false;
        let mut in_word = false;
        let mut pos = 0;
        while pos < input.len() {
            let (piece, consumed) = self.normalize_prefix(input, pos);
            for &byte in piece {
                if byte != b' ' {
                    if !in_word {
                        in_word = true;
                        // With remove_extra, every word gets one space before it, the first
                        // one too (even without add_prefix): llama.cpp's behaviour.
                        if (prepend_space && !space_prepended) || ws.remove_extra {
                            out.extend_from_slice(space);
                            space_prepended = true;
                        }
                    }
                    out.push(byte);
                } else {
                    in_word = false;
                    if !ws.remove_extra {
                        out.extend_from_slice(space);
                    }
                }
            }
            pos += consumed;
        }
        if append_space {
            out.extend_from_slice(space);
        }
        out
    }

    /// The normalized form of the start of `input[pos..]` and how many bytes it consumes
    /// (at least one).
    fn normalize_prefix<'a>(&'a self, input: &'a str, pos: usize) -> (&'a [u8], usize) {
        let rest = &input.as_bytes()[pos..];
        // llama.cpp passes through the longest run of bytes along the user-defined tokens'
        // trie, even where no token ends there.
        if let Some(user_defined) = &self.user_defined {
            let len = user_defined.path_len(rest);
            if len > 0 {
                return (&rest[..len], len);
            }
        }
        if let Some((len, replacement)) = self.charsmap.as_ref().and_then(|m| m.longest_match(rest))
        {
            return (replacement, len);
        }
        // One codepoint unchanged; mid-codepoint (after a partial match above) each stray
        // byte becomes U+FFFD.
        if input.is_char_boundary(pos) {
            let len = utf8_len(rest[0]).min(rest.len());
            (&rest[..len], len)
        } else {
            ("\u{FFFD}".as_bytes(), 1)
        }
    }

    /// Appends the tokenization of `text` with the highest total score, each codepoint no
    /// token covers becoming the unknown token (runs of them merged into one).
    fn viterbi(&self, text: &[u8], out: &mut Vec<TokenId>) {
        if text.is_empty() {
            return;
        }
        #[derive(Clone, Copy)]
        struct Best {
            token: TokenId,
            /// Where the token starts.
            start: usize,
            score: f64,
        }
        let unreached = Best {
            token: self.unk,
            start: 0,
            score: -f64::MAX,
        };
        // best[i]: the best tokenization of text[..i] ends with `token` over text[start..i].
        let mut best = vec![unreached; text.len() + 1];
        best[0].score = 0.0;

        let mut pos = 0;
        while pos < text.len() {
            let char_len = utf8_len(text[pos]).min(text.len() - pos);
            let base = best[pos].score;
            let mut covers_char = false;
            for (len, id) in self.tokens.prefixes(&text[pos..]) {
                covers_char |= len == char_len;
                let score = base + self.scores.get(id as usize).copied().unwrap_or(0.0);
                let end = &mut best[pos + len];
                if score > end.score {
                    *end = Best {
                        token: id,
                        start: pos,
                        score,
                    };
                }
            }
            if !covers_char {
                let score = base + self.unknown_score;
                let end = &mut best[pos + char_len];
                if score > end.score {
                    *end = Best {
                        token: self.unk,
                        start: pos,
                        score,
                    };
                }
            }
            pos += char_len;
        }

        let first = out.len();
        let mut at = text.len();
        let mut prev_unknown = false;
        loop {
            let step = best[at];
            let unknown = step.token == self.unk;
            if !(prev_unknown && unknown) {
                out.push(step.token);
            }
            // Every entry starts before its end, so this terminates.
            if step.start == 0 {
                break;
            }
            prev_unknown = unknown;
            at = step.start;
        }
        out[first..].reverse();
    }
}

impl TokenizerModel for Unigram {
    fn encode(
        &self,
        vocab: &Vocab,
        fragments: &[Fragment<'_>],
        add_special: bool,
        out: &mut Vec<TokenId>,
    ) {
        if add_special && vocab.add_bos() {
            out.extend(vocab.bos());
        }
        for fragment in fragments {
            match *fragment {
                Fragment::Text(text) => self.tokenize(text, out),
                Fragment::Token(id) => out.push(id),
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

/// The length of the UTF-8 sequence a lead byte announces (1 for a stray continuation
/// byte), as llama.cpp's `unicode_len_utf8`.
fn utf8_len(lead: u8) -> usize {
    match lead >> 4 {
        0xC | 0xD => 2,
        0xE => 3,
        0xF => 4,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_len_follows_lead_byte() {
        assert_eq!(utf8_len(b'a'), 1);
        assert_eq!(utf8_len(0x80), 1);
        assert_eq!(utf8_len(0xC3), 2);
        assert_eq!(utf8_len(0xE2), 3);
        assert_eq!(utf8_len(0xF0), 4);
    }
}
