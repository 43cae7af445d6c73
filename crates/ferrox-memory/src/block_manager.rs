//! Who owns which block of a [`crate::PagedKv`] arena, and the prefix cache.
//!
//! Blocks are reference counted: a block filled by one sequence's prompt can be shared
//! with later sequences whose prompts start with the same tokens. A full block is
//! registered under a hash of its tokens chained with the previous block's hash, so a hash
//! names a whole prefix (block contents depend on every earlier token). When its last
//! holder releases a registered block it is kept as a cached block, evicted
//! least-recently-released first when fresh blocks run out; unregistered blocks go straight
//! back to the free list.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

use crate::paged_kv::BlockId;

/// The chain hash before the first block.
pub const ROOT_HASH: u64 = 0x6665_7272_6f78_6b76;

/// What a registered block holds: its own tokens after the prefix named by `parent`.
#[derive(Debug)]
struct BlockKey {
    hash: u64,
    parent: u64,
    tokens: Box<[u32]>,
}

/// Cached blocks that start a token sequence.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CachedPrefix {
    /// The blocks, in order.
    pub blocks: Vec<BlockId>,
    /// The chain hash after the last of them ([`ROOT_HASH`] when there are none): the
    /// parent of the next block.
    pub hash: u64,
    /// The chain hash after each block.
    pub hashes: Vec<u64>,
}

/// Counts for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockUsage {
    /// Held by at least one sequence.
    pub used: usize,
    /// Held by nobody but kept for prefix reuse (evictable).
    pub cached: usize,
    /// Never filled or dropped.
    pub free: usize,
}

#[derive(Debug)]
pub struct BlockManager {
    block_tokens: usize,
    refs: Vec<u32>,
    free: Vec<BlockId>,
    keys: Vec<Option<BlockKey>>,
    by_hash: HashMap<u64, BlockId>,
    /// Cached blocks nobody holds, by release tick (oldest first).
    evictable: BTreeMap<u64, BlockId>,
    release_tick: Vec<u64>,
    tick: u64,
}

/// The chain root of a cache namespace (vLLM's `cache_salt`): prefixes computed under one
/// salt are found only by requests with the same salt, so whether a prompt is cached tells
/// nothing about another tenant's prompts. No salt is [`ROOT_HASH`].
pub fn salted_root(salt: Option<&str>) -> u64 {
    match salt {
        None => ROOT_HASH,
        Some(salt) => {
            let mut h = std::hash::DefaultHasher::new();
            ROOT_HASH.hash(&mut h);
            "cache_salt".hash(&mut h);
            salt.hash(&mut h);
            h.finish()
        }
    }
}

