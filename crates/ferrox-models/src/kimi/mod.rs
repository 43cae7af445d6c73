//! Kimi Linear (`kimi-linear`): Kimi Delta Attention layers ([`kda`]) interleaved with NoPE
//! Multi-head Latent Attention layers (the MLA engine's attention with no rotation), dense
//! SwiGLU then routed experts with a shared expert.
//!
//! Its memory is hybrid: the MLA layers keep one latent row per position in a paged store;
//! the KDA layers keep a recurrent state per sequence (three convolution windows and one
//! delta-rule matrix per head), which collapses the history and so cannot be rolled back
//! (llama.cpp does not roll kimi-linear back either). The recurrence runs token by token.

pub mod kda;

use std::sync::Arc;

use ferrox_core::{MemorySpec, PagedStoreSpec, RecurrentSpec, StepMemory};
use ferrox_gguf::{Gguf, GgufError, Metadata};

use crate::engine::{EngineError, EngineOptions};
use crate::hparams::{FfnKind, Keys, MoeFfnConfig};
use crate::layers::rope::{Rope, RopeStyle};
use crate::mla::attention::{attention, AttnScratch};
use crate::mla::weights::{load_ffn, load_layer};
use crate::mla::{ffn, KvB, MlaConfig, MlaFfn, MlaLayer, Path};
use crate::names::*;
use crate::step::{self, HeadScratch, OutputHead, Row, Runtime};
use crate::tensors::{check_block_count, embedding_and_head_bytes, name_keys, Loader, MatrixRef};
use crate::ModelError;
use kda::{KdaScratch, KdaShape, KdaWeights};

/// Everything the engine needs to know about a checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct KimiConfig {
    /// The MLA layers' attention, and the sizes and FFNs every layer shares.
    pub mla: MlaConfig,
    pub kda: KdaShape,
    /// Per layer: KDA (recurrent) or MLA.
    pub recurrent: Vec<bool>,
}

impl KimiConfig {
    pub fn read(meta: &Metadata<'_>) -> Result<KimiConfig, ModelError> {
        let arch = meta.architecture()?;
        let k = Keys { meta, arch };
        let n_layer = k.count("block_count", Keys::MAX_LAYERS)?;
        let n_embd = k.usize("embedding_length")?;
        let n_head = k.usize("attention.head_count")?;
        let kv_heads = k
            .per_layer("attention.head_count_kv", n_layer)?
            .ok_or_else(|| GgufError::MissingKey(k.key("attention.head_count_kv")))?;
        let max_head = crate::layers::attention::MAX_HEAD_DIM;
        let head_dim = k.count("kda.head_dim", max_head)?;
        let d_conv = k.count("ssm.conv_kernel", 64)?;
        let kv_lora_rank = k.usize("attention.kv_lora_rank")?;
        let head_dim_k = k.count("attention.key_length_mla", max_head)?;
        let head_dim_v = k.count("attention.value_length_mla", max_head)?;
        let n_rot = k.usize("rope.dimension_count")?;
        if n_layer == 0 || n_embd == 0 || n_head == 0 || head_dim == 0 || d_conv == 0 {
            return Err(ModelError::Config(format!(
                "{arch}: block_count, embedding_length, head_count, kda.head_dim and \
                 ssm.conv_kernel must be positive"
            )));
        }
        if n_rot >= head_dim_k || kv_lora_rank + n_rot > max_head || head_dim_v == 0 {
            return Err(ModelError::Config(format!(
                "{arch}: MLA heads of {head_dim_k} key ({n_rot} rope) and {head_dim_v} value \
                 dims over a latent of {kv_lora_rank} do not fit"
            )));
        }
        let n_ff = k.usize("feed_forward_length")?;
        let n_lead = k
            .opt_count("leading_dense_block_count", n_layer)?
            .unwrap_or(0);
        let n_shared = k.usize("expert_shared_count")?;
        let mut moe = MoeFfnConfig::from_metadata(meta, arch, n_ff)?;
        // llama.cpp normalises kimi-linear's expert weights whatever the file says.
        moe.router.norm_weights = true;
        if n_shared > 0 {
            let width = moe.n_ff_exp.checked_mul(n_shared);
            let width = width.ok_or_else(|| {
                k.bad_count(
                    "expert_shared_count",
                    n_shared,
                    "shared expert width overflows",
                )
            })?;
            moe.n_ff_shexp = Some(width);
        }
        let ffn = (0..n_layer)
            .map(|il| match il < n_lead {
                true => FfnKind::Dense,
                false => FfnKind::Moe(moe.clone()),
            })
            .collect();
        let mla = MlaConfig {
            arch: arch.to_string(),
            n_embd,
            n_vocab: k.vocab_size()?,
            n_ctx_train: k.usize("context_length")?,
            norm_eps: k.f32("attention.layer_norm_rms_epsilon")?,
            n_head,
            q_lora_rank: None,
            kv_lora_rank,
            head_dim_k,
            head_dim_v,
            n_rot,
            kv_b: KvB::Split,
            // NoPE: the rope part is sized, never rotated.
            rope: Rope::plain(RopeStyle::Normal, 0, 10_000.0),
            kq_scale: 1.0 / (head_dim_k as f32).sqrt(),
            temperature: None,
            n_ff,
            ffn,
        };
        Ok(KimiConfig {
            mla,
            kda: KdaShape {
                n_head,
                head_dim,
                d_conv,
            },
            recurrent: kv_heads.iter().map(|&h| h == 0).collect(),
        })
    }

