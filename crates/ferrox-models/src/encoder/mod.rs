//! The encoder: one engine for BERT and its kin (`bert`, `nomic-bert`), as llama.cpp's
//! `bert.cpp` graph runs them. Post-norm layers (LayerNorm after each residual), attention
//! over the whole sequence (both ways unless the file says `attention.causal`), no cache:
//! each sequence comes whole in one step and its every token's hidden state is its
//! embedding (no final norm, no output head), pooled by the caller.
//!
//! With an f16 cache type (the default) keys and values are rounded to f16 and attended by
//! the flash-attention kernel, as llama.cpp's flash attention does; with f32 they stay f32.

mod config;
mod weights;

use std::sync::Arc;

use ferrox_core::KvStorage;
use ferrox_gguf::Gguf;
use ferrox_memory::{MemorySpec, StepMemory};
use half::f16;
use rayon::prelude::*;

pub use config::{read_encoder, EncoderConfig, EncoderFfn, EncoderMoe, PositionKind, Positions};
use ferrox_moe::{moe_ffn, router_logits, Activation as MoeActivation, MoeExperts, MoeScratch};
use weights::{DenseFfn, EncoderWeights, FfnWeights, LayerNormWeights, LayerWeights};

use crate::engine::{Engine, EngineError, EngineOptions, Output, SeqInput, StepScratch};
use crate::hparams::moe_error;
use crate::layers::activation::{gated, gated_rows, gelu, Activation};
use crate::layers::attention::{
    alibi_slope, attend, attend_biased, kv_rows, AttentionParams, KvView,
};
use crate::layers::classifier::ClassifierHead;
use crate::layers::linear::{linear, linear_many};
use crate::layers::norm::layer_norm_in_place;
use crate::scaffold::{self, sized, Row, Runtime, StepBuffers, MAX_MICRO_BATCH};
use crate::ModelError;

/// A transformer encoder over a memory-mapped GGUF checkpoint.
pub struct Encoder {
    rt: Runtime,
    config: EncoderConfig,
    weights: EncoderWeights,
    /// A reranker's head (`cls`, `cls.output`), if the file has one.
    classifier: Option<ClassifierHead>,
}

/// Activations of a micro-batch, reused across steps.
#[derive(Default)]
pub struct Scratch {
    x: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    qkv: Vec<f32>,
    k16: Vec<f16>,
    v16: Vec<f16>,
    /// Keys and values repacked for [`ferrox_core::dense_attn`].
    dense: ferrox_core::dense_attn::DenseScratch,
    attn: Vec<f32>,
    proj: Vec<f32>,
    up: Vec<f32>,
    gate: Vec<f32>,
    /// A layer's input, kept when it is added again after attention (jina-bert-v2).
    layer_in: Vec<f32>,
    /// Router logits and the expert FFN's buffers (nomic-bert-moe).
    router_logits: Vec<f32>,
    moe: MoeScratch,
    xq: Vec<u8>,
}

/// Where a micro-batch's sequences lie among its rows.
#[derive(Clone, Copy)]
struct Span {
    start: usize,
    end: usize,
}

impl Encoder {
    pub fn with_config(
        gguf: Arc<Gguf>,
        options: &EngineOptions,
        config: EncoderConfig,
    ) -> Result<Encoder, ModelError> {
        if options.kv_storage != KvStorage::F16 && options.kv_storage != KvStorage::F32 {
            return Err(ModelError::UnsupportedCacheType {
                engine: config.arch.clone(),
                cache: options.kv_storage.name(),
            });
        }
        let mut weights = EncoderWeights::load(&gguf, &config)?;
        let classifier = ClassifierHead::load(&gguf, config.n_embd, false)?;
        let dims = (config.n_ctx_train, config.n_vocab, config.n_embd);
        let mut rt = Runtime::new(gguf, options, dims, "ferrox-encoder")?;
        if let Positions::Learned = config.positions {
            // Learned positions end at the trained context.
            rt.n_ctx = rt.n_ctx.min(config.n_ctx_train);
        }
        rt.repack(options, |g| weights.pack(g))?;
        rt.weight_bytes_per_token = weights.bytes_per_token();
        Ok(Encoder {
            rt,
            config,
            weights,
            classifier,
        })
    }

