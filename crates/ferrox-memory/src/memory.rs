//! Sequence memory that knows no model: what every engine keeps per sequence between steps,
//! behind one interface (the role of llama.cpp's `llama_memory_i`, vLLM's KV cache groups).
//!
//! An engine describes what it stores with a [`MemorySpec`]:
//!
//! * **paged stores**: per-layer rows indexed by position (GQA keys and values, an MLA
//!   latent row, an indexer's key row...). Every store shares one block table per
//!   sequence: position `p` of every store lives in the same block, so a block is
//!   allocated, shared by prefix, rolled back and freed for all stores at once. A
//!   *strided* store keeps one row per `stride` positions (a compressor's pooled rows): the
//!   row completed by position `p` (`(p + 1) % stride == 0`) lives in `p`'s block.
//! * **a recurrent state**: a fixed number of f32 values per sequence (a convolution
//!   window and a delta-rule matrix, or rings of the latest rows) that summarises the
//!   history. It can be restored from a checkpoint taken at a block boundary, which is also
//!   how a recurrent engine gets prefix reuse. A state made of rings holding `ring_slack`
//!   positions more than the engine reads can also drop up to that many positions anywhere,
//!   without a checkpoint.
//!
//! [`SequenceMemory`] owns the stores, the block pool ([`BlockManager`]: reference counts,
//! the prefix cache) and the sequences: admission reserves what a prompt plus its token
//! limit may need, so a running sequence never fails for memory; growth takes blocks from
//! that promise; release hands them back, full blocks staying in the prefix cache. A step
//! sees the sequences it advances through a [`StepMemory`].

use std::collections::HashMap;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::block_manager::{BlockUsage, ROOT_HASH};
use crate::paged_kv::{BlockId, BlockTable, PagedKv};
use ferrox_core::{KvRows, KvStorage};

use crate::BlockManager;

/// Sequences of one step whose references are kept without a heap allocation.
const INLINE_SEQS: usize = 16;

/// A sequence's recurrent checkpoints: (positions covered, state), oldest first.
type Checkpoints = Vec<(usize, Arc<[f32]>)>;

/// Checkpoints of its recurrent state a sequence keeps for rolling back (the latest ones).
const CHECKPOINTS_PER_SEQUENCE: usize = 4;

/// Block-end checkpoints kept for prefix reuse, per sequence slot (the least recently
/// published go first): a whole state each, so they are counted in states, not in blocks
/// (llama-server keeps 8 per slot, `--ctx-checkpoints`).
const SHARED_CHECKPOINTS_PER_SEQUENCE: usize = 8;

/// One paged store: `n_layers` layers of `key_width + value_width` values per row, one row
/// per `stride` positions. A store whose heads read their values out of the key row (MLA's
/// latent) has `value_width` 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedStoreSpec {
    pub n_layers: usize,
    pub key_width: usize,
    pub value_width: usize,
    pub stride: usize,
}

impl PagedStoreSpec {
    /// A store with a row per position.
    pub fn per_position(n_layers: usize, key_width: usize, value_width: usize) -> Self {
        PagedStoreSpec {
            n_layers,
            key_width,
            value_width,
            stride: 1,
        }
    }

    /// Rows completed before position `pos` (by positions `< pos`).
    pub fn rows_before(&self, pos: usize) -> usize {
        pos / self.stride.max(1)
    }

    /// Row slots a block of `block_tokens` positions needs: the most rows completed inside
    /// any block.
    pub fn rows_per_block(&self, block_tokens: usize) -> usize {
        block_tokens.div_ceil(self.stride.max(1))
    }

    /// Bytes of one block's rows, every layer.
    fn block_bytes(&self, block_tokens: usize, storage: KvStorage) -> usize {
        self.n_layers
            * storage.row_bytes(self.key_width, self.value_width)
            * self.rows_per_block(block_tokens)
    }
}

/// A recurrent state: `values` f32 values per sequence. `ring_slack` is how many positions
/// it can drop at any length without a checkpoint (0 for a state that collapses its
/// history); `step_checkpoints` how many positions before the end of every step the engine
/// checkpoints the state at (besides the end itself), so that a sequence rolls back that far
/// after any step (speculative decoding's rejected draft tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecurrentSpec {
    pub values: usize,
    pub ring_slack: usize,
    pub step_checkpoints: usize,
}

/// What an engine stores per sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemorySpec {
    pub paged: Vec<PagedStoreSpec>,
    pub recurrent: Option<RecurrentSpec>,
    /// Element types of the paged stores' keys and values (recurrent states are f32).
    pub storage: KvStorage,
    /// Positions a row lags behind its sequence: a row at `p` written only once position
    /// `p + row_lag` is known (a multi-token-prediction block reads the token after `p`). A
    /// full block enters the prefix cache only once its rows are all written, and a
    /// sequence writes no such row into a block it shares ([`StepMemory::writable_from`]).
    pub row_lag: usize,
}

impl MemorySpec {
    /// One paged store and no recurrent state (a KV or latent cache).
    pub fn one_store(
        n_layers: usize,
        key_width: usize,
        value_width: usize,
        storage: KvStorage,
    ) -> MemorySpec {
        MemorySpec {
            paged: vec![PagedStoreSpec::per_position(
                n_layers,
                key_width,
                value_width,
            )],
            recurrent: None,
            storage,
            row_lag: 0,
        }
    }

    /// Bytes the paged stores take per block of `block_tokens` positions.
    pub fn bytes_per_block(&self, block_tokens: usize) -> usize {
        self.paged
            .iter()
            .map(|s| s.block_bytes(block_tokens, self.storage))
            .sum()
    }

    /// Bytes the paged stores take per position, over a long sequence (a strided store's
    /// row counted as `1 / stride` of a position's).
    pub fn bytes_per_position(&self) -> f64 {
        self.paged
            .iter()
            .map(|s| {
                (s.n_layers * self.storage.row_bytes(s.key_width, s.value_width)) as f64
                    / s.stride.max(1) as f64
            })
            .sum::<f64>()
    }

    /// Positions a sequence can roll back by at any length (unbounded without a recurrent
    /// state; a recurrent state's ring slack or its step checkpoints otherwise).
    pub fn rollback_reach(&self) -> usize {
        self.recurrent
            .map_or(usize::MAX, |r| r.ring_slack.max(r.step_checkpoints))
    }