    fn n_mla(&self) -> usize {
        self.recurrent.iter().filter(|&&r| !r).count()
    }

    fn n_kda(&self) -> usize {
        self.recurrent.len() - self.n_mla()
    }
}

/// A layer: its attention (KDA, with its index among the KDA layers, or MLA with its index
/// among the MLA layers, which also holds the FFN), its norms and FFN.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
enum KimiLayer {
    Kda {
        index: usize,
        attn_norm: Vec<f32>,
        kda: KdaWeights,
        ffn_norm: Vec<f32>,
        ffn: MlaFfn,
    },
    Mla {
        index: usize,
        layer: MlaLayer,
    },
}

#[derive(Clone, Debug)]
struct KimiWeights {
    token_embd: MatrixRef,
    output_norm: Vec<f32>,
    output: MatrixRef,
    layers: Vec<KimiLayer>,
}

fn load_kda(l: &Loader<'_>, c: &KimiConfig, il: usize) -> Result<KdaWeights, ModelError> {
    let n_embd = c.mla.n_embd;
    let (h, dh, d_conv) = (c.kda.n_head, c.kda.head_dim, c.kda.d_conv);
    let d_inner = c.kda.d_inner();
    let conv = |t: Tensor| l.vector(&t.layer(il), d_conv * d_inner);
    Ok(KdaWeights {
        q: l.matrix(&ATTN_Q.layer(il), n_embd, d_inner)?,
        k: l.matrix(&ATTN_K.layer(il), n_embd, d_inner)?,
        v: l.matrix(&ATTN_V.layer(il), n_embd, d_inner)?,
        conv: [
            conv(SSM_CONV1D_Q)?,
            conv(SSM_CONV1D_K)?,
            conv(SSM_CONV1D_V)?,
        ],
        f_a: l.matrix(&SSM_F_A.layer(il), n_embd, dh)?,
        f_b: l.matrix(&SSM_F_B.layer(il), dh, d_inner)?,
        beta: l.matrix(&SSM_BETA.layer(il), n_embd, h)?,
        a: l.vector(&SSM_A.layer_bare(il), h)?,
        dt_bias: l.vector(&SSM_DT.layer_bias(il), d_inner)?,
        g_a: l.matrix(&SSM_G_A.layer(il), n_embd, dh)?,
        g_b: l.matrix(&SSM_G_B.layer(il), dh, d_inner)?,
        o_norm: l.vector(&SSM_NORM.layer(il), dh)?,
        wo: l.matrix(&ATTN_OUTPUT.layer(il), d_inner, n_embd)?,
    })
}

