//! Multi-head latent attention for one layer and a micro-batch of rows (one or more
//! sequences, each sequence's rows contiguous and in position order).
//!
//! Every token is reduced to one cache row, `[c | k_pe]`: the normalized latent (Lkv) and
//! the rotated key part (R) all heads share. Two ways to attend over those rows give the
//! same result up to rounding:
//!
//! * **absorbed** (decode): each head's unrotated query is projected into the latent space
//!   (`q_abs = K_b[h] · q_nope`), so `[q_abs | q_pe] · [c | k_pe]` is the head's score and the
//!   attention-weighted sum of latents, projected by `V_b[h]`, its output. The cache is read
//!   as it is; nothing is decompressed. This is llama.cpp's graph for files with
//!   `attn_k_b` / `attn_v_b`.
//! * **decompressed** (prefill): every cached latent is expanded into per-head keys
//!   `[K_b[h]ᵀ-side · c | k_pe]` and values `V_b[h] · c`, then attention is ordinary
//!   multi-head attention. Cheaper when a batch has about as many queries as keys, since the
//!   scores are then Dk wide instead of Lkv + R. This is llama.cpp's graph for files with
//!   one `attn_kv_b`.
//!
//! A layer can also attend sparsely ([`KeySet::Selected`]: DeepSeek Sparse Attention), each
//! row over the positions a selection lists for it, always in the absorbed form. The layer
//! then runs in two halves, [`project`] and [`attend_and_output`], so the selection can be
//! computed in between from the query latent.
//!
//! Both run the shared per-query attention kernel with an f16 cache following ggml's CPU
//! flash-attention arithmetic, as the dense decoder does. Each sequence's rows take the form
//! its own row count and length call for, never its neighbours' in the step, so a sequence
//! gets the same bits alone or batched.

use ferrox_core::flash_attn::MAX_GROUP;
use ferrox_core::packed::MAX_PRODUCTS;
use ferrox_core::{KvRows, KvStorage, MatrixProduct, WeightMatrix};
use ferrox_gguf::Gguf;
use ferrox_memory::StepMemory;
use half::f16;
use rayon::prelude::*;
use smallvec::SmallVec;

use super::config::MlaConfig;
use super::sparse::{self, Selection};
use super::weights::{Heads, MlaLayer, QueryWeights};
use super::{Path, LATENT_STORE};
use crate::engine::EngineError;
use crate::layers::attention::{attend, AttentionParams, KvView};
use crate::layers::linear::linear;
use crate::layers::norm::rms_norm_in_place;
use crate::layers::paged_attention::{self, HeadGroup};
use crate::scaffold::{sized as grown, Row};

/// Buffers of one layer's attention, reused across layers and steps.
#[derive(Default)]
pub struct AttnScratch {
    q_a: Vec<f32>,
    q: Vec<f32>,
    kv: Vec<f32>,
    /// Query heads in the form the chosen path attends with.
    q_att: Vec<f32>,
    /// Per-head gathers and results of the head matrices.
    gather: Vec<f32>,
    head_out: Vec<f32>,
    /// Attention outputs (latent per head, absorbed path).
    latent_out: Vec<f32>,
    /// Per-head values, concatenated (the output projection's input).
    heads: Vec<f32>,
    /// Decompressed keys and values (decompressed path).
    keys: Vec<f32>,
    values: Vec<f32>,
    keys16: Vec<f16>,
    values16: Vec<f16>,
    latents: Vec<f32>,
    gather_latents: Vec<f32>,
    angles: Vec<(f32, f32)>,
    xq: Vec<u8>,
    /// Rows (of the micro-batch) that attend in the absorbed form.
    absorbed_rows: Vec<usize>,
}

