//! The dense decoder: one engine for every GQA + RoPE transformer family
//! (llama, qwen2/3, gemma/2/3, phi3). Family differences live in [`crate::families`];
//! the shared pieces in [`crate::layers`].

mod config;
mod kv_target;
mod linear;
mod weights;

use std::path::Path;
use std::sync::Arc;

use ferrox_core::{BlockTable, KvCache, KvSnapshot, KvStorage, PagedKv};
use ferrox_gguf::Gguf;
use rayon::prelude::*;
use smallvec::SmallVec;

pub use config::{
    apply_swa_pattern, moe_error, read_common, DecoderConfig, FfnKind, Keys, LayerConfig,
    MoeFfnConfig,
};
pub use weights::DecoderWeights;

use crate::engine::{Engine, EngineError, LogitsFor};
use crate::layers::activation::{gated, softcap};
use crate::layers::attention::AttentionParams;
use crate::layers::norm::{rms_norm, rms_norm_in_place};
use crate::tokenizer::TokenId;
use crate::ModelError;
use kv_target::{HeadGroup, KvTarget};
use linear::{linear, linear_many};
use weights::{FfnWeights, GateUpWeights, QkvWeights};

/// Tokens processed together in one pass of a long prompt (bounds scratch memory).
const MAX_MICRO_BATCH: usize = 512;

/// Sequences per step handled without a heap allocation.
const INLINE_SEQS: usize = 16;

/// How to run a decoder.
#[derive(Clone, Debug)]
pub struct DecoderOptions {
    /// Context size in tokens; 0 means the model's training context.
    pub n_ctx: usize,
    /// Worker threads; 0 means one per available core.
    pub threads: usize,
    pub kv_storage: KvStorage,
    /// Repack the matrices that multiply faster in an interleaved layout at load (see
    /// `ferrox_core::packed`; llama.cpp's `--no-repack` turns its counterpart off).
    pub repack: bool,
}

impl Default for DecoderOptions {
    fn default() -> Self {
        DecoderOptions {
            n_ctx: 4096,
            threads: 0,
            kv_storage: KvStorage::F16,
            repack: true,
        }
    }
}

/// A dense transformer decoder over a memory-mapped GGUF checkpoint.
pub struct Decoder {
    gguf: Arc<Gguf>,
    config: DecoderConfig,
    weights: DecoderWeights,
    n_ctx: usize,
    kv_storage: KvStorage,
    pool: rayon::ThreadPool,
}

/// One sequence's part of a [`Decoder::forward_many`] step.
pub struct SequenceStep<'a> {
    /// Tokens to append at the state's next positions.
    pub tokens: &'a [TokenId],
    pub state: &'a mut DecoderState,
    pub logits: LogitsFor,
}

/// A sequence whose keys and values live in a shared [`PagedKv`] arena (see
/// [`Decoder::forward_paged`]). Whoever owns the arena's blocks fills `table` with enough
/// of them before each step.
#[derive(Debug, Default)]
pub struct PagedSequence {
    pub table: BlockTable,
    logits: Vec<f32>,
}

impl PagedSequence {
    pub fn new() -> PagedSequence {
        PagedSequence::default()
    }

    /// The logits of the last step (`vocab_size` per requested token).
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }
}

/// One sequence's part of a [`Decoder::forward_paged`] step.
pub struct PagedStep<'a> {
    pub tokens: &'a [TokenId],
    pub seq: &'a mut PagedSequence,
    pub logits: LogitsFor,
}

/// Activation buffers for batched steps, kept between steps so decoding does not allocate.
#[derive(Default)]
pub struct StepScratch(Scratch);

/// Where one row of a micro-batch comes from.
#[derive(Clone, Copy, Debug)]
struct Row {
    seq: usize,
    pos: usize,
    token: TokenId,
    /// Which of the sequence's logits rows this token fills, if any.
    logits_row: Option<usize>,
}

/// Per-sequence state: the KV cache, scratch buffers and the last logits.
pub struct DecoderState {
    kv: KvCache,
    scratch: Scratch,
    logits: Vec<f32>,
}

impl DecoderState {
    /// Positions held in the cache.
    pub fn len(&self) -> usize {
        self.kv.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kv.is_empty()
    }

    /// Forgets every position from `len` on (to re-use a shared prefix).
    pub fn truncate(&mut self, len: usize) {
        self.kv.truncate(len);
    }

    pub fn snapshot(&self) -> KvSnapshot {
        self.kv.snapshot()
    }