impl KimiWeights {
    fn load(gguf: &Gguf, c: &KimiConfig) -> Result<KimiWeights, ModelError> {
        let arch = &c.mla.arch;
        check_block_count(gguf, arch, c.recurrent.len())?;
        Self::load_checked(gguf, c).map_err(|e| name_keys(e, arch))
    }

    fn load_checked(gguf: &Gguf, c: &KimiConfig) -> Result<KimiWeights, ModelError> {
        let l = Loader { gguf };
        let (n_embd, n_vocab) = (c.mla.n_embd, c.mla.n_vocab);
        let (mut n_kda, mut n_mla) = (0, 0);
        let mut layers = Vec::with_capacity(c.recurrent.len());
        for (il, &recurrent) in c.recurrent.iter().enumerate() {
            layers.push(if recurrent {
                n_kda += 1;
                KimiLayer::Kda {
                    index: n_kda - 1,
                    attn_norm: l.vector(&ATTN_NORM.layer(il), n_embd)?,
                    kda: load_kda(&l, c, il)?,
                    ffn_norm: l.vector(&FFN_NORM.layer(il), n_embd)?,
                    ffn: load_ffn(&l, &c.mla, il)?,
                }
            } else {
                n_mla += 1;
                KimiLayer::Mla {
                    index: n_mla - 1,
                    layer: load_layer(&l, &c.mla, il)?,
                }
            });
        }
        Ok(KimiWeights {
            token_embd: l.matrix(&TOKEN_EMBD.weight(), n_embd, n_vocab)?,
            output_norm: l.vector(&OUTPUT_NORM.weight(), n_embd)?,
            output: l.matrix(&OUTPUT.weight(), n_embd, n_vocab)?,
            layers,
        })
    }

    fn pack(&mut self, gguf: &Gguf) -> Result<(), ModelError> {
        for layer in &mut self.layers {
            match layer {
                KimiLayer::Kda { kda, ffn, .. } => {
                    kda.pack(gguf)?;
                    pack_ffn(ffn, gguf)?;
                }
                KimiLayer::Mla { layer, .. } => {
                    layer.kv_a.pack(gguf)?;
                    layer.wo.pack(gguf)?;
                    pack_ffn(&mut layer.ffn, gguf)?;
                }
            }
        }
        Ok(())
    }

    fn bytes_per_token(&self, c: &KimiConfig) -> u64 {
        let mut total = embedding_and_head_bytes(&self.token_embd, &self.output);
        for (layer, kind) in self.layers.iter().zip(&c.mla.ffn) {
            let (attn, ffn) = match layer {
                KimiLayer::Kda { kda, ffn, .. } => (kda.n_bytes(), ffn),
                KimiLayer::Mla { layer, .. } => (
                    layer.kv_a.n_bytes()
                        + layer.k_absorb.n_bytes()
                        + layer.v.n_bytes()
                        + layer.wo.n_bytes(),
                    &layer.ffn,
                ),
            };
            total += attn
                + match ffn {
                    MlaFfn::Dense(d) => d.n_bytes(),
                    MlaFfn::Moe(m) => m.bytes_per_token_in(kind),
                };
        }
        total
    }
}

fn pack_ffn(ffn: &mut MlaFfn, gguf: &Gguf) -> Result<(), ModelError> {
    match ffn {
        MlaFfn::Dense(d) => d.pack(gguf),
        MlaFfn::Moe(m) => m.pack(gguf),
    }
}

/// A Kimi Linear model over a memory-mapped GGUF checkpoint.
pub struct KimiEngine {
    rt: Runtime,
    config: KimiConfig,
    weights: KimiWeights,
}