/// The layer's attention over `xn` (`rows.len()` normalized rows), their cache rows
/// written; leaves the output projection in `out` (`n × n_embd`). `path_of(n, end)` picks
/// the form for a sequence's `n` rows ending at `end` positions.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    c: &MlaConfig,
    lw: &MlaLayer,
    gguf: &Gguf,
    il: usize,
    rows: &[Row],
    xn: &[f32],
    memory: &mut StepMemory<'_>,
    path_of: impl Fn(usize, usize) -> Path,
    s: &mut AttnScratch,
    out: &mut [f32],
) -> Result<(), EngineError> {
    project(c, lw, gguf, il, rows, xn, memory, s)?;
    attend_and_output(
        c,
        lw,
        gguf,
        il,
        rows,
        memory,
        path_of,
        KeySet::Causal,
        s,
        out,
    )
}

/// The cached positions each row of a micro-batch attends to.
#[derive(Clone, Copy)]
pub(crate) enum KeySet<'a> {
    /// Every position of the row's sequence up to its own.
    Causal,
    /// The positions a selection lists for the row, or all of them up to its own where it
    /// lists none. Sparse rows attend in the absorbed form (the latent rows are read as
    /// they are, nothing is decompressed for positions that are not attended).
    Selected(&'a Selection),
}

impl<'a> KeySet<'a> {
    fn of(self, t: usize) -> Option<&'a [usize]> {
        match self {
            KeySet::Causal => None,
            KeySet::Selected(selection) => selection.of(t),
        }
    }
}

/// The first half of the layer's attention: every row's query heads (in `s`, rotated) and
/// cache row (written to `memory`). With a query LoRA, the normalized query latent stays in
/// `s` too ([`AttnScratch::query_latent`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn project(
    c: &MlaConfig,
    lw: &MlaLayer,
    gguf: &Gguf,
    il: usize,
    rows: &[Row],
    xn: &[f32],
    memory: &mut StepMemory<'_>,
    s: &mut AttnScratch,
) -> Result<(), EngineError> {
    let n = rows.len();
    let (h, dk, dn) = (c.n_head, c.head_dim_k, c.head_dim_nope());
    let (lkv, width) = (c.kv_lora_rank, c.cache_width());
    let q = grown(&mut s.q, n * h * dk);
    match &lw.q {
        QueryWeights::LoRa { a, norm, b } => {
            let a = a.view(gguf)?;
            let q_a = grown(&mut s.q_a, n * a.rows());
            linear(&a, xn, n, q_a, &mut s.xq)?;
            q_a.chunks_exact_mut(a.rows())
                .for_each(|r| rms_norm_in_place(r, norm, c.norm_eps));
            linear(&b.view(gguf)?, q_a, n, q, &mut s.xq)?;
        }
        QueryWeights::Plain(w) => linear(&w.view(gguf)?, xn, n, q, &mut s.xq)?,
    }
    let kv = grown(&mut s.kv, n * width);
    linear(&lw.kv_a.view(gguf)?, xn, n, kv, &mut s.xq)?;
    for (t, r) in rows.iter().enumerate() {
        let row = &mut kv[t * width..(t + 1) * width];
        let (latent, k_pe) = row.split_at_mut(lkv);
        rms_norm_in_place(latent, &lw.kv_a_norm, c.norm_eps);
        c.rope.angles(r.pos, &mut s.angles);
        c.rope.apply(k_pe, c.n_rot, &s.angles);
        for head in q[t * h * dk..(t + 1) * h * dk].chunks_exact_mut(dk) {
            c.rope.apply(&mut head[dn..], c.n_rot, &s.angles);
        }
        memory.write(LATENT_STORE, r.seq, il, r.pos, row, &[]);
    }
    Ok(())
}

/// The second half of the layer's attention, once [`project`] has run for `rows`: the heads
/// attend over the positions `keys` gives each row, and the output projection of their
/// values lands in `out` (`n × n_embd`). `path_of(n, end)` picks the form for a causal
/// sequence's `n` rows ending at `end` positions.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_and_output(
    c: &MlaConfig,
    lw: &MlaLayer,
    gguf: &Gguf,
    il: usize,
    rows: &[Row],
    memory: &StepMemory<'_>,
    path_of: impl Fn(usize, usize) -> Path,
    keys: KeySet<'_>,
    s: &mut AttnScratch,
    out: &mut [f32],
) -> Result<(), EngineError> {
    attend_heads(c, lw, gguf, il, rows, memory, path_of, keys, s)?;
    let heads = &s.heads[..rows.len() * c.n_head * c.head_dim_v];
    linear(&lw.wo.view(gguf)?, heads, rows.len(), out, &mut s.xq)?;
    Ok(())
}

