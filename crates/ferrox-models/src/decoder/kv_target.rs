//! Where the sequences of one step keep their keys and values: each in its own contiguous
//! [`KvCache`], or in blocks of one shared [`PagedKv`] arena (the server's pool). The layer
//! code writes and attends through [`KvTarget`] and does not care which.

use ferrox_core::{BlockTable, KvCache, PagedKv};

use crate::layers::attention::{attend, AttentionParams, KvView, OnlineAttention};

pub(super) enum KvTarget<'a> {
    Owned(Vec<&'a mut KvCache>),
    Paged {
        arena: &'a mut PagedKv,
        tables: Vec<&'a mut BlockTable>,
    },
}

/// One query head's place in the cache.
#[derive(Clone, Copy)]
pub(super) struct HeadSlot {
    pub seq: usize,
    pub layer: usize,
    pub kv_head: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
}

impl KvTarget<'_> {
    /// Positions sequence `seq` holds.
    pub fn len(&self, seq: usize) -> usize {
        match self {
            KvTarget::Owned(c) => c[seq].len(),
            KvTarget::Paged { tables, .. } => tables[seq].len(),
        }
    }

    /// Positions sequence `seq` can hold without more memory.
    pub fn capacity(&self, seq: usize) -> usize {
        match self {
            KvTarget::Owned(c) => c[seq].capacity(),
            KvTarget::Paged { arena, tables } => tables[seq].capacity(arena.block_tokens()),
        }
    }

    pub fn write(&mut self, seq: usize, layer: usize, pos: usize, keys: &[f32], values: &[f32]) {
        match self {
            KvTarget::Owned(c) => c[seq].write(layer, pos, keys, values),
            KvTarget::Paged { arena, tables } => {
                let (block, offset) = tables[seq].locate(pos, arena.block_tokens());
                arena.write(layer, block, offset, keys, values);
            }
        }
    }

    /// Marks sequence `seq` filled up to `len` positions.
    pub fn advance(&mut self, seq: usize, len: usize) {
        match self {
            KvTarget::Owned(c) => c[seq].advance(len),
            KvTarget::Paged { tables, .. } => tables[seq].advance(len),
        }
    }

    /// Attention of one query head over positions `lo..hi` of its sequence.
    pub fn attend(
        &self,
        at: HeadSlot,
        q: &[f32],
        lo: usize,
        hi: usize,
        params: &AttentionParams,
        out: &mut [f32],
    ) {
        match self {
            KvTarget::Owned(c) => {
                let kv = &*c[at.seq];
                let view = KvView {
                    keys: kv.keys(at.layer, 0, hi),
                    values: kv.values(at.layer, 0, hi),
                    key_width: kv.key_width(),
                    value_width: kv.value_width(),
                    head: at.kv_head,
                    head_dim_k: at.head_dim_k,
                    head_dim_v: at.head_dim_v,
                };
                attend(q, &view, lo, hi, params, out);
            }
            KvTarget::Paged { arena, tables } => {
                let bt = arena.block_tokens();
                let view = |block, start, end| KvView {
                    keys: arena.keys(at.layer, block, start, end),
                    values: arena.values(at.layer, block, start, end),
                    key_width: arena.key_width(),
                    value_width: arena.value_width(),
                    head: at.kv_head,
                    head_dim_k: at.head_dim_k,
                    head_dim_v: at.head_dim_v,
                };
                let table = &*tables[at.seq];
                let first = table.locate(lo.min(hi.saturating_sub(1)), bt).0;
                let mut acc = OnlineAttention::new(q, &view(first, 0, 0), params, out);
                table.for_each_run(lo, hi, bt, |block, start, end| {
                    acc.consume(q, &view(block, start, end), 0, end - start, out);
                });
                acc.finish(out);
            }
        }
    }
}