#[derive(Default)]
pub struct Scratch {
    residual: step::Residual,
    attn: AttnScratch,
    kda: KdaScratch,
    head: HeadScratch,
    router_logits: Vec<f32>,
    moe: ferrox_moe::MoeScratch,
}

impl KimiEngine {
    pub fn with_config(
        gguf: Arc<Gguf>,
        options: &EngineOptions,
        config: KimiConfig,
    ) -> Result<KimiEngine, ModelError> {
        let mut weights = KimiWeights::load(&gguf, &config)?;
        let c = &config.mla;
        let mut rt = Runtime::new(gguf, options, (c.n_ctx_train, c.n_vocab), "ferrox-kimi")?;
        rt.repack(options, |g| weights.pack(g))?;
        rt.weight_bytes_per_token = weights.bytes_per_token(&config);
        Ok(KimiEngine {
            rt,
            config,
            weights,
        })
    }

    pub fn config(&self) -> &KimiConfig {
        &self.config
    }
}

impl step::Layers for KimiEngine {
    type Buffers = Scratch;

    fn runtime(&self) -> &Runtime {
        &self.rt
    }

    /// Latent rows for the MLA layers; per sequence, every KDA layer's recurrent state.
    fn memory_spec(&self) -> MemorySpec {
        let c = &self.config;
        MemorySpec {
            paged: vec![PagedStoreSpec {
                n_layers: c.n_mla(),
                key_width: c.mla.cache_width(),
                value_width: 0,
            }],
            recurrent: Some(RecurrentSpec {
                values: c.n_kda() * c.kda.state_values(),
            }),
            storage: self.rt.kv_storage,
        }
    }

    fn checkpoints(&self) -> bool {
        true
    }

    fn micro_batch(
        &self,
        rows: &[Row],
        memory: &mut StepMemory<'_>,
        logits: &mut [&mut Vec<f32>],
        s: &mut Scratch,
    ) -> Result<(), EngineError> {
        let c = &self.config;
        let (n, eps, gguf) = (rows.len(), c.mla.norm_eps, &*self.rt.gguf);
        s.residual
            .embed(rows, &self.weights.token_embd.view(gguf)?, None)?;
        for (il, layer) in self.weights.layers.iter().enumerate() {
            let (attn_norm, ffn_norm, ffn_weights) = match layer {
                KimiLayer::Kda {
                    attn_norm,
                    ffn_norm,
                    ffn,
                    ..
                } => (attn_norm, ffn_norm, ffn),
                KimiLayer::Mla { layer, .. } => (&layer.attn_norm, &layer.ffn_norm, &layer.ffn),
            };
            s.residual
                .sublayer(n, attn_norm, eps, |xn, out| match layer {
                    KimiLayer::Kda { index, kda, .. } => {
                        let at = index * c.kda.state_values();
                        kda::forward(c.kda, kda, gguf, eps, rows, xn, memory, at, &mut s.kda, out)
                    }
                    KimiLayer::Mla { index, layer } => {
                        let path = |_, _| Path::Absorbed;
                        attention(
                            &c.mla,
                            layer,
                            gguf,
                            *index,
                            rows,
                            xn,
                            memory,
                            path,
                            &mut s.attn,
                            out,
                        )
                    }
                })?;
            s.residual.sublayer(n, ffn_norm, eps, |xn, out| {
                let (logits, moe) = (&mut s.router_logits, &mut s.moe);
                Ok(ffn(
                    gguf,
                    ffn_weights,
                    &c.mla.ffn[il],
                    xn,
                    out,
                    logits,
                    moe,
                )?)
            })?;
        }
        step::advance(memory, rows);
        let head = OutputHead {
            norm: &self.weights.output_norm,
            eps,
            output: self.weights.output.view(gguf)?,
            softcap: None,
        };
        head.run(rows, s.residual.x(), logits, &mut s.head)
    }
}