    pub fn config(&self) -> &EncoderConfig {
        &self.config
    }

    /// Checks that each sequence comes whole, from position 0, asking for embeddings.
    fn check(&self, memory: &StepMemory<'_>, seqs: &[SeqInput<'_>]) -> Result<(), EngineError> {
        for (i, s) in seqs.iter().enumerate() {
            if s.output != Output::Embeddings {
                return Err(ModelError::EmbeddingOnly {
                    arch: self.config.arch.clone(),
                }
                .into());
            }
            if memory.len(i) != 0 {
                return Err(EngineError::State(format!(
                    "{}: an encoder takes each sequence whole in one step (sequence {i} already holds {} positions)",
                    self.config.arch,
                    memory.len(i)
                )));
            }
        }
        Ok(())
    }

    /// The rows of whole sequences through every layer; each row wanting output gets its
    /// hidden state.
    fn run(
        &self,
        rows: &[Row],
        spans: &[Span],
        out: &mut [&mut Vec<f32>],
        s: &mut Scratch,
    ) -> Result<(), EngineError> {
        let c = &self.config;
        let (n, e) = (rows.len(), c.n_embd);
        let gguf = &*self.rt.gguf;
        let x = sized(&mut s.x, n * e);
        let embd = self.weights.token_embd.view(gguf)?;
        scaffold::embed(rows, &embd, None, &[], x)?;
        let positions = self
            .weights
            .position_embd
            .as_ref()
            .map(|p| p.view(gguf))
            .transpose()?;
        let token_type = self.weights.token_type.as_deref();
        let mut pos_row = vec![0.0f32; if positions.is_some() { e } else { 0 }];
        for (row, xt) in rows.iter().zip(x.chunks_exact_mut(e)) {
            if let Some(t) = token_type {
                xt.iter_mut().zip(t).for_each(|(a, b)| *a += b);
            }
            if let Some(p) = &positions {
                p.dequant_row(row.pos, &mut pos_row)
                    .map_err(ModelError::from)?;
                xt.iter_mut().zip(&pos_row).for_each(|(a, b)| *a += b);
            }
        }
        norm_rows(x, &self.weights.embd_norm, c.norm_eps);
        for lw in &self.weights.layers {
            self.attention(lw, rows, spans, s)?;
            self.ffn(lw, n, s)?;
        }
        for (row, xt) in rows.iter().zip(s.x.chunks_exact(e)) {
            if let Some(slot) = row.logits_row {
                out[row.seq][slot * e..(slot + 1) * e].copy_from_slice(xt);
            }
        }
        Ok(())
    }

    fn attention(
        &self,
        lw: &LayerWeights,
        rows: &[Row],
        spans: &[Span],
        s: &mut Scratch,
    ) -> Result<(), EngineError> {
        let c = &self.config;
        let (n, e, hd) = (rows.len(), c.n_embd, c.head_dim);
        let gguf = &*self.rt.gguf;
        let q = sized(&mut s.q, n * e);
        let k = sized(&mut s.k, n * e);
        let v = sized(&mut s.v, n * e);
        lw.qkv.project(
            gguf,
            &s.x,
            n,
            (&mut *q, &mut *k, &mut *v),
            &mut s.qkv,
            &mut s.xq,
        )?;
        if let Some(b) = &lw.qkv_bias {
            for (buf, bias) in [&mut *q, &mut *k, &mut *v].into_iter().zip(b.chunks(e)) {
                add_bias(buf, bias);
            }
        }
        for (buf, norm) in [(&mut *q, &lw.q_norm), (&mut *k, &lw.k_norm)] {
            if let Some(norm) = norm {
                norm_rows(buf, norm, c.norm_eps);
            }
        }
        if let Positions::Rotary(rope) = &c.positions {
            q.par_chunks_mut(e)
                .zip(k.par_chunks_mut(e))
                .zip(rows.par_iter())
                .for_each_init(Vec::new, |angles, ((qt, kt), row)| {
                    rope.angles(row.pos, angles);
                    rope.apply(qt, hd, angles);
                    rope.apply(kt, hd, angles);
                });
        }
        let attn = sized(&mut s.attn, n * e);
        let bidirectional = !c.causal && !matches!(c.positions, Positions::Alibi { .. });
        if bidirectional && hd <= ferrox_core::dense_attn::MAX_HEAD_DIM {
            // Every row of a sequence attends to every row of it: one dense attention per
            // sequence (its rows are contiguous).
            let attention = ferrox_core::dense_attn::DenseAttention {
                n_head: c.n_head,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                kv: if self.rt.kv_storage == KvStorage::F16 {
                    ferrox_core::dense_attn::KvPrecision::F16
                } else {
                    ferrox_core::dense_attn::KvPrecision::F32
                },
            };
            let mut done = 0;
            for span in spans.iter().filter(|s| s.end > s.start) {
                let at = span.start * e..span.end * e;
                let len = span.end - span.start;
                attention.run(
                    &q[at.clone()],
                    &k[at.clone()],
                    &v[at.clone()],
                    len,
                    &mut attn[at],
                    &mut s.dense,
                );
                done += len;
            }
            debug_assert_eq!(done, n, "every row in one sequence's span");
            return self.attention_output(lw, n, s);
        }
        let f16_rows = (self.rt.kv_storage == KvStorage::F16).then_some((&mut s.k16, &mut s.v16));
        let (keys, values) = kv_rows((&*k, &*v), f16_rows);
        let params = AttentionParams {
            scale: 1.0 / (hd as f32).sqrt(),
            softcap: None,
        };
        let attn = &mut s.attn[..n * e];
        let q = &*q;
        attn.par_chunks_mut(hd)
            .enumerate()
            .for_each_init(Vec::new, |scores, (i, out)| {
                let (t, head) = (i / c.n_head, i % c.n_head);
                let span = spans[rows[t].seq];
                let view = KvView::head_of((keys, values), e, head, hd);
                let hi = if c.causal { t + 1 } else { span.end };
                let q_head = &q[t * e + head * hd..t * e + (head + 1) * hd];
                match c.positions {
                    Positions::Alibi { max_bias } => {
                        let slope = alibi_slope(max_bias, c.n_head, head);
                        let pos = rows[t].pos as f32;
                        let bias = |j: usize| slope * -(pos - rows[j].pos as f32).abs();
                        let scale = params.scale;
                        attend_biased(q_head, &view, span.start, hi, scale, bias, scores, out);
                    }
                    _ => attend(q_head, &view, span.start, hi, &params, out),
                }
            });
        self.attention_output(lw, n, s)
    }

    /// The attention's output projection and the residual norms, from `s.attn`.
    fn attention_output(
        &self,
        lw: &LayerWeights,
        n: usize,
        s: &mut Scratch,
    ) -> Result<(), EngineError> {
        let c = &self.config;
        let e = c.n_embd;
        let gguf = &*self.rt.gguf;
        let attn = &s.attn[..n * e];
        let proj = sized(&mut s.proj, n * e);
        linear(&lw.wo.view(gguf)?, attn, n, proj, &mut s.xq)?;
        if let Some(b) = &lw.wo_bias {
            add_bias(proj, b);
        }
        let x = &mut s.x[..n * e];
        match &lw.attn_norm_2 {
            // The layer's input is added again before the second norm.
            Some(norm_2) => {
                let input = sized(&mut s.layer_in, n * e);
                input.copy_from_slice(x);
                residual_norm(x, proj, &lw.attn_out_norm, c.norm_eps);
                residual_norm(x, input, norm_2, c.norm_eps);
            }
            None => residual_norm(x, proj, &lw.attn_out_norm, c.norm_eps),
        }
        Ok(())
    }

    fn ffn(&self, lw: &LayerWeights, n: usize, s: &mut Scratch) -> Result<(), EngineError> {
        let c = &self.config;
        let e = c.n_embd;
        match &lw.ffn {
            FfnWeights::Dense(d) => self.dense_ffn(d, n, s)?,
            FfnWeights::Experts(x) => {
                let (Some(moe), gguf) = (&c.moe, &*self.rt.gguf) else {
                    return Err(ModelError::Config("experts on a dense encoder".into()).into());
                };
                let experts =
                    MoeExperts::ungated(x.up.view(gguf)?, x.down.view(gguf)?, MoeActivation::Gelu)
                        .map_err(moe_error)?;
                router_logits(&x.router.view(gguf)?, &s.x[..n * e], &mut s.router_logits)
                    .map_err(moe_error)?;
                let proj = sized(&mut s.proj, n * e);
                let (x_in, logits) = (&s.x[..n * e], &s.router_logits);
                moe_ffn(&moe.router, &experts, x_in, logits, None, proj, &mut s.moe)
                    .map_err(moe_error)?;
            }
        }
        let proj = &s.proj[..n * e];
        residual_norm(&mut s.x[..n * e], proj, &lw.out_norm, c.norm_eps);
        Ok(())
    }

    /// A dense FFN of the micro-batch's `n` rows, its output in `s.proj`.
    fn dense_ffn(&self, d: &DenseFfn, n: usize, s: &mut Scratch) -> Result<(), EngineError> {
        let c = &self.config;
        let (e, ff) = (c.n_embd, c.n_ff);
        let gguf = &*self.rt.gguf;
        let up_w = d.up.view(gguf)?;
        let up = sized(&mut s.up, n * up_w.rows());
        match (&d.gate, c.ffn) {
            (Some(gate_w), ffn) => {
                let gate = sized(&mut s.gate, n * ff);
                let gate_w = gate_w.view(gguf)?;
                let outs = &mut [&mut *up, &mut *gate];
                linear_many(&[&up_w, &gate_w], &s.x, n, outs, &mut s.xq)?;
                if let Some(b) = &d.up_bias {
                    add_bias(up, b);
                }
                let act = match ffn {
                    EncoderFfn::SwiGlu => Activation::Silu,
                    _ => Activation::Gelu,
                };
                gated_rows(act, gate, up, ff);
                up.copy_from_slice(gate);
            }
            // GEGLU with the gate as the first half of the up projection's rows.
            (None, EncoderFfn::GeGlu) => {
                linear(&up_w, &s.x, n, up, &mut s.xq)?;
                if let Some(b) = &d.up_bias {
                    add_bias(up, b);
                }
                let gate = sized(&mut s.gate, n * ff);
                gate.par_chunks_mut(ff)
                    .zip(up.par_chunks(2 * ff))
                    .for_each(|(g, both)| {
                        g.copy_from_slice(&both[..ff]);
                        gated(Activation::Gelu, g, &both[ff..]);
                    });
                up[..n * ff].copy_from_slice(gate);
            }
            (None, _) => {
                linear(&up_w, &s.x, n, up, &mut s.xq)?;
                if let Some(b) = &d.up_bias {
                    add_bias(up, b);
                }
                up.par_chunks_mut(ff)
                    .for_each(|row| row.iter_mut().for_each(|x| *x = gelu(*x)));
            }
        }
        let up = &s.up[..n * ff];
        let proj = sized(&mut s.proj, n * e);
        linear(&d.down.view(gguf)?, up, n, proj, &mut s.xq)?;
        if let Some(b) = &d.down_bias {
            add_bias(proj, b);
        }
        Ok(())
    }
}

