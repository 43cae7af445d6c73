//! Tokenizers loaded from GGUF metadata, byte-exact with llama.cpp.
//!
//! CONTRACT between the tokenizer modules (keep these signatures stable):
//! - `vocab.rs`: `Vocab` (tokens, scores, types/attributes, special ids, flags, merges,
//!   precompiled charsmap) loaded from GGUF metadata, `TokenId`, `TokenType`.
//! - `special.rs`: splits raw text into `Fragment`s around special tokens
//!   (llama.cpp's `tokenizer_st_partition`).
//! - one file per model kind, each implementing `TokenizerModel`:
//!   `spm.rs` (`llama`), `bpe.rs` + `pretokenize.rs` (`gpt2`, and BPE-style kinds such as
//!   `gemma4`), `unigram.rs` (`t5`), `wpm.rs` (`bert`).
//! - `stream.rs`: `StreamDecoder`.
//! - `tiktoken.rs`: tiktoken BPE files turned into the `tokenizer.ggml.*` metadata of a
//!   byte-level BPE vocabulary.

mod bpe;
mod libstdcxx;
mod normalize;
mod pretokenize;
mod special;
mod spm;
mod stream;
mod tiktoken;
mod trie;
mod unicode;
mod unigram;
mod vocab;
mod wpm;

use ferrox_gguf::{Gguf, Metadata};

use special::SpecialTokens;
pub use stream::{lossy_utf8, StreamDecoder};
pub use tiktoken::{tiktoken_metadata, TiktokenRanks, MAX_TIKTOKEN_TOKENS};
pub use vocab::{NormalizerOptions, TokenAttr, TokenId, TokenType, Vocab, VocabKind};

/// A piece of the input after special-token splitting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fragment<'a> {
    /// Raw text containing no special token (to be tokenized by the model).
    Text(&'a str),
    /// A special token matched in the text.
    Token(TokenId),
}

/// One tokenization algorithm. Each model kind runs its own outer loop over the fragments,
/// because llama.cpp's kinds differ there (SPM's space prefix, BPE's BOS/EOS handling,
/// WPM's CLS/SEP).
pub(crate) trait TokenizerModel: Send + Sync {
    /// Tokenizes `fragments` into `out`, adding BOS/EOS (or CLS/SEP) per the vocab's flags
    /// when `add_special` is set — exactly as llama.cpp's `llama_vocab::impl::tokenize`.
    fn encode(
        &self,
        vocab: &Vocab,
        fragments: &[Fragment<'_>],
        add_special: bool,
        out: &mut Vec<TokenId>,
    );

    /// Appends the bytes token `id` stands for (llama.cpp's `token_to_piece` with
    /// `lstrip = 0`); control tokens yield their text only when `special` is set.
    fn token_to_piece(&self, vocab: &Vocab, id: TokenId, special: bool, out: &mut Vec<u8>);
}

/// Builds the algorithm for the vocabulary's `tokenizer.ggml.model`.
fn build_model(vocab: &Vocab) -> Result<Box<dyn TokenizerModel>, TokenizerError> {
    let not_yet = |needs: &'static str| {
        Err(TokenizerError::Unsupported {
            model: vocab.model().to_string(),
            needs,
        })
    };
    Ok(match vocab.model() {
        "llama" => Box::new(spm::Spm::new(vocab)?),
        "none" | "no_vocab" => Box::new(NoVocab),
        "gpt2" | "gemma4" => Box::new(bpe::Bpe::new(vocab)?),
        "hybriddna" | "whitespace" => return not_yet("llama.cpp's BPE session of that name"),
        "t5" => Box::new(unigram::Unigram::new(vocab)?),
        "bert" => Box::new(wpm::Wpm::new(vocab)?),
        "rwkv" => return not_yet("an RWKV tokenizer"),
        "plamo2" => return not_yet("a PLaMo-2 tokenizer"),
        "test" => return not_yet("llama.cpp's test tokenizer"),
        other => return Err(TokenizerError::UnknownModel(other.to_string())),
    })
}

/// `none` / `no_vocab`: text maps to no tokens and tokens to no text.
struct NoVocab;

