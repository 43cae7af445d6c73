//! Scaled dot-product attention over the KV cache with an online softmax (one pass over
//! the keys, no score buffer). Prefill runs the same per-query arithmetic as decode, so a
//! prompt's logits do not depend on how it was batched or chunked.
//!
//! An f16 cache goes through [`ferrox_core::flash_attn`] (several heads sharing a KV head
//! at once, f32 queries and accumulators, the arithmetic of ggml's tiled CPU flash
//! attention for each key); an f32 cache through [`OnlineAttention`], in f32 throughout; the
//! other cache types (bf16, quantized, or K and V of different types) through
//! [`ferrox_core::typed_attn`] (from [`crate::layers::paged_attention`]).

use std::cell::RefCell;

use ferrox_core::flash_attn::{GroupShape, GroupState, KvRun};
use ferrox_core::typed_attn::TypedGroup;
use ferrox_core::KvRows;

pub use ferrox_core::flash_attn::MAX_HEAD_DIM;

/// Per-layer attention settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    /// Multiplies q·k (after any scaling already applied to q).
    pub scale: f32,
    /// Gemma-2 attention logit soft cap.
    pub softcap: Option<f32>,
}

/// Where one query head reads its keys and values.
#[derive(Clone, Copy, Debug)]
pub struct KvView<'a> {
    /// Keys of positions `first..first + n`, position-major, `key_width` per position.
    pub keys: KvRows<'a>,
    pub values: KvRows<'a>,
    pub key_width: usize,
    pub value_width: usize,
    /// Which KV head (offset inside each position's row).
    pub head: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
}

thread_local! {
    /// Each thread's flash-attention state (sized for the largest group once, then reused).
    static GROUP_STATE: RefCell<GroupState> = RefCell::new(GroupState::default());
    /// Its state for the caches of the other types, likewise.
    static TYPED_GROUP: RefCell<TypedGroup> = RefCell::new(TypedGroup::default());
}

/// Runs `f` with this thread's flash-attention state.
pub(crate) fn with_group_state<R>(f: impl FnOnce(&mut GroupState) -> R) -> R {
    GROUP_STATE.with_borrow_mut(f)
}

/// Runs `f` with this thread's state for typed caches.
pub(crate) fn with_typed_group<R>(f: impl FnOnce(&mut TypedGroup) -> R) -> R {
    TYPED_GROUP.with_borrow_mut(f)
}

/// The part of an f16 view one KV head reads, positions `lo..hi`.
pub(crate) fn f16_run<'a>(kv: &KvView<'a>, lo: usize, hi: usize) -> Option<KvRun<'a>> {
    let (KvRows::F16(k), KvRows::F16(v)) = (kv.keys, kv.values) else {
        return None;
    };
    Some(KvRun {
        keys: &k[lo * kv.key_width + kv.head * kv.head_dim_k..],
        key_stride: kv.key_width,
        values: &v[lo * kv.value_width + kv.head * kv.head_dim_v..],
        value_stride: kv.value_width,
        len: hi - lo,
    })
}

/// `out = softmax(q·K^T * scale) · V` over positions `lo..hi` of the view (indices relative
/// to the view's first position).
pub fn attend(
    q: &[f32],
    kv: &KvView<'_>,
    lo: usize,
    hi: usize,
    params: &AttentionParams,
    out: &mut [f32],
) {
    if let Some(run) = f16_run(kv, lo, hi) {
        let shape = GroupShape {
            n_queries: 1,
            head_dim_k: kv.head_dim_k,
            head_dim_v: kv.head_dim_v,
            scale: params.scale,
            softcap: params.softcap,
        };
        with_group_state(|state| {
            state.start(shape, q);
            state.attend_run(&run);
            state.finish(out);
        });
        return;
    }
    let mut acc = OnlineAttention::new(kv, params, out);
    acc.consume(q, kv, lo, hi, out);
    acc.finish(out);
}

/// One query's attention over an f32 cache, accumulated run by run (the runs of a paged
/// cache, in position order): the same arithmetic whether the keys come in one run or
/// many. The weighted sum accumulates in the output row.
pub struct OnlineAttention {
    max: f32,
    sum: f32,
    scale: f32,
    softcap: Option<f32>,
    head_dim_v: usize,
}

