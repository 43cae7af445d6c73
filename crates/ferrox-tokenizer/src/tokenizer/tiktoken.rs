//! tiktoken BPE files (`tiktoken.model`: one `BASE64 RANK` line per token, the rank being
//! the token's id and its merge priority), turned into the byte-level BPE vocabulary a GGUF
//! file carries (`tokenizer.ggml.*`), as llama.cpp's converter does for Moonshot's
//! checkpoints: token texts in GPT-2's byte-to-unicode alphabet, and one merge per token
//! whose bytes BPE over the lower ranks builds from exactly two parts.
//!
//! The result loads through [`super::Vocab::from_gguf`] unchanged, so tokenizing runs the
//! same byte-level BPE and pre-tokenizer (`kimi-k2`, the split pattern of Moonshot's
//! `tokenization_kimi.py`) as a converted GGUF file.

use std::collections::HashMap;

use ferrox_gguf::{OwnedArray, OwnedValue};

use super::unicode::byte_to_char;
use super::{TokenId, TokenType, TokenizerError};

/// The most tokens a tiktoken vocabulary may declare (eight times the largest in use).
pub const MAX_TIKTOKEN_TOKENS: usize = 1 << 21;

fn invalid(msg: impl Into<String>) -> TokenizerError {
    TokenizerError::Invalid(msg.into())
}

/// The mergeable tokens of a tiktoken file: `ranks[r]` holds the bytes of the token of
/// rank (and id) `r`, `None` for a rank the file skips.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TiktokenRanks {
    ranks: Vec<Option<Vec<u8>>>,
}

impl TiktokenRanks {
    /// Parses a tiktoken file. Ranks must be unique and below [`MAX_TIKTOKEN_TOKENS`], token
    /// bytes unique and non-empty.
    pub fn parse(text: &[u8]) -> Result<TiktokenRanks, TokenizerError> {
        let mut ranks: Vec<Option<Vec<u8>>> = Vec::new();
        let mut seen: HashMap<Vec<u8>, usize> = HashMap::new();
        for (i, line) in text.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let at = || format!("tiktoken line {}", i + 1);
            let mut fields = line.split(|&b| b == b' ').filter(|f| !f.is_empty());
            let (Some(token), Some(rank), None) = (fields.next(), fields.next(), fields.next())
            else {
                return Err(invalid(format!("{}: expected `BASE64 RANK`", at())));
            };
            let bytes = decode_base64(token)
                .filter(|b| !b.is_empty())
                .ok_or_else(|| invalid(format!("{}: the token is not base64", at())))?;
            let rank = std::str::from_utf8(rank)
                .ok()
                .and_then(|r| r.parse::<usize>().ok())
                .filter(|&r| r < MAX_TIKTOKEN_TOKENS)
                .ok_or_else(|| {
                    invalid(format!(
                        "{}: the rank is not a number below {MAX_TIKTOKEN_TOKENS}",
                        at()
                    ))
                })?;
            if ranks.len() <= rank {
                ranks.resize(rank + 1, None);
            }
            if ranks[rank].is_some() {
                return Err(invalid(format!("{}: rank {rank} appears twice", at())));
            }
            if let Some(other) = seen.insert(bytes.clone(), rank) {
                return Err(invalid(format!(
                    "{}: the token of rank {rank} repeats rank {other}",
                    at()
                )));
            }
            ranks[rank] = Some(bytes);
        }
        Ok(TiktokenRanks { ranks })
    }

    /// One past the highest rank: the id of the first token after the mergeable ones.
    pub fn len(&self) -> usize {
        self.ranks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranks.is_empty()
    }

    /// The bytes of the token of rank `rank`.
    pub fn bytes(&self, rank: usize) -> Option<&[u8]> {
        self.ranks.get(rank)?.as_deref()
    }

    /// The GGUF merges, in rank order: for each token of more than one byte, BPE over the
    /// ranks below its own; when that ends in exactly two parts, they are its merge
    /// (llama.cpp's converter derives them the same way).
    pub fn merges(&self) -> Vec<String> {
        let rank_of: HashMap<&[u8], usize> = self
            .ranks
            .iter()
            .enumerate()
            .filter_map(|(r, b)| Some((b.as_deref()?, r)))
            .collect();
        let mut merges = Vec::new();
        for (rank, token) in self.ranks.iter().enumerate() {
            let Some(token) = token.as_deref().filter(|t| t.len() > 1) else {
                continue;
            };
            let parts = bpe_parts(&rank_of, token, rank);
            if let [left, right] = &parts[..] {
                merges.push(format!(
                    "{} {}",
                    byte_level(&token[left.clone()]),
                    byte_level(&token[right.clone()])
                ));
            }
        }
        merges
    }
}

/// The parts (byte ranges of `token`) that merging pairs of rank below `max_rank`, lowest
/// rank first (leftmost on ties), builds from single bytes.
fn bpe_parts(
    rank_of: &HashMap<&[u8], usize>,
    token: &[u8],
    max_rank: usize,
) -> Vec<std::ops::Range<usize>> {
    let mut parts: Vec<std::ops::Range<usize>> = (0..token.len()).map(|i| i..i + 1).collect();
    loop {
        // Adjacent parts are adjacent ranges of `token`, so a pair is one slice.
        let best = parts
            .windows(2)
            .enumerate()
            .filter_map(|(i, w)| Some((*rank_of.get(&token[w[0].start..w[1].end])?, i)))
            .filter(|&(rank, _)| rank < max_rank)
            .min();
        let Some((_, i)) = best else {
            return parts;
        };
        parts[i].end = parts[i + 1].end;
        parts.remove(i + 1);
    }
}

