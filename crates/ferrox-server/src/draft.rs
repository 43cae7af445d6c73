//! A draft model beside the served one (`--model-draft`): a smaller model with the same
//! vocabulary proposes each drafting sequence's next tokens, greedily, and the served model
//! checks them inside its batch as it checks prompt-lookup drafts. The drafting itself is
//! `ferrox-generate`'s ([`DraftSequences`], the CLI's too); this holds the draft engine and
//! a paged memory for every sequence the server may run.

use ferrox_generate::draft_model::{DraftDistribution, DraftSequences};
use ferrox_memory::MemoryShape;
use ferrox_models::{AnyEngine, Engine, EngineError};
use ferrox_tokenizer::tokenizer::TokenId;

pub use ferrox_generate::draft_model::DraftRequest;

/// Positions per block of the draft's memory.
const BLOCK_TOKENS: usize = 16;

/// The draft model and its sequences.
pub struct DraftModel {
    engine: AnyEngine,
    sequences: DraftSequences,
    distributions: Vec<Vec<DraftDistribution>>,
}

impl DraftModel {
    /// Memory for `max_sequences` sequences of the draft's whole context; drafting stops at
    /// a token the draft gives less than `p_min`, or one outside the served model's
    /// `target_vocab`.
    pub fn new(
        engine: AnyEngine,
        max_sequences: usize,
        p_min: f32,
        target_vocab: usize,
    ) -> Result<DraftModel, EngineError> {
        let n_ctx = engine.context_size();
        let shape = MemoryShape {
            n_blocks: max_sequences * n_ctx.div_ceil(BLOCK_TOKENS),
            block_tokens: BLOCK_TOKENS,
            max_sequences,
            n_ctx,
            prefix_cache: false,
        };
        let sequences = DraftSequences::new(&engine, shape, p_min, target_vocab, 0)?;
        Ok(DraftModel {
            engine,
            sequences,
            distributions: Vec::new(),
        })
    }

    /// Forgets the sequences of requests that are no longer running.
    pub fn retain(&mut self, running: impl Fn(u64) -> bool) {
        self.sequences.retain(running);
    }

    /// Each request's drafted tokens into `out` (one list per request, in order; empty for
    /// a request the draft cannot serve now).
    pub fn propose(
        &mut self,
        requests: &[DraftRequest<'_>],
        out: &mut Vec<Vec<TokenId>>,
    ) -> Result<(), EngineError> {
        let distributions = &mut self.distributions;
        self.sequences
            .propose(&self.engine, requests, out, distributions)
    }
}
