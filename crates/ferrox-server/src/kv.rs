//! Sequence memory for the scheduler: the engine's [`SequenceMemory`] in paged blocks shared
//! by every sequence, with a prefix cache, whatever the engine keeps per position (GQA keys
//! and values, MLA latent rows, ...).
//!
//! One arena of fixed-size blocks (`--kv-memory`, or `--ctx-size` x `--parallel` positions)
//! holds every sequence. A sequence is admitted when the blocks it may need (prompt plus its
//! token limit, within the context) are available; its blocks are then allocated as it
//! grows, so a request never fails half-way for lack of memory. Whole blocks of a prompt
//! prefix already computed (a system prompt, a chat's earlier turns, even a finished
//! request's output) are shared by reference instead of being prefilled again; finished
//! sequences leave their blocks in the cache until fresh blocks run out, least recently
//! released first.

use ferrox_memory::block_manager::{salted_root, BlockUsage};
use ferrox_memory::{MemoryError, MemoryShape, SeqId, SequenceMemory};
use ferrox_models::engine::{step_sequences_with, InputEmbeddings};
use ferrox_models::{Engine, EngineError, LogitsFor, Output, SeqWork, StepScratch};
use ferrox_tokenizer::tokenizer::TokenId;
use smallvec::SmallVec;

pub use ferrox_memory::Refusal;

/// Positions per block: small enough that a shared prefix is reused to within a few
/// tokens, large enough that attention reads long runs.
pub const BLOCK_TOKENS: usize = 16;

/// A sequence's hold on the memory.
pub type SlotId = SeqId;

/// A sequence admitted by [`KvPool::acquire`].
#[derive(Clone, Copy, Debug)]
pub struct Lease {
    pub slot: SlotId,
    /// Leading prompt tokens already in the cache (not to be prefilled again).
    pub reused: usize,
}

/// One sequence's part of a [`KvPool::forward`] step.
pub struct Work<'a> {
    pub slot: SlotId,
    pub tokens: &'a [TokenId],
    /// Whether the last token's logits are needed.
    pub logits: bool,
    /// Every token's embedding is wanted instead (a sequence being embedded).
    pub embeddings: bool,
    /// Rows in place of the tokens' embeddings (an image's).
    pub given: Option<InputEmbeddings<'a>>,
    /// See [`ferrox_models::engine::SeqInput::position_shift`].
    pub position_shift: isize,
}

pub struct KvPool {
    memory: SequenceMemory,
    scratch: StepScratch,
    /// Each sequence slot's logits of its last step.
    logits: Vec<Vec<f32>>,
}

impl KvPool {
    /// A pool of `n_blocks` blocks serving at most `max_sequences` sequences of `engine`.
    pub fn new<E: Engine + ?Sized>(
        engine: &E,
        n_blocks: usize,
        max_sequences: usize,
    ) -> Result<KvPool, MemoryError> {
        let memory = SequenceMemory::new(
            engine.memory_spec(),
            MemoryShape {
                n_blocks,
                block_tokens: BLOCK_TOKENS,
                max_sequences,
                n_ctx: engine.context_size(),
                prefix_cache: true,
            },
        )?;
        Ok(KvPool {
            logits: vec![Vec::new(); memory.max_sequences()],
            memory,
            scratch: engine.new_scratch(),
        })
    }

    /// Positions one sequence can hold.
    pub fn capacity_per_sequence(&self) -> usize {
        self.memory.capacity_per_sequence()
    }

    pub fn max_sequences(&self) -> usize {
        self.memory.max_sequences()
    }

    pub fn block_tokens(&self) -> usize {
        BLOCK_TOKENS
    }

    /// Bytes one position takes (every layer and store of the engine's memory).
    pub fn bytes_per_position(&self) -> f64 {
        self.memory.bytes_per_position()
    }

    /// Bytes reserved for the memory.
    pub fn reserved_bytes(&self) -> usize {
        self.memory.reserved_bytes()
    }

    pub fn n_blocks(&self) -> usize {
        self.memory.n_blocks()
    }

    /// Blocks in use, kept for prefix reuse, and free.
    pub fn usage(&self) -> BlockUsage {
        self.memory.usage()
    }

    /// Whether [`acquire`](Self::acquire) would admit the prompt now.
    pub fn check(
        &self,
        prompt: &[TokenId],
        max_len: usize,
        cache_salt: Option<&str>,
    ) -> Result<(), Refusal> {
        self.memory
            .check_in(salted_root(cache_salt), prompt, max_len)
    }

