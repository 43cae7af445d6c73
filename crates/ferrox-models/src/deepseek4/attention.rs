//! DeepSeek-V4 attention: multi-query attention of `H` heads over one shared key-value head
//! (each key row is also its value), per head a learned sink logit in the softmax
//! denominator.
//!
//! A token's keys are the raw rows of its sliding window (positions `pos − W + 1 ..= pos`,
//! kept in a ring in the sequence's state) and, in compressed layers, compressed rows ([`super::compressor`]): every visible one
//! (ratio 128), or the `top_k` of them the lightning indexer scores highest (ratio 4). The
//! rotated tail of the output is rotated back at the query's position, then heads are
//! projected in groups through a low rank (`attn_output_a`) and together to the model width
//! (`attn_output_b`).
//!
//! The indexer's queries and its compressed keys are rotated by an orthonormal Hadamard
//! matrix as llama.cpp rotates them (its fast transform, in blocks: [`Deepseek4Config`]'s
//! `indexer_rotation`) before the keys are stored: every `q · k` is unchanged up to
//! rounding, but an f16 cache then rounds the values llama.cpp's rounds, and the top-k
//! selection on these scores picks what it picks.

use std::cell::RefCell;

use ferrox_core::flash_attn::GroupShape;
use ferrox_core::hadamard;
use ferrox_core::kernels::quantize_activation;
use ferrox_core::online_softmax::MAX_GROUP;
use ferrox_core::relu_scores::{self, IndexQuery};
use ferrox_core::typed_attn::TypedRun;
use ferrox_core::{KvRows, KvType};
use ferrox_gguf::Gguf;
use ferrox_memory::StepMemory;
use rayon::prelude::*;

use super::compressor::{self, read_row, CompressorScratch, CompressorStore};
use super::config::{Compression, Deepseek4Config};
use super::weights::{IndexerWeights, LayerWeights};
use super::RING_SLACK;
use crate::engine::EngineError;
use crate::layers::attention::{with_typed_group, MAX_HEAD_DIM};
use crate::layers::linear::linear;
use crate::layers::mla::sparse::Selection;
use crate::layers::norm::{rms_norm_in_place, rms_normalize_in_place};
use crate::scaffold::{sized, Row};
use ferrox_core::select::top_k;

/// A layer's raw key-value rows in a sequence's state: a ring of the latest `len` positions
/// (the window and [`RING_SLACK`]), position `p` at slot `p % len`.
#[derive(Clone, Copy, Debug)]
pub struct RawRing {
    pub offset: usize,
    pub len: usize,
    pub width: usize,
    /// The type rows are kept in, the cache type asked for (llama.cpp's raw cache takes
    /// `-ctk`): f32, f16 values (as f32), or the blocks of bf16 and the quantized types.
    pub ty: KvType,
    /// The size of llama.cpp's rotation of queries and keys for a quantized cache (also
    /// applied to the compressed rows, which share the head size), if any.
    pub rotation: Option<usize>,
}

impl Default for RawRing {
    fn default() -> Self {
        RawRing {
            offset: 0,
            len: 0,
            width: 0,
            ty: KvType::F32,
            rotation: None,
        }
    }
}

impl RawRing {
    /// The f32 values a row's slot takes: its values, or its blocks' bytes rounded up to
    /// whole f32s.
    pub fn slot_values(&self) -> usize {
        match self.typed() {
            false => self.width,
            true => self.ty.bytes(self.width).div_ceil(4),
        }
    }

    /// Whether rows are blocks (read by the typed kernels) rather than f32 values.
    pub fn typed(&self) -> bool {
        !matches!(self.ty, KvType::F32 | KvType::F16)
    }

    fn slot(&self, pos: usize) -> usize {
        self.offset + (pos % self.len) * self.slot_values()
    }