/// The hash naming `tokens` as the block after the prefix named `parent`.
pub fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    // SipHash with fixed keys: stable within a process, which is all the cache needs.
    let mut h = std::hash::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl BlockManager {
    /// Bytes of bookkeeping per block (its count, free-list entry, key and tick), which a
    /// memory must afford as well as the blocks' rows.
    pub const BYTES_PER_BLOCK: usize = std::mem::size_of::<u32>()
        + std::mem::size_of::<BlockId>()
        + std::mem::size_of::<Option<BlockKey>>()
        + std::mem::size_of::<u64>();

    pub fn new(n_blocks: usize, block_tokens: usize) -> BlockManager {
        assert!(block_tokens > 0 && n_blocks <= BlockId::MAX as usize);
        BlockManager {
            block_tokens,
            refs: vec![0; n_blocks],
            // Popped from the end: hand out low ids first.
            free: (0..n_blocks as BlockId).rev().collect(),
            keys: (0..n_blocks).map(|_| None).collect(),
            by_hash: HashMap::new(),
            evictable: BTreeMap::new(),
            release_tick: vec![0; n_blocks],
            tick: 0,
        }
    }

    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    pub fn n_blocks(&self) -> usize {
        self.refs.len()
    }

    /// Blocks that [`allocate`](Self::allocate) can still hand out (free or evictable).
    pub fn available(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    pub fn usage(&self) -> BlockUsage {
        BlockUsage {
            used: self.refs.len() - self.available(),
            cached: self.evictable.len(),
            free: self.free.len(),
        }
    }

    /// Holders of `block`.
    pub fn ref_count(&self, block: BlockId) -> u32 {
        self.refs[block as usize]
    }

    /// The cached blocks holding the longest run of whole blocks at the start of
    /// `tokens` (at most `max_blocks`), without taking them. Evictable blocks among them
    /// stop being available once [`acquire`](Self::acquire)d.
    pub fn lookup_prefix(&self, tokens: &[u32], max_blocks: usize) -> CachedPrefix {
        self.lookup_prefix_from(ROOT_HASH, tokens, max_blocks)
    }

    /// [`lookup_prefix`](Self::lookup_prefix) in the namespace whose chain starts at `root`
    /// ([`salted_root`]).
    pub fn lookup_prefix_from(&self, root: u64, tokens: &[u32], max_blocks: usize) -> CachedPrefix {
        let mut found = CachedPrefix {
            blocks: Vec::new(),
            hash: root,
            hashes: Vec::new(),
        };
        for chunk in tokens.chunks_exact(self.block_tokens).take(max_blocks) {
            let hash = chain_hash(found.hash, chunk);
            let Some(&block) = self.by_hash.get(&hash) else {
                break;
            };
            // Compare contents too: a hash collision must never reuse the wrong keys.
            match &self.keys[block as usize] {
                Some(key) if key.parent == found.hash && *key.tokens == *chunk => {}
                _ => break,
            }
            found.blocks.push(block);
            found.hashes.push(hash);
            found.hash = hash;
        }
        found
    }

    /// Whether `block` is in the prefix cache (its rows must not change).
    pub fn is_registered(&self, block: BlockId) -> bool {
        self.keys[block as usize].is_some()
    }

    /// Takes a hold on a block found by [`lookup_prefix`](Self::lookup_prefix).
    pub fn acquire(&mut self, block: BlockId) {
        let i = block as usize;
        if self.refs[i] == 0 {
            self.evictable.remove(&self.release_tick[i]);
        }
        self.refs[i] += 1;
    }

    /// A fresh block for the caller to fill: a free one, else the least recently released
    /// cached block (which leaves the prefix cache). `None` when every block is held.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let block = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.evictable.pop_first()?;
                if let Some(key) = self.keys[b as usize].take() {
                    self.by_hash.remove(&key.hash);
                }
                b
            }
        };
        self.refs[block as usize] = 1;
        Some(block)
    }

    /// Records that `block`, held by the caller, is full with `tokens` after the prefix
    /// named `parent`, so later prompts can reuse it. Returns the block's chain hash (the
    /// next block's parent). A block whose contents are already cached elsewhere stays
    /// unregistered and is freed on release.
    pub fn register(&mut self, block: BlockId, parent: u64, tokens: &[u32]) -> u64 {
        debug_assert_eq!(tokens.len(), self.block_tokens);
        debug_assert!(self.refs[block as usize] > 0);
        let hash = chain_hash(parent, tokens);
        if self.keys[block as usize].is_none() && !self.by_hash.contains_key(&hash) {
            self.by_hash.insert(hash, block);
            self.keys[block as usize] = Some(BlockKey {
                hash,
                parent,
                tokens: tokens.into(),
            });
        }
        hash
    }

    /// Drops a hold on `block`. Release a sequence's blocks last to first, so a cached
    /// prefix is evicted from its end.
    pub fn release(&mut self, block: BlockId) {
        let i = block as usize;
        assert!(
            self.refs[i] > 0,
            "block {block} released more often than held"
        );
        self.refs[i] -= 1;
        if self.refs[i] > 0 {
            return;
        }
        if self.keys[i].is_some() {
            self.tick += 1;
            self.release_tick[i] = self.tick;
            self.evictable.insert(self.tick, block);
        } else {
            self.free.push(block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fills a fresh sequence of `tokens`, registering each full block.
    fn fill(m: &mut BlockManager, tokens: &[u32]) -> Vec<BlockId> {
        let bt = m.block_tokens();
        let mut parent = ROOT_HASH;
        let mut blocks = Vec::new();
        for chunk in tokens.chunks(bt) {
            let b = m.allocate().expect("a block");
            if chunk.len() == bt {
                parent = m.register(b, parent, chunk);
            }
            blocks.push(b);
        }
        blocks
    }

    fn release_all(m: &mut BlockManager, blocks: &[BlockId]) {
        blocks.iter().rev().for_each(|&b| m.release(b));
    }

    #[test]
    fn prefix_blocks_are_shared_and_survive_release() {
        let mut m = BlockManager::new(8, 4);
        let prompt: Vec<u32> = (0..10).collect();
        let first = fill(&mut m, &prompt);
        assert_eq!(first.len(), 3);
        // Only whole blocks are cached, and a lookup stops at the first difference.
        let mut other = prompt.clone();
        other[6] = 99;
        assert_eq!(m.lookup_prefix(&prompt, 10).blocks, first[..2].to_vec());
        assert_eq!(m.lookup_prefix(&other, 10).blocks, first[..1].to_vec());
        assert_eq!(m.lookup_prefix(&prompt, 1).blocks, first[..1].to_vec());
        release_all(&mut m, &first);
        assert_eq!(
            m.usage(),
            BlockUsage {
                used: 0,
                cached: 2,
                free: 6
            }
        );
        // Reuse after release: the cached blocks come back, held once more.
        let again = m.lookup_prefix(&prompt, 10).blocks;
        assert_eq!(again, first[..2].to_vec());
        again.iter().for_each(|&b| m.acquire(b));
        assert_eq!(m.usage().cached, 0);
        assert_eq!(m.ref_count(again[0]), 1);
    }

    #[test]
    fn eviction_takes_the_oldest_cached_block_and_forgets_it() {
        let mut m = BlockManager::new(2, 2);
        let a = fill(&mut m, &[1, 2]);
        release_all(&mut m, &a);
        let b = fill(&mut m, &[3, 4]);
        release_all(&mut m, &b);
        assert_eq!(m.usage().cached, 2);
        // Both free blocks are gone; the next allocation evicts [1, 2], released first.
        let c = m.allocate().unwrap();
        assert_eq!(c, a[0]);
        assert!(m.lookup_prefix(&[1, 2], 1).blocks.is_empty());
        assert_eq!(m.lookup_prefix(&[3, 4], 1).blocks, b);
        let d = m.allocate().unwrap();
        assert_eq!(d, b[0]);
        assert_eq!(m.allocate(), None);
        m.release(c);
        assert_eq!(m.available(), 1);
    }

    #[test]
    fn duplicate_contents_stay_unregistered() {
        let mut m = BlockManager::new(4, 2);
        let a = fill(&mut m, &[7, 8]);
        let b = fill(&mut m, &[7, 8]);
        assert_ne!(a, b);
        // The second copy is not cached: it is freed, not kept, on release.
        m.release(b[0]);
        assert_eq!(m.usage().free, 3);
        assert_eq!(m.lookup_prefix(&[7, 8], 1).blocks, a);
    }

    #[test]
    fn shared_blocks_need_every_holder_to_release() {
        let mut m = BlockManager::new(3, 2);
        let a = fill(&mut m, &[1, 2, 3]);
        let shared = m.lookup_prefix(&[1, 2, 5], 1).blocks;
        shared.iter().for_each(|&b| m.acquire(b));
        assert_eq!(m.ref_count(a[0]), 2);
        release_all(&mut m, &a);
        assert_eq!(m.usage().used, 1);
        m.release(shared[0]);
        assert_eq!(m.usage().cached, 1);
    }
}
