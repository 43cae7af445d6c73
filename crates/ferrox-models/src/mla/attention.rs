//! Multi-head latent attention for one layer and a micro-batch of one sequence's tokens.
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
//! Both run the shared per-query attention kernel with an f16 cache following ggml's CPU
//! flash-attention arithmetic, as the dense decoder does.

use ferrox_core::flash_attn::{GroupShape, MAX_GROUP};
use ferrox_core::{KvCache, KvRows, KvStorage};
use ferrox_gguf::Gguf;
use half::f16;
use rayon::prelude::*;

use super::config::MlaConfig;
use super::weights::{Heads, MlaLayer, QueryWeights};
use super::{grown, Path};
use crate::engine::EngineError;
use crate::layers::attention::{attend, f16_run, with_group_state, AttentionParams, KvView};
use crate::layers::linear::linear;
use crate::layers::norm::rms_norm_in_place;

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
    angles: Vec<(f32, f32)>,
    xq: Vec<u8>,
}

/// The layer's attention over `xn` (`positions.len()` normalized rows), its cache rows
/// written; leaves the output projection in `out` (`n × n_embd`).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    c: &MlaConfig,
    lw: &MlaLayer,
    gguf: &Gguf,
    il: usize,
    positions: &[usize],
    xn: &[f32],
    cache: &mut KvCache,
    path: Path,
    s: &mut AttnScratch,
    out: &mut [f32],
) -> Result<(), EngineError> {
    let n = positions.len();
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
    for (t, &pos) in positions.iter().enumerate() {
        let row = &mut kv[t * width..(t + 1) * width];
        let (latent, k_pe) = row.split_at_mut(lkv);
        rms_norm_in_place(latent, &lw.kv_a_norm, c.norm_eps);
        c.rope.angles(pos, &mut s.angles);
        c.rope.apply(k_pe, c.n_rot, &s.angles);
        for head in q[t * h * dk..(t + 1) * h * dk].chunks_exact_mut(dk) {
            c.rope.apply(&mut head[dn..], c.n_rot, &s.angles);
        }
        cache.write(il, pos, row, &[]);
    }
    let step = Step {
        c,
        lw,
        gguf,
        il,
        positions,
        cache,
    };
    match path {
        Path::Absorbed => absorbed(&step, s)?,
        Path::Decompressed => decompressed(&step, s)?,
    }
    let heads = &s.heads[..n * h * c.head_dim_v];
    linear(&lw.wo.view(gguf)?, heads, n, out, &mut s.xq)?;
    Ok(())
}

/// Where each head's input rows come from.
#[derive(Clone, Copy)]
enum HeadInput<'a> {
    /// Row `t` of head `h` at `(t · n_head + h) · stride` (each head its own input).
    PerHead(&'a [f32], usize),
    /// Row `t` at `t · cols` for every head (cached latents).
    Shared(&'a [f32]),
}

/// `out[t][h] = M[h] · x[t][h]` for `n` rows and every head; head `h` of row `t` lands at
/// `(t · n_head + h) · out_stride` (its first `rows` values).
#[allow(clippy::too_many_arguments)]
fn per_head(
    heads: &Heads,
    gguf: &Gguf,
    input: HeadInput<'_>,
    n: usize,
    out: &mut [f32],
    out_stride: usize,
    gather: &mut Vec<f32>,
    result: &mut Vec<f32>,
    xq: &mut Vec<u8>,
) -> Result<(), EngineError> {
    let m = heads.view(gguf)?;
    let (rows, cols, n_head) = (m.rows(), m.cols(), m.n_expert());
    let result = grown(result, n * rows);
    for hd in 0..n_head {
        let x: &[f32] = match input {
            HeadInput::Shared(x) => x,
            HeadInput::PerHead(x, stride) => {
                let g = grown(gather, n * cols);
                for (t, row) in g.chunks_exact_mut(cols).enumerate() {
                    let at = (t * n_head + hd) * stride;
                    row.copy_from_slice(&x[at..at + cols]);
                }
                g
            }
        };
        linear(&m.expert(hd), x, n, result, xq)?;
        for (t, r) in result.chunks_exact(rows).enumerate() {
            let at = (t * n_head + hd) * out_stride;
            out[at..at + rows].copy_from_slice(r);
        }
    }
    Ok(())
}

/// One layer's attention step once the batch's cache rows are written.
struct Step<'a> {
    c: &'a MlaConfig,
    lw: &'a MlaLayer,
    gguf: &'a Gguf,
    il: usize,
    positions: &'a [usize],
    cache: &'a KvCache,
}

