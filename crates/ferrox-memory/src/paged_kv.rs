//! Paged KV memory: one arena of fixed-size blocks shared by every sequence, as vLLM's
//! paged attention does. A sequence's cache is a [`BlockTable`] (block ids in position
//! order); blocks holding a common prompt prefix can appear in several tables at once, so
//! the prefix is stored and computed once. Which block is free, shared or cached is
//! [`crate::block_manager`]'s business; this module only stores rows.

use ferrox_core::{KvRows, KvStorage};

use crate::rows::Rows;

/// Index of a block in a [`PagedKv`] arena.
pub type BlockId = u32;

#[derive(Debug)]
struct LayerBlocks {
    keys: Rows,
    values: Rows,
}

/// Keys and values for `n_blocks` blocks of `block_tokens` rows, every layer.
/// Inside a block, rows are position-major: position `p` of a layer holds `key_width` keys at
/// `p * key_width`.
#[derive(Debug)]
pub struct PagedKv {
    layers: Vec<LayerBlocks>,
    storage: KvStorage,
    n_blocks: usize,
    block_tokens: usize,
    key_width: usize,
    value_width: usize,
}

impl PagedKv {
    /// Reserves the arena (zeroed pages: memory is touched only as blocks fill); `None` when
    /// the sizes overflow, a row is not whole blocks of its type, or the allocator refuses.
    pub fn try_new(
        n_layers: usize,
        n_blocks: usize,
        block_tokens: usize,
        key_width: usize,
        value_width: usize,
        storage: KvStorage,
    ) -> Option<PagedKv> {
        let whole_blocks = key_width.is_multiple_of(storage.keys.block_len())
            && value_width.is_multiple_of(storage.values.block_len());
        if block_tokens == 0 || n_blocks > BlockId::MAX as usize || !whole_blocks {
            return None;
        }
        let positions = n_blocks.checked_mul(block_tokens)?;
        let mut layers = Vec::new();
        layers.try_reserve_exact(n_layers).ok()?;
        for _ in 0..n_layers {
            layers.push(LayerBlocks {
                keys: Rows::try_zeroed(storage.keys, positions.checked_mul(key_width)?)?,
                values: Rows::try_zeroed(storage.values, positions.checked_mul(value_width)?)?,
            });
        }
        Some(PagedKv {
            layers,
            storage,
            n_blocks,
            block_tokens,
            key_width,
            value_width,
        })
    }

    /// Copies the first `n` positions of block `from` into block `to`, every layer.
    pub fn copy_block(&mut self, from: BlockId, to: BlockId, n: usize) {
        let bt = self.block_tokens;
        for l in &mut self.layers {
            for (rows, width) in [
                (&mut l.keys, self.key_width),
                (&mut l.values, self.value_width),
            ] {
                let src = from as usize * bt * width;
                rows.copy_within(src..src + n * width, to as usize * bt * width);
            }
        }
    }

    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    pub fn storage(&self) -> KvStorage {
        self.storage
    }

    pub fn key_width(&self) -> usize {
        self.key_width
    }

    pub fn value_width(&self) -> usize {
        self.value_width
    }

    /// Stores the rows of `layer` at `offset` inside `block`.
    pub fn write(
        &mut self,
        layer: usize,
        block: BlockId,
        offset: usize,
        keys: &[f32],
        values: &[f32],
    ) {
        debug_assert!(offset < self.block_tokens && (block as usize) < self.n_blocks);
        let at = block as usize * self.block_tokens + offset;
        let l = &mut self.layers[layer];
        l.keys.write(at * self.key_width, keys);
        l.values.write(at * self.value_width, values);
    }

    /// Keys of offsets `start..end` inside `block`, position-major.
    pub fn keys(&self, layer: usize, block: BlockId, start: usize, end: usize) -> KvRows<'_> {
        let base = block as usize * self.block_tokens;
        self.layers[layer].keys.slice(
            (base + start) * self.key_width,
            (base + end) * self.key_width,
        )
    }

    /// Values of offsets `start..end` inside `block`, position-major.
    pub fn values(&self, layer: usize, block: BlockId, start: usize, end: usize) -> KvRows<'_> {
        let base = block as usize * self.block_tokens;
        self.layers[layer].values.slice(
            (base + start) * self.value_width,
            (base + end) * self.value_width,
        )
    }
}

/// One sequence's view of a [`PagedKv`]: the blocks holding its positions, in order, and
/// how many positions are filled. Position `p` lives in `blocks[p / block_tokens]` at
/// offset `p % block_tokens`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockTable {
    blocks: Vec<BlockId>,
    len: usize,
}

impl BlockTable {
    pub fn new() -> BlockTable {
        BlockTable::default()
    }

    /// An empty table with room for `blocks` blocks.
    pub fn with_capacity(blocks: usize) -> BlockTable {
        BlockTable {
            blocks: Vec::with_capacity(blocks),
            len: 0,
        }
    }