impl TokenizerModel for NoVocab {
    fn encode(&self, _: &Vocab, _: &[Fragment<'_>], _: bool, _: &mut Vec<TokenId>) {}
    fn token_to_piece(&self, _: &Vocab, _: TokenId, _: bool, _: &mut Vec<u8>) {}
}

/// A GGUF file's tokenizer: text to token ids and back, byte-exact with llama.cpp.
pub struct Tokenizer {
    vocab: Vocab,
    model: Box<dyn TokenizerModel>,
    special: SpecialTokens,
    /// Every token's bytes rendered with `special = true`, as llama.cpp caches them.
    pieces: PieceCache,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab", &self.vocab)
            .finish_non_exhaustive()
    }
}

/// How [`Tokenizer::detokenize`] renders special tokens (llama.cpp's `llama_detokenize`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DetokenizeOptions {
    /// Drop a leading BOS and a trailing EOS where the vocabulary adds them.
    pub remove_special: bool,
    /// Render control and unknown tokens as their text (otherwise they yield nothing).
    pub unparse_special: bool,
}

impl Tokenizer {
    /// Loads the tokenizer described by a file's metadata.
    pub fn from_metadata(meta: &Metadata<'_>) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_vocab(Vocab::from_gguf(meta)?)
    }

    /// Loads the tokenizer of a GGUF file (a vocab-only file is enough).
    pub fn from_gguf(gguf: &Gguf) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_metadata(&gguf.metadata())
    }

    /// Builds the tokenizer for an already loaded vocabulary.
    pub fn from_vocab(vocab: Vocab) -> Result<Tokenizer, TokenizerError> {
        let model = build_model(&vocab)?;
        let special = SpecialTokens::new(&vocab)?;
        let pieces = PieceCache::build(&vocab, model.as_ref());
        Ok(Tokenizer {
            vocab,
            model,
            special,
            pieces,
        })
    }

    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    /// Tokenizes `text` as llama.cpp's `llama_tokenize`: `add_special` adds BOS/EOS (or
    /// CLS/SEP) where the vocabulary asks for them; `parse_special` lets control tokens
    /// written in the text (`<start_of_turn>`...) become those tokens.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<TokenId> {
        let mut out = Vec::new();
        self.encode_into(text, add_special, parse_special, &mut out);
        out
    }

    /// [`Tokenizer::encode`], appending to `out`.
    pub fn encode_into(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
        out: &mut Vec<TokenId>,
    ) {
        let fragments = self.fragments(text, parse_special);
        self.model.encode(&self.vocab, &fragments, add_special, out);
    }

    /// `text` split around the special tokens it contains (the first step of `encode`).
    pub fn fragments<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        self.special.partition(&self.vocab, text, parse_special)
    }

    /// The text of `ids`, special tokens included, as llama.cpp's `common_detokenize`;
    /// bytes that are not UTF-8 (a cut multi-byte character) become U+FFFD.
    pub fn decode(&self, ids: &[TokenId]) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids)).into_owned()
    }

    /// The bytes of `ids` as [`Tokenizer::decode`] sees them before UTF-8 validation.
    pub fn decode_bytes(&self, ids: &[TokenId]) -> Vec<u8> {
        let options = DetokenizeOptions {
            remove_special: false,
            unparse_special: true,
        };
        self.detokenize(ids, options)
    }

    /// llama.cpp's `llama_detokenize`: the pieces of `ids`, less the space prefix SPM adds
    /// to the first word, with `clean_spaces` vocabularies' spacing fixes. Ids past the
    /// vocabulary yield nothing.
    pub fn detokenize(&self, ids: &[TokenId], options: DetokenizeOptions) -> Vec<u8> {
        let mut out = Vec::new();
        if self.vocab.kind() == VocabKind::None {
            return out;
        }
        let mut ids = ids;
        let mut remove_space = self.vocab.add_space_prefix();
        if options.remove_special && self.vocab.add_bos() {
            if let (Some(&first), Some(bos)) = (ids.first(), self.vocab.bos()) {
                if first == bos {
                    remove_space = false;
                    ids = &ids[1..];
                }
            }
        }
        if options.remove_special && self.vocab.add_eos() {
            if let (Some((&last, rest)), Some(eos)) = (ids.split_last(), self.vocab.eos()) {
                if last == eos {
                    ids = rest;
                }
            }
        }
        for &id in ids {
            let mut piece = self.piece(id, options.unparse_special);
            if remove_space {
                piece = piece.strip_prefix(b" ").unwrap_or(piece);
                remove_space = false;
            }
            out.extend_from_slice(piece);
        }
        if self.vocab.clean_spaces() {
            let len = clean_up_spaces(&mut out);
            out.truncate(len);
        }
        out
    }

    /// The bytes token `id` stands for, special tokens rendered (llama.cpp's
    /// `common_token_to_piece`); empty for an id past the vocabulary.
    pub fn token_to_piece(&self, id: TokenId) -> &[u8] {
        self.pieces.get(id)
    }

    /// [`Tokenizer::token_to_piece`], with control and unknown tokens rendered only when
    /// `special` is set.
    pub fn piece(&self, id: TokenId, special: bool) -> &[u8] {
        if !special
            && self
                .vocab
                .attr(id)
                .intersects(TokenAttr::CONTROL | TokenAttr::UNKNOWN)
        {
            return &[];
        }
        self.pieces.get(id)
    }

    /// A decoder for generated tokens that yields only complete UTF-8 text.
    pub fn stream_decoder(&self, special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, special)
    }
}

