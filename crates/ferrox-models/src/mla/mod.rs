//! The Multi-head Latent Attention engine: DeepSeek-V2/V3-style models (`deepseek2`) and
//! Mistral-4 (`mistral4`, the same graph under another name). Attention caches one
//! compressed row per token and layer; the feed-forward blocks are dense SwiGLU for the
//! leading layers and routed experts plus shared experts after them (`ferrox-moe`). The
//! layers themselves are [`crate::layers::mla`], shared with the engines built on them.
//!
//! # Multi-token prediction
//! With [`EngineOptions::mtp`](crate::EngineOptions) the file's NextN block
//! ([`MtpBlock`]) is loaded and drafts tokens for speculative decoding. The block reads, for
//! position `p`, the trunk's normed final state at `p` and the token at `p + 1`, and writes
//! its own latent row at `p`: so every step also keeps each position's final state (one
//! more store) and runs the block one position behind the trunk, over the pairs the step
//! completes. A draft ([`Engine::draft_mtp`](crate::Engine::draft_mtp)) then continues from
//! the last position: the block's normed output and its greedy token are its next input.

use std::sync::Arc;

use ferrox_gguf::Gguf;
use ferrox_memory::{MemorySpec, StepMemory};

pub use crate::layers::mla::{config_for, yarn_scales, KvB, MlaConfig, MscaleRule};
pub use crate::layers::mla::{MlaFfn, MlaLayer, MlaWeights, MtpBlock};

use crate::engine::EngineError;
use crate::engine::EngineOptions;
use crate::hparams::FfnKind;
use crate::layers::linear::linear;
use crate::layers::mla::attention::{self, AttnScratch};
use crate::layers::mla::{ffn, Path};
use crate::scaffold::{self, sized, HeadScratch, OutputHead, Row, Runtime};
use crate::ModelError;
use crate::TokenId;
use ferrox_core::select::argmax;

/// With a multi-token-prediction block: each position's normed final state.
const HIDDEN_STORE: usize = 1;

/// Most per-head key and value entries a decompressed step may rebuild (256 MiB as f32);
/// beyond that a batch attends in the latent space instead.
const MAX_DECOMPRESSED: usize = 1 << 26;

/// Which form of attention a forward step uses (see [`attention`]'s module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AttentionPath {
    /// llama.cpp's form for the file: absorbed throughout for files with split
    /// `attn_k_b`/`attn_v_b` (so a prompt's results do not depend on how it is split into
    /// chunks or how much of it came from the prefix cache); for a legacy `attn_kv_b` file,
    /// absorbed for single tokens and for a sequence's batch whichever costs fewer operations.
    #[default]
    Auto,
    Absorbed,
    Decompressed,
}

/// An MLA model over a memory-mapped GGUF checkpoint.
pub struct MlaEngine {
    rt: Runtime,
    config: MlaConfig,
    weights: MlaWeights,
    path: AttentionPath,
}

#[derive(Default)]
pub struct Scratch {
    residual: scaffold::Residual,
    attn: AttnScratch,
    head: HeadScratch,
    router_logits: Vec<f32>,
    moe: ferrox_moe::MoeScratch,
    mtp: MtpScratch,
    /// The rows the last layer's feed-forward runs for.
    output_rows: scaffold::OutputRows,
}

impl Scratch {
    /// The trunk's residual stream (or the multi-token-prediction block's), and the buffers
    /// a layer works in.
    fn layer_buffers(&mut self, mtp: bool) -> (&mut scaffold::Residual, LayerBuffers<'_>) {
        let residual = match mtp {
            true => &mut self.mtp.residual,
            false => &mut self.residual,
        };
        let buffers = LayerBuffers {
            attn: &mut self.attn,
            router_logits: &mut self.router_logits,
            moe: &mut self.moe,
            output_rows: &mut self.output_rows,
        };
        (residual, buffers)
    }
}

/// Buffers of the multi-token-prediction block.
#[derive(Default)]
struct MtpScratch {
    rows: Vec<Row>,
    /// The final states the block reads, and the trunk's normed ones.
    h: Vec<f32>,
    hidden: Vec<f32>,
    /// `[RMSNorm(embedding) | RMSNorm(h)]` per row, and the embeddings.
    joined: Vec<f32>,
    embedded: Vec<f32>,
    residual: scaffold::Residual,
    logits: Vec<f32>,
    xq: Vec<u8>,
}

