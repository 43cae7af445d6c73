//! The Multi-head Latent Attention engine: DeepSeek-V2/V3-style models (`deepseek2`) and
//! Mistral-4 (`mistral4`, the same graph under another name). Attention caches one
//! compressed row per token and layer ([`attention`]); the feed-forward blocks are dense
//! SwiGLU for the leading layers and routed experts plus shared experts after them
//! (`ferrox-moe`).

mod attention;
mod config;
mod weights;

use std::path::Path as FsPath;
use std::sync::Arc;

use ferrox_core::{KvCache, KvStorage};
use ferrox_gguf::Gguf;

pub use config::{read as config_for, yarn_scales, KvB, MlaConfig, MscaleRule};
pub use weights::MlaWeights;

use crate::decoder::{moe_error, DecoderOptions, FfnKind};
use crate::engine::{Engine, EngineError, LogitsFor};
use crate::layers::linear::linear;
use crate::layers::norm::rms_norm;
use crate::tokenizer::TokenId;
use crate::ModelError;
use attention::AttnScratch;
use weights::{MlaFfn, MlaLayer};

/// Tokens processed together in one pass of a long prompt (bounds scratch memory).
const MAX_MICRO_BATCH: usize = 512;

/// Most per-head key and value entries a decompressed step may rebuild (256 MiB as f32);
/// beyond that a batch attends in the latent space instead.
const MAX_DECOMPRESSED: usize = 1 << 26;

/// Which form of attention a forward step uses (see [`attention`]'s module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AttentionPath {
    /// Absorbed for single tokens; for batches whichever costs fewer operations.
    #[default]
    Auto,
    Absorbed,
    Decompressed,
}

/// The path one micro-batch takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Absorbed,
    Decompressed,
}

/// `buf[..len]`, grown if needed.
fn grown(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
}

/// An MLA model over a memory-mapped GGUF checkpoint.
pub struct MlaEngine {
    gguf: Arc<Gguf>,
    config: MlaConfig,
    weights: MlaWeights,
    n_ctx: usize,
    kv_storage: KvStorage,
    path: AttentionPath,
    pool: rayon::ThreadPool,
}

/// One sequence's state: the latent cache, scratch buffers and the last logits.
pub struct MlaState {
    kv: KvCache,
    scratch: Scratch,
    logits: Vec<f32>,
}

impl MlaState {
    /// The latent cache: its length is the sequence's, and it rolls back like any KV cache
    /// (`truncate`, `snapshot` / `restore`).
    pub fn kv_cache(&self) -> &KvCache {
        &self.kv
    }

    pub fn kv_cache_mut(&mut self) -> &mut KvCache {
        &mut self.kv
    }

    /// Cache bytes per position over all layers: one row of `kv_lora_rank + n_rot` values
    /// per layer, nothing per head.
    pub fn kv_bytes_per_position(&self) -> usize {
        self.kv.bytes_per_position()
    }

    pub fn logits(&self) -> &[f32] {
        &self.logits
    }
}

#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    proj: Vec<f32>,
    logits: Vec<f32>,
    xq: Vec<u8>,
    attn: AttnScratch,
    router_logits: Vec<f32>,
    moe: ferrox_moe::MoeScratch,
}

impl MlaEngine {
    pub fn open(path: impl AsRef<FsPath>, options: &DecoderOptions) -> Result<Self, ModelError> {
        MlaEngine::from_gguf(Arc::new(Gguf::open(path)?), options)
    }