    /// Admits a sequence for `prompt` that may grow to `max_len` positions (capped at the
    /// context size), sharing the cached blocks of its longest cached prefix computed
    /// under the same `cache_salt` (vLLM's: requests with different salts share nothing).
    /// A refusal changes nothing.
    pub fn acquire(
        &mut self,
        prompt: &[TokenId],
        max_len: usize,
        cache_salt: Option<&str>,
    ) -> Result<Lease, Refusal> {
        let admission = self
            .memory
            .admit_in(salted_root(cache_salt), prompt, max_len)?;
        self.logits[admission.seq.index()].clear();
        Ok(Lease {
            slot: admission.seq,
            reused: admission.reused,
        })
    }

    /// Ends a sequence: its blocks go back to the pool, the full ones staying in the prefix
    /// cache.
    pub fn release(&mut self, id: SlotId) {
        self.memory.release(id);
    }

    /// Positions the sequence holds.
    pub fn len(&self, id: SlotId) -> usize {
        self.memory.len(id)
    }

    /// Runs one batched step of `engine`: each entry's tokens are appended to its sequence.
    pub fn forward<E: Engine + ?Sized>(
        &mut self,
        engine: &E,
        work: &[Work<'_>],
    ) -> Result<(), EngineError> {
        self.forward_checking(engine, work, &[])
    }

    /// [`KvPool::forward`], with the logits of every token (not only the last) for the
    /// entries whose `check` is set: the rows that check drafted tokens.
    pub fn forward_checking<E: Engine + ?Sized>(
        &mut self,
        engine: &E,
        work: &[Work<'_>],
        check: &[bool],
    ) -> Result<(), EngineError> {
        if work.is_empty() {
            return Ok(());
        }
        let steps: SmallVec<[SeqWork<'_>; 16]> = work
            .iter()
            .enumerate()
            .map(|(i, w)| SeqWork {
                seq: w.slot,
                tokens: w.tokens,
                logits: if check.get(i).copied().unwrap_or(false) || w.embeddings {
                    LogitsFor::All
                } else if w.logits {
                    LogitsFor::Last
                } else {
                    LogitsFor::From(w.tokens.len())
                },
                output: match w.embeddings {
                    true => Output::Embeddings,
                    false => Output::Logits,
                },
                position_shift: w.position_shift,
            })
            .collect();
        // Each slot's logits buffer, in the order of `work` (each slot at most once).
        let mut outs: SmallVec<[Option<&mut Vec<f32>>; 16]> = work.iter().map(|_| None).collect();
        for (i, buf) in self.logits.iter_mut().enumerate() {
            if let Some(k) = work.iter().position(|w| w.slot.index() == i) {
                outs[k] = Some(buf);
            }
        }
        let mut outs: SmallVec<[&mut Vec<f32>; 16]> = outs
            .into_iter()
            .map(|o| o.ok_or(MemoryError::UnknownSequence(usize::MAX)))
            .collect::<Result<_, _>>()?;
        let given: SmallVec<[Option<InputEmbeddings<'_>>; 16]> =
            work.iter().map(|w| w.given).collect();
        step_sequences_with(
            engine,
            &mut self.memory,
            &mut self.scratch,
            &steps,
            &given,
            &mut outs,
        )
    }

    /// Drafts up to `max` tokens to follow `token` (to be fed next) with the engine's
    /// multi-token-prediction block ([`Engine::draft_mtp`]), within the sequence's promise
    /// of blocks.
    pub fn draft_mtp<E: Engine + ?Sized>(
        &mut self,
        engine: &E,
        id: SlotId,
        token: TokenId,
        max: usize,
        out: &mut Vec<TokenId>,
    ) -> Result<(), EngineError> {
        out.clear();
        let pos = self.memory.len(id);
        if max == 0 || pos == 0 {
            return Ok(());
        }
        self.memory.grow(id, pos + max - 1)?;
        let mut view = self.memory.view(&[id])?;
        engine.draft_mtp(&mut view, &mut self.scratch, 0, token, pos, max, out)
    }

    /// Forgets the sequence's positions from `len` on (drafted tokens that were rejected).
    pub fn rollback(&mut self, id: SlotId, len: usize) -> Result<(), MemoryError> {
        self.memory.rollback(id, len)
    }

    /// The next-token logits of the sequence's last step (when it asked for them; one row
    /// per token after a checking step), or its tokens' embeddings.
    pub fn logits(&self, id: SlotId) -> &[f32] {
        &self.logits[id.index()]
    }
}
