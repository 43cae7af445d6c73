//! Sparse attention: each row of a micro-batch attends to a listed subset of its
//! sequence's cached positions (DeepSeek Sparse Attention's top-k selection), or to all of
//! them.
//!
//! The listed positions are read store run by store run, each maximal stretch of
//! consecutive listed positions fed to the same online-softmax kernels as dense attention:
//! a list that names every position gives dense attention's arithmetic exactly.

use std::ops::Range;

use ferrox_core::flash_attn::GroupShape;
use ferrox_core::KvStorage;
use ferrox_memory::StepMemory;

use crate::layers::attention::{
    f16_run, with_group_state, AttentionParams, KvView, OnlineAttention,
};
use crate::layers::paged_attention::{attend_typed, typed_run, HeadGroup};

/// Per row of a micro-batch: the sorted positions it attends to, or none listed (every
/// position up to its own).
#[derive(Clone, Debug, Default)]
pub struct Selection {
    spans: Vec<Option<Range<usize>>>,
    positions: Vec<usize>,
}

impl Selection {
    pub fn clear(&mut self) {
        self.spans.clear();
        self.positions.clear();
    }

    /// Room for `rows` rows of up to `per_row` positions each (after a [`Selection::clear`]),
    /// so that selecting them does not allocate.
    pub fn reserve(&mut self, rows: usize, per_row: usize) {
        self.spans.reserve(rows.saturating_sub(self.spans.len()));
        let positions = rows.saturating_mul(per_row);
        self.positions
            .reserve(positions.saturating_sub(self.positions.len()));
    }

    /// Rows selected so far.
    pub fn rows(&self) -> usize {
        self.spans.len()
    }

    /// The next row attends to every position up to its own.
    pub fn push_all(&mut self) {
        self.spans.push(None);
    }

    /// The next row attends to `positions` (sorted ascending, no repeats).
    pub fn push(&mut self, positions: impl IntoIterator<Item = usize>) {
        let start = self.positions.len();
        self.positions.extend(positions);
        debug_assert!(self.positions[start..].windows(2).all(|w| w[0] < w[1]));
        self.spans.push(Some(start..self.positions.len()));
    }

    /// Row `t`'s listed positions (`None`: all of them).
    pub fn of(&self, t: usize) -> Option<&[usize]> {
        self.spans[t].clone().map(|span| &self.positions[span])
    }
}

/// Attention of a group of query heads (`q`: `n_queries` rows of `head_dim_k`) over the
/// listed `positions` (sorted) of their sequence in `store`; `out` gets `n_queries` rows of
/// `head_dim_v`. Like [`crate::layers::paged_attention::attend`], a store without values
/// reads each head's values from the start of its key row.
pub fn attend(
    memory: &StepMemory<'_>,
    store: usize,
    at: HeadGroup,
    q: &[f32],
    positions: &[usize],
    params: &AttentionParams,
    out: &mut [f32],
) {
    let Some(&last) = positions.last() else {
        out[..at.n_queries * at.head_dim_v].fill(0.0);
        return;
    };
    let (key_width, stored_value_width) = memory.widths(store);
    let values_in_keys = stored_value_width == 0;
    let value_width = if values_in_keys {
        key_width
    } else {
        stored_value_width
    };
    let (dk, dv) = (at.head_dim_k, at.head_dim_v);
    // Calls `f(view, lo, hi)` for each stretch `lo..hi` of consecutive listed positions,
    // relative to the start of the store run that holds it.
    let stretches = |f: &mut dyn FnMut(&KvView<'_>, usize, usize)| {
        let (mut run_start, mut next) = (0, 0);
        memory.for_each_run(store, at.seq, at.layer, 0, last + 1, |keys, values, len| {
            let view = KvView {
                keys,
                values: if values_in_keys { keys } else { values },
                key_width,
                value_width,
                head: at.kv_head,
                head_dim_k: dk,
                head_dim_v: dv,
            };
            let run_end = run_start + len;
            while next < positions.len() && positions[next] < run_end {
                let lo = positions[next];
                let mut hi = lo + 1;
                next += 1;
                while next < positions.len() && positions[next] == hi && hi < run_end {
                    hi += 1;
                    next += 1;
                }
                f(&view, lo - run_start, hi - run_start);
            }
            run_start = run_end;
        });
    };
    let storage = memory.storage(store);
    if !storage.is_float() {
        // Latent rows (values inside the keys): one type for both.
        let types = match values_in_keys {
            true => KvStorage::uniform(storage.keys),
            false => storage,
        };
        attend_typed(types, at, q, params, out, |f| {
            stretches(&mut |view, lo, hi| f(&typed_run(types, view, lo..hi)))
        });
        return;
    }
    if storage == KvStorage::F16 {
        let shape = GroupShape {
            n_queries: at.n_queries,
            head_dim_k: dk,
            head_dim_v: dv,
            scale: params.scale,
            softcap: params.softcap,
        };
        with_group_state(|state| {
            state.start(shape, q);
            stretches(&mut |view, lo, hi| {
                if let Some(run) = f16_run(view, lo, hi) {
                    state.attend_run(&run);
                }
            });
            state.finish(out);
        });
        return;
    }
    // An f32 store: each query on its own, in f32 throughout.
    for g in 0..at.n_queries {
        let qg = &q[g * dk..(g + 1) * dk];
        let out = &mut out[g * dv..(g + 1) * dv];
        let mut acc: Option<OnlineAttention> = None;
        stretches(&mut |view, lo, hi| {
            acc.get_or_insert_with(|| OnlineAttention::new(view, params, out))
                .consume(qg, view, lo, hi, out);
        });
        if let Some(acc) = acc {
            acc.finish(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_lists_rows_in_order() {
        let mut s = Selection::default();
        s.push_all();
        s.push([1, 4, 5]);
        s.push(std::iter::empty());
        assert_eq!(s.rows(), 3);
        assert_eq!(s.of(0), None);
        assert_eq!(s.of(1), Some(&[1, 4, 5][..]));
        assert_eq!(s.of(2), Some(&[][..]));
        s.clear();
        assert_eq!(s.rows(), 0);
    }
}