/// [`attend_and_output`] without the output projection: the heads' values, concatenated
/// per row, are left in `s` ([`AttnScratch::heads_mut`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_heads(
    c: &MlaConfig,
    lw: &MlaLayer,
    gguf: &Gguf,
    il: usize,
    rows: &[Row],
    memory: &StepMemory<'_>,
    path_of: impl Fn(usize, usize) -> Path,
    keys: KeySet<'_>,
    s: &mut AttnScratch,
) -> Result<(), EngineError> {
    let n = rows.len();
    let h = c.n_head;
    let step = Step {
        c,
        lw,
        gguf,
        il,
        rows,
        memory,
    };
    grown(&mut s.heads, n * h * c.head_dim_v);
    // Each sequence's rows (a contiguous segment) take their own form.
    let mut absorbed_rows = std::mem::take(&mut s.absorbed_rows);
    absorbed_rows.clear();
    let mut start = 0;
    while start < n {
        let seq = rows[start].seq;
        let end = start + rows[start..].iter().take_while(|r| r.seq == seq).count();
        let path = match keys {
            KeySet::Selected(_) => Path::Absorbed,
            KeySet::Causal => path_of(end - start, rows[end - 1].pos + 1),
        };
        match path {
            Path::Absorbed => absorbed_rows.extend(start..end),
            Path::Decompressed => decompressed(&step, start..end, s)?,
        }
        start = end;
    }
    let result = if absorbed_rows.is_empty() {
        Ok(())
    } else {
        absorbed(&step, &absorbed_rows, keys, s)
    };
    s.absorbed_rows = absorbed_rows;
    result
}

impl AttnScratch {
    /// The first `len` values of the heads' outputs the last [`attend_heads`] left.
    pub(crate) fn heads_mut(&mut self, len: usize) -> &mut [f32] {
        &mut self.heads[..len]
    }

    /// The `n` rows of the normalized query latent (`q_lora_rank` wide) the last
    /// [`project`] computed; empty for a model without a query LoRA.
    pub(crate) fn query_latent(&self, n: usize, rank: usize) -> &[f32] {
        self.q_a.get(..n * rank).unwrap_or(&[])
    }
}

/// Which rows a per-head product reads or writes: every row in order, or the listed ones.
#[derive(Clone, Copy)]
enum RowSet<'a> {
    All,
    Listed(&'a [usize]),
}

impl RowSet<'_> {
    fn at(self, j: usize) -> usize {
        match self {
            RowSet::All => j,
            RowSet::Listed(rows) => rows[j],
        }
    }
}

/// Where each head's input rows come from.
#[derive(Clone, Copy)]
enum HeadInput<'a> {
    /// Input row `j` of head `h` at `(t · n_head + h) · stride`, `t` the set's `j`-th row
    /// (each head its own input).
    PerHead(&'a [f32], usize, RowSet<'a>),
    /// Row `j` at `j · cols` for every head (cached latents).
    Shared(&'a [f32]),
}

