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

impl<'a> KvView<'a> {
    /// Head `head` of keys and values that are rows of `width` values holding every head in
    /// turn, `head_dim` each (as a projection writes them).
    pub fn head_of(
        (keys, values): (KvRows<'a>, KvRows<'a>),
        width: usize,
        head: usize,
        head_dim: usize,
    ) -> KvView<'a> {
        KvView {
            keys,
            values,
            key_width: width,
            value_width: width,
            head,
            head_dim_k: head_dim,
            head_dim_v: head_dim,
        }
    }
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

/// Keys and values as attention reads them: `k` and `v` themselves (an f32 cache), or
/// rounded to f16 into `k16` and `v16` (an f16 cache, llama.cpp's flash attention), in
/// parallel.
pub fn kv_rows<'a>(
    (k, v): (&'a [f32], &'a [f32]),
    f16_rows: Option<(&'a mut Vec<half::f16>, &'a mut Vec<half::f16>)>,
) -> (KvRows<'a>, KvRows<'a>) {
    use rayon::prelude::*;
    let Some((k16, v16)) = f16_rows else {
        return (KvRows::F32(k), KvRows::F32(v));
    };
    let round = |src: &[f32], dst: &'a mut Vec<half::f16>| -> &'a [half::f16] {
        dst.clear();
        dst.resize(src.len(), half::f16::ZERO);
        dst.par_iter_mut()
            .zip(src.par_iter())
            .for_each(|(o, &x)| *o = half::f16::from_f32(x));
        dst
    };
    (KvRows::F16(round(k, k16)), KvRows::F16(round(v, v16)))
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

/// ALiBi's slope for head `h` of `n_head`, as ggml computes it from `max_bias`.
pub fn alibi_slope(max_bias: f32, n_head: usize, h: usize) -> f32 {
    let n_head_log2 = 1usize << (n_head as f32).log2().floor() as u32;
    let m0 = 2f32.powf(-max_bias / n_head_log2 as f32);
    let m1 = 2f32.powf(-(max_bias / 2.0) / n_head_log2 as f32);
    if h < n_head_log2 {
        m0.powi(h as i32 + 1)
    } else {
        m1.powi(2 * (h - n_head_log2) as i32 + 1)
    }
}

/// `out = softmax(q·K^T * scale + bias(j)) · V` over positions `lo..hi` of an f32 or f16
/// view, for attention with a positional bias (ALiBi): the scores first (in `scores`), then
/// the weighted sum. With f16 rows the query is rounded to f16 as well, as ggml's flash
/// attention rounds it for the dot products.
#[allow(clippy::too_many_arguments)]
pub fn attend_biased(
    q_in: &[f32],
    kv: &KvView<'_>,
    lo: usize,
    hi: usize,
    scale: f32,
    bias: impl Fn(usize) -> f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let (dk, dv) = (kv.head_dim_k, kv.head_dim_v);
    let key = |p: usize, i: usize| -> f32 {
        let at = p * kv.key_width + kv.head * dk + i;
        match kv.keys {
            KvRows::F32(k) => k[at],
            KvRows::F16(k) => k[at].to_f32(),
            KvRows::Blocks(..) => unreachable!("biased attention reads f32 or f16 rows"),
        }
    };
    let value = |p: usize, i: usize| -> f32 {
        let at = p * kv.value_width + kv.head * dv + i;
        match kv.values {
            KvRows::F32(v) => v[at],
            KvRows::F16(v) => v[at].to_f32(),
            KvRows::Blocks(..) => unreachable!("biased attention reads f32 or f16 rows"),
        }
    };
    let half = matches!(kv.keys, KvRows::F16(_));
    let mut rounded = [0f32; MAX_HEAD_DIM];
    let q = &mut rounded[..dk];
    q.iter_mut().zip(&q_in[..dk]).for_each(|(r, &x)| {
        *r = if half {
            half::f16::from_f32(x).to_f32()
        } else {
            x
        };
    });
    scores.clear();
    scores.extend((lo..hi).map(|p| {
        let s: f32 = (0..dk).map(|i| key(p, i) * q[i]).sum();
        s * scale + bias(p)
    }));
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += f64::from(*s);
    }
    let inv = (1.0 / sum) as f32;
    let out = &mut out[..dv];
    out.fill(0.0);
    for (j, &w) in scores.iter().enumerate() {
        let w = w * inv;
        out.iter_mut()
            .enumerate()
            .for_each(|(i, o)| *o += w * value(lo + j, i));
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
    fn alibi_slopes_follow_ggml() {
        // 8 heads, max bias 8: 2^-1, 2^-2, ... 2^-8.
        for h in 0..8 {
            assert_eq!(alibi_slope(8.0, 8, h), 2f32.powi(-(h as i32) - 1));
        }
        // 12 heads: the 8 of the power of two, then odd powers of 2^-0.5.
        assert_eq!(alibi_slope(8.0, 12, 8), 2f32.powf(-0.5));
        assert_eq!(alibi_slope(8.0, 12, 9), 2f32.powf(-0.5).powi(3));
    }

    #[test]
    fn biased_attention_without_a_bias_is_attention() {
        let keys: Vec<Vec<f32>> = (0..5)
            .map(|p| vec![p as f32 * 0.3, 1.0 - p as f32 * 0.1])
            .collect();
        let values: Vec<Vec<f32>> = (0..5).map(|p| vec![p as f32, -(p as f32)]).collect();
        let (flat_k, flat_v) = (keys.concat(), values.concat());
        let kv = KvView {
            keys: KvRows::F32(&flat_k),
            values: KvRows::F32(&flat_v),
            key_width: 2,
            value_width: 2,
            head: 0,
            head_dim_k: 2,
            head_dim_v: 2,
        };
        let q = [0.7f32, -0.2];
        let mut out = [0.0f32; 2];
        attend_biased(&q, &kv, 0, 5, 0.5, |_| 0.0, &mut Vec::new(), &mut out);
        let want = reference(&q, &keys, &values, 0.5);
        assert!(
            out.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-6),
            "{out:?} {want:?}"
        );
        // A bias that all but removes every key but the last.
        attend_biased(
            &q,
            &kv,
            0,
            5,
            0.5,
            |p| if p == 4 { 0.0 } else { -100.0 },
            &mut Vec::new(),
            &mut out,
        );
        assert!(
            (out[0] - 4.0).abs() < 1e-4 && (out[1] + 4.0).abs() < 1e-4,
            "{out:?}"
        );
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