/// Bytes in GPT-2's byte-to-unicode alphabet, the text byte-level BPE tokens are stored as.
pub(crate) fn byte_level(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_to_char(b)).collect()
}

/// The `tokenizer.ggml.*` metadata of a tiktoken vocabulary of `n_vocab` ids: the mergeable
/// tokens at their ranks, `specials` (id, text) as control tokens, every other id an unused
/// `[PAD{id}]` (the layout llama.cpp's converter writes). `pre` names the pre-tokenizer.
pub fn tiktoken_metadata(
    ranks: &TiktokenRanks,
    specials: &[(TokenId, String)],
    n_vocab: usize,
    pre: &str,
) -> Result<Vec<(String, OwnedValue)>, TokenizerError> {
    if n_vocab > MAX_TIKTOKEN_TOKENS || n_vocab < ranks.len() {
        return Err(invalid(format!(
            "vocabulary size {n_vocab} cannot hold the {} tiktoken ranks",
            ranks.len()
        )));
    }
    let mut tokens: Vec<Option<(String, TokenType)>> = (0..n_vocab)
        .map(|r| Some((byte_level(ranks.bytes(r)?), TokenType::Normal)))
        .collect();
    for (id, text) in specials {
        let slot = tokens.get_mut(*id as usize).ok_or_else(|| {
            invalid(format!(
                "special token {text:?} has id {id}, past the vocabulary ({n_vocab})"
            ))
        })?;
        if let Some((old, TokenType::Normal)) = slot {
            return Err(invalid(format!(
                "special token {text:?} has id {id}, which tiktoken gives to {old:?}"
            )));
        }
        *slot = Some((text.clone(), TokenType::Control));
    }
    let mut texts = Vec::with_capacity(n_vocab);
    let mut types = Vec::with_capacity(n_vocab);
    for (id, token) in tokens.into_iter().enumerate() {
        let (text, ty) = token.unwrap_or_else(|| (format!("[PAD{id}]"), TokenType::Unused));
        texts.push(text);
        types.push(match ty {
            TokenType::Normal => 1,
            TokenType::Control => 3,
            _ => 5,
        });
    }
    let key = |k: &str| format!("tokenizer.ggml.{k}");
    Ok(vec![
        (key("model"), "gpt2".into()),
        (key("pre"), pre.into()),
        (key("tokens"), OwnedValue::Array(OwnedArray::String(texts))),
        (key("token_type"), OwnedValue::Array(OwnedArray::I32(types))),
        (
            key("merges"),
            OwnedValue::Array(OwnedArray::String(ranks.merges())),
        ),
    ])
}

/// Standard base64 (with or without `=` padding); `None` for anything else.
fn decode_base64(text: &[u8]) -> Option<Vec<u8>> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    use base64::Engine;
    const STANDARD_ANY_PADDING: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    STANDARD_ANY_PADDING.decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_with_and_without_padding() {
        assert_eq!(decode_base64(b"IQ==").as_deref(), Some(&b"!"[..]));
        assert_eq!(decode_base64(b"IQ").as_deref(), Some(&b"!"[..]));
        assert_eq!(decode_base64(b"aGVsbG8=").as_deref(), Some(&b"hello"[..]));
        assert_eq!(decode_base64(b"aGVsbG8h").as_deref(), Some(&b"hello!"[..]));
        assert_eq!(decode_base64(b"a"), None);
        assert_eq!(decode_base64(b"a*=="), None);
    }

    fn file(tokens: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for (rank, t) in tokens.iter().enumerate() {
            out.extend(encode_base64(t).bytes());
            out.extend(format!(" {rank}\n").bytes());
        }
        out
    }

    fn encode_base64(bytes: &[u8]) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn merges_come_from_ranks() {
        let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        for t in [&b"ab"[..], b"cd", b"abcd", b" a", b"abc"] {
            tokens.push(t.to_vec());
        }
        let refs: Vec<&[u8]> = tokens.iter().map(Vec::as_slice).collect();
        let ranks = TiktokenRanks::parse(&file(&refs)).unwrap();
        assert_eq!(ranks.len(), 261);
        // "abc" (rank 260) is built from "ab" + "c"; "abcd" (258) from "ab" + "cd", since
        // "abc" ranks after it.
        assert_eq!(ranks.merges(), ["a b", "c d", "ab cd", "Ġ a", "ab c"]);
    }

    #[test]
    fn bad_lines_are_errors() {
        assert!(TiktokenRanks::parse(b"YQ== 0\nYQ== 1\n").is_err());
        assert!(TiktokenRanks::parse(b"YQ== 0\nYg== 0\n").is_err());
        assert!(TiktokenRanks::parse(b"YQ== x\n").is_err());
        assert!(TiktokenRanks::parse(b"YQ==\n").is_err());
        assert!(TiktokenRanks::parse(b"YQ== 99999999999\n").is_err());
    }
}