/// Leaves the heads' outputs in `s.heads`.
fn absorbed(step: &Step<'_>, s: &mut AttnScratch) -> Result<(), EngineError> {
    let (c, lw, gguf) = (step.c, step.lw, step.gguf);
    let (il, positions, cache) = (step.il, step.positions, step.cache);
    let n = positions.len();
    let (h, dk, dn, dv) = (c.n_head, c.head_dim_k, c.head_dim_nope(), c.head_dim_v);
    let (lkv, width) = (c.kv_lora_rank, c.cache_width());
    let q_att = grown(&mut s.q_att, n * h * width);
    per_head(
        &lw.k_absorb,
        gguf,
        HeadInput::PerHead(&s.q, dk),
        n,
        q_att,
        width,
        &mut s.gather,
        &mut s.head_out,
        &mut s.xq,
    )?;
    for (t, &pos) in positions.iter().enumerate() {
        let temp = c.temperature_at(pos);
        for hd in 0..h {
            let dst = &mut q_att[(t * h + hd) * width..(t * h + hd + 1) * width];
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
    let latent_out = grown(&mut s.latent_out, n * h * lkv);
    let q_att = &*q_att;
    // Every head reads the same cache rows: heads go through them in groups, each key and
    // value row read once per group.
    let group = (1..=MAX_GROUP.min(h))
        .rev()
        .find(|g| h % g == 0)
        .unwrap_or(1);
    latent_out
        .par_chunks_mut(group * lkv)
        .enumerate()
        .for_each(|(i, o)| {
            let pos = positions[i * group / h];
            let q = &q_att[i * group * width..(i + 1) * group * width];
            // One shared key row per position; the values are its first Lkv entries.
            let rows = cache.keys(il, 0, pos + 1);
            let view = KvView {
                keys: rows,
                values: rows,
                key_width: width,
                value_width: width,
                head: 0,
                head_dim_k: width,
                head_dim_v: lkv,
            };
            match f16_run(&view, 0, pos + 1) {
                Some(run) => with_group_state(|state| {
                    let shape = GroupShape {
                        n_queries: group,
                        head_dim_k: width,
                        head_dim_v: lkv,
                        scale: params.scale,
                        softcap: None,
                    };
                    state.start(shape, q);
                    state.attend_run(&run);
                    state.finish(o);
                }),
                None => {
                    for (qg, og) in q.chunks_exact(width).zip(o.chunks_exact_mut(lkv)) {
                        attend(qg, &view, 0, pos + 1, &params, og);
                    }
                }
            }
        });
    let heads = grown(&mut s.heads, n * h * dv);
    per_head(
        &lw.v,
        gguf,
        HeadInput::PerHead(latent_out, lkv),
        n,
        heads,
        dv,
        &mut s.gather,
        &mut s.head_out,
        &mut s.xq,
    )?;
    Ok(())
}

/// Leaves the heads' outputs in `s.heads`.
fn decompressed(step: &Step<'_>, s: &mut AttnScratch) -> Result<(), EngineError> {
    let (c, lw, gguf) = (step.c, step.lw, step.gguf);
    let (il, positions, cache) = (step.il, step.positions, step.cache);
    let n = positions.len();
    let (h, dk, dn, dv) = (c.n_head, c.head_dim_k, c.head_dim_nope(), c.head_dim_v);
    let lkv = c.kv_lora_rank;
    let n_keys = positions.iter().max().map_or(0, |&p| p + 1);

    // Every cached latent (this batch's included), as f32.
    let latents = grown(&mut s.latents, n_keys * lkv);
    let k_pe_at = |j: usize, out: &mut [f32]| match cache.keys(il, j, j + 1) {
        KvRows::F32(r) => out.copy_from_slice(&r[lkv..]),
        KvRows::F16(r) => out
            .iter_mut()
            .zip(&r[lkv..])
            .for_each(|(o, v)| *o = v.to_f32()),
    };
    for (j, dst) in latents.chunks_exact_mut(lkv).enumerate() {
        match cache.keys(il, j, j + 1) {
            KvRows::F32(r) => dst.copy_from_slice(&r[..lkv]),
            KvRows::F16(r) => dst.iter_mut().zip(r).for_each(|(o, v)| *o = v.to_f32()),
        }
    }
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
    let (keys, values) = match cache.storage() {
        KvStorage::F32 => (KvRows::F32(keys), KvRows::F32(values)),
        KvStorage::F16 => {
            let k16 = to_f16(keys, &mut s.keys16);
            let v16 = to_f16(values, &mut s.values16);
            (KvRows::F16(k16), KvRows::F16(v16))
        }
    };

    let q = &mut s.q[..n * h * dk];
    for (t, &pos) in positions.iter().enumerate() {
        let temp = c.temperature_at(pos);
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
    let heads = grown(&mut s.heads, n * h * dv);
    let q = &*q;
    heads.par_chunks_mut(dv).enumerate().for_each(|(i, o)| {
        let (t, hd) = (i / h, i % h);
        let pos = positions[t];
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