    fn row<'s>(&self, state: &'s [f32], pos: usize) -> &'s [f32] {
        &state[self.slot(pos)..][..self.width]
    }

    /// The whole ring as bytes, a row's slot every `4 · slot_values()`.
    fn ring_bytes<'s>(&self, state: &'s [f32]) -> &'s [u8] {
        bytemuck::cast_slice(&state[self.offset..][..self.len * self.slot_values()])
    }

    fn write(&self, state: &mut [f32], pos: usize, row: &[f32]) {
        let slot = self.slot(pos);
        let dst = &mut state[slot..][..self.slot_values()];
        match self.ty {
            KvType::F32 => dst.copy_from_slice(row),
            KvType::F16 => dst
                .iter_mut()
                .zip(row)
                .for_each(|(d, &v)| *d = half::f16::from_f32(v).to_f32()),
            ty => {
                let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
                quantize_activation(ty.ggml(), row, &mut bytes[..ty.bytes(row.len())])
                    .expect("the engine checked the cache's type and head size at load");
            }
        }
    }
}

/// Where one layer keeps its rows: the raw ring, and its compressors' rings and stores.
#[derive(Clone, Copy, Debug, Default)]
pub struct LayerStores {
    pub raw: RawRing,
    pub compressor: Option<CompressorStore>,
    pub indexer: Option<CompressorStore>,
}

/// Buffers of attention, reused across layers and steps.
#[derive(Default)]
pub struct AttnScratch {
    qr: Vec<f32>,
    q: Vec<f32>,
    kv: Vec<f32>,
    iq: Vec<f32>,
    iw: Vec<f32>,
    o: Vec<f32>,
    group_in: Vec<f32>,
    group_out: Vec<f32>,
    oa: Vec<f32>,
    angles: Vec<(f32, f32)>,
    index_scores: Vec<f32>,
    chosen: Vec<u32>,
    selection: Selection,
    compressor: CompressorScratch,
    xq: Vec<u8>,
}

/// Compressed rows the indexer scores per parallel task.
const SCORE_CHUNK: usize = 64;
/// Compressed rows gathered for one call of the scoring kernel.
const KEYS_GATHERED: usize = 16;

thread_local! {
    /// One head's scores over a token's keys.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Bounds on what one token reads, for sizing buffers once rather than as a sequence grows.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Keys one token attends to in any layer.
    pub keys: usize,
    /// Positions a sequence can hold.
    pub positions: usize,
}

