//! Where the sequences of one step keep their keys and values: each in its own contiguous
//! [`KvCache`], or in blocks of one shared [`PagedKv`] arena (the server's pool). The layer
//! code writes and attends through [`KvTarget`] and does not care which.

use ferrox_core::flash_attn::GroupShape;
use ferrox_core::{BlockTable, KvCache, KvRows, KvStorage, PagedKv};
use smallvec::SmallVec;

use crate::layers::attention::{
    f16_run, with_group_state, AttentionParams, KvView, OnlineAttention,
};

/// Sequences per step whose references are kept without a heap allocation.
const INLINE: usize = 16;

pub(super) enum KvTarget<'a> {
    Owned(SmallVec<[&'a mut KvCache; INLINE]>),
    Paged {
        arena: &'a mut PagedKv,
        tables: SmallVec<[&'a mut BlockTable; INLINE]>,
    },
}

/// A group of query heads sharing one KV head, at one position of one sequence.
#[derive(Clone, Copy)]
pub(super) struct HeadGroup {
    pub seq: usize,
    pub layer: usize,
    pub kv_head: usize,
    pub n_queries: usize,
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

    fn storage(&self) -> KvStorage {
        match self {
            KvTarget::Owned(c) => c[0].storage(),
            KvTarget::Paged { arena, .. } => arena.storage(),
        }
    }

    fn widths(&self) -> (usize, usize) {
        match self {
            KvTarget::Owned(c) => (c[0].key_width(), c[0].value_width()),
            KvTarget::Paged { arena, .. } => (arena.key_width(), arena.value_width()),
        }
    }

    /// Calls `f(keys, values, n)` for each stretch of positions `lo..hi` of a sequence
    /// that lies contiguously in memory, in order (rows position-major from the stretch's
    /// first position).
    fn for_each_run<'s>(
        &'s self,
        seq: usize,
        layer: usize,
        lo: usize,
        hi: usize,
        mut f: impl FnMut(KvRows<'s>, KvRows<'s>, usize),
    ) {
        match self {
            KvTarget::Owned(c) => {
                let kv = &*c[seq];
                f(kv.keys(layer, lo, hi), kv.values(layer, lo, hi), hi - lo);
            }
            KvTarget::Paged { arena, tables } => {
                let arena = &**arena;
                tables[seq].for_each_run(lo, hi, arena.block_tokens(), |block, start, end| {
                    f(
                        arena.keys(layer, block, start, end),
                        arena.values(layer, block, start, end),
                        end - start,
                    )
                });
            }
        }
    }

    /// Attention of a group of query heads (`q`: `n_queries` rows) over positions `lo..hi`
    /// of their sequence; `out` gets `n_queries` rows of `head_dim_v`.
    pub fn attend(
        &self,
        at: HeadGroup,
        q: &[f32],
        lo: usize,
        hi: usize,
        params: &AttentionParams,
        out: &mut [f32],
    ) {
        let (key_width, value_width) = self.widths();
        let (dk, dv) = (at.head_dim_k, at.head_dim_v);
        let view = |keys, values| KvView {
            keys,
            values,
            key_width,
            value_width,
            head: at.kv_head,
            head_dim_k: dk,
            head_dim_v: dv,
        };
        if self.storage() == KvStorage::F16 {
            let shape = GroupShape {
                n_queries: at.n_queries,
                head_dim_k: dk,
                head_dim_v: dv,
                scale: params.scale,
                softcap: params.softcap,
            };
            with_group_state(|state| {
                state.start(shape, q);
                self.for_each_run(at.seq, at.layer, lo, hi, |keys, values, len| {
                    if let Some(run) = f16_run(&view(keys, values), 0, len) {
                        state.attend_run(&run);
                    }
                });
                state.finish(out);
            });
            return;
        }
        // An f32 cache: each query on its own, in f32 throughout.
        for g in 0..at.n_queries {
            let qg = &q[g * dk..(g + 1) * dk];
            let out = &mut out[g * dv..(g + 1) * dv];
            let mut acc: Option<OnlineAttention> = None;
            self.for_each_run(at.seq, at.layer, lo, hi, |keys, values, len| {
                let view = view(keys, values);
                acc.get_or_insert_with(|| OnlineAttention::new(&view, params, out))
                    .consume(qg, &view, 0, len, out);
            });
            if let Some(acc) = acc {
                acc.finish(out);
            }
        }
    }
}
