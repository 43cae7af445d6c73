//! Reading a Kimi checkpoint's hyperparameters: what `kimi-linear` and `kimi-k3` share, and
//! Kimi-K3's additions ([`K3Config`]).

use ferrox_gguf::{GgufError, Metadata};

use super::kda::{Decay, KdaShape};
use crate::hparams::{FfnKind, Keys, MoeFfnConfig};
use crate::layers::mla::{KvB, MlaConfig};
use crate::layers::rope::{Rope, RopeStyle};
use crate::ModelError;

/// Everything the engine needs to know about a checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct KimiConfig {
    /// The MLA layers' attention, and the sizes and FFNs every layer shares.
    pub mla: MlaConfig,
    pub kda: KdaShape,
    /// Per layer: KDA (recurrent) or MLA.
    pub recurrent: Vec<bool>,
    /// Kimi-K3's additions; `None` for Kimi Linear.
    pub k3: Option<K3Config>,
}

/// What Kimi-K3 adds to the Kimi Linear graph.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct K3Config {
    /// Layers per block of the residual attention (`attn_res.block_size`): the first layer
    /// of each block banks its input as a checkpoint and restarts the stream from its
    /// attention output. 0 disables the residual attention.
    pub res_block: usize,
    /// The SiTU activation of every FFN and expert.
    pub situ: Situ,
    /// The routed experts' latent width (`expert_latent_length`), if they run in a latent
    /// space.
    pub expert_latent: Option<usize>,
}

/// `situ(g, u) = β·tanh(g/β)·sigmoid(g) · λ·tanh(u/λ)` (`u` as is when `λ ≤ 0`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Situ {
    pub beta: f32,
    pub linear_beta: f32,
}

impl Situ {
    pub fn activation(self) -> ferrox_moe::Activation {
        ferrox_moe::Activation::Situ {
            beta: self.beta,
            linear_beta: self.linear_beta,
        }
    }
}

impl KimiConfig {
    /// A `kimi-linear` checkpoint.
    pub fn read(meta: &Metadata<'_>) -> Result<KimiConfig, ModelError> {
        let mut c = read_common(meta, Decay::Softplus, None)?;
        // llama.cpp normalises kimi-linear's expert weights whatever the file says.
        for kind in &mut c.mla.ffn {
            if let FfnKind::Moe(moe) = kind {
                moe.router.norm_weights = true;
            }
        }
        Ok(c)
    }

    /// A `kimi-k3` checkpoint: the Kimi Linear keys plus the residual attention, SiTU, the
    /// optional query LoRA, latent experts and lower-bound decay.
    pub fn read_k3(meta: &Metadata<'_>) -> Result<KimiConfig, ModelError> {
        let arch = meta.architecture()?;
        let k = Keys { meta, arch };
        let decay = match k.opt_f32("kda.gate_lower_bound")? {
            Some(lb) if lb.is_finite() => {
                if lb >= 0.0 {
                    return Err(ModelError::Config(format!(
                        "{}: {lb} is not a negative lower bound",
                        k.key("kda.gate_lower_bound")
                    )));
                }
                Decay::LowerBound(lb)
            }
            _ => Decay::Softplus,
        };
        let q_lora = k.opt_usize("attention.q_lora_rank")?.filter(|&r| r > 0);
        let mut c = read_common(meta, decay, q_lora)?;
        let situ = Situ {
            beta: k.f32("activation.situ_beta")?,
            linear_beta: k.f32("activation.situ_linear_beta")?,
        };
        if !(situ.beta > 0.0 && situ.beta.is_finite()) || situ.linear_beta.is_nan() {
            return Err(ModelError::Config(format!(
                "{arch}: activation.situ_beta must be positive (found {}) and \
                 activation.situ_linear_beta a number (found {})",
                situ.beta, situ.linear_beta
            )));
        }
        let res_block = k.count("attn_res.block_size", Keys::MAX_LAYERS)?;
        let expert_latent = k
            .opt_count("expert_latent_length", 1 << 20)?
            .filter(|&n| n > 0);
        c.k3 = Some(K3Config {
            res_block,
            situ,
            expert_latent,
        });
        Ok(c)
    }

    pub(crate) fn n_mla(&self) -> usize {
        self.recurrent.iter().filter(|&&r| !r).count()
    }

    pub(crate) fn n_kda(&self) -> usize {
        self.recurrent.len() - self.n_mla()
    }
}

fn read_common(
    meta: &Metadata<'_>,
    decay: Decay,
    q_lora_rank: Option<usize>,
) -> Result<KimiConfig, ModelError> {
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
    let ffn = if n_lead < n_layer {
        let mut moe = MoeFfnConfig::from_metadata(meta, arch, n_ff)?;
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
        (0..n_layer)
            .map(|il| match il < n_lead {
                true => FfnKind::Dense,
                false => FfnKind::Moe(moe.clone()),
            })
            .collect()
    } else {
        vec![FfnKind::Dense; n_layer]
    };
    let mla = MlaConfig {
        arch: arch.to_string(),
        n_embd,
        n_vocab: k.vocab_size()?,
        n_ctx_train: k.usize("context_length")?,
        norm_eps: k.f32("attention.layer_norm_rms_epsilon")?,
        n_head,
        q_lora_rank,
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
        mtp_ffn: None,
    };
    Ok(KimiConfig {
        mla,
        kda: KdaShape {
            n_head,
            head_dim,
            d_conv,
            decay,
        },
        recurrent: kv_heads.iter().map(|&h| h == 0).collect(),
        k3: None,
    })
}