/// One layer's attention of the micro-batch's normed inputs `xn` into `out` (`n × n_embd`):
/// its compressors' rows written to the memory first, then the raw rows and the attention
/// of at most [`RING_SLACK`] rows at a time, so the raw ring keeps every row a chunk reads.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    c: &Deepseek4Config,
    lw: &LayerWeights,
    stores: LayerStores,
    gguf: &Gguf,
    il: usize,
    rows: &[Row],
    xn: &[f32],
    memory: &mut StepMemory<'_>,
    bounds: Bounds,
    s: &mut AttnScratch,
    out: &mut [f32],
) -> Result<(), EngineError> {
    let (n, h, d) = (rows.len(), c.n_head, c.head_dim);
    let max_keys = bounds.keys;
    let (eps, rope) = (c.norm_eps, c.rope(il));
    let qr = sized(&mut s.qr, n * c.q_lora_rank);
    linear(&lw.q_a.view(gguf)?, xn, n, qr, &mut s.xq)?;
    qr.par_chunks_mut(c.q_lora_rank)
        .for_each(|r| rms_norm_in_place(r, &lw.q_a_norm, eps));
    let q = sized(&mut s.q, n * h * d);
    linear(&lw.q_b.view(gguf)?, qr, n, q, &mut s.xq)?;
    q.par_chunks_mut(d)
        .for_each(|head| rms_normalize_in_place(head, eps));
    let kv = sized(&mut s.kv, n * d);
    linear(&lw.kv.view(gguf)?, xn, n, kv, &mut s.xq)?;
    for (t, r) in rows.iter().enumerate() {
        let row = &mut kv[t * d..(t + 1) * d];
        rms_norm_in_place(row, &lw.kv_norm, eps);
        rope.angles(r.pos, &mut s.angles);
        rope.apply_tail(row, d, &s.angles);
        rope.apply_tail(&mut q[t * h * d..(t + 1) * h * d], d, &s.angles);
    }
    // A quantized cache's rotation, as llama.cpp's: `q · k` is unchanged, and the rounded
    // keys lose less.
    let rotation = stores.raw.rotation;
    if let Some(block) = rotation {
        hadamard::rotate_fast(q, block);
        hadamard::rotate_fast(kv, block);
    }
    let compressed = (&c.rope_compressed, eps);
    if let (Some(at), Some(w)) = (stores.compressor, &lw.compressor) {
        let s = &mut s.compressor;
        compressor::record(at, w, gguf, rows, xn, memory, compressed, rotation, s)?;
    }
    if let (Some(at), Some(ix)) = (stores.indexer, &lw.indexer) {
        compressor::record(
            at,
            &ix.compressor,
            gguf,
            rows,
            xn,
            memory,
            compressed,
            c.indexer_rotation,
            &mut s.compressor,
        )?;
        select(c, ix, at, gguf, rows, xn, memory, bounds, s)?;
    }

    // Every (token, head) on its own: scores over the token's keys, then their weighted sum.
    let scale = 1.0 / (d as f32).sqrt();
    let o = sized(&mut s.o, n * h * d);
    for first in (0..n).step_by(RING_SLACK) {
        let chunk = first..n.min(first + RING_SLACK);
        for t in chunk.clone() {
            let r = &rows[t];
            stores
                .raw
                .write(memory.state(r.seq), r.pos, &s.kv[t * d..(t + 1) * d]);
        }
        let memory = &*memory;
        let (q, selection) = (&s.q, &s.selection);
        let o = &mut o[first * h * d..chunk.end * h * d];
        if stores.raw.typed() {
            let group = head_group(h);
            o.par_chunks_mut(group * d).enumerate().for_each(|(i, o)| {
                let (t, head) = (first + i * group / h, i * group % h);
                attend_typed_heads(
                    c,
                    il,
                    stores,
                    &rows[t],
                    (t, head..head + group),
                    (q, selection),
                    memory,
                    o,
                    (&lw.sinks, scale),
                );
            });
            continue;
        }
        o.par_chunks_mut(d).enumerate().for_each(|(i, o)| {
            let (t, head) = (first + i / h, i % h);
            attend_token_head(
                c,
                il,
                stores,
                rows,
                t,
                head,
                (q, selection),
                memory,
                o,
                (lw.sinks[head], scale, max_keys),
            );
        });
    }
    if let Some(block) = rotation {
        // Back to the keys' own basis (the rotation is its own inverse).
        hadamard::rotate_fast(o, block);
    }
    for (t, r) in rows.iter().enumerate() {
        rope.angles(r.pos, &mut s.angles);
        rope.unapply_tail(&mut o[t * h * d..(t + 1) * h * d], d, &mut s.angles);
    }
    grouped_output(c, lw, gguf, n, s, out)
}

/// Head `head` of row `t`'s attention into `o`.
#[allow(clippy::too_many_arguments)]
fn attend_token_head(
    c: &Deepseek4Config,
    il: usize,
    stores: LayerStores,
    rows: &[Row],
    t: usize,
    head: usize,
    (q, selection): (&[f32], &Selection),
    memory: &StepMemory<'_>,
    o: &mut [f32],
    (sink, scale, max_keys): (f32, f32, usize),
) {
    let (h, d) = (c.n_head, c.head_dim);
    let i = t * h + head;
    let keys = key_set(c, il, stores, &rows[t], t, selection);
    let query = &q[i * d..(i + 1) * d];
    attend_head(memory, &keys, query, sink, scale, max_keys, o);
}