/// `buf[..len]` of f16 values, grown if needed.
/// Adds `bias` to each row of `x` (rows of the bias's width).
fn add_bias(x: &mut [f32], bias: &[f32]) {
    x.par_chunks_mut(bias.len())
        .for_each(|row| row.iter_mut().zip(bias).for_each(|(a, b)| *a += b));
}

/// LayerNorm of each row in place.
fn norm_rows(x: &mut [f32], norm: &LayerNormWeights, eps: f32) {
    x.par_chunks_mut(norm.weight.len())
        .for_each(|row| layer_norm_in_place(row, &norm.weight, Some(&norm.bias), eps));
}

/// The post-norm residual: `x = LayerNorm(y + x)`.
fn residual_norm(x: &mut [f32], y: &[f32], norm: &LayerNormWeights, eps: f32) {
    x.par_iter_mut()
        .zip(y.par_iter())
        .for_each(|(a, b)| *a += b);
    norm_rows(x, norm, eps);
}

/// Micro-batches of whole sequences: consecutive sequences while their rows fit
/// [`MAX_MICRO_BATCH`] (a longer sequence goes alone).
fn micro_batches(rows: &[Row]) -> Vec<std::ops::Range<usize>> {
    let mut batches = Vec::new();
    let mut start = 0;
    let mut seq_start = 0;
    for i in 1..=rows.len() {
        let ends_seq = i == rows.len() || rows[i].seq != rows[i - 1].seq;
        if !ends_seq {
            continue;
        }
        if i - start > MAX_MICRO_BATCH && seq_start > start {
            batches.push(start..seq_start);
            start = seq_start;
        }
        seq_start = i;
    }
    if start < rows.len() {
        batches.push(start..rows.len());
    }
    batches
}