/// Every token's piece in one buffer.
struct PieceCache {
    bytes: Vec<u8>,
    /// `ends[i]` is where token i's piece ends in `bytes`.
    ends: Vec<usize>,
}

impl PieceCache {
    fn build(vocab: &Vocab, model: &dyn TokenizerModel) -> PieceCache {
        let mut bytes = Vec::new();
        let mut ends = Vec::with_capacity(vocab.len());
        for id in 0..vocab.len() as TokenId {
            model.token_to_piece(vocab, id, true, &mut bytes);
            ends.push(bytes.len());
        }
        PieceCache { bytes, ends }
    }

    fn get(&self, id: TokenId) -> &[u8] {
        let i = id as usize;
        let Some(&end) = self.ends.get(i) else {
            return &[];
        };
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start..end]
    }
}

/// llama.cpp's `clean_spaces` passes over detokenized text, done in place exactly as it
/// does them (including their quirks: each pass reads bytes the previous steps of the same
/// pass may have rewritten). Returns the new length.
fn clean_up_spaces(text: &mut [u8]) -> usize {
    // " ?", " !", " .", " ," lose the space.
    let len1 = text.len();
    let mut total = usize::from(len1 > 0);
    for i in 1..len1 {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }

    // " ' " becomes "'".
    let len2 = total;
    total = usize::from(len2 > 0);
    let mut i = 1;
    while i < len2 {
        let x = text[i];
        if x == b'\'' && i + 1 < len2 && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }

    // " 's", " 'm", " 're", " 've" lose the space.
    let len3 = total;
    total = usize::from(len3 > 0);
    for i in 1..len3 {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < len3 {
            let x1 = text[i + 1];
            let joins = match x1 {
                b's' | b'm' => true,
                b't' | b'd' => false,
                _ => {
                    i + 2 < len3 && {
                        let x2 = text[i + 2];
                        x2 == b'e' && (x1 == b'r' || x1 == b'v')
                    }
                }
            };
            if joins {
                total -= 1;
            }
        }
        text[total] = x;
        total += 1;
    }
    total
}

/// Errors loading a tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(transparent)]
    Gguf(#[from] ferrox_gguf::GgufError),
    #[error("unknown tokenizer model `{0}`")]
    UnknownModel(String),
    #[error("unknown pre-tokenizer `{0}` (tokenizer.ggml.pre)")]
    UnknownPreTokenizer(String),
    #[error("invalid tokenizer metadata: {0}")]
    Invalid(String),
    #[error("tokenizer model `{model}` is not supported yet (it needs {needs})")]
    Unsupported { model: String, needs: &'static str },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(s: &str) -> String {
        let mut bytes = s.as_bytes().to_vec();
        let len = clean_up_spaces(&mut bytes);
        bytes.truncate(len);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[test]
    fn clean_spaces_matches_llama_cpp() {
        assert_eq!(clean(""), "");
        assert_eq!(clean("Hello , world !"), "Hello, world!");
        assert_eq!(clean("a ' b"), "a'b");
        assert_eq!(
            clean("it 's I 'm we 're they 've"),
            "it's I'm we're they've"
        );
        assert_eq!(clean("don 't I 'd we 'll"), "don 't I 'd we 'll");
        assert_eq!(clean(" ?"), "?");
    }
}