/// The keys of row `r` (row `t` of the micro-batch) in layer `il`.
fn key_set<'a>(
    c: &Deepseek4Config,
    il: usize,
    stores: LayerStores,
    r: &Row,
    t: usize,
    selection: &'a Selection,
) -> KeySet<'a> {
    KeySet {
        seq: r.seq,
        raw_ring: stores.raw,
        raw: r.pos.saturating_sub(c.window - 1)..r.pos + 1,
        compressed: match (stores.compressor, c.compression[il]) {
            (Some(at), Compression::Heavy) => Compressed::All(at, at.visible(r.pos)),
            (Some(at), Compression::Sparse) => match selection.of(t) {
                None => Compressed::All(at, at.visible(r.pos)),
                Some(list) => Compressed::Listed(at, list),
            },
            _ => Compressed::None,
        },
    }
}

/// Query heads that attend together over a typed cache: the largest divisor of the head
/// count the typed kernels take at once.
fn head_group(n_head: usize) -> usize {
    (1..=n_head.min(MAX_GROUP))
        .rev()
        .find(|g| n_head.is_multiple_of(*g))
        .unwrap_or(1)
}

/// Heads `heads` of row `t` (`r`) over a typed cache into `o` (`heads.len() · D`), with
/// ggml's arithmetic for it (the query rounded to the keys' dot type, the online softmax,
/// each row decoded as a value; the sinks after the last key), every key read once for the
/// group.
#[allow(clippy::too_many_arguments)]
fn attend_typed_heads(
    c: &Deepseek4Config,
    il: usize,
    stores: LayerStores,
    r: &Row,
    (t, heads): (usize, std::ops::Range<usize>),
    (q, selection): (&[f32], &Selection),
    memory: &StepMemory<'_>,
    o: &mut [f32],
    (sinks, scale): (&[f32], f32),
) {
    let (h, d, ty) = (c.n_head, c.head_dim, stores.raw.ty);
    let keys = key_set(c, il, stores, r, t, selection);
    let shape = GroupShape {
        n_queries: heads.len(),
        head_dim_k: d,
        head_dim_v: d,
        scale,
        softcap: None,
    };
    let queries = &q[(t * h + heads.start) * d..(t * h + heads.end) * d];
    with_typed_group(|group| {
        group
            .start((ty, ty), shape, queries)
            .expect("the engine checked the cache's type and head size at load");
        keys.for_each_run(memory, &mut |run| group.attend_run(run));
        group.finish_with_sinks(&sinks[heads], o);
    });
}

/// The compressed rows a token attends to.
enum Compressed<'a> {
    None,
    /// Rows `0..n`.
    All(CompressorStore, usize),
    /// The listed rows.
    Listed(CompressorStore, &'a [usize]),
}

/// A token's keys: its window of raw rows, then compressed rows.
struct KeySet<'a> {
    seq: usize,
    raw_ring: RawRing,
    raw: std::ops::Range<usize>,
    compressed: Compressed<'a>,
}

