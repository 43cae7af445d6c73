//! The Kimi engine: Kimi Delta Attention layers ([`kda`]) interleaved with NoPE Multi-head
//! Latent Attention layers (the MLA engine's attention with no rotation), dense FFNs then
//! routed experts with a shared expert. It runs two architectures:
//!
//! * Kimi Linear (`kimi-linear`): SwiGLU FFNs, the KDA output gate in low rank;
//! * Kimi-K3 (`kimi-k3`, [`K3Config`]): residual attention across layers over block
//!   checkpoints ([`residual`]), SiTU FFNs and experts in a latent space ([`latent`]), a
//!   sigmoid gate on the MLA heads' output, a full-rank KDA output gate and, optionally, the
//!   KDA's lower-bound decay.
//!
//! Its memory is hybrid: the MLA layers keep one latent row per position in a paged store;
//! the KDA layers keep a recurrent state per sequence (three convolution windows and one
//! delta-rule matrix per head), which collapses the history: a sequence rolls back only to
//! the states checkpointed at block ends (llama.cpp does not roll kimi-linear back at all).
//! Kimi-K3 can also keep the state after each of a step's last few positions
//! ([`KimiEngine::set_rollback_depth`], llama.cpp's `n_rs_seq` snapshots), so it rolls back
//! that many tokens anywhere.

mod config;
mod delta_rule;
pub mod kda;
mod lanes;
mod latent;
mod residual;
mod weights;

use std::sync::Arc;

use ferrox_gguf::Gguf;
use ferrox_memory::{MemorySpec, PagedStoreSpec, RecurrentSpec, StepMemory};

pub use config::{K3Config, KimiConfig, Situ};

use crate::engine::{EngineError, EngineOptions};
use crate::layers::linear::linear;
use crate::layers::mla::attention::{attend_heads, attention, project, AttnScratch, KeySet};
use crate::layers::mla::{ffn, MlaLayer, Path};
use crate::scaffold::{self, sized, HeadScratch, OutputHead, Row, Runtime};
use crate::ModelError;
use kda::KdaScratch;
use latent::LatentScratch;
use residual::MixedStream;
use weights::{KimiLayer, KimiWeights, Mixer};

/// Most tokens [`KimiEngine::set_rollback_depth`] allows: the sequence memory keeps a
/// sequence's four latest checkpoints, the state at its end and at the three positions
/// before it. (A step's own checkpoints push out older ones, a block end's among them, which
/// then no longer serves prefix reuse.)
pub const MAX_ROLLBACK_DEPTH: usize = 3;

/// A Kimi Linear or Kimi-K3 model over a memory-mapped GGUF checkpoint.
pub struct KimiEngine {
    rt: Runtime,
    config: KimiConfig,
    weights: KimiWeights,
    /// Tokens a sequence can roll back by anywhere (0: only to block ends).
    rollback_depth: usize,
}

#[derive(Default)]
pub struct Scratch {
    /// The residual stream, a sublayer's normalized input and its output.
    x: Vec<f32>,
    xn: Vec<f32>,
    proj: Vec<f32>,
    stream: MixedStream,
    attn: AttnScratch,
    /// The MLA output gate's logits, and activations quantized for its products.
    gate: Vec<f32>,
    xq: Vec<u8>,
    kda: KdaScratch,
    /// The rows of one pass when a micro-batch runs in several.
    pass_rows: Vec<Row>,
    head: HeadScratch,
    router_logits: Vec<f32>,
    latent: LatentScratch,
    output_rows: scaffold::OutputRows,
}

