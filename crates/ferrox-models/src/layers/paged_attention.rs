//! Attention over a sequence's rows in a [`StepMemory`] store, run by run (a paged memory's
//! blocks, or the single run of a one-sequence memory), with the same arithmetic however
//! the positions are split. Every engine's attention goes through here.

use ferrox_core::flash_attn::GroupShape;
use ferrox_core::typed_attn::TypedRun;
use ferrox_core::KvStorage;
use ferrox_memory::StepMemory;

use crate::layers::attention::{
    f16_run, with_group_state, with_typed_group, AttentionParams, KvView, OnlineAttention,
};

/// A group of query heads sharing one KV head, at one position of one sequence.
#[derive(Clone, Copy, Debug)]
pub struct HeadGroup {
    /// The sequence's index in the step.
    pub seq: usize,
    pub layer: usize,
    pub kv_head: usize,
    pub n_queries: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
}

/// Attention of a group of query heads (`q`: `n_queries` rows of `head_dim_k`) over
/// positions `lo..hi` of their sequence in `store`; `out` gets `n_queries` rows of
/// `head_dim_v`. A store without values (value width 0: MLA's latent rows) reads each
/// head's values from the start of its key row.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    memory: &StepMemory<'_>,
    store: usize,
    at: HeadGroup,
    q: &[f32],
    lo: usize,
    hi: usize,
    params: &AttentionParams,
    out: &mut [f32],
) {
    let (key_width, stored_value_width) = memory.widths(store);
    let values_in_keys = stored_value_width == 0;
    let value_width = if values_in_keys {
        key_width
    } else {
        stored_value_width
    };
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
    let runs = |f: &mut dyn FnMut(KvView<'_>, usize)| {
        memory.for_each_run(store, at.seq, at.layer, lo, hi, |keys, values, len| {
            f(view(keys, if values_in_keys { keys } else { values }), len)
        });
    };
    let storage = memory.storage(store);
    if !storage.is_float() {
        let types = if values_in_keys {
            KvStorage::uniform(storage.keys)
        } else {
            storage
        };
        attend_typed(types, at, q, params, out, |f| {
            runs(&mut |v, len| f(&typed_run(types, &v, 0..len)))
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
            runs(&mut |v, len| {
                if let Some(run) = f16_run(&v, 0, len) {
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
        runs(&mut |v, len| {
            acc.get_or_insert_with(|| OnlineAttention::new(&v, params, out))
                .consume(qg, &v, 0, len, out);
        });
        if let Some(acc) = acc {
            acc.finish(out);
        }
    }
}

/// Positions `span` of a run of a typed cache (`types`), the view's head.
pub(crate) fn typed_run<'a>(
    types: KvStorage,
    v: &KvView<'a>,
    span: std::ops::Range<usize>,
) -> TypedRun<'a> {
    let (_, keys) = v.keys.as_bytes();
    let (_, values) = v.values.as_bytes();
    let (key_stride, value_stride) = (
        types.keys.bytes(v.key_width),
        types.values.bytes(v.value_width),
    );
    TypedRun {
        keys: &keys[span.start * key_stride + types.keys.bytes(v.head * v.head_dim_k)..],
        key_stride,
        values: &values[span.start * value_stride + types.values.bytes(v.head * v.head_dim_v)..],
        value_stride,
        len: span.len(),
    }
}

/// The group over a cache of the other types (ggml's arithmetic for them, each key and value
/// read once for the group); `for_each_run` hands every run of the group's KV head to its
/// argument.
pub(crate) fn attend_typed(
    types: KvStorage,
    at: HeadGroup,
    q: &[f32],
    params: &AttentionParams,
    out: &mut [f32],
    for_each_run: impl Fn(&mut dyn FnMut(&TypedRun<'_>)),
) {
    let shape = GroupShape {
        n_queries: at.n_queries,
        head_dim_k: at.head_dim_k,
        head_dim_v: at.head_dim_v,
        scale: params.scale,
        softcap: params.softcap,
    };
    with_typed_group(|group| {
        group
            .start((types.keys, types.values), shape, q)
            .expect("the engine checked the cache's types and head sizes at load");
        for_each_run(&mut |run| group.attend_run(run));
        group.finish(out);
    });
}
