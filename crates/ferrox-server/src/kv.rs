//! KV memory for the scheduler: a paged block pool shared by every sequence, with a prefix
//! cache.
//!
//! One arena of fixed-size blocks (`--kv-memory`, or `--ctx-size` x `--parallel` positions)
//! holds every sequence's keys and values. A sequence is admitted when the blocks it may
//! need (prompt plus its token limit, within the context) are available; its blocks are
//! then allocated as it grows, so a request never fails half-way for lack of memory.
//! Whole blocks of a prompt prefix already computed (a system prompt, a chat's earlier
//! turns, even a finished request's output) are shared by reference instead of being
//! prefilled again; finished sequences leave their blocks in the cache until fresh blocks
//! run out, least recently released first.

use ferrox_core::block_manager::{BlockUsage, CachedPrefix};
use ferrox_core::{BlockManager, PagedKv};
use ferrox_models::decoder::{PagedSequence, PagedStep, StepScratch};
use ferrox_models::tokenizer::TokenId;
use ferrox_models::{Decoder, Engine, EngineError, LogitsFor};

/// Positions per block: small enough that a shared prefix is reused to within a few
/// tokens, large enough that attention reads long runs.
pub const BLOCK_TOKENS: usize = 16;

/// A sequence's hold on KV memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotId(usize);

impl SlotId {
    pub fn index(self) -> usize {
        self.0
    }
}

struct Slot {
    seq: PagedSequence,
    /// The tokens whose keys and values the sequence holds, in order.
    tokens: Vec<TokenId>,
    /// Leading blocks registered in the prefix cache, and the chain hash of the last.
    registered: usize,
    last_hash: u64,
    /// Blocks promised at admission and not yet allocated.
    promised: usize,
}

/// A sequence admitted by [`KvPool::acquire`].
#[derive(Clone, Copy, Debug)]
pub struct Lease {
    pub slot: SlotId,
    /// Leading prompt tokens already in the cache (not to be prefilled again).
    pub reused: usize,
}

/// What admitting a prompt takes: cached blocks to share, fresh blocks to promise.
struct Plan {
    reused: CachedPrefix,
    fresh: usize,
}

/// Why a request cannot be admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Every sequence slot is taken, or the blocks it needs are held by running sequences:
    /// it can be admitted once some finish.
    Busy,
    /// It needs more blocks than the whole pool has.
    TooLarge { needed: usize, capacity: usize },
}

/// One sequence's part of a [`KvPool::forward`] step.
pub struct Work<'a> {
    pub slot: SlotId,
    pub tokens: &'a [TokenId],
    /// Whether the last token's logits are needed.
    pub logits: bool,
}

pub struct KvPool {
    arena: PagedKv,
    blocks: BlockManager,
    scratch: StepScratch,
    slots: Vec<Option<Slot>>,
    /// Positions one sequence may hold (the context size).
    n_ctx: usize,
    /// Blocks promised to admitted sequences and not yet allocated; never more than
    /// `blocks.available()`, so allocation during a step cannot fail.
    promised: usize,
    bytes_per_position: usize,
}

impl KvPool {
    /// A pool of `n_blocks` blocks serving at most `max_sequences` sequences at once.
    pub fn new(decoder: &Decoder, n_blocks: usize, max_sequences: usize) -> KvPool {
        KvPool {
            arena: decoder.new_paged_kv(n_blocks, BLOCK_TOKENS),
            blocks: BlockManager::new(n_blocks, BLOCK_TOKENS),
            scratch: StepScratch::default(),
            slots: (0..max_sequences.max(1)).map(|_| None).collect(),
            n_ctx: decoder.context_size(),
            promised: 0,
            bytes_per_position: decoder.kv_bytes_per_position(),
        }
    }

    /// Positions one sequence can hold.
    pub fn capacity_per_sequence(&self) -> usize {
        self.n_ctx
    }

    pub fn max_sequences(&self) -> usize {
        self.slots.len()
    }

    pub fn block_tokens(&self) -> usize {
        BLOCK_TOKENS
    }

    /// Bytes reserved for the arena.
    pub fn reserved_bytes(&self) -> usize {
        self.bytes_per_position * BLOCK_TOKENS * self.blocks.n_blocks()
    }

    pub fn n_blocks(&self) -> usize {
        self.blocks.n_blocks()
    }

    /// Blocks in use, kept for prefix reuse, and free.
    pub fn usage(&self) -> BlockUsage {
        self.blocks.usage()
    }

    /// The blocks a prompt would reuse, and how many more it needs to reach `max_len`
    /// positions. At least one prompt token is always left to prefill, since the
    /// next-token logits come from it.
    fn plan(&self, prompt: &[TokenId], max_len: usize) -> Plan {
        let max_reused = prompt.len().saturating_sub(1) / BLOCK_TOKENS;
        let reused = self.blocks.lookup_prefix(prompt, max_reused);
        let total = max_len
            .clamp(prompt.len(), self.n_ctx)
            .div_ceil(BLOCK_TOKENS);
        let fresh = total.saturating_sub(reused.blocks.len());
        Plan { reused, fresh }
    }