impl KimiEngine {
    pub fn with_config(
        gguf: Arc<Gguf>,
        options: &EngineOptions,
        config: KimiConfig,
    ) -> Result<KimiEngine, ModelError> {
        // The MLA layers' latent rows take the cache type; the KDA layers' recurrent
        // states stay f32, as llama.cpp's hybrid memory keeps them.
        let options = &crate::layers::mla::latent_cache_options(options, &config.mla, &[])?;
        let mut weights = KimiWeights::load(&gguf, &config)?;
        let c = &config.mla;
        let mut rt = Runtime::new(
            gguf,
            options,
            (c.n_ctx_train, c.n_vocab, c.n_embd),
            "ferrox-kimi",
        )?;
        rt.repack(options, |g| weights.pack(g))?;
        rt.weight_bytes_per_token = weights.bytes_per_token(&config);
        Ok(KimiEngine {
            rt,
            config,
            weights,
            rollback_depth: 0,
        })
    }

    pub fn config(&self) -> &KimiConfig {
        &self.config
    }

    /// Checkpoints each sequence's state after each of the last `depth` positions of every
    /// step (llama.cpp's `n_rs_seq`), so a sequence can roll back up to `depth` tokens
    /// (speculative decoding); 0, the default, checkpoints at block ends only. Each
    /// checkpoint copies the sequence's whole recurrent state. Kimi-K3 only, as in llama.cpp;
    /// at most [`MAX_ROLLBACK_DEPTH`].
    pub fn set_rollback_depth(&mut self, depth: usize) -> Result<(), ModelError> {
        if depth > 0 && self.config.k3.is_none() {
            return Err(ModelError::Config(format!(
                "{} cannot roll its recurrent state back by tokens",
                self.config.mla.arch
            )));
        }
        if depth > MAX_ROLLBACK_DEPTH {
            return Err(ModelError::Config(format!(
                "a rollback depth of {depth} tokens: at most {MAX_ROLLBACK_DEPTH}"
            )));
        }
        self.rollback_depth = depth;
        Ok(())
    }

    /// Tokens a sequence can roll back by (besides to its block-end checkpoints).
    pub fn rollback_depth(&self) -> usize {
        self.rollback_depth
    }

    /// Layer `layer`'s attention (KDA or MLA) of the normalized rows `xn` into `out`.
    fn attention(
        &self,
        layer: &KimiLayer,
        rows: &[Row],
        xn: &[f32],
        memory: &mut StepMemory<'_>,
        out: &mut [f32],
        s: &mut Scratch,
    ) -> Result<(), EngineError> {
        let (c, gguf) = (&self.config, &*self.rt.gguf);
        let eps = c.mla.norm_eps;
        match &layer.mixer {
            Mixer::Kda { index, kda, .. } => {
                let at = index * c.kda.state_values();
                kda::forward(c.kda, kda, gguf, eps, rows, xn, memory, at, &mut s.kda, out)
            }
            Mixer::Mla { index, layer: mla } => match &layer.mla_gate {
                None => attention(
                    &c.mla,
                    mla,
                    gguf,
                    *index,
                    rows,
                    xn,
                    memory,
                    |_, _| Path::Absorbed,
                    &mut s.attn,
                    out,
                ),
                Some(gate) => self.gated_mla(mla, gate, *index, rows, xn, memory, out, s),
            },
        }
    }

    /// Kimi-K3's MLA: the heads' concatenated values times `sigmoid(attn_gate · xn)`, then
    /// the output projection.
    #[allow(clippy::too_many_arguments)]
    fn gated_mla(
        &self,
        mla: &MlaLayer,
        gate: &crate::tensors::MatrixRef,
        index: usize,
        rows: &[Row],
        xn: &[f32],
        memory: &mut StepMemory<'_>,
        out: &mut [f32],
        s: &mut Scratch,
    ) -> Result<(), EngineError> {
        let (c, gguf) = (&self.config.mla, &*self.rt.gguf);
        let n = rows.len();
        let width = n * c.n_head * c.head_dim_v;
        project(c, mla, gguf, index, rows, xn, memory, &mut s.attn)?;
        let path = |_, _| Path::Absorbed;
        attend_heads(
            c,
            mla,
            gguf,
            index,
            rows,
            memory,
            path,
            KeySet::Causal,
            &mut s.attn,
        )?;
        let g = sized(&mut s.gate, width);
        linear(&gate.view(gguf)?, xn, n, g, &mut s.xq)?;
        let heads = s.attn.heads_mut(width);
        heads
            .iter_mut()
            .zip(g.iter())
            .for_each(|(h, &gv)| *h *= ferrox_moe::numerics::sigmoid(gv));
        linear(&mla.wo.view(gguf)?, heads, n, out, &mut s.xq)?;
        Ok(())
    }

