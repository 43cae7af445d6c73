//! The Multi-head Latent Attention engine: DeepSeek-V2/V3-style models (`deepseek2`) and
//! Mistral-4 (`mistral4`, the same graph under another name). Attention caches one
//! compressed row per token and layer ([`attention`]); the feed-forward blocks are dense
//! SwiGLU for the leading layers and routed experts plus shared experts after them
//! (`ferrox-moe`). Attention can also be sparse ([`sparse`]): the DeepSeek Sparse Attention
//! engine ([`crate::dsa`]) runs these layers over the positions its indexer selects.

pub(crate) mod attention;
mod config;
pub(crate) mod sparse;
pub(crate) mod weights;

use std::sync::Arc;

use ferrox_core::{MemorySpec, StepMemory};
use ferrox_gguf::Gguf;

pub use config::{read as config_for, yarn_scales, KvB, MlaConfig, MscaleRule};
pub use weights::{MlaFfn, MlaLayer, MlaWeights};

use crate::engine::EngineError;
use crate::engine::EngineOptions;
use crate::hparams::FfnKind;
use crate::step::{self, HeadScratch, OutputHead, Row, Runtime};
use crate::ModelError;
use attention::AttnScratch;

/// The memory's one store: the latent row `[c | k_pe]` per position and layer.
pub(crate) const LATENT_STORE: usize = 0;

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

/// The form one sequence's rows take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
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
    residual: step::Residual,
    attn: AttnScratch,
    head: HeadScratch,
    router_logits: Vec<f32>,
    moe: ferrox_moe::MoeScratch,
}

impl MlaEngine {
    /// An engine for a configuration its family has read.
    pub fn with_config(
        gguf: Arc<Gguf>,
        options: &EngineOptions,
        config: MlaConfig,
    ) -> Result<Self, ModelError> {
        let mut weights = MlaWeights::load(&gguf, &config)?;
        let mut rt = Runtime::new(
            gguf,
            options,
            (config.n_ctx_train, config.n_vocab),
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
    fn layers(
        &self,
        rows: &[Row],
        memory: &mut StepMemory<'_>,
        seq_logits: &mut [&mut Vec<f32>],
        s: &mut Scratch,
    ) -> Result<(), EngineError> {
        let c = &self.config;
        let (n, eps, gguf) = (rows.len(), c.norm_eps, &*self.rt.gguf);
        s.residual
            .embed(rows, &self.weights.token_embd.view(gguf)?, None)?;
        for (il, lw) in self.weights.layers.iter().enumerate() {
            s.residual.sublayer(n, &lw.attn_norm, eps, |xn, out| {
                let path = |n, end| self.path_for(n, end);
                attention::attention(c, lw, gguf, il, rows, xn, memory, path, &mut s.attn, out)
            })?;
            s.residual.sublayer(n, &lw.ffn_norm, eps, |xn, out| {
                let (logits, moe) = (&mut s.router_logits, &mut s.moe);
                Ok(ffn(gguf, &lw.ffn, &c.ffn[il], xn, out, logits, moe)?)
            })?;
        }
        step::advance(memory, rows);
        let head = OutputHead {
            norm: &self.weights.output_norm,
            eps: c.norm_eps,
            output: self.weights.output.view(&self.rt.gguf)?,
            softcap: None,
        };
        head.run(rows, s.residual.x(), seq_logits, &mut s.head)
    }
}

impl step::Layers for MlaEngine {
    type Buffers = Scratch;

    fn runtime(&self) -> &Runtime {
        &self.rt
    }

    /// One row of `kv_lora_rank + n_rot` values per position and layer, nothing per head:
    /// a head reads its values from the row's first `kv_lora_rank` entries.
    fn memory_spec(&self) -> MemorySpec {
        let c = &self.config;
        MemorySpec::one_store(c.n_layer(), c.cache_width(), 0, self.rt.kv_storage)
    }

    fn micro_batch(
        &self,
        rows: &[Row],
        memory: &mut StepMemory<'_>,
        logits: &mut [&mut Vec<f32>],
        buffers: &mut Scratch,
    ) -> Result<(), EngineError> {
        self.layers(rows, memory, logits, buffers)
    }
}

/// A layer's FFN of `xn` into `out` (`n × n_embd`): dense SwiGLU, or routed experts plus the
/// shared expert.
pub(crate) fn ffn(
    gguf: &Gguf,
    weights: &MlaFfn,
    kind: &FfnKind,
    xn: &[f32],
    out: &mut [f32],
    router_logits: &mut Vec<f32>,
    moe: &mut ferrox_moe::MoeScratch,
) -> Result<(), ModelError> {
    match (weights, kind) {
        (MlaFfn::Dense(dense), _) => {
            out.fill(0.0);
            dense
                .view(gguf)?
                .forward_add(xn, out, moe)
                .map_err(crate::hparams::moe_error)
        }
        (MlaFfn::Moe(mw), FfnKind::Moe(mc)) => {
            mw.forward(gguf, &mc.router, xn, out, router_logits, moe)
        }
        (MlaFfn::Moe(_), FfnKind::Dense) => {
            Err(ModelError::Config("MoE weights on a dense layer".into()))
        }
    }
}