    /// Bytes of one sequence's recurrent state.
    pub fn recurrent_bytes(&self) -> usize {
        self.recurrent.map_or(0, |r| r.values * 4)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MemoryError {
    #[error(
        "the sequence holds a recurrent state, which cannot roll back from {len} to {to} \
         positions (no checkpoint there)"
    )]
    CannotRollBack { len: usize, to: usize },
    #[error("cannot roll forward: {to} positions asked, the sequence holds {len}")]
    BeyondEnd { len: usize, to: usize },
    #[error("{needed} positions needed, the sequence can hold {capacity}")]
    ContextFull { needed: usize, capacity: usize },
    #[error(
        "the sequence memory ({positions} positions) needs {bytes} bytes, which cannot be \
         allocated (use a smaller context or memory size)"
    )]
    Allocation { positions: u128, bytes: u128 },
    #[error(
        "the sequence memory ({positions} positions) needs {bytes} bytes, more than the \
         {available} bytes of memory available (use a smaller context or memory size)"
    )]
    ExceedsMemory {
        positions: u128,
        bytes: u128,
        available: usize,
    },
    #[error("sequence {0} is not admitted, or appears twice in a step")]
    UnknownSequence(usize),
}

/// Why a request cannot be admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Every sequence slot is taken, or the blocks it needs are held by running sequences:
    /// it can be admitted once some finish.
    Busy,
    /// It needs more positions than the whole pool has.
    TooLarge { needed: usize, capacity: usize },
}

/// A sequence admitted by [`SequenceMemory::admit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SeqId(usize);

impl SeqId {
    pub fn index(self) -> usize {
        self.0
    }
}

/// An admission: the sequence and how many leading prompt positions it already holds.
#[derive(Clone, Copy, Debug)]
pub struct Admission {
    pub seq: SeqId,
    pub reused: usize,
}

struct Sequence {
    table: BlockTable,
    /// The tokens whose rows the sequence holds, in order.
    tokens: Vec<u32>,
    /// Chain hashes of the leading blocks registered in the prefix cache.
    hashes: Vec<u64>,
    /// The chain hash before the first block: its cache namespace (`salted_root`).
    root: u64,
    /// Blocks promised at admission and not yet allocated.
    promised: usize,
    /// Recurrent checkpoints.
    checkpoints: Checkpoints,
    /// The most positions the recurrent state has held since it was last restored: its
    /// rings were last written up to there, whatever the sequence rolled back since.
    ring_top: usize,
}

impl Sequence {
    fn last_hash(&self) -> u64 {
        self.hashes.last().copied().unwrap_or(self.root)
    }
}

/// Recurrent states: one slot per sequence slot, and checkpoints published under the chain
/// hash of the block they end (for prefix reuse).
struct RecurrentStore {
    values: usize,
    ring_slack: usize,
    slots: Vec<f32>,
    shared: HashMap<u64, (Arc<[f32]>, u64)>,
    max_shared: usize,
    tick: u64,
}

impl RecurrentStore {
    fn slot(&mut self, index: usize) -> &mut [f32] {
        &mut self.slots[index * self.values..(index + 1) * self.values]
    }

    fn publish(&mut self, hash: u64, state: Arc<[f32]>) {
        if self.max_shared == 0 {
            return;
        }
        if self.shared.len() >= self.max_shared && !self.shared.contains_key(&hash) {
            if let Some(&oldest) = self
                .shared
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(h, _)| h)
            {
                self.shared.remove(&oldest);
            }
        }
        self.tick += 1;
        self.shared.insert(hash, (state, self.tick));
    }
}

/// How a [`SequenceMemory`] is laid out.
#[derive(Clone, Copy, Debug)]
pub struct MemoryShape {
    pub n_blocks: usize,
    pub block_tokens: usize,
    pub max_sequences: usize,
    /// Positions one sequence may hold.
    pub n_ctx: usize,
    /// Whether full blocks are kept for prefix reuse.
    pub prefix_cache: bool,
}

/// Every sequence's memory: the paged stores, the recurrent slots, the block pool and its
/// prefix cache.
pub struct SequenceMemory {
    spec: MemorySpec,
    shape: MemoryShape,
    stores: Vec<PagedKv>,
    recurrent: Option<RecurrentStore>,
    blocks: BlockManager,
    seqs: Vec<Option<Sequence>>,
    /// Blocks promised to admitted sequences and not yet allocated; never more than
    /// `blocks.available()`, so growth during a step cannot fail.
    promised: usize,
    /// Checkpoint buffers no longer referenced, for the next checkpoints to reuse.
    spare_states: Vec<Arc<[f32]>>,
}