/// `out[t][h] = M[h] · x[j][h]` for `n` input rows and every head; head `h` of input row
/// `j` lands at `(t · n_head + h) · out_stride` (its first `rows` values), `t` the output
/// set's `j`-th row.
#[allow(clippy::too_many_arguments)]
fn per_head(
    heads: &Heads,
    gguf: &Gguf,
    input: HeadInput<'_>,
    n: usize,
    out: &mut [f32],
    out_rows: RowSet<'_>,
    out_stride: usize,
    gather: &mut Vec<f32>,
    result: &mut Vec<f32>,
    xq: &mut Vec<u8>,
) -> Result<(), EngineError> {
    let m = heads.view(gguf)?;
    let (rows, cols, n_head) = (m.rows(), m.cols(), m.n_expert());
    if n <= FEW_ROWS {
        return per_head_few(&m, input, n, out, out_rows, out_stride, gather, result, xq);
    }
    let result = grown(result, n * rows);
    for hd in 0..n_head {
        let x: &[f32] = match input {
            HeadInput::Shared(x) => x,
            HeadInput::PerHead(x, stride, set) => {
                let g = grown(gather, n * cols);
                for (j, row) in g.chunks_exact_mut(cols).enumerate() {
                    let at = (set.at(j) * n_head + hd) * stride;
                    row.copy_from_slice(&x[at..at + cols]);
                }
                g
            }
        };
        linear(&m.expert(hd), x, n, result, xq)?;
        scatter_head(result, rows, hd, n_head, out, out_rows, out_stride);
    }
    Ok(())
}

/// Head `hd`'s results (`rows` values per input row) to their places in `out`.
fn scatter_head(
    result: &[f32],
    rows: usize,
    hd: usize,
    n_head: usize,
    out: &mut [f32],
    out_rows: RowSet<'_>,
    out_stride: usize,
) {
    for (j, r) in result.chunks_exact(rows).enumerate() {
        let at = (out_rows.at(j) * n_head + hd) * out_stride;
        out[at..at + rows].copy_from_slice(r);
    }
}

/// Rows up to which [`per_head`] runs every head's product in one pass over the pool: a
/// decode step's heads are many small products, each worth less than a pass of its own.
const FEW_ROWS: usize = 8;

