//! The interface every engine implements, so one generation loop drives them all.
//!
//! Only what every engine can honour is here. Rolling a sequence back (KV truncation,
//! snapshots) is offered by the engines whose state allows it, on their state types; a
//! recurrent state cannot be rolled back and does not pretend to.

use crate::tokenizer::TokenId;
use crate::ModelError;

/// Which positions of a batch need logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsFor {
    /// Only the last token (prompt prefill).
    Last,
    /// Every token (speculative checks).
    All,
    /// The tokens from this index of the batch on (perplexity scores the second half of
    /// each chunk; the rest would be wasted memory with a large vocabulary).
    From(usize),
}

impl LogitsFor {
    /// The batch indices that get logits, for a batch of `n` tokens.
    pub fn range(self, n: usize) -> std::ops::Range<usize> {
        match self {
            LogitsFor::Last => n.saturating_sub(1)..n,
            LogitsFor::All => 0..n,
            LogitsFor::From(i) => i.min(n)..n,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("token id {token} is outside the vocabulary of {vocab_size}")]
    InvalidToken { token: TokenId, vocab_size: usize },
    #[error("position {got} does not continue the sequence ({len} positions so far)")]
    Position { got: usize, len: usize },
    #[error("the context is full: {needed} positions needed, {capacity} available")]
    ContextFull { needed: usize, capacity: usize },
    #[error("a batch needs at least one token")]
    EmptyBatch,
    #[error("{0}")]
    State(String),
    #[error(transparent)]
    Model(Box<ModelError>),
}

impl From<ModelError> for EngineError {
    fn from(e: ModelError) -> EngineError {
        EngineError::Model(Box::new(e))
    }
}

/// A model that turns tokens into next-token logits.
///
/// Implementations run each forward step on their own thread pool, entered once per call;
/// calling them from inside any rayon pool (theirs included) is allowed.
pub trait Engine: Send + Sync {
    /// Everything one sequence carries between steps (KV cache, recurrent state, scratch).
    type State: Send;

    fn new_state(&self) -> Self::State;

    fn vocab_size(&self) -> usize;

    /// Positions one state can hold.
    fn context_size(&self) -> usize;

    /// Runs one token at position `pos` (which must follow what the state holds) and
    /// returns the next-token logits.
    fn forward_token<'s>(
        &self,
        token: TokenId,
        pos: usize,
        state: &'s mut Self::State,
    ) -> Result<&'s [f32], EngineError> {
        self.forward_batch(&[token], pos, state, LogitsFor::Last)
    }

    /// Runs a batch of tokens at positions `start_pos..` (prompt prefill) and returns the
    /// logits the batch indices in `logits.range(tokens.len())` (`vocab_size()` each, in
    /// order).
    fn forward_batch<'s>(
        &self,
        tokens: &[TokenId],
        start_pos: usize,
        state: &'s mut Self::State,
        logits: LogitsFor,
    ) -> Result<&'s [f32], EngineError>;
}