    pub fn restore(&mut self, snapshot: &KvSnapshot) -> Result<(), EngineError> {
        self.kv
            .restore(snapshot)
            .map_err(|e| EngineError::State(e.to_string()))
    }

    pub fn kv_cache(&self) -> &KvCache {
        &self.kv
    }

    /// The logits of the last forward step (`vocab_size` per requested token).
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }
}

/// Activations for a micro-batch, reused across steps so decoding does not allocate.
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// Activations quantized for the integer kernels.
    xq: Vec<u8>,
    /// Output-head results before they are handed to each sequence.
    logits: Vec<f32>,
    /// MoE router logits (`n_expert` per token) and the expert FFN's buffers.
    router_logits: Vec<f32>,
    moe: ferrox_moe::MoeScratch,
    /// The step's rows, and those of a micro-batch that want logits.
    rows: Vec<Row>,
    wanting: Vec<usize>,
}

/// The largest divisor of `n` not above `cap`.
fn largest_divisor_at_most(n: usize, cap: usize) -> usize {
    (1..=cap.min(n))
        .rev()
        .find(|&d| n.is_multiple_of(d))
        .unwrap_or(1)
}

fn sized(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
}

impl Decoder {
    /// Opens a GGUF file and prepares a decoder for its architecture.
    pub fn open(path: impl AsRef<Path>, options: &DecoderOptions) -> Result<Decoder, ModelError> {
        let gguf = Gguf::open(path)?;
        Decoder::from_gguf(Arc::new(gguf), options)
    }