impl MlaEngine {
    /// An engine for a configuration its family has read.
    pub fn with_config(
        gguf: Arc<Gguf>,
        options: &EngineOptions,
        config: MlaConfig,
    ) -> Result<Self, ModelError> {
        let options = &crate::layers::mla::latent_cache_options(options, &config, &[])?;
        let mut weights = match options.mtp {
            true => MlaWeights::load_with_mtp(&gguf, &config)?,
            false => MlaWeights::load(&gguf, &config)?,
        };
        let mut rt = Runtime::new(
            gguf,
            options,
            (config.n_ctx_train, config.n_vocab, config.n_embd),
            "ferrox-mla",
        )?;
        rt.repack(options, |g| weights.pack(g))?;
        rt.weight_bytes_per_token = weights.bytes_per_token(&config);
        Ok(MlaEngine {
            rt,
            config,
            weights,
            path: AttentionPath::Auto,
        })
    }

    /// Forces one form of attention (both give the same results up to rounding).
    pub fn set_attention_path(&mut self, path: AttentionPath) {
        self.path = path;
    }

    pub fn config(&self) -> &MlaConfig {
        &self.config
    }

    /// The form for a sequence's `n` new rows ending at `end` cached positions. Per head,
    /// absorbing costs one `Lkv × (Dn + Dv)` projection per query and `2·Lkv + R` per
    /// query-key pair; decompressing costs that projection per key and `Dk + Dv` per pair,
    /// and memory for every key's heads.
    fn path_for(&self, n: usize, end: usize) -> Path {
        let c = &self.config;
        // A quantized latent cache is read in place, as llama.cpp's flash attention does.
        if !self.rt.kv_storage.is_float() {
            return Path::Absorbed;
        }
        match self.path {
            AttentionPath::Absorbed => Path::Absorbed,
            AttentionPath::Decompressed => Path::Decompressed,
            AttentionPath::Auto
                if n == 1
                    || c.kv_b == KvB::Split
                    || end * c.n_head * (c.head_dim_k + c.head_dim_v) > MAX_DECOMPRESSED =>
            {
                Path::Absorbed
            }
            AttentionPath::Auto => {
                let proj = c.kv_lora_rank * (c.head_dim_nope() + c.head_dim_v);
                let pairs = n * (end - n / 2);
                let absorbed = n * proj + pairs * (2 * c.kv_lora_rank + c.n_rot);
                let decompressed = end * proj + pairs * (c.head_dim_k + c.head_dim_v);
                if decompressed < absorbed {
                    Path::Decompressed
                } else {
                    Path::Absorbed
                }
            }
        }
    }

    /// One micro-batch of rows through every layer, then the output head.
    fn run_layers(
        &self,
        (rows, embeddings): (&[Row], &[f32]),
        memory: &mut StepMemory<'_>,
        seq_logits: &mut [&mut Vec<f32>],
        s: &mut Scratch,
    ) -> Result<(), EngineError> {
        let c = &self.config;
        let gguf = &*self.rt.gguf;
        s.residual
            .embed(rows, &self.weights.token_embd.view(gguf)?, embeddings)?;
        // The multi-token-prediction block reads every row's final state.
        let last = match self.weights.mtp {
            None => self.weights.layers.len().checked_sub(1),
            Some(_) => None,
        };
        s.output_rows.reset();
        for (il, lw) in self.weights.layers.iter().enumerate() {
            let (residual, mut buffers) = s.layer_buffers(false);
            let keep = Some(il) == last;
            self.layer(
                lw,
                &c.ffn[il],
                il,
                rows,
                memory,
                residual,
                &mut buffers,
                keep,
            )?;
        }
        if let Some(mtp) = &self.weights.mtp {
            self.mtp_follow(mtp, (rows, embeddings), memory, s)?;
        }
        scaffold::advance(memory, rows);
        let head = OutputHead {
            norm: &self.weights.output_norm,
            eps: c.norm_eps,
            output: self.weights.output.view(&self.rt.gguf)?,
            softcap: None,
        };
        head.run(
            s.output_rows.of(rows),
            s.residual.x(),
            seq_logits,
            &mut s.head,
        )
    }
}