    /// Layer `il`'s FFN of the normalized rows `xn` into `out`.
    fn ffn(
        &self,
        il: usize,
        layer: &KimiLayer,
        xn: &[f32],
        out: &mut [f32],
        s: &mut Scratch,
    ) -> Result<(), ModelError> {
        let (c, gguf) = (&self.config, &*self.rt.gguf);
        let (_, _, weights) = layer.norms_and_ffn();
        let kind = &c.mla.ffn[il];
        match c.k3 {
            None => {
                let (logits, moe) = (&mut s.router_logits, &mut s.latent.moe);
                ffn(gguf, weights, kind, xn, out, logits, moe)
            }
            Some(k3) => {
                let eps = c.mla.norm_eps;
                let latent = layer.latent.as_ref();
                latent::forward(
                    gguf,
                    weights,
                    kind,
                    latent,
                    k3.situ,
                    eps,
                    xn,
                    out,
                    &mut s.latent,
                )
            }
        }
    }
}

crate::scaffold::engine_from_body!(KimiEngine);

impl scaffold::EngineBody for KimiEngine {
    type Buffers = Scratch;

    fn runtime(&self) -> &Runtime {
        &self.rt
    }

    /// Latent rows for the MLA layers; per sequence, every KDA layer's recurrent state.
    fn memory_spec(&self) -> MemorySpec {
        let c = &self.config;
        MemorySpec {
            paged: vec![PagedStoreSpec::per_position(
                c.n_mla(),
                c.mla.cache_width(),
                0,
            )],
            recurrent: Some(RecurrentSpec {
                values: c.n_kda() * c.kda.state_values(),
                ring_slack: 0,
                step_checkpoints: self.rollback_depth,
            }),
            storage: self.rt.kv_storage,
            row_lag: 0,
        }
    }

    fn checkpoints(&self) -> bool {
        true
    }

    /// Kimi-K3 checkpoints the last `tokens` positions of every step (up to
    /// [`MAX_ROLLBACK_DEPTH`]); Kimi Linear rolls back to block ends only.
    fn enable_rollback(&mut self, tokens: usize) -> Result<(), EngineError> {
        if self.config.k3.is_some() {
            self.set_rollback_depth(tokens.min(MAX_ROLLBACK_DEPTH))?;
        }
        Ok(())
    }

    /// With a rollback depth `d`, each sequence's last `d + 1` rows run one position per
    /// pass after the rest, its state checkpointed after each: at its end and at the `d`
    /// positions before.
    fn micro_batch(
        &self,
        rows: &[Row],
        _embeddings: &[f32],
        memory: &mut StepMemory<'_>,
        logits: &mut [&mut Vec<f32>],
        s: &mut Scratch,
    ) -> Result<(), EngineError> {
        let depth = self.rollback_depth;
        if depth == 0 {
            return self.run_layers(rows, memory, logits, s);
        }
        let mut pass_rows = std::mem::take(&mut s.pass_rows);
        let result = (|| {
            // Each sequence's rows (contiguous) and the length of their tail.
            let runs = sequence_runs(rows).map(|r| (r.end, r.len().min(depth + 1)));
            pass_rows.clear();
            for run in sequence_runs(rows) {
                pass_rows.extend_from_slice(&rows[run.start..run.end - run.len().min(depth + 1)]);
            }
            if !pass_rows.is_empty() {
                self.run_layers(&pass_rows, memory, logits, s)?;
            }
            for back in (0..=depth).rev() {
                pass_rows.clear();
                let tails = runs.clone().filter(|&(_, tail)| tail > back);
                pass_rows.extend(tails.map(|(end, _)| rows[end - 1 - back]));
                if pass_rows.is_empty() {
                    continue;
                }
                self.run_layers(&pass_rows, memory, logits, s)?;
                for r in &pass_rows {
                    memory.checkpoint(r.seq, r.pos + 1);
                }
            }
            Ok(())
        })();
        s.pass_rows = pass_rows;
        result
    }
}

