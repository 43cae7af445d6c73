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

mod libstdcxx;
mod vocab;

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
    fn encode(&self, vocab: &Vocab, fragments: &[Fragment<'_>], add_special: bool, out: &mut Vec<TokenId>);

    /// Appends the bytes token `id` stands for (llama.cpp's `token_to_piece` with
    /// `lstrip = 0`); control tokens yield their text only when `special` is set.
    fn token_to_piece(&self, vocab: &Vocab, id: TokenId, special: bool, out: &mut Vec<u8>);
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
}