impl SequenceMemory {
    /// Reserves the memory (zeroed pages: touched only as positions fill). An arena the
    /// allocator refuses is an error, not an abort.
    pub fn new(spec: MemorySpec, shape: MemoryShape) -> Result<SequenceMemory, MemoryError> {
        let max_sequences = shape.max_sequences.max(1);
        let positions = shape.n_blocks as u128 * shape.block_tokens as u128;
        // The blocks' rows and their bookkeeping (which alone sizes a memory that keeps no
        // rows, as an encoder's).
        let per_block = spec.bytes_per_block(shape.block_tokens) + BlockManager::BYTES_PER_BLOCK;
        let bytes = shape.n_blocks as u128 * per_block as u128
            + max_sequences as u128 * spec.recurrent_bytes() as u128;
        let too_large = || MemoryError::Allocation { positions, bytes };
        if shape.block_tokens == 0 || shape.n_blocks > BlockId::MAX as usize {
            return Err(too_large());
        }
        // Zeroed pages are only promised by the kernel; more than the machine has would fail
        // later, when touched.
        if let Some(available) = ferrox_core::available_memory() {
            if bytes > available as u128 {
                return Err(MemoryError::ExceedsMemory {
                    positions,
                    bytes,
                    available,
                });
            }
        }
        let stores = spec
            .paged
            .iter()
            .map(|s| {
                PagedKv::try_new(
                    s.n_layers,
                    shape.n_blocks,
                    s.rows_per_block(shape.block_tokens),
                    s.key_width,
                    s.value_width,
                    spec.storage,
                )
                .ok_or_else(too_large)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let recurrent = match spec.recurrent {
            Some(r) => {
                let len = r.values.checked_mul(max_sequences).ok_or_else(too_large)?;
                let mut slots = Vec::new();
                slots.try_reserve_exact(len).map_err(|_| too_large())?;
                slots.resize(len, 0.0);
                Some(RecurrentStore {
                    values: r.values,
                    ring_slack: r.ring_slack,
                    slots,
                    shared: HashMap::new(),
                    max_shared: if shape.prefix_cache {
                        shape
                            .n_blocks
                            .min(SHARED_CHECKPOINTS_PER_SEQUENCE * max_sequences)
                    } else {
                        0
                    },
                    tick: 0,
                })
            }
            None => None,
        };
        Ok(SequenceMemory {
            blocks: BlockManager::new(shape.n_blocks, shape.block_tokens),
            seqs: (0..max_sequences).map(|_| None).collect(),
            shape: MemoryShape {
                max_sequences,
                ..shape
            },
            spec,
            stores,
            recurrent,
            promised: 0,
            spare_states: Vec::new(),
        })
    }

    /// The memory of one sequence of up to `n_ctx` positions, contiguous (one block), with
    /// no prefix cache: what a single-stream front end (`ferrox run`) needs.
    pub fn solo(spec: MemorySpec, n_ctx: usize) -> Result<SequenceMemory, MemoryError> {
        SequenceMemory::new(
            spec,
            MemoryShape {
                n_blocks: 1,
                block_tokens: n_ctx.max(1),
                max_sequences: 1,
                n_ctx,
                prefix_cache: false,
            },
        )
    }

    pub fn spec(&self) -> &MemorySpec {
        &self.spec
    }

    pub fn block_tokens(&self) -> usize {
        self.shape.block_tokens
    }

    pub fn n_blocks(&self) -> usize {
        self.blocks.n_blocks()
    }

    pub fn max_sequences(&self) -> usize {
        self.seqs.len()
    }

    /// Positions one sequence can hold.
    pub fn capacity_per_sequence(&self) -> usize {
        self.shape.n_ctx
    }

    /// Bytes the paged stores take per position (every store, every layer; a strided
    /// store's rows as they fill a block).
    pub fn bytes_per_position(&self) -> f64 {
        self.spec.bytes_per_block(self.shape.block_tokens) as f64 / self.shape.block_tokens as f64
    }

    /// Bytes reserved: the paged arenas and the recurrent slots.
    pub fn reserved_bytes(&self) -> usize {
        self.spec.bytes_per_block(self.shape.block_tokens) * self.n_blocks()
            + self.spec.recurrent_bytes() * self.max_sequences()
    }

    /// Blocks in use, kept for prefix reuse, and free.
    pub fn usage(&self) -> BlockUsage {
        self.blocks.usage()
    }

    fn block_count(&self, positions: usize) -> usize {
        positions.div_ceil(self.shape.block_tokens)
    }

    /// The cached blocks a prompt would reuse (for a recurrent state, only up to the last
    /// block whose end has a published checkpoint), with the chain hash after each, and
    /// how many fresh blocks it needs to reach `max_len` positions. At least one prompt
    /// token is always left to compute, since the next-token logits come from it.
    fn plan(&self, prompt: &[u32], max_len: usize, root: u64) -> (Vec<BlockId>, Vec<u64>, usize) {
        let (mut reused, mut hashes) = (Vec::new(), Vec::new());
        if self.shape.prefix_cache {
            let max_reused = prompt.len().saturating_sub(1) / self.shape.block_tokens;
            let found = self.blocks.lookup_prefix_from(root, prompt, max_reused);
            reused = found.blocks;
            hashes = found.hashes;
            if let Some(rec) = &self.recurrent {
                let keep = hashes
                    .iter()
                    .rposition(|h| rec.shared.contains_key(h))
                    .map_or(0, |i| i + 1);
                reused.truncate(keep);
                hashes.truncate(keep);
            }
        }
        let total = self.block_count(max_len.clamp(prompt.len(), self.shape.n_ctx));
        let fresh = total.saturating_sub(reused.len());
        (reused, hashes, fresh)
    }

    fn refusal(&self, reused: &[BlockId], fresh: usize) -> Option<Refusal> {
        let capacity = self.blocks.n_blocks();
        if reused.len() + fresh > capacity {
            let bt = self.shape.block_tokens;
            return Some(Refusal::TooLarge {
                needed: (reused.len() + fresh) * bt,
                capacity: capacity * bt,
            });
        }
        // Reused blocks nobody holds stop being available once taken. What stays available
        // after taking them must cover every promise, the running sequences' and this one's.
        let idle = reused
            .iter()
            .filter(|&&b| self.blocks.ref_count(b) == 0)
            .count();
        let needed = idle + self.promised + fresh;
        if !self.seqs.iter().any(Option::is_none) || self.blocks.available() < needed {
            return Some(Refusal::Busy);
        }
        None
    }

    /// Whether [`admit`](Self::admit) would take the prompt now.
    pub fn check(&self, prompt: &[u32], max_len: usize) -> Result<(), Refusal> {
        self.check_in(ROOT_HASH, prompt, max_len)
    }

    /// [`check`](Self::check) in the cache namespace `root` ([`salted_root`]).
    ///
    /// [`salted_root`]: crate::block_manager::salted_root
    pub fn check_in(&self, root: u64, prompt: &[u32], max_len: usize) -> Result<(), Refusal> {
        let (reused, _, fresh) = self.plan(prompt, max_len, root);
        self.refusal(&reused, fresh).map_or(Ok(()), Err)
    }

    /// Admits a sequence for `prompt` that may grow to `max_len` positions (capped at the
    /// context size), sharing the cached blocks (and recurrent checkpoint) of its longest
    /// cached prefix. A refusal changes nothing.
    pub fn admit(&mut self, prompt: &[u32], max_len: usize) -> Result<Admission, Refusal> {
        self.admit_in(ROOT_HASH, prompt, max_len)
    }

    /// [`admit`](Self::admit) in the cache namespace `root` ([`salted_root`]): it reuses,
    /// and later shares, only blocks computed in the same namespace.
    ///
    /// [`salted_root`]: crate::block_manager::salted_root
    pub fn admit_in(
        &mut self,
        root: u64,
        prompt: &[u32],
        max_len: usize,
    ) -> Result<Admission, Refusal> {
        let (reused, hashes, fresh) = self.plan(prompt, max_len, root);
        if let Some(refusal) = self.refusal(&reused, fresh) {
            return Err(refusal);
        }
        let index = self.seqs.iter().position(Option::is_none).unwrap_or(0);
        // Sized for everything the sequence may hold, so its steps do not allocate.
        let max_len = max_len.clamp(prompt.len(), self.shape.n_ctx);
        let mut table = BlockTable::with_capacity(reused.len() + fresh);
        let mut tokens = Vec::with_capacity(max_len);
        tokens.extend_from_slice(&prompt[..reused.len() * self.shape.block_tokens]);
        for &block in &reused {
            self.blocks.acquire(block);
            table.push_block(block);
        }
        let n_reused = reused.len() * self.shape.block_tokens;
        table.advance(n_reused);
        let mut checkpoints = Vec::new();
        if let Some(rec) = &mut self.recurrent {
            let state = hashes
                .last()
                .and_then(|h| rec.shared.get(h))
                .map(|(s, _)| s.clone());
            match state {
                Some(state) => {
                    rec.slot(index).copy_from_slice(&state);
                    checkpoints.push((n_reused, state));
                }
                None => rec.slot(index).fill(0.0),
            }
        }
        self.promised += fresh;
        self.seqs[index] = Some(Sequence {
            table,
            tokens,
            hashes,
            root,
            promised: fresh,
            checkpoints,
            ring_top: n_reused,
        });
        Ok(Admission {
            seq: SeqId(index),
            reused: n_reused,
        })
    }

    /// Ends a sequence: its blocks go back to the pool, the full ones staying in the prefix
    /// cache; its unused promise is returned.
    pub fn release(&mut self, seq: SeqId) {
        if let Some(mut s) = self.seqs.get_mut(seq.0).and_then(Option::take) {
            for block in s.table.clear().into_iter().rev() {
                self.blocks.release(block);
            }
            self.promised -= s.promised;
        }
    }

    fn seq(&self, seq: SeqId) -> Result<&Sequence, MemoryError> {
        self.seqs
            .get(seq.0)
            .and_then(Option::as_ref)
            .ok_or(MemoryError::UnknownSequence(seq.0))
    }

    fn seq_mut(&mut self, seq: SeqId) -> Result<&mut Sequence, MemoryError> {
        self.seqs
            .get_mut(seq.0)
            .and_then(Option::as_mut)
            .ok_or(MemoryError::UnknownSequence(seq.0))
    }

    /// Positions the sequence holds (0 for a sequence that is not admitted).
    pub fn len(&self, seq: SeqId) -> usize {
        self.seq(seq).map_or(0, |s| s.table.len())
    }

    /// The tokens whose rows the sequence holds.
    pub fn tokens(&self, seq: SeqId) -> &[u32] {
        self.seq(seq).map_or(&[], |s| &s.tokens)
    }

    /// Gives the sequence blocks for `len` positions, from its promise first.
    pub fn grow(&mut self, seq: SeqId, len: usize) -> Result<(), MemoryError> {
        let bt = self.shape.block_tokens;
        let n_ctx = self.shape.n_ctx;
        let available = self.blocks.available();
        let promised_total = self.promised;
        let s = self.seq_mut(seq)?;
        if len > n_ctx {
            return Err(MemoryError::ContextFull {
                needed: len,
                capacity: n_ctx,
            });
        }
        let missing = len.div_ceil(bt).saturating_sub(s.table.blocks().len());
        let from_promise = missing.min(s.promised);
        if missing - from_promise > available.saturating_sub(promised_total) {
            return Err(MemoryError::ContextFull {
                needed: len,
                capacity: s.table.capacity(bt),
            });
        }
        s.promised -= from_promise;
        self.promised -= from_promise;
        for _ in 0..missing {
            let block = self
                .blocks
                .allocate()
                .expect("promised blocks are available");
            self.seqs[seq.0]
                .as_mut()
                .expect("checked above")
                .table
                .push_block(block);
        }
        Ok(())
    }

    /// Forgets every position from `len` on. A paged-only sequence can roll back anywhere;
    /// a recurrent state by up to its ring slack, or else only to the positions of one of
    /// its checkpoints (or nowhere: to its own length). Blocks shared with other sequences or kept in the prefix cache are never
    /// written again: the partly kept one is copied first, those wholly past `len` are
    /// released (and promised back, so the sequence can grow again).
    pub fn rollback(&mut self, seq: SeqId, len: usize) -> Result<(), MemoryError> {
        let bt = self.shape.block_tokens;
        let cur = self.seq(seq)?.table.len();
        if len > cur {
            return Err(MemoryError::BeyondEnd { len: cur, to: len });
        }
        if len == cur {
            return Ok(());
        }
        if let Some(rec) = &mut self.recurrent {
            let s = self.seqs[seq.0].as_mut().expect("checked above");
            s.ring_top = s.ring_top.max(cur);
            if s.ring_top - len <= rec.ring_slack {
                // The rings still hold what the kept positions need.
                s.checkpoints.retain(|(p, _)| *p <= len);
            } else {
                let Some(i) = s.checkpoints.iter().rposition(|(p, _)| *p == len) else {
                    return Err(MemoryError::CannotRollBack { len: cur, to: len });
                };
                rec.slot(seq.0).copy_from_slice(&s.checkpoints[i].1);
                s.checkpoints.truncate(i + 1);
                s.ring_top = len;
            }
        }
        let keep_blocks = len.div_ceil(bt);
        // The last kept block, if partly kept and not this sequence's alone (shared, or
        // registered in the prefix cache), is replaced by a private copy, from a block no
        // promise covers (dropped blocks add to what is available and to the promise alike).
        let s = self.seqs[seq.0].as_ref().expect("checked above");
        let partial = (!len.is_multiple_of(bt)).then(|| s.table.blocks()[keep_blocks - 1]);
        let needs_copy =
            partial.is_some_and(|b| self.blocks.ref_count(b) > 1 || self.blocks.is_registered(b));
        if needs_copy && self.blocks.available() <= self.promised {
            return Err(MemoryError::ContextFull {
                needed: len,
                capacity: 0,
            });
        }
        let s = self.seqs[seq.0].as_mut().expect("checked above");
        let dropped: Vec<BlockId> = s.table.blocks()[keep_blocks..].to_vec();
        s.table.truncate(len, keep_blocks);
        s.tokens.truncate(len);
        s.hashes.truncate(len / bt);
        s.promised += dropped.len();
        self.promised += dropped.len();
        for &block in dropped.iter().rev() {
            self.blocks.release(block);
        }
        if let (true, Some(block)) = (needs_copy, partial) {
            let fresh = self.blocks.allocate().expect("checked above");
            let start = (keep_blocks - 1) * bt;
            for (store, spec) in self.stores.iter_mut().zip(&self.spec.paged) {
                let rows = spec.rows_before(len) - spec.rows_before(start);
                store.copy_block(block, fresh, rows);
            }
            self.blocks.release(block);
            let s = self.seqs[seq.0].as_mut().expect("checked above");
            s.table.replace_block(keep_blocks - 1, fresh);
        }
        Ok(())
    }

    /// The step view of `seqs` (in that order; each admitted once). Call
    /// [`grow`](Self::grow) first so their tables cover the new positions.
    pub fn view(&mut self, seqs: &[SeqId]) -> Result<StepMemory<'_>, MemoryError> {
        let mut tables: SmallVec<[Option<&mut BlockTable>; INLINE_SEQS]> =
            seqs.iter().map(|_| None).collect();
        let mut states: SmallVec<[Option<&mut [f32]>; INLINE_SEQS]> =
            seqs.iter().map(|_| None).collect();
        let values = self.recurrent.as_ref().map_or(0, |r| r.values);
        let mut slots = self
            .recurrent
            .as_mut()
            .map(|r| r.slots.chunks_mut(values.max(1)));
        let mut checkpoints: SmallVec<[Option<&mut Checkpoints>; INLINE_SEQS]> =
            seqs.iter().map(|_| None).collect();
        let mut writable_from: SmallVec<[usize; INLINE_SEQS]> = seqs.iter().map(|_| 0).collect();
        for (i, s) in self.seqs.iter_mut().enumerate() {
            let slot = slots.as_mut().and_then(Iterator::next);
            let Some(s) = s else { continue };
            let Some(k) = seqs.iter().position(|id| id.0 == i) else {
                continue;
            };
            let blocks = &self.blocks;
            let shared = s
                .table
                .blocks()
                .iter()
                .take_while(|&&b| blocks.ref_count(b) > 1 || blocks.is_registered(b))
                .count();
            writable_from[k] = shared * self.shape.block_tokens;
            tables[k] = Some(&mut s.table);
            checkpoints[k] = Some(&mut s.checkpoints);
            states[k] = slot;
        }
        if let Some(k) = tables.iter().position(Option::is_none) {
            return Err(MemoryError::UnknownSequence(seqs[k].0));
        }
        if seqs
            .iter()
            .enumerate()
            .any(|(k, id)| seqs[..k].contains(id))
        {
            return Err(MemoryError::UnknownSequence(seqs[0].0));
        }
        Ok(StepMemory {
            stores: &mut self.stores,
            specs: &self.spec.paged,
            block_tokens: self.shape.block_tokens,
            tables: tables.into_iter().map(|t| t.expect("checked")).collect(),
            states: states.into_iter().map(|s| s.unwrap_or_default()).collect(),
            checkpoints: checkpoints
                .into_iter()
                .map(|c| c.expect("checked"))
                .collect(),
            spare_states: &mut self.spare_states,
            writable_from,
        })
    }

    /// Notes the tokens a step added to a sequence: full blocks go to the prefix cache, and
    /// a recurrent checkpoint taken at a block's end is published with it (the sequence then
    /// keeps its latest checkpoints only).
    pub fn record(&mut self, seq: SeqId, tokens: &[u32]) -> Result<(), MemoryError> {
        let bt = self.shape.block_tokens;
        let prefix_cache = self.shape.prefix_cache;
        let lag = self.spec.row_lag;
        let s = self.seqs.get_mut(seq.0).and_then(Option::as_mut);
        let s = s.ok_or(MemoryError::UnknownSequence(seq.0))?;
        s.tokens.extend_from_slice(tokens);
        s.ring_top = s.ring_top.max(s.tokens.len());
        while prefix_cache && (s.hashes.len() + 1) * bt + lag <= s.tokens.len() {
            let i = s.hashes.len();
            let block = s.table.blocks()[i];
            let chunk = &s.tokens[i * bt..(i + 1) * bt];
            let hash = self.blocks.register(block, s.last_hash(), chunk);
            s.hashes.push(hash);
            if let Some(rec) = &mut self.recurrent {
                if let Some((_, state)) = s.checkpoints.iter().find(|(p, _)| *p == (i + 1) * bt) {
                    rec.publish(hash, state.clone());
                }
            }
        }
        // The step's checkpoints were all kept until now, so the block ends among them
        // could be published; a sequence keeps only its latest ones.
        let extra = s.checkpoints.len().saturating_sub(CHECKPOINTS_PER_SEQUENCE);
        for (_, state) in s.checkpoints.drain(..extra) {
            recycle(&mut self.spare_states, state);
        }
        Ok(())
    }
}

/// Spare checkpoint buffers kept for reuse: enough for a step's block ends.
const MAX_SPARE_STATES: usize = 2 * INLINE_SEQS;

/// Keeps a checkpoint buffer nobody else references for the next checkpoint, so that
/// checkpointing in steady state allocates nothing.
fn recycle(spare: &mut Vec<Arc<[f32]>>, mut state: Arc<[f32]>) {
    if spare.len() < MAX_SPARE_STATES && Arc::get_mut(&mut state).is_some() {
        spare.push(state);
    }
}

/// The part of the memory one step works on: the paged stores, and the block tables and
/// recurrent states of the step's sequences (indexed by their order in the step).
pub struct StepMemory<'a> {
    stores: &'a mut [PagedKv],
    specs: &'a [PagedStoreSpec],
    block_tokens: usize,
    tables: SmallVec<[&'a mut BlockTable; INLINE_SEQS]>,
    states: SmallVec<[&'a mut [f32]; INLINE_SEQS]>,
    checkpoints: SmallVec<[&'a mut Checkpoints; INLINE_SEQS]>,
    spare_states: &'a mut Vec<Arc<[f32]>>,
    writable_from: SmallVec<[usize; INLINE_SEQS]>,
}

impl StepMemory<'_> {
    pub fn n_seqs(&self) -> usize {
        self.tables.len()
    }

    /// Positions sequence `seq` holds.
    pub fn len(&self, seq: usize) -> usize {
        self.tables[seq].len()
    }

    /// The first position of sequence `seq` whose block is its own: the blocks before are
    /// shared with other sequences or kept in the prefix cache, and must not be written.
    pub fn writable_from(&self, seq: usize) -> usize {
        self.writable_from[seq]
    }

    /// Positions sequence `seq` can hold without more blocks.
    pub fn capacity(&self, seq: usize) -> usize {
        self.tables[seq].capacity(self.block_tokens)
    }

    /// Marks sequence `seq` filled up to `len` positions.
    pub fn advance(&mut self, seq: usize, len: usize) {
        self.tables[seq].advance(len);
    }

    pub fn n_stores(&self) -> usize {
        self.stores.len()
    }

    pub fn storage(&self, store: usize) -> KvStorage {
        self.stores[store].storage()
    }

    /// (key width, value width) of a store.
    pub fn widths(&self, store: usize) -> (usize, usize) {
        let s = &self.stores[store];
        (s.key_width(), s.value_width())
    }

    /// Where the row of `store` that position `pos` of sequence `seq` writes lives: the
    /// block of `pos`, and the row's slot in it (for a strided store, `pos` completes the
    /// row: `(pos + 1) % stride == 0`).
    fn slot(&self, store: usize, seq: usize, pos: usize) -> (BlockId, usize) {
        let (block, offset) = self.tables[seq].locate(pos, self.block_tokens);
        let spec = &self.specs[store];
        if spec.stride <= 1 {
            return (block, offset);
        }
        debug_assert_eq!((pos + 1) % spec.stride, 0, "a strided row ends its stride");
        let row = spec.rows_before(pos + 1) - 1;
        (block, row - spec.rows_before(pos - offset))
    }

    /// Writes the rows of `layer` in `store` at position `pos` (for a strided store, the row
    /// that `pos` completes).
    pub fn write(
        &mut self,
        store: usize,
        seq: usize,
        layer: usize,
        pos: usize,
        keys: &[f32],
        values: &[f32],
    ) {
        let (block, slot) = self.slot(store, seq, pos);
        self.stores[store].write(layer, block, slot, keys, values);
    }

    /// The key row of `layer` in `store` at position `pos` (for a strided store, the row
    /// that `pos` completed).
    pub fn key_row(&self, store: usize, seq: usize, layer: usize, pos: usize) -> KvRows<'_> {
        let (block, slot) = self.slot(store, seq, pos);
        self.stores[store].keys(layer, block, slot, slot + 1)
    }

    /// Calls `f(keys, values, n)` for each stretch of positions `lo..hi` of sequence `seq`
    /// that lies contiguously in `store` (a store with a row per position), in order (rows
    /// position-major from the stretch's first position).
    pub fn for_each_run<'s>(
        &'s self,
        store: usize,
        seq: usize,
        layer: usize,
        lo: usize,
        hi: usize,
        mut f: impl FnMut(KvRows<'s>, KvRows<'s>, usize),
    ) {
        debug_assert_eq!(self.specs[store].stride, 1, "runs of a per-position store");
        let arena = &self.stores[store];
        self.tables[seq].for_each_run(lo, hi, self.block_tokens, |block, start, end| {
            f(
                arena.keys(layer, block, start, end),
                arena.values(layer, block, start, end),
                end - start,
            )
        });
    }