    /// Why `plan` cannot be admitted now, if it cannot.
    fn refusal(&self, plan: &Plan) -> Option<Refusal> {
        let blocks = plan.reused.blocks.len() + plan.fresh;
        let capacity = self.blocks.n_blocks();
        if blocks > capacity {
            return Some(Refusal::TooLarge {
                needed: blocks * BLOCK_TOKENS,
                capacity: capacity * BLOCK_TOKENS,
            });
        }
        // Reused blocks nobody holds stop being available once taken. What stays available
        // after taking them must cover every promise, the running sequences' and this one's.
        let idle_reused = plan
            .reused
            .blocks
            .iter()
            .filter(|&&b| self.blocks.ref_count(b) == 0)
            .count();
        let needed = idle_reused + self.promised + plan.fresh;
        if !self.slots.iter().any(Option::is_none) || self.blocks.available() < needed {
            return Some(Refusal::Busy);
        }
        None
    }

    /// Whether [`acquire`](Self::acquire) would admit the prompt now.
    pub fn check(&self, prompt: &[TokenId], max_len: usize) -> Result<(), Refusal> {
        self.refusal(&self.plan(prompt, max_len))
            .map_or(Ok(()), Err)
    }

    /// Admits a sequence for `prompt` that may grow to `max_len` positions (capped at the
    /// context size), sharing the cached blocks of its longest cached prefix. A refusal
    /// changes nothing.
    pub fn acquire(&mut self, prompt: &[TokenId], max_len: usize) -> Result<Lease, Refusal> {
        let plan = self.plan(prompt, max_len);
        if let Some(refusal) = self.refusal(&plan) {
            return Err(refusal);
        }
        let Plan { reused, fresh } = plan;
        let index = self.slots.iter().position(Option::is_none).unwrap_or(0);
        let mut seq = PagedSequence::new();
        for &block in &reused.blocks {
            self.blocks.acquire(block);
            seq.table.push_block(block);
        }
        let n_reused = reused.blocks.len() * BLOCK_TOKENS;
        seq.table.advance(n_reused);
        self.promised += fresh;
        self.slots[index] = Some(Slot {
            seq,
            tokens: prompt[..n_reused].to_vec(),
            registered: reused.blocks.len(),
            last_hash: reused.hash,
            promised: fresh,
        });
        Ok(Lease {
            slot: SlotId(index),
            reused: n_reused,
        })
    }

    /// Ends a sequence: its blocks go back to the pool, the full ones staying in the prefix
    /// cache.
    pub fn release(&mut self, id: SlotId) {
        if let Some(mut slot) = self.slots[id.0].take() {
            for block in slot.seq.table.clear().into_iter().rev() {
                self.blocks.release(block);
            }
            self.promised -= slot.promised;
        }
    }

    /// Positions the sequence holds.
    pub fn len(&self, id: SlotId) -> usize {
        self.slot(id).seq.table.len()
    }

    fn slot(&self, id: SlotId) -> &Slot {
        self.slots[id.0].as_ref().expect("an admitted sequence")
    }

    /// Gives the sequence blocks for `len` positions, from its promise first.
    fn grow(&mut self, id: SlotId, len: usize) -> Result<(), EngineError> {
        let slot = self.slots[id.0].as_mut().expect("an admitted sequence");
        while slot.seq.table.capacity(BLOCK_TOKENS) < len {
            let unpromised = self.blocks.available().saturating_sub(self.promised);
            if slot.promised == 0 && unpromised == 0 {
                return Err(EngineError::ContextFull {
                    needed: len,
                    capacity: slot.seq.table.capacity(BLOCK_TOKENS),
                });
            }
            let block = self
                .blocks
                .allocate()
                .expect("promised blocks are available");
            if slot.promised > 0 {
                slot.promised -= 1;
                self.promised -= 1;
            }
            slot.seq.table.push_block(block);
        }
        Ok(())
    }

    /// Runs one batched step: each entry's tokens are appended to its sequence.
    pub fn forward(&mut self, decoder: &Decoder, work: &[Work<'_>]) -> Result<(), EngineError> {
        for w in work {
            let len = self.len(w.slot) + w.tokens.len();
            self.grow(w.slot, len)?;
        }
        let mut steps: Vec<PagedStep<'_>> = Vec::with_capacity(work.len());
        for (i, slot) in self.slots.iter_mut().enumerate() {
            let (Some(slot), Some(w)) = (slot, work.iter().find(|w| w.slot.0 == i)) else {
                continue;
            };
            steps.push(PagedStep {
                tokens: w.tokens,
                seq: &mut slot.seq,
                logits: if w.logits {
                    LogitsFor::Last
                } else {
                    LogitsFor::From(w.tokens.len())
                },
            });
        }
        if steps.is_empty() {
            return Ok(());
        }
        decoder.forward_paged(&mut self.arena, &mut self.scratch, &mut steps)?;
        drop(steps);
        for w in work {
            self.record(w.slot, w.tokens);
        }
        Ok(())
    }

    /// Notes the tokens a step added and offers newly filled blocks to the prefix cache.
    fn record(&mut self, id: SlotId, tokens: &[TokenId]) {
        let slot = self.slots[id.0].as_mut().expect("an admitted sequence");
        slot.tokens.extend_from_slice(tokens);
        while (slot.registered + 1) * BLOCK_TOKENS <= slot.tokens.len() {
            let i = slot.registered;
            let block = slot.seq.table.blocks()[i];
            let chunk = &slot.tokens[i * BLOCK_TOKENS..(i + 1) * BLOCK_TOKENS];
            slot.last_hash = self.blocks.register(block, slot.last_hash, chunk);
            slot.registered += 1;
        }
    }

    /// The next-token logits of the sequence's last step (when it asked for them).
    pub fn logits(&self, id: SlotId) -> &[f32] {
        self.slot(id).seq.logits()
    }
}