impl KeySet<'_> {
    fn len(&self) -> usize {
        self.raw.len()
            + match &self.compressed {
                Compressed::None => 0,
                Compressed::All(_, n) => *n,
                Compressed::Listed(_, list) => list.len(),
            }
    }

    /// Calls `f` with the keys of a typed cache in order, as runs of consecutive rows: the
    /// window's (one or two stretches of the ring), then each compressed row.
    fn for_each_run(&self, memory: &StepMemory<'_>, f: &mut dyn FnMut(&TypedRun<'_>)) {
        let ring = self.raw_ring;
        let bytes = ring.ring_bytes(memory.state_ref(self.seq));
        let stride = 4 * ring.slot_values();
        let mut pos = self.raw.start;
        while pos < self.raw.end {
            let slot = pos % ring.len;
            let len = (self.raw.end - pos).min(ring.len - slot);
            let rows = &bytes[slot * stride..];
            f(&TypedRun {
                keys: rows,
                key_stride: stride,
                values: rows,
                value_stride: stride,
                len,
            });
            pos += len;
        }
        let mut compressed = |at: CompressorStore, b: usize| {
            let (_, row) = memory
                .key_row(at.store, self.seq, at.layer, at.position_of(b))
                .as_bytes();
            f(&TypedRun {
                keys: row,
                key_stride: row.len(),
                values: row,
                value_stride: row.len(),
                len: 1,
            });
        };
        match &self.compressed {
            Compressed::None => {}
            Compressed::All(at, n) => (0..*n).for_each(|b| compressed(*at, b)),
            Compressed::Listed(at, list) => list.iter().for_each(|&b| compressed(*at, b)),
        }
    }

    /// Calls `f` with each key (`width` values) in order.
    fn for_each(&self, memory: &StepMemory<'_>, width: usize, mut f: impl FnMut(&[f32])) {
        let state = memory.state_ref(self.seq);
        for pos in self.raw.clone() {
            f(self.raw_ring.row(state, pos));
        }
        let mut row = [0f32; MAX_HEAD_DIM];
        let row = &mut row[..width];
        let mut compressed = |at: CompressorStore, b: usize| {
            read_row(memory, at, self.seq, b, row);
            f(row);
        };
        match &self.compressed {
            Compressed::None => {}
            Compressed::All(at, n) => (0..*n).for_each(|b| compressed(*at, b)),
            Compressed::Listed(at, list) => list.iter().for_each(|&b| compressed(*at, b)),
        }
    }
}

/// One head's attention over `keys` (each also its value), with a sink logit in the
/// softmax denominator, into `out`.
fn attend_head(
    memory: &StepMemory<'_>,
    keys: &KeySet<'_>,
    q: &[f32],
    sink: f32,
    scale: f32,
    max_keys: usize,
    out: &mut [f32],
) {
    SCORES.with_borrow_mut(|scores| {
        if scores.capacity() < max_keys {
            scores.reserve_exact(max_keys - scores.len());
        }
        scores.clear();
        let width = q.len();
        keys.for_each(memory, width, |k| {
            let dot: f32 = q.iter().zip(k).map(|(a, b)| a * b).sum();
            scores.push(dot * scale);
        });
        debug_assert_eq!(scores.len(), keys.len());
        let max = scores.iter().fold(sink, |m, &v| m.max(v));
        let mut sum = 0f64;
        for v in scores.iter_mut() {
            *v = (*v - max).exp();
            sum += *v as f64;
        }
        sum += (sink - max).exp() as f64;
        let inv = (1.0 / sum) as f32;
        out.fill(0.0);
        let mut j = 0;
        keys.for_each(memory, width, |k| {
            let p = scores[j] * inv;
            out.iter_mut().zip(k).for_each(|(o, &v)| *o += p * v);
            j += 1;
        });
    });
}