    /// Sequence `seq`'s recurrent state (empty without one).
    pub fn state(&mut self, seq: usize) -> &mut [f32] {
        self.states[seq]
    }

    /// Sequence `seq`'s recurrent state, to read (empty without one).
    pub fn state_ref(&self, seq: usize) -> &[f32] {
        self.states[seq]
    }

    /// Positions per block: a recurrent engine checkpoints its state when a sequence's
    /// length reaches a multiple of this.
    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// Records sequence `seq`'s recurrent state as it is after `pos` positions, so the
    /// sequence can roll back to `pos` and, when `pos` ends a block, later prompts sharing
    /// the prefix can start from it.
    pub fn checkpoint(&mut self, seq: usize, pos: usize) {
        let list = &mut *self.checkpoints[seq];
        while let Some(i) = list.iter().position(|(p, _)| *p >= pos) {
            recycle(self.spare_states, list.remove(i).1);
        }
        let state = match self.spare_states.pop() {
            Some(mut buffer) => {
                Arc::get_mut(&mut buffer)
                    .expect("spare states are unshared")
                    .copy_from_slice(self.states[seq]);
                buffer
            }
            None => Arc::from(&*self.states[seq]),
        };
        list.push((pos, state));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(recurrent: Option<usize>) -> MemorySpec {
        MemorySpec {
            paged: vec![PagedStoreSpec::per_position(2, 3, 1)],
            recurrent: recurrent.map(|values| RecurrentSpec {
                values,
                ring_slack: 0,
                step_checkpoints: 0,
            }),
            storage: KvStorage::F32,
            row_lag: 0,
        }
    }

    /// The per-position store and a strided one: one row of 2 values per 3 positions.
    fn strided_spec() -> MemorySpec {
        let mut s = spec(None);
        s.paged.push(PagedStoreSpec {
            n_layers: 1,
            key_width: 2,
            value_width: 0,
            stride: 3,
        });
        s
    }

    fn shape(n_blocks: usize, max_sequences: usize) -> MemoryShape {
        MemoryShape {
            n_blocks,
            block_tokens: 4,
            max_sequences,
            n_ctx: 64,
            prefix_cache: true,
        }
    }

    /// Runs a fake step: every new position's row holds (token, position) in each layer.
    fn fake_step(m: &mut SequenceMemory, seq: SeqId, tokens: &[u32]) {
        let start = m.len(seq);
        m.grow(seq, start + tokens.len()).unwrap();
        let mut v = m.view(&[seq]).unwrap();
        for (i, &t) in tokens.iter().enumerate() {
            for layer in 0..2 {
                v.write(
                    0,
                    0,
                    layer,
                    start + i,
                    &[t as f32, (start + i) as f32, 1.0],
                    &[2.0],
                );
            }
            let pos = start + i;
            if v.n_stores() > 1 && (pos + 1).is_multiple_of(3) {
                v.write(1, 0, 0, pos, &[t as f32, pos as f32], &[]);
            }
        }
        v.advance(0, start + tokens.len());
        drop(v);
        m.record(seq, tokens).unwrap();
    }

    fn rows(m: &mut SequenceMemory, seq: SeqId) -> Vec<f32> {
        let len = m.len(seq);
        let v = m.view(&[seq]).unwrap();
        let mut out = Vec::new();
        v.for_each_run(0, 0, 1, 0, len, |k, _, _| match k {
            KvRows::F32(k) => out.extend_from_slice(k),
            _ => unreachable!(),
        });
        out
    }

    /// Sequence `seq`'s strided rows, one per completed stride.
    fn strided_rows(m: &mut SequenceMemory, seq: SeqId) -> Vec<f32> {
        let len = m.len(seq);
        let v = m.view(&[seq]).unwrap();
        let mut out = Vec::new();
        for pos in (2..len).step_by(3) {
            match v.key_row(1, 0, 0, pos) {
                KvRows::F32(k) => out.extend_from_slice(k),
                _ => unreachable!(),
            }
        }
        out
    }

    #[test]
    fn rows_that_lag_enter_the_prefix_cache_late_and_shared_blocks_are_read_only() {
        let mut lagging = spec(None);
        lagging.row_lag = 1;
        let mut m = SequenceMemory::new(lagging, shape(16, 4)).unwrap();
        let prompt: Vec<u32> = (10..18).collect();
        let a = m.admit(&prompt, 16).unwrap();
        fake_step(&mut m, a.seq, &prompt);
        // Eight positions: the second block's last row is not written yet, so only the
        // first block is registered, and `a` may still write from position 4.
        assert_eq!(m.view(&[a.seq]).unwrap().writable_from(0), 4);
        fake_step(&mut m, a.seq, &[18]);
        assert_eq!(m.view(&[a.seq]).unwrap().writable_from(0), 8);
        // A sequence sharing both blocks may write only after them.
        let b = m.admit(&(10..20).collect::<Vec<_>>(), 16).unwrap();
        assert_eq!(b.reused, 8);
        assert_eq!(m.view(&[b.seq]).unwrap().writable_from(0), 8);
        let c = m.admit(&[1, 2, 3], 16).unwrap();
        assert_eq!(m.view(&[c.seq]).unwrap().writable_from(0), 0);
    }

    #[test]
    fn bytes_count_every_store_and_a_strided_store_by_its_rows() {
        let mut s = spec(Some(10));
        s.paged.push(PagedStoreSpec::per_position(1, 5, 0));
        assert_eq!(s.bytes_per_position(), ((2 * 4 + 5) * 4) as f64);
        assert_eq!(s.bytes_per_block(4), (2 * 4 + 5) * 4 * 4);
        assert_eq!(s.recurrent_bytes(), 40);
        // A block of 4 positions completes at most 2 rows of stride 3.
        let s = strided_spec();
        assert_eq!(s.bytes_per_block(4), (2 * 4 * 4 + 2 * 2) * 4);
        assert_eq!(s.bytes_per_position(), (2.0 * 4.0 + 2.0 / 3.0) * 4.0);
        let m = SequenceMemory::new(s, shape(16, 2)).unwrap();
        assert_eq!(m.reserved_bytes(), 16 * (2 * 4 * 4 + 2 * 2) * 4);
    }

    #[test]
    fn strided_rows_are_shared_by_prefix_and_copied_on_rollback() {
        let mut m = SequenceMemory::new(strided_spec(), shape(16, 4)).unwrap();
        let prompt: Vec<u32> = (10..20).collect();
        let a = m.admit(&prompt, 16).unwrap();
        fake_step(&mut m, a.seq, &prompt);
        // Rows completed at positions 2, 5 and 8 (the last in the third block).
        let a_rows = strided_rows(&mut m, a.seq);
        assert_eq!(a_rows, [12.0, 2.0, 15.0, 5.0, 18.0, 8.0]);
        let b = m.admit(&prompt, 16).unwrap();
        assert_eq!(b.reused, 8);
        fake_step(&mut m, b.seq, &prompt[8..]);
        assert_eq!(strided_rows(&mut m, b.seq), a_rows);
        // b keeps position 5's row through a rollback into the shared second block, and
        // rewrites the row of position 8: a's rows stay as they were.
        m.rollback(b.seq, 6).unwrap();
        fake_step(&mut m, b.seq, &[99, 98, 97]);
        assert_eq!(strided_rows(&mut m, a.seq), a_rows);
        assert_eq!(
            strided_rows(&mut m, b.seq),
            [12.0, 2.0, 15.0, 5.0, 97.0, 8.0]
        );
    }

    /// Grows a sequence to `len` positions without touching its state.
    fn step_state(m: &mut SequenceMemory, seq: SeqId, len: usize) {
        let start = m.len(seq);
        m.grow(seq, len).unwrap();
        m.view(&[seq]).unwrap().advance(0, len);
        m.record(seq, &vec![1; len - start]).unwrap();
    }

    #[test]
    fn a_ring_state_drops_its_slack_anywhere_and_more_only_to_a_checkpoint() {
        let mut s = spec(Some(3));
        s.recurrent = Some(RecurrentSpec {
            values: 3,
            ring_slack: 2,
            step_checkpoints: 0,
        });
        let mut m = SequenceMemory::new(s, shape(16, 2)).unwrap();
        let a = m.admit(&[1; 9], 16).unwrap();
        m.grow(a.seq, 9).unwrap();
        {
            let mut v = m.view(&[a.seq]).unwrap();
            v.state(0).copy_from_slice(&[1.0, 2.0, 3.0]);
            v.advance(0, 4);
            v.checkpoint(0, 4);
            v.state(0).copy_from_slice(&[4.0, 5.0, 6.0]);
            v.advance(0, 9);
        }
        m.record(a.seq, &[1; 9]).unwrap();
        // Within the slack the state is kept as it is (its rings still hold what is needed).
        m.rollback(a.seq, 7).unwrap();
        assert_eq!(m.view(&[a.seq]).unwrap().state(0), &[4.0, 5.0, 6.0]);
        // The slack counts from the furthest position the rings were written to (9), not
        // from the current length.
        step_state(&mut m, a.seq, 8);
        assert_eq!(
            m.rollback(a.seq, 6),
            Err(MemoryError::CannotRollBack { len: 8, to: 6 })
        );
        m.rollback(a.seq, 7).unwrap();
        m.rollback(a.seq, 4).unwrap();
        assert_eq!(m.view(&[a.seq]).unwrap().state(0), &[1.0, 2.0, 3.0]);
        // Restored, the rings were last written up to the checkpoint.
        step_state(&mut m, a.seq, 6);
        m.rollback(a.seq, 4).unwrap();
        assert_eq!(m.spec().rollback_reach(), 2);
        assert_eq!(spec(None).rollback_reach(), usize::MAX);
    }

    #[test]
    fn prefixes_are_shared_and_rollback_never_writes_a_shared_block() {
        let mut m = SequenceMemory::new(spec(None), shape(16, 4)).unwrap();
        let prompt: Vec<u32> = (10..20).collect();
        let a = m.admit(&prompt, 16).unwrap();
        assert_eq!(a.reused, 0);
        fake_step(&mut m, a.seq, &prompt);
        // A second sequence with the same prompt shares the two full blocks.
        let b = m.admit(&prompt, 16).unwrap();
        assert_eq!(b.reused, 8);
        fake_step(&mut m, b.seq, &prompt[8..]);
        assert_eq!(rows(&mut m, a.seq), rows(&mut m, b.seq));
        // b rolls back into the shared second block and writes other tokens there: a's
        // rows must not change, and b gets its own copy of the kept positions.
        let before = rows(&mut m, a.seq);
        m.rollback(b.seq, 6).unwrap();
        fake_step(&mut m, b.seq, &[99, 98]);
        assert_eq!(rows(&mut m, a.seq), before);
        let b_rows = rows(&mut m, b.seq);
        assert_eq!(&b_rows[..6 * 3], &before[..6 * 3]);
        assert_eq!(b_rows[6 * 3], 99.0);
        assert_eq!(m.tokens(b.seq)[6..], [99, 98]);
        // Every block comes back on release; the registered ones stay cached.
        m.release(a.seq);
        m.release(b.seq);
        assert_eq!(m.usage().used, 0);
        assert!(m.usage().cached >= 2);
        assert_eq!(m.promised, 0);
    }

    #[test]
    fn admission_reserves_what_a_sequence_may_need() {
        let mut m = SequenceMemory::new(spec(None), shape(4, 4)).unwrap();
        assert_eq!(
            m.check(&[1; 3], 100),
            Err(Refusal::TooLarge {
                needed: 64,
                capacity: 16
            })
        );
        let a = m.admit(&[1, 2, 3], 12).unwrap();
        // 3 blocks promised to a: a 2-block request must wait.
        assert_eq!(m.check(&[5, 6, 7], 8), Err(Refusal::Busy));
        assert!(m.check(&[5, 6, 7], 4).is_ok());
        fake_step(&mut m, a.seq, &[1, 2, 3]);
        fake_step(&mut m, a.seq, &(0..9).collect::<Vec<_>>());
        assert_eq!(m.len(a.seq), 12);
        m.release(a.seq);
        assert!(m.check(&[5, 6, 7], 16).is_ok());
    }

    #[test]
    fn a_recurrent_state_rolls_back_only_to_a_checkpoint() {
        let mut m = SequenceMemory::new(spec(Some(3)), shape(16, 3)).unwrap();
        let a = m.admit(&[1; 8], 16).unwrap();
        m.grow(a.seq, 8).unwrap();
        {
            let mut v = m.view(&[a.seq]).unwrap();
            v.state(0).copy_from_slice(&[1.0, 2.0, 3.0]);
            v.advance(0, 4);
            v.checkpoint(0, 4);
            v.state(0).copy_from_slice(&[4.0, 5.0, 6.0]);
            v.advance(0, 8);
        }
        m.record(a.seq, &[1; 8]).unwrap();
        assert_eq!(
            m.rollback(a.seq, 6),
            Err(MemoryError::CannotRollBack { len: 8, to: 6 })
        );
        assert_eq!(m.len(a.seq), 8, "a refused rollback changes nothing");
        m.rollback(a.seq, 4).unwrap();
        assert_eq!(m.view(&[a.seq]).unwrap().state(0), &[1.0, 2.0, 3.0]);
        // The checkpoint at the first block's end was published: a new sequence with the
        // same prefix starts from it, bit for bit.
        let b = m.admit(&[1; 9], 16).unwrap();
        assert_eq!(b.reused, 4);
        assert_eq!(m.view(&[b.seq]).unwrap().state(0), &[1.0, 2.0, 3.0]);
        // Without a checkpoint at a block end, nothing is reused.
        let c = m.admit(&[2; 9], 16);
        assert_eq!(c.map(|c| c.reused), Ok(0));
    }

    #[test]
    fn an_impossible_arena_is_an_error() {
        let s = spec(None);
        let r = SequenceMemory::new(
            s,
            MemoryShape {
                n_blocks: 1 << 31,
                block_tokens: 1 << 20,
                max_sequences: 1,
                n_ctx: 1 << 30,
                prefix_cache: false,
            },
        );
        assert!(matches!(
            r,
            Err(MemoryError::Allocation { .. } | MemoryError::ExceedsMemory { .. })
        ));
    }

    /// A memory that keeps no rows (an encoder's) is still sized by its blocks' bookkeeping:
    /// a hostile context is refused, not allocated.
    #[test]
    fn blocks_without_rows_still_cost_their_bookkeeping() {
        let rowless = MemorySpec {
            paged: Vec::new(),
            recurrent: None,
            storage: KvStorage::F32,
            row_lag: 0,
        };
        let r = SequenceMemory::new(
            rowless,
            MemoryShape {
                n_blocks: BlockId::MAX as usize,
                block_tokens: 16,
                max_sequences: 4,
                n_ctx: 1 << 30,
                prefix_cache: true,
            },
        );
        let e = r.err();
        assert!(
            matches!(e, Some(MemoryError::ExceedsMemory { .. })),
            "{e:?}"
        );
    }
}