    /// Positions filled.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Positions the table's blocks can hold.
    pub fn capacity(&self, block_tokens: usize) -> usize {
        self.blocks.len() * block_tokens
    }

    /// Appends a block (its positions become writable).
    pub fn push_block(&mut self, block: BlockId) {
        self.blocks.push(block);
    }

    /// Marks positions up to `len` (exclusive) as filled.
    pub fn advance(&mut self, len: usize) {
        self.len = self.len.max(len);
    }

    /// Keeps the first `blocks` blocks and `len` filled positions (the caller hands the
    /// dropped blocks back).
    pub fn truncate(&mut self, len: usize, blocks: usize) {
        self.blocks.truncate(blocks);
        self.len = len.min(self.len);
    }

    /// Puts `block` at index `i` of the table (a private copy of the block there).
    pub fn replace_block(&mut self, i: usize, block: BlockId) {
        self.blocks[i] = block;
    }

    /// Empties the table, handing back every block.
    pub fn clear(&mut self) -> Vec<BlockId> {
        self.len = 0;
        std::mem::take(&mut self.blocks)
    }

    /// The block and offset of position `pos`.
    pub fn locate(&self, pos: usize, block_tokens: usize) -> (BlockId, usize) {
        (self.blocks[pos / block_tokens], pos % block_tokens)
    }

    /// Calls `f(block, start, end)` for each block-contiguous run of positions `lo..hi`,
    /// in order (`start..end` are offsets inside the block).
    pub fn for_each_run(
        &self,
        lo: usize,
        hi: usize,
        block_tokens: usize,
        mut f: impl FnMut(BlockId, usize, usize),
    ) {
        let mut p = lo;
        while p < hi {
            let (block, offset) = self.locate(p, block_tokens);
            let end = (offset + (hi - p)).min(block_tokens);
            f(block, offset, end);
            p += end - offset;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_land_in_their_block_and_runs_cover_the_range() {
        let mut kv = PagedKv::try_new(2, 4, 3, 2, 1, KvStorage::F32).unwrap();
        let mut table = BlockTable::new();
        // Blocks out of order: positions 0..3 in block 2, 3..6 in block 0.
        table.push_block(2);
        table.push_block(0);
        for pos in 0..5 {
            let (b, off) = table.locate(pos, 3);
            kv.write(1, b, off, &[pos as f32; 2], &[-(pos as f32)]);
        }
        table.advance(5);
        let mut seen = Vec::new();
        table.for_each_run(1, 5, 3, |b, s, e| {
            match kv.keys(1, b, s, e) {
                KvRows::F32(k) => seen.extend(k.iter().step_by(2).copied()),
                _ => unreachable!(),
            }
            let n = e - s;
            assert!(n > 0 && e <= 3);
        });
        assert_eq!(seen, vec![1.0, 2.0, 3.0, 4.0]);
        match kv.values(1, 0, 1, 2) {
            KvRows::F32(v) => assert_eq!(v, &[-4.0]),
            _ => unreachable!(),
        }
    }

    /// Block-typed rows (here q8_0 keys beside q4_0 values) land, copy and read back as
    /// the type rounds them, each row whole blocks.
    #[test]
    fn quantized_rows_round_trip_and_copy() {
        use ferrox_core::KvType;
        let storage = KvStorage {
            keys: KvType::Q8_0,
            values: KvType::Q4_0,
        };
        let mut kv = PagedKv::try_new(1, 2, 4, 64, 32, storage).unwrap();
        let key: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        let value: Vec<f32> = (0..32).map(|i| (i as f32 * 0.11).cos()).collect();
        kv.write(0, 0, 2, &key, &value);
        kv.copy_block(0, 1, 3);
        for block in [0, 1] {
            let mut k = vec![0f32; 64];
            let mut v = vec![0f32; 32];
            let KvRows::Blocks(KvType::Q8_0, bytes) = kv.keys(0, block, 2, 3) else {
                panic!("q8_0 keys")
            };
            assert_eq!(bytes.len(), 68);
            kv.keys(0, block, 2, 3).copy_to(&mut k);
            kv.values(0, block, 2, 3).copy_to(&mut v);
            assert!(k.iter().zip(&key).all(|(a, b)| (a - b).abs() < 1e-2));
            // q4_0 has eight steps below zero and seven above: -1 clamps to -7/8 here.
            assert!(
                v.iter().zip(&value).all(|(a, b)| (a - b).abs() <= 0.13),
                "{v:?}"
            );
            assert!(v.iter().zip(&value).any(|(a, b)| a != b), "q4_0 rounds");
        }
        // A width that is not whole blocks cannot be stored.
        assert!(PagedKv::try_new(1, 2, 4, 48, 32, storage).is_none());
    }

    #[test]
    fn clear_returns_every_block() {
        let mut table = BlockTable::new();
        for b in [5, 6, 7] {
            table.push_block(b);
        }
        table.advance(8);
        assert_eq!(table.clear(), vec![5, 6, 7]);
        assert!(table.is_empty());
    }
}
