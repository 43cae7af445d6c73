//! The lightning indexer: which cached positions each token attends to.
//!
//! Per token, `Hi` query heads come from the query LoRA latent the MLA already computed
//! (`indexer.attn_q_b · qr`), one key from the normed input (`indexer.attn_k · x̂`, then a
//! LayerNorm), both rotated on their first R dims, and one weight per head
//! (`indexer.proj · x̂ / sqrt(Di·Hi)`). A cached position `j` scores
//! `Σ_h w_h · relu(q_h · k_j)`, and the token attends to the `top_k` best-scoring positions
//! up to its own ([`ferrox_core::select`]); to all of them while there are no more than `top_k`.
//!
//! After RoPE, queries and keys are multiplied by an orthonormal Hadamard matrix as llama.cpp
//! multiplies them ([`ferrox_core::hadamard::Hadamard::rotate_as_product`]): every `q · k` is unchanged up to
//! rounding, but the keys are rounded to the cache's type rotated, so an f16 cache rounds
//! what llama.cpp's rounds, and top-k, which selects on these scores, picks what it picks. The keys are kept in the sequence
//! memory's indexer store, one row of Di per position and indexer layer, so they are paged,
//! shared by prefix and rolled back with the latent rows.

use crate::plan::Packing;
use ferrox_core::relu_scores::{self, IndexQuery};
use ferrox_gguf::Gguf;
use ferrox_memory::StepMemory;
use rayon::prelude::*;

use super::config::{DsaConfig, IndexerConfig};
use crate::engine::EngineError;
use crate::layers::linear::linear;
use crate::layers::mla::sparse::Selection;
use crate::layers::norm::layer_norm;
use crate::names::*;
use crate::scaffold::{sized as grown, Row};
use crate::tensors::{Loader, MatrixRef};
use crate::ModelError;
use ferrox_core::select::top_k;

/// The memory's second store: the indexer's key rows.
pub(crate) const INDEXER_STORE: usize = 1;

/// One layer's indexer weights.
#[derive(Clone, Debug)]
pub struct IndexerWeights {
    /// q LoRA latent → `Hi` query heads of Di.
    pub q_b: MatrixRef,
    /// Normed input → one key of Di.
    pub k: MatrixRef,
    pub k_norm: Vec<f32>,
    pub k_norm_bias: Vec<f32>,
    /// Normed input → one weight per head.
    pub proj: MatrixRef,
}

impl IndexerWeights {
    pub(crate) fn load(l: &Loader<'_>, c: &DsaConfig, il: usize) -> Result<Self, ModelError> {
        let (n_embd, hi, di) = (c.mla.n_embd, c.indexer.n_head, c.indexer.head_dim);
        let rank = c.mla.q_lora_rank.unwrap_or(0);
        Ok(IndexerWeights {
            q_b: l.matrix(&INDEXER_ATTN_Q_B.layer(il), rank, hi * di)?,
            k: l.matrix(&INDEXER_ATTN_K.layer(il), n_embd, di)?,
            k_norm: l.vector(&INDEXER_K_NORM.layer(il), di)?,
            k_norm_bias: l.vector(&INDEXER_K_NORM.layer_bias(il), di)?,
            proj: l.matrix(&INDEXER_PROJ.layer(il), n_embd, hi)?,
        })
    }

    pub fn pack(&mut self, gguf: &Packing<'_>) -> Result<(), ModelError> {
        self.q_b.pack(gguf)?;
        self.k.pack(gguf)?;
        self.proj.pack(gguf)
    }

    pub fn n_bytes(&self) -> u64 {
        self.q_b.n_bytes() + self.k.n_bytes() + self.proj.n_bytes()
    }
}

/// Buffers of the indexer, reused across layers and steps.
#[derive(Default)]
pub struct IndexerScratch {
    q: Vec<f32>,
    k: Vec<f32>,
    k_normed: Vec<f32>,
    weights: Vec<f32>,
    scores: Vec<f32>,
    chosen: Vec<u32>,
    angles: Vec<(f32, f32)>,
    xq: Vec<u8>,
}