impl MlaEngine {
    /// Keeps the micro-batch's final states, then runs the multi-token-prediction block
    /// over the pairs they complete: (state at `p − 1`, token at `p`) at position `p − 1`.
    fn mtp_follow(
        &self,
        mtp: &MtpBlock,
        (rows, embeddings): (&[Row], &[f32]),
        memory: &mut StepMemory<'_>,
        s: &mut Scratch,
    ) -> Result<(), EngineError> {
        let (e, eps) = (self.config.n_embd, self.config.norm_eps);
        let n = rows.len();
        let hidden = sized(&mut s.mtp.hidden, n * e);
        scaffold::norm_rows(
            &s.residual.x()[..n * e],
            &self.weights.output_norm,
            eps,
            hidden,
        );
        for (t, r) in rows.iter().enumerate() {
            memory.write(
                HIDDEN_STORE,
                r.seq,
                0,
                r.pos,
                &hidden[t * e..(t + 1) * e],
                &[],
            );
        }
        let mut pairs = std::mem::take(&mut s.mtp.rows);
        pairs.clear();
        // A position in a block shared with other sequences keeps the row it has (whoever
        // wrote it first read their own next token: only drafts can differ).
        let writable = |r: &&Row| r.pos > memory.writable_from(r.seq);
        pairs.extend(rows.iter().filter(writable).map(|r| Row {
            pos: r.pos - 1,
            logits_row: None,
            attend_end: r.pos,
            rope: crate::layers::rope::RopePos::at(r.pos - 1),
            ..*r
        }));
        let h = sized(&mut s.mtp.h, pairs.len() * e);
        for (t, r) in pairs.iter().enumerate() {
            read_hidden(memory, r.seq, r.pos, &mut h[t * e..(t + 1) * e]);
        }
        let result = self.mtp_rows(mtp, (&pairs, embeddings), memory, s);
        s.mtp.rows = pairs;
        result
    }

    /// The multi-token-prediction block over `rows` (each the token after its position, or
    /// the given embedding that stood in for it) with the final states in `s.mtp.h`: its
    /// latent rows written, its output in `s.mtp.residual`.
    fn mtp_rows(
        &self,
        mtp: &MtpBlock,
        (rows, embeddings): (&[Row], &[f32]),
        memory: &mut StepMemory<'_>,
        s: &mut Scratch,
    ) -> Result<(), EngineError> {
        let c = &self.config;
        let (n, e, eps, gguf) = (rows.len(), c.n_embd, c.norm_eps, &*self.rt.gguf);
        if n == 0 {
            return Ok(());
        }
        let embd = mtp.embd.as_ref().unwrap_or(&self.weights.token_embd);
        let embedded = sized(&mut s.mtp.embedded, n * e);
        scaffold::embed(rows, &embd.view(gguf)?, None, embeddings, embedded)?;
        let joined = sized(&mut s.mtp.joined, 2 * n * e);
        for t in 0..n {
            let (en, hn) = joined[2 * t * e..2 * (t + 1) * e].split_at_mut(e);
            crate::layers::norm::rms_norm(&embedded[t * e..(t + 1) * e], &mtp.enorm, eps, en);
            crate::layers::norm::rms_norm(&s.mtp.h[t * e..(t + 1) * e], &mtp.hnorm, eps, hn);
        }
        let x = s.mtp.residual.start(n * e);
        linear(&mtp.eh_proj.view(gguf)?, joined, n, x, &mut s.mtp.xq)?;
        let (lw, il) = (&mtp.layer, c.n_layer());
        let kind = c.mtp_ffn.as_ref().expect("a loaded block has its FFN kind");
        let (residual, mut buffers) = s.layer_buffers(true);
        self.layer(lw, kind, il, rows, memory, residual, &mut buffers, false)
    }

    /// Layer `il` (attention, then its FFN of kind `kind`) over the rows of `residual`; the
    /// FFN only over the rows that give something back where `keep_output_rows` (the last
    /// layer, see [`scaffold::OutputRows`]).
    #[allow(clippy::too_many_arguments)]
    fn layer(
        &self,
        lw: &MlaLayer,
        kind: &FfnKind,
        il: usize,
        rows: &[Row],
        memory: &mut StepMemory<'_>,
        residual: &mut scaffold::Residual,
        b: &mut LayerBuffers<'_>,
        keep_output_rows: bool,
    ) -> Result<(), EngineError> {
        let (c, gguf) = (&self.config, &*self.rt.gguf);
        let (n, eps) = (rows.len(), c.norm_eps);
        residual.sublayer(n, &lw.attn_norm, eps, |xn, out| {
            let path = |n, end| self.path_for(n, end);
            attention::attention(c, lw, gguf, il, rows, xn, memory, path, b.attn, out)
        })?;
        let n = match keep_output_rows {
            true => residual.keep_output_rows(rows, c.n_embd, b.output_rows),
            false => n,
        };
        if n > 0 {
            residual.sublayer(n, &lw.ffn_norm, eps, |xn, out| {
                Ok(ffn(gguf, &lw.ffn, kind, xn, out, b.router_logits, b.moe)?)
            })?;
        }
        Ok(())
    }
}