/// The lightning indexer of a sparse layer: each token's selection of compressed rows into
/// `s.selection` (every visible row while there are no more than `top_k`).
#[allow(clippy::too_many_arguments)]
fn select(
    c: &Deepseek4Config,
    ix: &IndexerWeights,
    at: CompressorStore,
    gguf: &Gguf,
    rows: &[Row],
    xn: &[f32],
    memory: &StepMemory<'_>,
    bounds: Bounds,
    s: &mut AttnScratch,
) -> Result<(), EngineError> {
    let (n, hi, di) = (rows.len(), c.indexer_heads, c.indexer_dim);
    // Selecting grows nothing once these hold every row a sequence can have.
    let most_rows = at.visible(bounds.positions);
    let index_scores = &mut s.index_scores;
    index_scores.reserve(most_rows.saturating_sub(index_scores.len()));
    let most_chosen = c.indexer_top_k.min(most_rows);
    s.chosen.reserve(most_chosen.saturating_sub(s.chosen.len()));
    s.selection.clear();
    s.selection.reserve(n, most_chosen);
    let iq = sized(&mut s.iq, n * hi * di);
    linear(
        &ix.q_b.view(gguf)?,
        &s.qr[..n * c.q_lora_rank],
        n,
        iq,
        &mut s.xq,
    )?;
    let iw = sized(&mut s.iw, n * hi);
    linear(&ix.proj.view(gguf)?, xn, n, iw, &mut s.xq)?;
    // llama.cpp scales the weights rather than every score.
    let scale = 1.0 / ((di * hi) as f32).sqrt();
    iw.iter_mut().for_each(|v| *v *= scale);
    for (t, r) in rows.iter().enumerate() {
        let heads = &mut iq[t * hi * di..(t + 1) * hi * di];
        c.rope_compressed.angles(r.pos, &mut s.angles);
        c.rope_compressed.apply_tail(heads, di, &s.angles);
        if let Some(block) = c.indexer_rotation {
            hadamard::rotate_fast(heads, block);
        }
        let visible = at.visible(r.pos);
        if visible <= c.indexer_top_k {
            s.selection.push_all();
            continue;
        }
        let query = IndexQuery {
            heads,
            weights: &iw[t * hi..(t + 1) * hi],
            head_dim: di,
        };
        let scores = sized(&mut s.index_scores, visible);
        scores
            .par_chunks_mut(SCORE_CHUNK)
            .enumerate()
            .for_each(|(chunk, scores)| {
                // The compressed rows are not contiguous in the store: gather a few at a
                // time, then score them together.
                let mut keys = [0f32; KEYS_GATHERED * MAX_HEAD_DIM];
                for (part, scores) in scores.chunks_mut(KEYS_GATHERED).enumerate() {
                    let first = chunk * SCORE_CHUNK + part * KEYS_GATHERED;
                    let keys = &mut keys[..scores.len() * di];
                    for (i, key) in keys.chunks_exact_mut(di).enumerate() {
                        read_row(memory, at, r.seq, first + i, key);
                    }
                    relu_scores::scores(&query, KvRows::F32(keys), scores);
                }
            });
        top_k(scores, c.indexer_top_k, &mut s.chosen);
        s.chosen.sort_unstable();
        s.selection.push(s.chosen.iter().map(|&b| b as usize));
    }
    Ok(())
}

/// `out = attn_output_b · [attn_output_a[g] · o_g for each group g]`, `o_g` the heads of
/// group `g` (the micro-batch's rows of `s.o`).
fn grouped_output(
    c: &Deepseek4Config,
    lw: &LayerWeights,
    gguf: &Gguf,
    n: usize,
    s: &mut AttnScratch,
    out: &mut [f32],
) -> Result<(), EngineError> {
    let (g_count, rank) = (c.o_groups, c.o_lora_rank);
    let width = c.n_head * c.head_dim;
    let group_width = width / g_count;
    let out_a = lw.out_a.view(gguf)?;
    let oa = sized(&mut s.oa, n * g_count * rank);
    for g in 0..g_count {
        let group_in = sized(&mut s.group_in, n * group_width);
        for (t, dst) in group_in.chunks_exact_mut(group_width).enumerate() {
            dst.copy_from_slice(&s.o[t * width + g * group_width..][..group_width]);
        }
        let group_out = sized(&mut s.group_out, n * rank);
        linear(&out_a.expert(g), group_in, n, group_out, &mut s.xq)?;
        for (t, src) in group_out.chunks_exact(rank).enumerate() {
            oa[(t * g_count + g) * rank..][..rank].copy_from_slice(src);
        }
    }
    linear(&lw.out_b.view(gguf)?, oa, n, out, &mut s.xq)?;
    Ok(())
}