impl IndexerScratch {
    /// Sizes the buffers whose need grows with the context (scores over up to `n_ctx`
    /// positions, `top_k` chosen), so that decoding never grows them.
    pub fn reserve(&mut self, n_ctx: usize, top_k: usize) {
        self.scores.reserve(n_ctx.saturating_sub(self.scores.len()));
        self.chosen
            .reserve(top_k.min(n_ctx).saturating_sub(self.chosen.len()));
    }
}

/// A layer's own indexer: its weights and its layer in the indexer store.
#[derive(Clone, Debug)]
pub(crate) struct LayerIndexer {
    pub store_layer: usize,
    pub weights: IndexerWeights,
}

/// Computes the micro-batch's indexer keys (written to `memory`) and each row's selection
/// into `out`. `xn` holds the rows' normed inputs, `q_latent` their normalized query LoRA
/// latents.
#[allow(clippy::too_many_arguments)]
pub(crate) fn select(
    c: &IndexerConfig,
    layer: &LayerIndexer,
    gguf: &Gguf,
    rows: &[Row],
    xn: &[f32],
    q_latent: &[f32],
    memory: &mut StepMemory<'_>,
    s: &mut IndexerScratch,
    out: &mut Selection,
) -> Result<(), EngineError> {
    let n = rows.len();
    let (hi, di) = (c.n_head, c.head_dim);
    let w = &layer.weights;
    let q = grown(&mut s.q, n * hi * di);
    linear(&w.q_b.view(gguf)?, q_latent, n, q, &mut s.xq)?;
    let k = grown(&mut s.k, n * di);
    linear(&w.k.view(gguf)?, xn, n, k, &mut s.xq)?;
    let weights = grown(&mut s.weights, n * hi);
    linear(&w.proj.view(gguf)?, xn, n, weights, &mut s.xq)?;
    // llama.cpp scales the weights rather than every score.
    let scale = 1.0 / ((di * hi) as f32).sqrt();
    weights.iter_mut().for_each(|v| *v *= scale);

    let normed = grown(&mut s.k_normed, di);
    for (t, r) in rows.iter().enumerate() {
        let key = &mut k[t * di..(t + 1) * di];
        layer_norm(key, &w.k_norm, Some(&w.k_norm_bias), c.k_norm_eps, normed);
        key.copy_from_slice(normed);
        c.rope.angles(r.pos, &mut s.angles);
        c.rope.apply(key, di, &s.angles);
        let heads = &mut q[t * hi * di..(t + 1) * hi * di];
        c.rope.apply(heads, di, &s.angles);
        if let Some(rotation) = &c.rotation {
            rotation.rotate_as_product(key);
            rotation.rotate_as_product(heads);
        }
        memory.write(INDEXER_STORE, r.seq, layer.store_layer, r.pos, key, &[]);
    }

    out.clear();
    for (t, r) in rows.iter().enumerate() {
        let visible = r.pos + 1;
        if visible <= c.top_k {
            out.push_all();
            continue;
        }
        let scores = grown(&mut s.scores, visible);
        let query = IndexQuery {
            heads: &q[t * hi * di..(t + 1) * hi * di],
            weights: &weights[t * hi..(t + 1) * hi],
            head_dim: di,
        };
        score(memory, layer.store_layer, r.seq, &query, scores);
        top_k(scores, c.top_k, &mut s.chosen);
        s.chosen.sort_unstable();
        out.push(s.chosen.iter().map(|&j| j as usize));
    }
    Ok(())
}

/// Positions scored per parallel task.
const SCORE_CHUNK: usize = 128;

/// Scores positions `0..scores.len()` of sequence `seq` in the indexer store, in parallel
/// chunks of positions (each reading its stretch of the store).
fn score(
    memory: &StepMemory<'_>,
    layer: usize,
    seq: usize,
    q: &IndexQuery<'_>,
    scores: &mut [f32],
) {
    scores
        .par_chunks_mut(SCORE_CHUNK)
        .enumerate()
        .for_each(|(i, chunk)| {
            let lo = i * SCORE_CHUNK;
            let hi = lo + chunk.len();
            let mut at = 0;
            memory.for_each_run(INDEXER_STORE, seq, layer, lo, hi, |keys, _, len| {
                relu_scores::scores(q, keys, &mut chunk[at..at + len]);
                at += len;
            });
        });
}