impl Engine for Encoder {
    fn architecture(&self) -> &str {
        &self.rt.arch
    }

    fn gguf(&self) -> &Gguf {
        &self.rt.gguf
    }

    fn memory_spec(&self) -> MemorySpec {
        MemorySpec {
            paged: Vec::new(),
            recurrent: None,
            storage: self.rt.kv_storage,
            row_lag: 0,
        }
    }

    fn vocab_size(&self) -> usize {
        self.rt.n_vocab
    }

    fn embedding_size(&self) -> usize {
        self.rt.n_embd
    }

    fn is_encoder(&self) -> bool {
        true
    }

    fn has_classifier(&self) -> bool {
        self.classifier.is_some()
    }

    fn classify(&self, pooled: &[f32]) -> Result<Vec<f32>, EngineError> {
        match &self.classifier {
            Some(head) => Ok(head.apply(&self.rt.gguf, pooled)?),
            None => Err(EngineError::NoClassifier(self.rt.arch.clone())),
        }
    }

    fn context_size(&self) -> usize {
        self.rt.n_ctx
    }

    fn threads(&self) -> usize {
        self.rt.pool.current_num_threads()
    }

    fn weight_bytes_per_token(&self) -> u64 {
        self.rt.weight_bytes_per_token
    }

    fn new_scratch(&self) -> StepScratch {
        StepScratch::new(StepBuffers::<Scratch>::default())
    }