/// [`per_head`] for a few rows: every head's input gathered and quantized at once, the
/// heads' products in passes of up to [`MAX_PRODUCTS`] (each result the one the head's
/// product alone gives), then scattered.
#[allow(clippy::too_many_arguments)]
fn per_head_few(
    m: &ferrox_moe::ExpertTensor<'_>,
    input: HeadInput<'_>,
    n: usize,
    out: &mut [f32],
    out_rows: RowSet<'_>,
    out_stride: usize,
    gather: &mut Vec<f32>,
    result: &mut Vec<f32>,
    xq: &mut Vec<u8>,
) -> Result<(), EngineError> {
    let (rows, cols, n_head) = (m.rows(), m.cols(), m.n_expert());
    let first = m.expert(0);
    // Quantization is row by row: one call quantizes every head's rows.
    let per_head_input = match input {
        HeadInput::Shared(x) => {
            first
                .quantize_activation(&x[..n * cols], xq)
                .map_err(crate::ModelError::from)?;
            false
        }
        HeadInput::PerHead(x, stride, set) => {
            let g = grown(gather, n_head * n * cols);
            for (i, row) in g.chunks_exact_mut(cols).enumerate() {
                let (hd, j) = (i / n, i % n);
                let at = (set.at(j) * n_head + hd) * stride;
                row.copy_from_slice(&x[at..at + cols]);
            }
            first
                .quantize_activation(g, xq)
                .map_err(crate::ModelError::from)?;
            true
        }
    };
    let act = first.activation_row_bytes();
    let result = grown(result, n_head * n * rows);
    for (pass, results) in result.chunks_mut(MAX_PRODUCTS * n * rows).enumerate() {
        let matrices: SmallVec<[WeightMatrix<'_>; MAX_PRODUCTS]> = (0..results.len() / (n * rows))
            .map(|i| m.expert(pass * MAX_PRODUCTS + i))
            .collect();
        let mut products: SmallVec<[MatrixProduct<'_, '_>; MAX_PRODUCTS]> = matrices
            .iter()
            .zip(results.chunks_mut(n * rows))
            .enumerate()
            .map(|(i, (matrix, out))| {
                let hd = pass * MAX_PRODUCTS + i;
                let at = if per_head_input { hd * n * act } else { 0 };
                MatrixProduct {
                    matrix,
                    xq: &xq[at..at + n * act],
                    n_tokens: n,
                    out,
                }
            })
            .collect();
        WeightMatrix::matmul_products(&mut products).map_err(crate::ModelError::from)?;
    }
    for (hd, head) in result.chunks_exact(n * rows).enumerate() {
        scatter_head(head, rows, hd, n_head, out, out_rows, out_stride);
    }
    Ok(())
}

/// One layer's attention step once the batch's cache rows are written.
struct Step<'a, 'm> {
    c: &'a MlaConfig,
    lw: &'a MlaLayer,
    gguf: &'a Gguf,
    il: usize,
    rows: &'a [Row],
    memory: &'a StepMemory<'m>,
}

/// The heads' outputs of rows `which` (of the micro-batch) into `s.heads`.
fn absorbed(
    step: &Step<'_, '_>,
    which: &[usize],
    keys: KeySet<'_>,
    s: &mut AttnScratch,
) -> Result<(), EngineError> {
    let (c, lw, gguf) = (step.c, step.lw, step.gguf);
    let (il, rows, memory) = (step.il, step.rows, step.memory);
    let m = which.len();
    let (h, dk, dn) = (c.n_head, c.head_dim_k, c.head_dim_nope());
    let (lkv, width) = (c.kv_lora_rank, c.cache_width());
    let q_att = grown(&mut s.q_att, m * h * width);
    per_head(
        &lw.k_absorb,
        gguf,
        HeadInput::PerHead(&s.q, dk, RowSet::Listed(which)),
        m,
        q_att,
        RowSet::All,
        width,
        &mut s.gather,
        &mut s.head_out,
        &mut s.xq,
    )?;
    for (j, &t) in which.iter().enumerate() {
        let temp = c.temperature_at(rows[t].pos);
        for hd in 0..h {
            let dst = &mut q_att[(j * h + hd) * width..(j * h + hd + 1) * width];
            dst[lkv..].copy_from_slice(&s.q[(t * h + hd) * dk + dn..(t * h + hd + 1) * dk]);
            if temp != 1.0 {
                dst.iter_mut().for_each(|v| *v *= temp);
            }
        }
    }
    let params = AttentionParams {
        scale: c.kq_scale,
        softcap: None,
    };
    let latent_out = grown(&mut s.latent_out, m * h * lkv);
    let q_att = &*q_att;
    // Every head reads the same cache rows: heads go through them in groups, each key and
    // value row read once per group. The values are each row's first Lkv entries.
    let group = (1..=MAX_GROUP.min(h))
        .rev()
        .find(|g| h % g == 0)
        .unwrap_or(1);
    latent_out
        .par_chunks_mut(group * lkv)
        .enumerate()
        .for_each(|(i, o)| {
            let t = which[i * group / h];
            let row = rows[t];
            let at = HeadGroup {
                seq: row.seq,
                layer: il,
                kv_head: 0,
                n_queries: group,
                head_dim_k: width,
                head_dim_v: lkv,
            };
            let q = &q_att[i * group * width..(i + 1) * group * width];
            match keys.of(t) {
                Some(positions) => {
                    sparse::attend(memory, LATENT_STORE, at, q, positions, &params, o)
                }
                None => {
                    paged_attention::attend(memory, LATENT_STORE, at, q, 0, row.pos + 1, &params, o)
                }
            }
        });
    let heads = &mut s.heads[..rows.len() * h * c.head_dim_v];
    per_head(
        &lw.v,
        gguf,
        HeadInput::PerHead(latent_out, lkv, RowSet::All),
        m,
        heads,
        RowSet::Listed(which),
        c.head_dim_v,
        &mut s.gather,
        &mut s.head_out,
        &mut s.xq,
    )?;
    Ok(())
}

/// The heads' outputs of one sequence's rows `seg` (of the micro-batch) into `s.heads`.
fn decompressed(
    step: &Step<'_, '_>,
    seg: std::ops::Range<usize>,
    s: &mut AttnScratch,
) -> Result<(), EngineError> {
    let (c, lw, gguf) = (step.c, step.lw, step.gguf);
    let (il, rows, memory) = (step.il, &step.rows[seg.clone()], step.memory);
    let (h, dk, dn, dv) = (c.n_head, c.head_dim_k, c.head_dim_nope(), c.head_dim_v);
    let (lkv, width) = (c.kv_lora_rank, c.cache_width());
    let seq = rows[0].seq;
    let n_keys = rows.last().map_or(0, |r| r.pos + 1);

    // Every cached latent row of the sequence (this batch's included), as f32.
    let cached = grown(&mut s.latents, n_keys * width);
    let mut at = 0;
    memory.for_each_run(LATENT_STORE, seq, il, 0, n_keys, |keys, _, len| {
        keys.copy_to(&mut cached[at * width..(at + len) * width]);
        at += len;
    });
    // The latents, packed, as the decompression's input.
    let latents = grown(&mut s.gather_latents, n_keys * lkv);
    for (dst, row) in latents
        .chunks_exact_mut(lkv)
        .zip(cached.chunks_exact(width))
    {
        dst.copy_from_slice(&row[..lkv]);
    }
    let cached = &s.latents[..n_keys * width];
    let k_pe_at =
        |j: usize, out: &mut [f32]| out.copy_from_slice(&cached[j * width + lkv..(j + 1) * width]);
    let keys = grown(&mut s.keys, n_keys * h * dk);
    let values = grown(&mut s.values, n_keys * h * dv);
    for (m, out, stride) in [
        (&lw.k_decompress, &mut *keys, dk),
        (&lw.v, &mut *values, dv),
    ] {
        let input = HeadInput::Shared(latents);
        per_head(
            m,
            gguf,
            input,
            n_keys,
            out,
            RowSet::All,
            stride,
            &mut s.gather,
            &mut s.head_out,
            &mut s.xq,
        )?;
    }
    for (j, key) in keys.chunks_exact_mut(h * dk).enumerate() {
        for head in key.chunks_exact_mut(dk) {
            k_pe_at(j, &mut head[dn..]);
        }
    }
    let (keys, values) = match memory.storage(LATENT_STORE) {
        KvStorage::F32 => (KvRows::F32(keys), KvRows::F32(values)),
        KvStorage::F16 => {
            let k16 = to_f16(keys, &mut s.keys16);
            let v16 = to_f16(values, &mut s.values16);
            (KvRows::F16(k16), KvRows::F16(v16))
        }
        other => unreachable!("a {} latent cache is always read absorbed", other.name()),
    };

    let q = &mut s.q[seg.start * h * dk..seg.end * h * dk];
    for (t, r) in rows.iter().enumerate() {
        let temp = c.temperature_at(r.pos);
        if temp != 1.0 {
            q[t * h * dk..(t + 1) * h * dk]
                .iter_mut()
                .for_each(|v| *v *= temp);
        }
    }
    let params = AttentionParams {
        scale: c.kq_scale,
        softcap: None,
    };
    let heads = &mut s.heads[seg.start * h * dv..seg.end * h * dv];
    let q = &*q;
    heads.par_chunks_mut(dv).enumerate().for_each(|(i, o)| {
        let (t, hd) = (i / h, i % h);
        let pos = rows[t].pos;
        let view = KvView {
            keys,
            values,
            key_width: h * dk,
            value_width: h * dv,
            head: hd,
            head_dim_k: dk,
            head_dim_v: dv,
        };
        attend(&q[i * dk..(i + 1) * dk], &view, 0, pos + 1, &params, o);
    });
    Ok(())
}

fn to_f16<'a>(src: &[f32], dst: &'a mut Vec<f16>) -> &'a [f16] {
    dst.clear();
    dst.extend(src.iter().map(|&v| f16::from_f32(v)));
    dst
}
