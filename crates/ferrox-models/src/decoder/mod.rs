//! The dense decoder: one engine for every GQA + RoPE transformer family
//! (llama, qwen2/3, gemma/2/3, phi3). Family differences live in [`crate::families`];
//! the shared pieces in [`crate::layers`].

mod config;
mod weights;

use std::sync::Arc;

use ferrox_gguf::Gguf;
use ferrox_memory::{MemorySpec, StepMemory};
use rayon::prelude::*;

pub use config::{
    apply_swa_pattern, moe_error, read_common, DecoderConfig, FfnKind, Keys, LayerConfig,
    MoeFfnConfig,
};
pub use weights::DecoderWeights;

use crate::engine::{Engine, EngineError, EngineOptions};
use crate::layers::activation::{gated, gated_rows};
use crate::layers::attention::AttentionParams;
use crate::layers::classifier::ClassifierHead;
use crate::layers::kv_rotation::KvRotation;
use crate::layers::linear::{linear, linear_many};
use crate::layers::norm::rms_norm_in_place;
use crate::layers::paged_attention::{attend, HeadGroup};
use crate::scaffold::{self, sized, HeadScratch, OutputHead, Row, Runtime};
use crate::ModelError;
use weights::{FfnWeights, GateUpWeights};

/// The store of the decoder's memory: one key and one value row per position and layer.
const KV_STORE: usize = 0;

/// A dense transformer decoder over a memory-mapped GGUF checkpoint.
pub struct Decoder {
    rt: Runtime,
    config: DecoderConfig,
    weights: DecoderWeights,
    rotation: KvRotation,
    /// A reranker's head (`cls.output`), if the file has one.
    classifier: Option<ClassifierHead>,
}

/// Activations for a micro-batch, reused across steps so decoding does not allocate.
#[derive(Default)]
pub struct Scratch {
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
    head: HeadScratch,
    /// The rows the last layer's feed-forward runs for.
    output_rows: scaffold::OutputRows,
    /// MoE router logits (`n_expert` per token) and the expert FFN's buffers.
    router_logits: Vec<f32>,
    moe: ferrox_moe::MoeScratch,
}

/// The largest divisor of `n` not above `cap`.
/// Query heads per attention task: the largest number (a divisor of the heads sharing a KV
/// head, at most `cap`) that still gives every thread the same number of tasks, or at least
/// two each; else one. Heads attended together read (and decode) each key and value once.
fn heads_per_task(rows: usize, n_head: usize, group: usize, cap: usize, threads: usize) -> usize {
    (1..=cap.min(group))
        .rev()
        .filter(|&d| group.is_multiple_of(d))
        .find(|&d| {
            let tasks = rows * n_head / d;
            tasks.is_multiple_of(threads) || tasks >= 2 * threads
        })
        .unwrap_or(1)
}

impl Decoder {
    /// A decoder for a configuration its family has read.
    pub fn with_config(
        gguf: Arc<Gguf>,
        options: &EngineOptions,
        mut config: DecoderConfig,
    ) -> Result<Decoder, ModelError> {
        let head_dims = config.layers.iter().map(|l| (l.head_dim_k, l.head_dim_v));
        let rotation = KvRotation::new(options.kv_storage, head_dims)?;
        let mut weights = DecoderWeights::load(&gguf, &config)?;
        let classifier = ClassifierHead::load(&gguf, config.n_embd, config.rank_softmax)?;
        if let Some(freqs) = &weights.rope_freqs {
            for layer in &mut config.layers {
                layer.rope.freq_factors = Some(freqs.clone());
            }
        }
        let mut rt = Runtime::new(
            gguf,
            options,
            (config.n_ctx_train, config.n_vocab, config.n_embd),
            "ferrox-worker",
        )?;
        // Each worker's RoPE buffer, made now rather than by whichever step first runs on it.
        let rope_pairs = config.layers.iter().map(|l| l.rope.n_dims / 2).max();
        rt.pool
            .broadcast(|_| ROPE_ANGLES.with_borrow_mut(|a| a.reserve(rope_pairs.unwrap_or(0))));
        rt.repack(options, |g| weights.pack(g))?;
        rt.weight_bytes_per_token = weights.bytes_per_token(&config);
        Ok(Decoder {
            rt,
            config,
            weights,
            rotation,
            classifier,
        })
    }

    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    /// One micro-batch of rows (from one or more sequences, each sequence's rows in
    /// position order) through every layer, then the output head for the rows that want
    /// logits.
    fn run_layers(
        &self,
        rows: &[Row],
        embeddings: &[f32],
        kv: &mut StepMemory<'_>,
        seq_logits: &mut [&mut Vec<f32>],
        s: &mut Scratch,
    ) -> Result<(), EngineError> {
        let c = &self.config;
        let x = sized(&mut s.x, rows.len() * c.n_embd);
        let embd = self.weights.token_embd.view(&self.rt.gguf)?;
        let width = c.n_embd * (1 + c.deepstack_layers);
        scaffold::embed_given(rows, &embd, c.embedding_scale, (embeddings, width), x)?;
        let last = c.layers.len().saturating_sub(1);
        s.output_rows.reset();
        for (il, (lc, lw)) in c.layers.iter().zip(&self.weights.layers).enumerate() {
            self.attention_block(il, lc, lw, rows, kv, s)?;
            let n = match il == last && il >= c.deepstack_layers {
                true => s.output_rows.keep(rows, &mut s.x, c.n_embd),
                false => rows.len(),
            };
            if n > 0 {
                self.ffn_block(lc, lw, n, s)?;
            }
            if il < c.deepstack_layers {
                // A given row's slice `il + 1` joins its hidden state (token rows add zeros).
                let n_embd = c.n_embd;
                let slice = (il + 1) * n_embd;
                s.x[..rows.len() * n_embd]
                    .par_chunks_mut(n_embd)
                    .zip(rows.par_iter())
                    .for_each(|(x, row)| {
                        if let Some(i) = row.embedding {
                            let add = &embeddings[i * width + slice..][..n_embd];
                            x.iter_mut().zip(add).for_each(|(x, a)| *x += a);
                        }
                    });
            }
        }
        scaffold::advance(kv, rows);
        let head = OutputHead {
            norm: &self.weights.output_norm,
            eps: c.norm_eps,
            output: self.weights.output.view(&self.rt.gguf)?,
            softcap: c.final_logit_softcap,
        };
        head.run(s.output_rows.of(rows), &s.x, seq_logits, &mut s.head)
    }