    fn step(
        &self,
        memory: &mut StepMemory<'_>,
        scratch: &mut StepScratch,
        seqs: &[SeqInput<'_>],
        out: &mut [&mut Vec<f32>],
    ) -> Result<(), EngineError> {
        let StepBuffers {
            rows,
            embeddings,
            engine,
        } = scratch.get::<StepBuffers<Scratch>>();
        let widths = (self.rt.n_vocab, self.rt.n_embd);
        scaffold::layout(
            memory,
            seqs,
            (widths.0, widths.1, widths.1),
            out,
            rows,
            (scaffold::InputKinds::default(), embeddings),
        )?;
        self.check(memory, seqs)?;
        self.rt.pool.install(|| {
            for batch in micro_batches(rows) {
                let chunk = &rows[batch.clone()];
                // Each sequence's rows, as indices into the chunk.
                let mut spans = vec![Span { start: 0, end: 0 }; seqs.len()];
                for (i, r) in chunk.iter().enumerate() {
                    if i == 0 || chunk[i - 1].seq != r.seq {
                        spans[r.seq].start = i;
                    }
                    spans[r.seq].end = i + 1;
                }
                self.run(chunk, &spans, out, engine)?;
                scaffold::advance(memory, chunk);
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(lens: &[usize]) -> Vec<Row> {
        lens.iter()
            .enumerate()
            .flat_map(|(seq, &len)| {
                (0..len).map(move |pos| Row {
                    seq,
                    pos,
                    token: 0,
                    logits_row: None,
                    output: Output::Embeddings,
                    embedding: None,
                    attend_end: pos + 1,
                    rope: crate::layers::rope::RopePos::at(pos),
                })
            })
            .collect()
    }

    #[test]
    fn micro_batches_keep_sequences_whole() {
        let m = MAX_MICRO_BATCH;
        assert_eq!(micro_batches(&rows(&[3, 4])), vec![0..7]);
        assert_eq!(micro_batches(&rows(&[m, 1])), vec![0..m, m..m + 1]);
        assert_eq!(micro_batches(&rows(&[m + 5])), vec![0..m + 5]);
        assert_eq!(
            micro_batches(&rows(&[10, m + 5, 2])),
            vec![0..10, 10..m + 15, m + 15..m + 17]
        );
        assert!(micro_batches(&rows(&[])).is_empty());
    }
}
