//! Splitting raw text around special tokens, as llama.cpp's `tokenizer_st_partition`.
//!
//! llama.cpp takes the special tokens one at a time, longest first, and splits every text
//! fragment left at each occurrence of the token (leftmost first, not overlapping), so a
//! longer token claims its text before shorter ones are even looked for. Control and
//! unknown tokens take part only when `parse_special` is set; user-defined tokens always
//! do. A token with the LSTRIP (RSTRIP) attribute swallows the ASCII whitespace to its left
//! (right).
//!
//! Doing that literally costs one scan of the text per special token (Gemma has 6,000 of
//! them), so we first find, in one Aho-Corasick pass, which special tokens occur anywhere
//! in the text, and replay llama.cpp's loop for those only: a token absent from the whole
//! text cannot split any fragment of it.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use memchr::memmem;

use super::{Fragment, TokenAttr, TokenId, TokenizerError, Vocab};

/// The special tokens of a vocabulary, ready to split text with.
pub(crate) struct SpecialTokens {
    /// Token ids in the order llama.cpp tries them.
    order: Vec<TokenId>,
    /// Whether the token at the same position in `order` is split out even without
    /// `parse_special` (user-defined tokens).
    always: Vec<bool>,
    /// Whether any token is in `always`: without one, text without `parse_special` is
    /// never split.
    any_always: bool,
    /// Finds every occurrence of every special token; pattern i is `order[i]`.
    matcher: Option<AhoCorasick>,
}

impl SpecialTokens {
    pub(crate) fn new(vocab: &Vocab) -> Result<SpecialTokens, TokenizerError> {
        let order = vocab.special_tokens().to_vec();
        let always: Vec<bool> = order
            .iter()
            .map(|&id| {
                !vocab
                    .attr(id)
                    .intersects(TokenAttr::CONTROL | TokenAttr::UNKNOWN)
            })
            .collect();
        let any_always = always.contains(&true);
        let matcher = if order.is_empty() {
            None
        } else {
            let patterns = order.iter().map(|&id| vocab.text(id));
            let ac = AhoCorasickBuilder::new()
                .match_kind(MatchKind::Standard)
                .build(patterns)
                .map_err(|e| {
                    TokenizerError::Invalid(format!("cannot index the special tokens: {e}"))
                })?;
            Some(ac)
        };
        Ok(SpecialTokens {
            order,
            always,
            any_always,
            matcher,
        })
    }

    /// Splits `text` into raw-text fragments and special tokens.
    pub(crate) fn partition<'t>(
        &self,
        vocab: &Vocab,
        text: &'t str,
        parse_special: bool,
    ) -> Vec<Fragment<'t>> {
        if text.is_empty() {
            return Vec::new();
        }
        let Some(matcher) = &self.matcher else {
            return vec![Fragment::Text(text)];
        };
        if !parse_special && !self.any_always {
            return vec![Fragment::Text(text)];
        }
        let mut pieces = vec![Piece::Text(0, text.len())];

        let mut present = vec![false; self.order.len()];
        for m in matcher.find_overlapping_iter(text) {
            present[m.pattern().as_usize()] = true;
        }

        let bytes = text.as_bytes();
        let mut next = Vec::new();
        for (pos, &id) in self.order.iter().enumerate() {
            if !present[pos] || !(parse_special || self.always[pos]) {
                continue;
            }
            let needle = vocab.text(id).as_bytes();
            let finder = memmem::Finder::new(needle);
            let attr = vocab.attr(id);
            next.clear();
            for &piece in &pieces {
                match piece {
                    Piece::Token(_) => next.push(piece),
                    Piece::Text(start, end) => {
                        split_fragment(bytes, start, end, &finder, id, attr, &mut next)
                    }
                }
            }
            std::mem::swap(&mut pieces, &mut next);
        }

        pieces
            .into_iter()
            .map(|piece| match piece {
                // Matches and stripped ASCII whitespace sit on character boundaries (a
                // UTF-8 needle only matches a UTF-8 haystack at one), so slicing is sound.
                Piece::Text(start, end) => Fragment::Text(&text[start..end]),
                Piece::Token(id) => Fragment::Token(id),
            })
            .collect()
    }
}

/// A fragment as byte offsets into the text being split.
#[derive(Clone, Copy)]
enum Piece {
    Text(usize, usize),
    Token(TokenId),
}

/// Splits `bytes[start..end]` at every occurrence of one special token, appending the
/// pieces to `out`.
fn split_fragment(
    bytes: &[u8],
    mut start: usize,
    end: usize,
    finder: &memmem::Finder<'_>,
    id: TokenId,
    attr: TokenAttr,
    out: &mut Vec<Piece>,
) {
    let needle_len = finder.needle().len();
    loop {
        let Some(found) = finder.find(&bytes[start..end]) else {
            if start < end {
                out.push(Piece::Text(start, end));
            }
            return;
        };
        let at = start + found;
        let mut left_end = at;
        if attr.intersects(TokenAttr::LSTRIP) {
            while left_end > start && is_c_space(bytes[left_end - 1]) {
                left_end -= 1;
            }
        }
        if left_end > start {
            out.push(Piece::Text(start, left_end));
        }
        out.push(Piece::Token(id));

        start = at + needle_len;
        if start >= end {
            return;
        }
        if attr.intersects(TokenAttr::RSTRIP) {
            while start < end && is_c_space(bytes[start]) {
                start += 1;
            }
        }
    }
}

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}