    fn attention_block(
        &self,
        il: usize,
        lc: &LayerConfig,
        lw: &weights::LayerWeights,
        rows: &[Row],
        kv: &mut StepMemory<'_>,
        s: &mut Scratch,
    ) -> Result<(), EngineError> {
        let n = rows.len();
        let c = &self.config;
        let n_embd = c.n_embd;
        let (hd_k, hd_v) = (lc.head_dim_k, lc.head_dim_v);
        let (q_w, k_w, v_w) = (lc.n_head * hd_k, lc.n_head_kv * hd_k, lc.n_head_kv * hd_v);
        let xn = sized(&mut s.xn, n * n_embd);
        scaffold::norm_rows(&s.x[..n * n_embd], &lw.attn_norm, c.norm_eps, xn);
        let q = sized(&mut s.q, n * q_w);
        let k = sized(&mut s.k, n * k_w);
        let v = sized(&mut s.v, n * v_w);
        let gguf = &*self.rt.gguf;
        lw.qkv.project(
            gguf,
            xn,
            n,
            (&mut *q, &mut *k, &mut *v),
            &mut s.qkv,
            &mut s.xq,
        )?;
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
                    lc.rope.angles_at(row.rope, angles);
                    lc.rope.apply(qt, hd_k, angles);
                    lc.rope.apply(kt, hd_k, angles);
                });
                if let Some(scale) = c.query_scale {
                    qt.iter_mut().for_each(|x| *x *= scale);
                }
                self.rotation.queries_and_keys(qt, kt);
            });
        if self.rotation.values.is_some() {
            v.par_chunks_mut(v_w)
                .for_each(|vt| self.rotation.values(vt));
        }
        for (t, row) in rows.iter().enumerate() {
            let (kt, vt) = (&k[t * k_w..(t + 1) * k_w], &v[t * v_w..(t + 1) * v_w]);
            kv.write(KV_STORE, row.seq, il, row.pos, kt, vt);
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
        // for all of them) as far as every thread stays busy. The results are the same bits
        // either way.
        let per_task = heads_per_task(
            n,
            lc.n_head,
            group,
            ferrox_core::flash_attn::MAX_GROUP,
            self.threads(),
        );
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
                // Causal, or to the end of a bidirectional span (an image's tokens).
                let hi = rows[t].attend_end;
                attend(kv, KV_STORE, at, q_heads, lo, hi, &params, out);
                self.rotation.values(out);
            });

        let proj = sized(&mut s.proj, n * n_embd);
        linear(&lw.wo.view(&self.rt.gguf)?, attn, n, proj, &mut s.xq)?;
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
        scaffold::norm_rows(&s.x[..n * n_embd], &lw.ffn_norm, c.norm_eps, xn);
        let (gate_up, down) = match &lw.ffn {
            FfnWeights::Dense { gate_up, down } => (gate_up, down),
            FfnWeights::Moe(mw) => {
                let FfnKind::Moe(mc) = &lc.ffn else {
                    return Err(ModelError::Config("MoE weights on a dense layer".into()).into());
                };
                let proj = sized(&mut s.proj, n * n_embd);
                let xn = &s.xn[..n * n_embd];
                mw.forward(
                    &self.rt.gguf,
                    &mc.router,
                    xn,
                    proj,
                    &mut s.router_logits,
                    &mut s.moe,
                )?;
                self.residual_add(&lw.ffn_post_norm, n, s);
                return Ok(());
            }
        };
        let n_ff = lc.n_ff;
        let gate = sized(&mut s.gate, n * n_ff);
        match gate_up {
            GateUpWeights::Separate { gate: wg, up: wu } => {
                let up = sized(&mut s.up, n * n_ff);
                let (wg, wu) = (wg.view(&self.rt.gguf)?, wu.view(&self.rt.gguf)?);
                linear_many(&[&wg, &wu], xn, n, &mut [&mut *gate, &mut *up], &mut s.xq)?;
                gated_rows(c.activation, gate, up, n_ff);
            }
            GateUpWeights::Fused(w) => {
                let both = sized(&mut s.up, n * 2 * n_ff);
                linear(&w.view(&self.rt.gguf)?, xn, n, both, &mut s.xq)?;
                let gate_row = |(gate, both): (&mut [f32], &mut [f32])| {
                    let (g, u) = both.split_at_mut(n_ff);
                    gated(c.activation, g, u);
                    gate.copy_from_slice(g);
                };
                if n == 1 || n_ff == 0 {
                    gate_row((gate, both));
                } else {
                    gate.par_chunks_mut(n_ff)
                        .zip(both.par_chunks_mut(2 * n_ff))
                        .for_each(gate_row);
                }
            }
        }
        let proj = sized(&mut s.proj, n * n_embd);
        linear(&down.view(&self.rt.gguf)?, gate, n, proj, &mut s.xq)?;
        self.residual_add(&lw.ffn_post_norm, n, s);
        Ok(())
    }

    /// `x += post_norm(proj)` (or `x += proj` without a post norm).
    fn residual_add(&self, post_norm: &Option<Vec<f32>>, n: usize, s: &mut Scratch) {
        let n_embd = self.config.n_embd;
        scaffold::residual_add(
            &mut s.x[..n * n_embd],
            &mut s.proj[..n * n_embd],
            n_embd,
            post_norm.as_deref(),
            self.config.norm_eps,
        );
    }
}