/// The row ranges of each sequence (each sequence's rows are contiguous).
fn sequence_runs(rows: &[Row]) -> impl Iterator<Item = std::ops::Range<usize>> + Clone + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        let seq = rows.get(start)?.seq;
        let end = start + rows[start..].iter().take_while(|r| r.seq == seq).count();
        let run = start..end;
        start = end;
        Some(run)
    })
}

impl KimiEngine {
    /// One pass of rows (each sequence's contiguous, in position order) through every layer
    /// and the output head.
    fn run_layers(
        &self,
        rows: &[Row],
        memory: &mut StepMemory<'_>,
        logits: &mut [&mut Vec<f32>],
        s: &mut Scratch,
    ) -> Result<(), EngineError> {
        let c = &self.config;
        let (n, eps, gguf) = (rows.len(), c.mla.norm_eps, &*self.rt.gguf);
        let n_embd = c.mla.n_embd;
        let res_block = c.k3.map_or(0, |k3| k3.res_block);
        let mut x = std::mem::take(&mut s.x);
        let mut xn = std::mem::take(&mut s.xn);
        let mut proj = std::mem::take(&mut s.proj);
        let result = (|| {
            let x = sized(&mut x, n * n_embd);
            let xn = sized(&mut xn, n * n_embd);
            let proj = sized(&mut proj, n * n_embd);
            scaffold::embed(rows, &self.weights.token_embd.view(gguf)?, None, &[], x)?;
            s.stream.checkpoints.reset(n, n_embd);
            s.output_rows.reset();
            let last_layer = self.weights.layers.len().saturating_sub(1);
            let mut n = n;
            for (il, layer) in self.weights.layers.iter().enumerate() {
                let (attn_norm, ffn_norm, _) = layer.norms_and_ffn();
                let scores = layer.res.as_ref();
                let input = s.stream.input(x, scores.map(|r| &r.attn[..]), eps);
                scaffold::norm_rows(input, attn_norm, eps, xn);
                // A block's first layer banks its raw input and restarts the stream from
                // its attention output.
                let banked = res_block > 0 && il % res_block == 0;
                if banked {
                    s.stream.checkpoints.push(x);
                }
                self.attention(layer, rows, xn, memory, proj, s)?;
                match banked {
                    true => x.copy_from_slice(proj),
                    false => scaffold::residual_add(x, proj, n_embd, None, eps),
                }
                // The last layer's FFN only for the rows that give something back (their
                // checkpoints cut alike).
                if il == last_layer {
                    n = s.output_rows.keep(rows, x, n_embd);
                    s.stream.checkpoints.keep_output_rows(rows, &s.output_rows);
                }
                let (x, xn, proj) = (
                    &mut x[..n * n_embd],
                    &mut xn[..n * n_embd],
                    &mut proj[..n * n_embd],
                );
                let input = s.stream.input(x, scores.map(|r| &r.ffn[..]), eps);
                scaffold::norm_rows(input, ffn_norm, eps, xn);
                self.ffn(il, layer, xn, proj, s)?;
                scaffold::residual_add(x, proj, n_embd, None, eps);
            }
            scaffold::advance(memory, rows);
            let x = &x[..n * n_embd];
            let w = self.weights.output_res_score.as_deref();
            let last = s.stream.input(x, w, eps);
            let head = OutputHead {
                norm: &self.weights.output_norm,
                eps,
                output: self.weights.output.view(gguf)?,
                softcap: None,
            };
            head.run(s.output_rows.of(rows), last, logits, &mut s.head)
        })();
        (s.x, s.xn, s.proj) = (x, xn, proj);
        result
    }
}