/// The buffers one layer works in, besides its residual stream.
struct LayerBuffers<'a> {
    attn: &'a mut AttnScratch,
    router_logits: &'a mut Vec<f32>,
    moe: &'a mut ferrox_moe::MoeScratch,
    /// The rows the last layer's feed-forward runs for.
    output_rows: &'a mut scaffold::OutputRows,
}

/// Copies sequence `seq`'s final state at `pos` into `out`.
fn read_hidden(memory: &StepMemory<'_>, seq: usize, pos: usize, out: &mut [f32]) {
    memory.key_row(HIDDEN_STORE, seq, 0, pos).copy_to(out);
}

crate::scaffold::engine_from_body!(MlaEngine);

impl scaffold::EngineBody for MlaEngine {
    type Buffers = Scratch;

    fn runtime(&self) -> &Runtime {
        &self.rt
    }

    /// One row of `kv_lora_rank + n_rot` values per position and layer, nothing per head:
    /// a head reads its values from the row's first `kv_lora_rank` entries.
    /// With a multi-token-prediction block, its latent rows as one more layer, and each
    /// position's final state (`n_embd`).
    fn memory_spec(&self) -> MemorySpec {
        let c = &self.config;
        let mtp = usize::from(self.weights.mtp.is_some());
        let mut spec =
            MemorySpec::one_store(c.n_layer() + mtp, c.cache_width(), 0, self.rt.kv_storage);
        if mtp == 1 {
            spec.paged
                .push(ferrox_memory::PagedStoreSpec::per_position(1, c.n_embd, 0));
            // The block's row at `p` is written once the token at `p + 1` is known.
            spec.row_lag = 1;
        }
        spec
    }

    fn takes_embeddings(&self) -> bool {
        true
    }

    fn has_mtp(&self) -> bool {
        self.weights.mtp.is_some()
    }

    /// Step `i` runs the block at position `pos − 1 + i` on the previous step's output (at
    /// first the trunk's final state at `pos − 1`) and token (at first `token`), and drafts
    /// the block's greedy token.
    fn draft_mtp(
        &self,
        memory: &mut StepMemory<'_>,
        s: &mut Scratch,
        seq: usize,
        token: TokenId,
        pos: usize,
        max: usize,
        out: &mut Vec<TokenId>,
    ) -> Result<(), EngineError> {
        let mtp = self.weights.mtp.as_ref().expect("checked by the caller");
        let (e, gguf) = (self.config.n_embd, &*self.rt.gguf);
        let shared = pos <= memory.writable_from(seq);
        if pos == 0 || shared || pos > memory.len(seq) || token as usize >= self.rt.n_vocab {
            return Ok(());
        }
        let h = sized(&mut s.mtp.h, e);
        read_hidden(memory, seq, pos - 1, h);
        let head = OutputHead {
            norm: &mtp.head_norm,
            eps: self.config.norm_eps,
            output: mtp
                .head
                .as_ref()
                .unwrap_or(&self.weights.output)
                .view(gguf)?,
            softcap: None,
        };
        let mut logits = std::mem::take(&mut s.mtp.logits);
        let mut next = token;
        let result = (|| {
            for i in 0..max {
                let row = [Row {
                    seq,
                    pos: pos - 1 + i,
                    token: next,
                    logits_row: Some(0),
                    output: crate::engine::Output::Logits,
                    embedding: None,
                    attend_end: pos + i,
                    rope: crate::layers::rope::RopePos::at(pos - 1 + i),
                }];
                self.mtp_rows(mtp, (&row, &[]), memory, s)?;
                let x = &s.mtp.residual.x()[..e];
                // The next input is the block's normed output.
                crate::layers::norm::rms_norm(x, &mtp.head_norm, head.eps, &mut s.mtp.h[..e]);
                sized(&mut logits, head.output.rows());
                let mut outs = [&mut logits];
                let head_row = [Row { seq: 0, ..row[0] }];
                head.run(&head_row, x, &mut outs, &mut s.head)?;
                next = argmax(&logits);
                out.push(next);
            }
            Ok(())
        })();
        s.mtp.logits = logits;
        result
    }

    fn micro_batch(
        &self,
        rows: &[Row],
        embeddings: &[f32],
        memory: &mut StepMemory<'_>,
        logits: &mut [&mut Vec<f32>],
        buffers: &mut Scratch,
    ) -> Result<(), EngineError> {
        self.run_layers((rows, embeddings), memory, logits, buffers)
    }
}
