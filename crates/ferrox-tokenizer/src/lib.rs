//! Text in and out of token ids, as llama.cpp does it: the tokenizers of GGUF files
//! (SentencePiece, byte-level BPE with llama.cpp's pre-tokenizers, Unigram, WordPiece), the
//! models' chat templates (Jinja, as transformers renders them) and stop-string matching.
//! Nothing here knows about engines.

pub mod chat_template;
pub mod stop;
pub mod tokenizer;