    pub fn from_gguf(gguf: Arc<Gguf>, options: &DecoderOptions) -> Result<Self, ModelError> {
        let config = crate::families::mla_config(&gguf.metadata())?;
        let mut weights = MlaWeights::load(&gguf, &config)?;
        let n_ctx = match options.n_ctx {
            0 => config.n_ctx_train,
            n => n,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(options.threads)
            .thread_name(|i| format!("ferrox-mla-{i}"))
            .build()
            .map_err(|e| ModelError::Config(format!("cannot start the thread pool: {e}")))?;
        if options.repack {
            pool.install(|| weights.pack(&gguf))?;
        }
        Ok(MlaEngine {
            gguf,
            config,
            weights,
            n_ctx,
            kv_storage: options.kv_storage,
            path: AttentionPath::Auto,
            pool,
        })
    }

    /// Forces one form of attention (both give the same results up to rounding).
    pub fn set_attention_path(&mut self, path: AttentionPath) {
        self.path = path;
    }

    pub fn config(&self) -> &MlaConfig {
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

    /// The path for `n` new queries ending at `end` cached positions. Per head, absorbing
    /// costs one `Lkv × (Dn + Dv)` projection per query and `2·Lkv + R` per query-key pair;
    /// decompressing costs that projection per key and `Dk + Dv` per pair, and memory for
    /// every key's heads.
    fn path_for(&self, n: usize, end: usize) -> Path {
        let c = &self.config;
        match self.path {
            AttentionPath::Absorbed => Path::Absorbed,
            AttentionPath::Decompressed => Path::Decompressed,
            AttentionPath::Auto
                if n == 1 || end * c.n_head * (c.head_dim_k + c.head_dim_v) > MAX_DECOMPRESSED =>
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

    fn forward(
        &self,
        tokens: &[TokenId],
        start_pos: usize,
        state: &mut MlaState,
        want: LogitsFor,
    ) -> Result<(), EngineError> {
        let c = &self.config;
        if start_pos != state.kv.len() {
            return Err(EngineError::Position {
                got: start_pos,
                len: state.kv.len(),
            });
        }
        if tokens.is_empty() {
            return Err(EngineError::EmptyBatch);
        }
        let needed = start_pos + tokens.len();
        if needed > state.kv.capacity() {
            return Err(EngineError::ContextFull {
                needed,
                capacity: state.kv.capacity(),
            });
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.n_vocab) {
            return Err(EngineError::InvalidToken {
                token: bad,
                vocab_size: c.n_vocab,
            });
        }
        let wanted = want.range(tokens.len());
        state.logits.resize(wanted.len() * c.n_vocab, 0.0);
        let MlaState {
            kv,
            scratch,
            logits,
        } = state;
        self.pool.install(|| {
            let mut done = 0;
            for chunk in tokens.chunks(MAX_MICRO_BATCH) {
                let first = start_pos + done;
                let rows = done..done + chunk.len();
                let keep = rows.start.max(wanted.start)..rows.end.min(wanted.end);
                let out = &mut logits[(keep.start.saturating_sub(wanted.start)) * c.n_vocab..];
                let keep = keep.start.saturating_sub(done)..keep.end.saturating_sub(done);
                self.micro_batch(chunk, first, kv, scratch, keep, out)?;
                done += chunk.len();
            }
            Ok(())
        })
    }

    /// One micro-batch through every layer; logits for its rows `keep` go to `out`.
    fn micro_batch(
        &self,
        tokens: &[TokenId],
        first: usize,
        kv: &mut KvCache,
        s: &mut Scratch,
        keep: std::ops::Range<usize>,
        out: &mut [f32],
    ) -> Result<(), EngineError> {
        let c = &self.config;
        let (n, n_embd) = (tokens.len(), c.n_embd);
        let positions: Vec<usize> = (first..first + n).collect();
        let path = self.path_for(n, first + n);
        let x = grown(&mut s.x, n * n_embd);
        let embd = self.weights.token_embd.view(&self.gguf)?;
        for (row, &t) in x.chunks_exact_mut(n_embd).zip(tokens) {
            embd.dequant_row(t as usize, row)
                .map_err(ModelError::from)?;
        }
        for (il, lw) in self.weights.layers.iter().enumerate() {
            let xn = grown(&mut s.xn, n * n_embd);
            normed(&s.x, &lw.attn_norm, c.norm_eps, n_embd, xn);
            let proj = grown(&mut s.proj, n * n_embd);
            attention::attention(
                c,
                lw,
                &self.gguf,
                il,
                &positions,
                xn,
                kv,
                path,
                &mut s.attn,
                proj,
            )?;
            add(&mut s.x, proj);
            let xn = grown(&mut s.xn, n * n_embd);
            normed(&s.x, &lw.ffn_norm, c.norm_eps, n_embd, xn);
            let proj = grown(&mut s.proj, n * n_embd);
            self.ffn(lw, &c.ffn[il], xn, proj, &mut s.router_logits, &mut s.moe)?;
            add(&mut s.x, proj);
        }
        kv.advance(first + n);

        if keep.is_empty() {
            return Ok(());
        }
        let count = keep.len();
        let xn = grown(&mut s.xn, count * n_embd);
        normed(
            &s.x[keep.start * n_embd..keep.end * n_embd],
            &self.weights.output_norm,
            c.norm_eps,
            n_embd,
            xn,
        );
        let logits = grown(&mut s.logits, count * c.n_vocab);
        linear(
            &self.weights.output.view(&self.gguf)?,
            xn,
            count,
            logits,
            &mut s.xq,
        )?;
        out[..count * c.n_vocab].copy_from_slice(logits);
        Ok(())
    }

    /// The layer's FFN of `xn` into `out` (`n × n_embd`).
    fn ffn(
        &self,
        lw: &MlaLayer,
        kind: &FfnKind,
        xn: &[f32],
        out: &mut [f32],
        router_logits: &mut Vec<f32>,
        moe: &mut ferrox_moe::MoeScratch,
    ) -> Result<(), ModelError> {
        let gguf = &*self.gguf;
        match (&lw.ffn, kind) {
            (MlaFfn::Dense(dense), _) => {
                out.fill(0.0);
                dense.view(gguf)?.forward_add(xn, out, moe)
            }
            (MlaFfn::Moe(mw), FfnKind::Moe(mc)) => {
                ferrox_moe::router_logits(&mw.gate_inp.view(gguf)?, xn, router_logits)
                    .map_err(moe_error)?;
                ferrox_moe::moe_ffn(
                    &mc.router,
                    &mw.experts(gguf)?,
                    xn,
                    router_logits,
                    mw.selection_bias.as_deref(),
                    out,
                    moe,
                )
                .map_err(moe_error)?;
                match mw.shared_expert(gguf)? {
                    Some(shared) => shared.forward_add(xn, out, moe),
                    None => Ok(()),
                }
            }
            (MlaFfn::Moe(_), FfnKind::Dense) => {
                return Err(ModelError::Config("MoE weights on a dense layer".into()))
            }
        }
        .map_err(moe_error)
    }
}

/// RMSNorm of each `n_embd` row of `x` into `out`.
fn normed(x: &[f32], weight: &[f32], eps: f32, n_embd: usize, out: &mut [f32]) {
    for (src, dst) in x.chunks_exact(n_embd).zip(out.chunks_exact_mut(n_embd)) {
        rms_norm(src, weight, eps, dst);
    }
}

/// The residual connection: `x += y`.
fn add(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, &b)| *a += b);
}

impl Engine for MlaEngine {
    type State = MlaState;

    fn new_state(&self) -> MlaState {
        let c = &self.config;
        MlaState {
            // Keys only: the value a head reads is the first `kv_lora_rank` entries of the
            // same row.
            kv: KvCache::new(c.n_layer(), self.n_ctx, c.cache_width(), 0, self.kv_storage),
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
        state: &'s mut MlaState,
        logits: LogitsFor,
    ) -> Result<&'s [f32], EngineError> {
        self.forward(tokens, start_pos, state, logits)?;
        Ok(&state.logits)
    }
}