impl OnlineAttention {
    /// Starts an empty accumulation; `out` (the head's output row) is zeroed. `kv` gives
    /// the shapes of the runs to come.
    pub fn new(kv: &KvView<'_>, params: &AttentionParams, out: &mut [f32]) -> OnlineAttention {
        out[..kv.head_dim_v].fill(0.0);
        let scale = match params.softcap {
            Some(cap) => params.scale / cap,
            None => params.scale,
        };
        OnlineAttention {
            max: f32::NEG_INFINITY,
            sum: 0.0,
            scale,
            softcap: params.softcap,
            head_dim_v: kv.head_dim_v,
        }
    }

    /// Adds positions `lo..hi` of `kv` (which must follow everything consumed so far).
    ///
    /// # Panics
    /// On an f16 view (those go through [`attend`] or the flash-attention kernel).
    pub fn consume(&mut self, q: &[f32], kv: &KvView<'_>, lo: usize, hi: usize, out: &mut [f32]) {
        let (KvRows::F32(keys), KvRows::F32(values)) = (kv.keys, kv.values) else {
            panic!("OnlineAttention reads f32 caches only");
        };
        let dk = kv.head_dim_k;
        let dv = kv.head_dim_v;
        for p in lo..hi {
            let k_at = p * kv.key_width + kv.head * dk;
            let mut s = dot_f32(&keys[k_at..k_at + dk], &q[..dk]) * self.scale;
            if let Some(cap) = self.softcap {
                s = cap * s.tanh();
            }
            // Online softmax: rescale what has accumulated when a new maximum appears.
            let (ms, vs) = if s > self.max {
                let ms = (self.max - s).exp();
                self.max = s;
                (ms, 1.0)
            } else {
                (1.0, (s - self.max).exp())
            };
            let v_at = p * kv.value_width + kv.head * dv;
            mad(&mut out[..dv], ms, &values[v_at..v_at + dv], vs);
            self.sum = self.sum * ms + vs;
        }
    }

    /// Normalises the accumulated row in `out`.
    pub fn finish(&self, out: &mut [f32]) {
        let inv = if self.sum > 0.0 { 1.0 / self.sum } else { 0.0 };
        out[..self.head_dim_v].iter_mut().for_each(|o| *o *= inv);
    }
}

fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `acc = acc * ms + v * vs`.
fn mad(acc: &mut [f32], ms: f32, v: &[f32], vs: f32) {
    if ms != 1.0 {
        acc.iter_mut().for_each(|a| *a *= ms);
    }
    for (a, &x) in acc.iter_mut().zip(v) {
        *a += x * vs;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two-pass softmax reference.
    fn reference(q: &[f32], keys: &[Vec<f32>], values: &[Vec<f32>], scale: f32) -> Vec<f32> {
        let scores: Vec<f32> = keys.iter().map(|k| dot_f32(k, q) * scale).collect();
        let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let w: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f32 = w.iter().sum();
        let mut out = vec![0.0; values[0].len()];
        for (wi, v) in w.iter().zip(values) {
            for (o, x) in out.iter_mut().zip(v) {
                *o += wi / total * x;
            }
        }
        out
    }

    #[test]
    fn online_softmax_matches_two_pass() {
        let (n, d) = (13, 8);
        let keys: Vec<Vec<f32>> = (0..n)
            .map(|p| {
                (0..d)
                    .map(|i| ((p * 7 + i * 3) % 11) as f32 * 0.3 - 1.5)
                    .collect()
            })
            .collect();
        let values: Vec<Vec<f32>> = (0..n)
            .map(|p| (0..d).map(|i| ((p * 5 + i) % 7) as f32 - 3.0).collect())
            .collect();
        let q: Vec<f32> = (0..d).map(|i| i as f32 * 0.25 - 1.0).collect();
        let flat = |rows: &[Vec<f32>]| rows.concat();
        let (kf, vf) = (flat(&keys), flat(&values));
        let view = KvView {
            keys: KvRows::F32(&kf),
            values: KvRows::F32(&vf),
            key_width: d,
            value_width: d,
            head: 0,
            head_dim_k: d,
            head_dim_v: d,
        };
        let params = AttentionParams {
            scale: 0.35,
            softcap: None,
        };
        let mut out = vec![0.0; d];
        attend(&q, &view, 3, 11, &params, &mut out);
        let expected = reference(&q, &keys[3..11], &values[3..11], 0.35);
        for (a, b) in out.iter().zip(&expected) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }
}