    pub fn from_gguf(gguf: Arc<Gguf>, options: &DecoderOptions) -> Result<Decoder, ModelError> {
        let mut config = crate::families::decoder_config(&gguf.metadata())?;
        let mut weights = DecoderWeights::load(&gguf, &config)?;
        if let Some(freqs) = &weights.rope_freqs {
            for layer in &mut config.layers {
                layer.rope.freq_factors = Some(freqs.clone());
            }
        }
        let n_ctx = if options.n_ctx == 0 {
            config.n_ctx_train
        } else {
            options.n_ctx
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(options.threads)
            .thread_name(|i| format!("ferrox-worker-{i}"))
            .build()
            .map_err(|e| ModelError::Config(format!("cannot start the thread pool: {e}")))?;
        // Each worker's own buffers, made now rather than by whichever step first runs on it.
        let rope_pairs = config.layers.iter().map(|l| l.rope.n_dims / 2).max();
        pool.broadcast(|_| {
            crate::layers::attention::with_group_state(|_| ());
            ROPE_ANGLES.with_borrow_mut(|a| a.reserve(rope_pairs.unwrap_or(0)));
        });
        if options.repack {
            pool.install(|| weights.pack(&gguf))?;
        }
        Ok(Decoder {
            gguf,
            config,
            weights,
            n_ctx,
            kv_storage: options.kv_storage,
            pool,
        })
    }

    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Bytes of weights read per decoded token.
    pub fn weight_bytes_per_token(&self) -> u64 {
        self.weights.bytes_per_token(&self.config)
    }

    /// Runs `tokens` at positions `start_pos..`, appending to the state's cache.
    fn forward(
        &self,
        tokens: &[TokenId],
        start_pos: usize,
        state: &mut DecoderState,
        want: LogitsFor,
    ) -> Result<(), EngineError> {
        if start_pos != state.kv.len() {
            return Err(EngineError::Position {
                got: start_pos,
                len: state.kv.len(),
            });
        }
        self.forward_many(&mut [SequenceStep {
            tokens,
            state,
            logits: want,
        }])
    }

    /// One step for several sequences at once (continuous batching): all their tokens go
    /// through the matrix products together, while each token attends only to its own
    /// sequence's cache. Each sequence continues from its state's length and gets its logits
    /// in its state ([`DecoderState::logits`]). Because the kernels are batch-invariant, a
    /// sequence's results do not depend on which others share the step.
    pub fn forward_many(&self, steps: &mut [SequenceStep<'_>]) -> Result<(), EngineError> {
        let Some(first) = steps.first_mut() else {
            return Ok(());
        };
        let mut scratch = std::mem::take(&mut first.state.scratch);
        let mut caches = SmallVec::new();
        let mut logits: SmallVec<[_; INLINE_SEQS]> = SmallVec::new();
        let mut seqs: SmallVec<[_; INLINE_SEQS]> = SmallVec::new();
        for step in steps.iter_mut() {
            let DecoderState {
                kv, logits: out, ..
            } = &mut *step.state;
            caches.push(kv);
            logits.push(out);
            seqs.push((step.tokens, step.logits));
        }
        let result = self.run_step(KvTarget::Owned(caches), &mut logits, &seqs, &mut scratch);
        drop((logits, seqs));
        steps[0].state.scratch = scratch;
        result
    }

    /// An arena for [`forward_paged`](Self::forward_paged) with this model's layer shapes:
    /// `n_blocks` blocks of `block_tokens` positions.
    pub fn new_paged_kv(&self, n_blocks: usize, block_tokens: usize) -> PagedKv {
        let (kw, vw) = self.config.kv_widths();
        let n_layer = self.config.n_layer();
        PagedKv::new(n_layer, n_blocks, block_tokens, kw, vw, self.kv_storage)
    }

    /// Bytes of KV memory one position takes.
    pub fn kv_bytes_per_position(&self) -> usize {
        let (kw, vw) = self.config.kv_widths();
        PagedKv::bytes_per_position(self.config.n_layer(), kw, vw, self.kv_storage)
    }

    /// [`forward_many`](Self::forward_many) for sequences kept in a paged arena (made by
    /// [`new_paged_kv`](Self::new_paged_kv)). Each sequence's table must already hold
    /// blocks for its new positions; blocks shared with other tables are only read (a
    /// sequence writes only positions from its length on).
    pub fn forward_paged(
        &self,
        arena: &mut PagedKv,
        scratch: &mut StepScratch,
        steps: &mut [PagedStep<'_>],
    ) -> Result<(), EngineError> {
        let (kw, vw) = self.config.kv_widths();
        if arena.n_layers() != self.config.n_layer()
            || (arena.key_width(), arena.value_width()) != (kw, vw)
        {
            return Err(EngineError::State(
                "the paged KV arena was made for another model".into(),
            ));
        }
        let mut tables = SmallVec::new();
        let mut logits: SmallVec<[_; INLINE_SEQS]> = SmallVec::new();
        let mut seqs: SmallVec<[_; INLINE_SEQS]> = SmallVec::new();
        for step in steps.iter_mut() {
            let PagedSequence { table, logits: out } = &mut *step.seq;
            tables.push(table);
            logits.push(out);
            seqs.push((step.tokens, step.logits));
        }
        let target = KvTarget::Paged { arena, tables };
        self.run_step(target, &mut logits, &seqs, &mut scratch.0)
    }

    /// Checks a step's sequences, lays their tokens out as rows and runs them through the
    /// model in micro-batches.
    fn run_step(
        &self,
        mut kv: KvTarget<'_>,
        logits: &mut [&mut Vec<f32>],
        seqs: &[(&[TokenId], LogitsFor)],
        scratch: &mut Scratch,
    ) -> Result<(), EngineError> {
        let n_vocab = self.config.n_vocab;
        let mut rows = std::mem::take(&mut scratch.rows);
        rows.clear();
        for (seq, &(tokens, want)) in seqs.iter().enumerate() {
            if tokens.is_empty() {
                return Err(EngineError::EmptyBatch);
            }
            let start = kv.len(seq);
            let needed = start + tokens.len();
            if needed > kv.capacity(seq) {
                return Err(EngineError::ContextFull {
                    needed,
                    capacity: kv.capacity(seq),
                });
            }
            if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
                return Err(EngineError::InvalidToken {
                    token: bad,
                    vocab_size: n_vocab,
                });
            }
            let wanted = want.range(tokens.len());
            logits[seq].resize(wanted.len() * n_vocab, 0.0);
            for (i, &token) in tokens.iter().enumerate() {
                let logits_row = wanted.contains(&i).then(|| i - wanted.start);
                rows.push(Row {
                    seq,
                    pos: start + i,
                    token,
                    logits_row,
                });
            }
        }
        let result = self.pool.install(|| {
            rows.chunks(MAX_MICRO_BATCH)
                .try_for_each(|chunk| self.forward_micro_batch(chunk, &mut kv, logits, scratch))
        });
        scratch.rows = rows;
        result
    }

    /// One micro-batch of rows (from one or more sequences, each sequence's rows in
    /// position order) through every layer, then the output head for the rows that want
    /// logits.
    fn forward_micro_batch(
        &self,
        rows: &[Row],
        kv: &mut KvTarget<'_>,
        seq_logits: &mut [&mut Vec<f32>],
        s: &mut Scratch,
    ) -> Result<(), EngineError> {
        let c = &self.config;
        let n = rows.len();
        let n_embd = c.n_embd;
        let x = sized(&mut s.x, n * n_embd);

        let embd = self.weights.token_embd.view(&self.gguf)?;
        for (t, row) in rows.iter().enumerate() {
            let out = &mut x[t * n_embd..(t + 1) * n_embd];
            embd.dequant_row(row.token as usize, out)
                .map_err(ModelError::from)?;
            if let Some(scale) = c.embedding_scale {
                out.iter_mut().for_each(|v| *v *= scale);
            }
        }

        for (il, (lc, lw)) in c.layers.iter().zip(&self.weights.layers).enumerate() {
            self.attention_block(il, lc, lw, rows, kv, s)?;
            self.ffn_block(lc, lw, n, s)?;
        }
        for row in rows {
            kv.advance(row.seq, row.pos + 1);
        }

        let mut wanting = std::mem::take(&mut s.wanting);
        wanting.clear();
        wanting.extend((0..n).filter(|&t| rows[t].logits_row.is_some()));
        let result = self.output_head(rows, &wanting, seq_logits, s);
        s.wanting = wanting;
        result
    }

    /// The final norm and the output projection for the rows `wanting` logits, copied to
    /// their sequences.
    fn output_head(
        &self,
        rows: &[Row],
        wanting: &[usize],
        seq_logits: &mut [&mut Vec<f32>],
        s: &mut Scratch,
    ) -> Result<(), EngineError> {
        if wanting.is_empty() {
            return Ok(());
        }
        let c = &self.config;
        let n_embd = c.n_embd;
        let count = wanting.len();
        let xn = sized(&mut s.xn, count * n_embd);
        for (i, &t) in wanting.iter().enumerate() {
            rms_norm(
                &s.x[t * n_embd..(t + 1) * n_embd],
                &self.weights.output_norm,
                c.norm_eps,
                &mut xn[i * n_embd..(i + 1) * n_embd],
            );
        }
        let out = self.weights.output.view(&self.gguf)?;
        let n_vocab = c.n_vocab;
        let logits = sized(&mut s.logits, count * n_vocab);
        linear(&out, xn, count, logits, &mut s.xq)?;
        if let Some(cap) = c.final_logit_softcap {
            softcap(logits, cap);
        }
        for (i, &t) in wanting.iter().enumerate() {
            let (row, slot) = (&rows[t], rows[t].logits_row.unwrap_or(0));
            seq_logits[row.seq][slot * n_vocab..(slot + 1) * n_vocab]
                .copy_from_slice(&logits[i * n_vocab..(i + 1) * n_vocab]);
        }
        Ok(())
    }

    fn attention_block(
        &self,
        il: usize,
        lc: &LayerConfig,
        lw: &weights::LayerWeights,
        rows: &[Row],
        kv: &mut KvTarget<'_>,
        s: &mut Scratch,
    ) -> Result<(), EngineError> {
        let n = rows.len();
        let c = &self.config;
        let n_embd = c.n_embd;
        let (hd_k, hd_v) = (lc.head_dim_k, lc.head_dim_v);
        let (q_w, k_w, v_w) = (lc.n_head * hd_k, lc.n_head_kv * hd_k, lc.n_head_kv * hd_v);
        let xn = sized(&mut s.xn, n * n_embd);
        norm_rows(&s.x[..n * n_embd], &lw.attn_norm, c.norm_eps, xn);
        let q = sized(&mut s.q, n * q_w);
        let k = sized(&mut s.k, n * k_w);
        let v = sized(&mut s.v, n * v_w);
        match &lw.qkv {
            QkvWeights::Separate {
                q: wq,
                k: wk,
                v: wv,
            } => {
                let (wq, wk, wv) = (
                    wq.view(&self.gguf)?,
                    wk.view(&self.gguf)?,
                    wv.view(&self.gguf)?,
                );
                linear_many(&[&wq, &wk, &wv], xn, n, &mut [q, k, v], &mut s.xq)?;
            }
            QkvWeights::Fused(w) => {
                let all = q_w + k_w + v_w;
                let qkv = sized(&mut s.qkv, n * all);
                linear(&w.view(&self.gguf)?, xn, n, qkv, &mut s.xq)?;
                for t in 0..n {
                    let row = &qkv[t * all..(t + 1) * all];
                    q[t * q_w..(t + 1) * q_w].copy_from_slice(&row[..q_w]);
                    k[t * k_w..(t + 1) * k_w].copy_from_slice(&row[q_w..q_w + k_w]);
                    v[t * v_w..(t + 1) * v_w].copy_from_slice(&row[q_w + k_w..]);
                }
            }
        }
        for (buf, bias, width) in [
            (&mut *q, &lw.q_bias, q_w),
            (&mut *k, &lw.k_bias, k_w),
            (&mut *v, &lw.v_bias, v_w),
        ] {
            if let Some(b) = bias {
                buf.chunks_exact_mut(width)
                    .for_each(|row| row.iter_mut().zip(b).for_each(|(x, bi)| *x += bi));
            }
        }
        // Per token, in parallel: Q/K norms, RoPE, the query scale.
        q.par_chunks_mut(q_w)
            .zip(k.par_chunks_mut(k_w))
            .zip(rows.par_iter())
            .for_each(|((qt, kt), row)| {
                if let (Some(qn), Some(kn), true) = (&lw.q_norm, &lw.k_norm, c.qk_norm_whole) {
                    rms_norm_in_place(qt, qn, c.norm_eps);
                    rms_norm_in_place(kt, kn, c.norm_eps);
                } else if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                    qt.chunks_exact_mut(hd_k)
                        .for_each(|h| rms_norm_in_place(h, qn, c.norm_eps));
                    kt.chunks_exact_mut(hd_k)
                        .for_each(|h| rms_norm_in_place(h, kn, c.norm_eps));
                }
                ROPE_ANGLES.with_borrow_mut(|angles| {
                    lc.rope.angles(row.pos, angles);
                    lc.rope.apply(qt, hd_k, angles);
                    lc.rope.apply(kt, hd_k, angles);
                });
                if let Some(scale) = c.query_scale {
                    qt.iter_mut().for_each(|x| *x *= scale);
                }
            });
        for (t, row) in rows.iter().enumerate() {
            let (kt, vt) = (&k[t * k_w..(t + 1) * k_w], &v[t * v_w..(t + 1) * v_w]);
            kv.write(row.seq, il, row.pos, kt, vt);
        }

        let params = AttentionParams {
            scale: if c.query_scale.is_some() {
                1.0
            } else {
                1.0 / (hd_k as f32).sqrt()
            },
            softcap: c.attn_softcap,
        };
        let group = lc.n_head / lc.n_head_kv;
        // Heads sharing a KV head are attended together (the keys and values are read once
        // for all of them); with few rows, one head per task keeps every thread busy. The
        // results are the same bits either way.
        let per_task = if n * lc.n_head_kv >= 2 * self.threads() {
            largest_divisor_at_most(group, ferrox_core::flash_attn::MAX_GROUP)
        } else {
            1
        };
        let tasks_per_row = lc.n_head / per_task;
        let attn = sized(&mut s.attn, n * lc.n_head * hd_v);
        let q = &*q;
        let kv = &*kv;
        attn.par_chunks_mut(per_task * hd_v)
            .enumerate()
            .for_each(|(i, out)| {
                let (t, h0) = (i / tasks_per_row, (i % tasks_per_row) * per_task);
                let Row { seq, pos, .. } = rows[t];
                let at = HeadGroup {
                    seq,
                    layer: il,
                    kv_head: h0 / group,
                    n_queries: per_task,
                    head_dim_k: hd_k,
                    head_dim_v: hd_v,
                };
                let lo = lc.sliding_window.map_or(0, |w| (pos + 1).saturating_sub(w));
                let q_heads = &q[t * q_w + h0 * hd_k..t * q_w + (h0 + per_task) * hd_k];
                kv.attend(at, q_heads, lo, pos + 1, &params, out);
            });

        let proj = sized(&mut s.proj, n * n_embd);
        linear(&lw.wo.view(&self.gguf)?, attn, n, proj, &mut s.xq)?;
        self.residual_add(&lw.attn_post_norm, n, s);
        Ok(())
    }

    fn ffn_block(
        &self,
        lc: &LayerConfig,
        lw: &weights::LayerWeights,
        n: usize,
        s: &mut Scratch,
    ) -> Result<(), EngineError> {
        let c = &self.config;
        let n_embd = c.n_embd;
        let xn = sized(&mut s.xn, n * n_embd);
        norm_rows(&s.x[..n * n_embd], &lw.ffn_norm, c.norm_eps, xn);
        let (gate_up, down) = match &lw.ffn {
            FfnWeights::Dense { gate_up, down } => (gate_up, down),
            FfnWeights::Moe(mw) => {
                let FfnKind::Moe(mc) = &lc.ffn else {
                    return Err(ModelError::Config("MoE weights on a dense layer".into()).into());
                };
                let xn = &s.xn[..n * n_embd];
                ferrox_moe::router_logits(&mw.gate_inp.view(&self.gguf)?, xn, &mut s.router_logits)
                    .map_err(config::moe_error)?;
                let experts = mw.experts(&self.gguf)?;
                let proj = sized(&mut s.proj, n * n_embd);
                ferrox_moe::moe_ffn(
                    &mc.router,
                    &experts,
                    xn,
                    &s.router_logits,
                    None,
                    proj,
                    &mut s.moe,
                )
                .map_err(config::moe_error)?;
                if let Some(shared) = mw.shared_expert(&self.gguf)? {
                    shared
                        .forward_add(xn, proj, &mut s.moe)
                        .map_err(config::moe_error)?;
                }
                self.residual_add(&lw.ffn_post_norm, n, s);
                return Ok(());
            }
        };
        let n_ff = lc.n_ff;
        let gate = sized(&mut s.gate, n * n_ff);
        match gate_up {
            GateUpWeights::Separate { gate: wg, up: wu } => {
                let up = sized(&mut s.up, n * n_ff);
                let (wg, wu) = (wg.view(&self.gguf)?, wu.view(&self.gguf)?);
                linear_many(&[&wg, &wu], xn, n, &mut [&mut *gate, &mut *up], &mut s.xq)?;
                gated(c.activation, gate, up);
            }
            GateUpWeights::Fused(w) => {
                let both = sized(&mut s.up, n * 2 * n_ff);
                linear(&w.view(&self.gguf)?, xn, n, both, &mut s.xq)?;
                for t in 0..n {
                    let (g, u) = both[t * 2 * n_ff..(t + 1) * 2 * n_ff].split_at_mut(n_ff);
                    gated(c.activation, g, u);
                    gate[t * n_ff..(t + 1) * n_ff].copy_from_slice(g);
                }
            }
        }
        let proj = sized(&mut s.proj, n * n_embd);
        linear(&down.view(&self.gguf)?, gate, n, proj, &mut s.xq)?;
        self.residual_add(&lw.ffn_post_norm, n, s);
        Ok(())
    }

    /// `x += post_norm(proj)` (or `x += proj` without a post norm).
    fn residual_add(&self, post_norm: &Option<Vec<f32>>, n: usize, s: &mut Scratch) {
        let n_embd = self.config.n_embd;
        let eps = self.config.norm_eps;
        s.proj[..n * n_embd]
            .par_chunks_mut(n_embd)
            .zip(s.x[..n * n_embd].par_chunks_mut(n_embd))
            .for_each(|(p, x)| {
                if let Some(w) = post_norm {
                    rms_norm_in_place(p, w, eps);
                }
                x.iter_mut().zip(p.iter()).for_each(|(x, p)| *x += p);
            });
    }
}

thread_local! {
    /// Each worker's RoPE (cos, sin) pairs for the token it is rotating.
    static ROPE_ANGLES: std::cell::RefCell<Vec<(f32, f32)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `out` row by row: the RMS norm of each `weight.len()`-wide row of `x`, rows in parallel.
fn norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let width = weight.len();
    out.par_chunks_mut(width)
        .zip(x.par_chunks(width))
        .for_each(|(o, x)| rms_norm(x, weight, eps, o));
}

impl Engine for Decoder {
    type State = DecoderState;

    fn new_state(&self) -> DecoderState {
        let (kw, vw) = self.config.kv_widths();
        DecoderState {
            kv: KvCache::new(self.config.n_layer(), self.n_ctx, kw, vw, self.kv_storage),
            scratch: Scratch::default(),
            logits: Vec::new(),
        }
    }

    fn vocab_size(&self) -> usize {
        self.config.n_vocab
    }

    fn context_size(&self) -> usize {
        self.n_ctx
    }

    fn forward_batch<'s>(
        &self,
        tokens: &[TokenId],
        start_pos: usize,
        state: &'s mut DecoderState,
        logits: LogitsFor,
    ) -> Result<&'s [f32], EngineError> {
        self.forward(tokens, start_pos, state, logits)?;
        Ok(&state.logits)
    }
}