thread_local! {
    /// Each worker's RoPE (cos, sin) pairs for the token it is rotating.
    static ROPE_ANGLES: std::cell::RefCell<Vec<(f32, f32)>> = const { std::cell::RefCell::new(Vec::new()) };
}

crate::scaffold::engine_from_body!(Decoder);

impl scaffold::EngineBody for Decoder {
    type Buffers = Scratch;

    fn runtime(&self) -> &Runtime {
        &self.rt
    }

    fn classifier(&self) -> Option<&ClassifierHead> {
        self.classifier.as_ref()
    }

    fn takes_embeddings(&self) -> bool {
        true
    }

    fn takes_bidirectional(&self) -> bool {
        true
    }

    fn takes_image_grids(&self) -> bool {
        self.config.layers.iter().all(|l| l.rope.mrope.is_some())
    }

    fn input_width(&self) -> usize {
        self.config.n_embd * (1 + self.config.deepstack_layers)
    }

    /// One key and one value row per position and layer (the widest layer's, for every
    /// layer).
    fn memory_spec(&self) -> MemorySpec {
        let (key_width, value_width) = self.config.kv_widths();
        let n_layer = self.config.n_layer();
        MemorySpec::one_store(n_layer, key_width, value_width, self.rt.kv_storage)
    }

    fn micro_batch(
        &self,
        rows: &[Row],
        embeddings: &[f32],
        memory: &mut StepMemory<'_>,
        logits: &mut [&mut Vec<f32>],
        buffers: &mut Scratch,
    ) -> Result<(), EngineError> {
        self.run_layers(rows, embeddings, memory, logits, buffers)
    }
}

#[cfg(test)]
mod tests {
    use super::heads_per_task;

    #[test]
    fn heads_go_together_while_every_thread_stays_busy() {
        // Qwen2.5-0.5B decode (14 heads, 7 per KV head) on two threads: one task per KV head.
        assert_eq!(heads_per_task(1, 14, 7, 8, 2), 7);
        // Gemma-3-270M decode (4 heads on one KV head): two tasks of two.
        assert_eq!(heads_per_task(1, 4, 4, 8, 2), 2);
        // Sixteen threads and one row: a head per task.
        assert_eq!(heads_per_task(1, 14, 7, 8, 16), 1);
        // A prompt: whole groups, capped.
        assert_eq!(heads_per_task(64, 14, 7, 8, 16), 7);
        assert_eq!(heads_per_task(64, 32, 16, 8, 16), 8);
        // Three threads, two KV heads of six: 4 tasks of three would leave one thread with
        // two, 6 tasks of two are even.
        assert_eq!(heads_per_task(1, 12, 6, 8, 3), 2);
    }
}
