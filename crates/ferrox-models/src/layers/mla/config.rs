//! Hyperparameters of a Multi-head Latent Attention model (DeepSeek-V2/V3, Mistral-4), read
//! from GGUF metadata with llama.cpp's rules and defaults.

use ferrox_gguf::{GgufError, Metadata};
use ferrox_moe::MoeHparams;

use crate::hparams::{moe_error, FfnKind, Keys, MoeFfnConfig};
use crate::layers::attention::MAX_HEAD_DIM;
use crate::layers::rope::{Rope, RopeStyle};
use crate::ModelError;

/// How the file stores the per-head decompression of the latent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvB {
    /// `attn_k_b` `{Dn, Lkv, H}` and `attn_v_b` `{Lkv, Dv, H}` (files with
    /// `attention.key_length_mla`, what current converters write).
    Split,
    /// One `attn_kv_b` `{Lkv, H·(Dn+Dv)}`: each head's Dn key rows, then its Dv value rows
    /// (older files, without the `*_mla` keys).
    Fused,
}

/// Which YaRN attention-factor rule llama.cpp applies (it differs by architecture).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MscaleRule {
    /// `deepseek2`: the RoPE magnitude is `mscale(s, m) / mscale(s, L)` with `m = L`
    /// (DeepSeek-V2's `mscale == mscale_all_dim`), so 1 whenever `L` is set.
    Deepseek2,
    /// Every other architecture: `m = 1`.
    Other,
    /// `m = 1`, and the loader never reads `rope.scaling.yarn_log_multiplier` (so `L = 0`,
    /// whatever the file says): `glm-dsa`.
    NoLogMultiplier,
}

/// Everything the MLA engine needs to know about a checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaConfig {
    pub arch: String,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub norm_eps: f32,
    pub n_head: usize,
    /// `attn_q_a` → `attn_q_a_norm` → `attn_q_b` when set; one `attn_q` otherwise.
    pub q_lora_rank: Option<usize>,
    /// Lkv: width of the compressed latent every head shares.
    pub kv_lora_rank: usize,
    /// Dk = Dn + R: a head's query/key width after decompression.
    pub head_dim_k: usize,
    /// Dv: a head's value width after decompression.
    pub head_dim_v: usize,
    /// R: the rotated part of each query head, and the one rotated key row all heads share.
    pub n_rot: usize,
    pub kv_b: KvB,
    pub rope: Rope,
    /// Multiplies q·k (1/sqrt(Dk), with YaRN's mscale² correction).
    pub kq_scale: f32,
    /// Llama-4 style attention temperature: queries at position `p` are multiplied by
    /// `1 + scale · ln(floor(p / length) + 1)`.
    pub temperature: Option<(f32, usize)>,
    /// Hidden units of the dense FFN of the leading layers.
    pub n_ff: usize,
    /// Per layer: dense FFN, or routed experts plus the shared expert(s).
    pub ffn: Vec<FfnKind>,
    /// The FFN of the first multi-token-prediction block, when the file declares one
    /// (`nextn_predict_layers`).
    pub mtp_ffn: Option<FfnKind>,
}

impl MlaConfig {
    pub fn n_layer(&self) -> usize {
        self.ffn.len()
    }

    /// Dn: the part of each query/key head that is not rotated.
    pub fn head_dim_nope(&self) -> usize {
        self.head_dim_k - self.n_rot
    }

    /// Values per cached position and layer: the normalized latent, then the rotated key.
    pub fn cache_width(&self) -> usize {
        self.kv_lora_rank + self.n_rot
    }

    /// The attention-temperature factor at position `pos` (1 without one), computed as
    /// llama.cpp does (in double precision, then rounded).
    pub fn temperature_at(&self, pos: usize) -> f32 {
        match self.temperature {
            None => 1.0,
            Some((scale, length)) => {
                let floor = (pos as f32 / length as f32).floor();
                ((f64::from(floor) + 1.0).ln() * f64::from(scale) + 1.0) as f32
            }
        }
    }
}

fn missing(key: String) -> ModelError {
    ModelError::Gguf(GgufError::MissingKey(key))
}

/// One value for every layer (MLA files have no per-layer head counts).
fn uniform(k: &Keys<'_, '_>, name: &str, n_layer: usize) -> Result<Option<usize>, ModelError> {
    let Some(values) = k.per_layer(name, n_layer)? else {
        return Ok(None);
    };
    if values.iter().any(|&v| v != values[0]) {
        return Err(ModelError::Config(format!(
            "`{}` differs between layers, which MLA models do not do",
            k.key(name)
        )));
    }
    Ok(values.first().copied())
}

/// YaRN's corrections as llama.cpp applies them to MLA models: returns the RoPE magnitude
/// (`attn_factor` handed to RoPE) and the q·k scale.
///
/// With `s = 1/freq_scale` and `L = yarn_log_multiplier / 0.1` (the converter stores
/// `0.1 · mscale_all_dim`), the context first sets `attn_factor = mscale(s, m) / mscale(s, L)
/// / (1 + 0.1 ln s) · rope_attn_factor` (RoPE multiplies the `1 + 0.1 ln s` back in), and
/// the graph scales q·k by `(attn_factor · (1 + 0.1 ln s) · (1 + 0.1 L ln s))² / sqrt(Dk)`.
/// Without YaRN the magnitude is `rope_attn_factor` and only the graph's formula applies.
pub fn yarn_scales(
    rule: MscaleRule,
    yarn: bool,
    freq_scale: f32,
    log_mul: f32,
    rope_attn_factor: f32,
    head_dim_k: usize,
) -> (f32, f32) {
    let mscale = |s: f32, m: f32| {
        if s <= 1.0 {
            1.0
        } else {
            0.1 * m * s.ln() + 1.0
        }
    };
    let factor = 1.0 / freq_scale;
    let mut attn_factor = 1.0f32;
    if yarn {
        attn_factor = if log_mul != 0.0 {
            let m = match rule {
                MscaleRule::Deepseek2 if log_mul != 1.0 => log_mul,
                _ => 1.0,
            };
            mscale(factor, m) / mscale(factor, log_mul)
        } else {
            mscale(factor, 1.0)
        };
        attn_factor *= 1.0 / (1.0 + 0.1 * factor.ln());
    }
    attn_factor *= rope_attn_factor;
    let original = attn_factor * (1.0 + 0.1 * (1.0 / freq_scale).ln());
    let m = original * (1.0 + 0.1 * log_mul * (1.0 / freq_scale).ln());
    (attn_factor, m * m / (head_dim_k as f32).sqrt())
}

/// Reads an MLA model of architecture `arch` (`deepseek2` and `mistral4` share the loader).
pub fn read(meta: &Metadata<'_>, arch: &str, rule: MscaleRule) -> Result<MlaConfig, ModelError> {
    let k = Keys { meta, arch };
    let (n_layer_all, nextn) = read_layer_counts(&k)?;
    let n_layer = n_layer_all - nextn;
    let n_embd = k.usize("embedding_length")?;
    let n_ctx_train = k.usize("context_length")?;
    if n_layer == 0 || n_embd == 0 {
        return Err(ModelError::Config(
            "block_count and embedding_length must be positive".into(),
        ));
    }
    let n_vocab = k.vocab_size()?;
    let n_head = uniform(&k, "attention.head_count", n_layer_all)?
        .filter(|&h| h > 0)
        .ok_or_else(|| missing(k.key("attention.head_count")))?;
    let norm_eps = k.f32("attention.layer_norm_rms_epsilon")?;
    // llama.cpp's "lite" files (DeepSeek-V2-Lite and relatives) may omit the query rank.
    let lite = n_layer == 26 || n_layer == 27 || (n_layer == 48 && n_vocab == 128_256);
    let shape = read_latent_shape(&k, n_embd / n_head, lite)?;
    let (rope, kq_scale) = read_rope(&k, rule, &shape, n_ctx_train)?;
    let (n_ff, ffn, mtp_ffn) = read_ffn(&k, n_layer_all, nextn)?;
    Ok(MlaConfig {
        arch: arch.to_string(),
        n_embd,
        n_vocab,
        n_ctx_train,
        norm_eps,
        n_head,
        q_lora_rank: shape.q_lora_rank,
        kv_lora_rank: shape.kv_lora_rank,
        head_dim_k: shape.head_dim_k,
        head_dim_v: shape.head_dim_v,
        n_rot: shape.n_rot,
        kv_b: shape.kv_b,
        rope,
        kq_scale,
        temperature: read_temperature(&k)?,
        n_ff,
        ffn,
        mtp_ffn,
    })
}

/// All layers in the file, and how many of them are multi-token-prediction blocks (the
/// last ones); at least one trunk layer remains.
fn read_layer_counts(k: &Keys<'_, '_>) -> Result<(usize, usize), ModelError> {
    let n_layer_all = k.count("block_count", Keys::MAX_LAYERS)?;
    let nextn = k.opt_usize("nextn_predict_layers")?.unwrap_or(0);
    if n_layer_all > 0 && nextn >= n_layer_all {
        return Err(k.bad_count(
            "nextn_predict_layers",
            nextn,
            &format!("leaves none of the {n_layer_all} layers"),
        ));
    }
    Ok((n_layer_all, nextn.min(n_layer_all)))
}

/// The attention's shapes: ranks, head sizes, the rotated part, the latent's storage.
struct LatentShape {
    q_lora_rank: Option<usize>,
    kv_lora_rank: usize,
    head_dim_k: usize,
    head_dim_v: usize,
    n_rot: usize,
    kv_b: KvB,
}

/// Reads the [`LatentShape`]; `default_head` is the embedding split over the heads, the
/// head size where the file states none.
fn read_latent_shape(
    k: &Keys<'_, '_>,
    default_head: usize,
    lite: bool,
) -> Result<LatentShape, ModelError> {
    let q_lora_rank = match k.opt_usize("attention.q_lora_rank")? {
        Some(r) => r,
        None if lite => 0,
        None => return Err(missing(k.key("attention.q_lora_rank"))),
    };
    let kv_lora_rank = k.usize("attention.kv_lora_rank")?;
    let key_mla = k.opt_usize("attention.key_length_mla")?;
    let value_mla = k.opt_usize("attention.value_length_mla")?;
    let (key_k, key_v, kv_b) = match (key_mla, value_mla) {
        (Some(dk), Some(dv)) if dk > 0 && dv > 0 => (
            "attention.key_length_mla",
            "attention.value_length_mla",
            KvB::Split,
        ),
        (None, None) | (Some(0), Some(0)) => {
            ("attention.key_length", "attention.value_length", KvB::Fused)
        }
        _ => {
            return Err(ModelError::Config(format!(
                "`{}` and `{}` must both be set or both be absent",
                k.key("attention.key_length_mla"),
                k.key("attention.value_length_mla")
            )))
        }
    };
    // The decompressed path attends with whole key and value heads.
    let head_dim = |name: &str| -> Result<usize, ModelError> {
        let dim = k.opt_usize(name)?.unwrap_or(default_head);
        if dim == 0 || dim > MAX_HEAD_DIM {
            return Err(k.bad_count(
                name,
                dim,
                &format!("a head size must be 1 to {MAX_HEAD_DIM}"),
            ));
        }
        Ok(dim)
    };
    let head_dim_k = head_dim(key_k)?;
    let head_dim_v = head_dim(key_v)?;
    let full_k = k.opt_usize("attention.key_length")?.unwrap_or(default_head);
    let n_rot = k.opt_usize("rope.dimension_count")?.unwrap_or(full_k);
    if n_rot == 0 || n_rot % 2 != 0 || n_rot >= head_dim_k {
        return Err(k.bad_count(
            "rope.dimension_count",
            n_rot,
            &format!("must be even, positive and smaller than the key length {head_dim_k}"),
        ));
    }
    // (Every count is below 2^32, so the sum cannot overflow.)
    if kv_lora_rank == 0 || kv_lora_rank + n_rot > MAX_HEAD_DIM {
        return Err(k.bad_count(
            "attention.kv_lora_rank",
            kv_lora_rank,
            &format!(
                "with {n_rot} rotated dimensions, the cached row must be 1 to {MAX_HEAD_DIM} wide"
            ),
        ));
    }
    Ok(LatentShape {
        q_lora_rank: (q_lora_rank > 0).then_some(q_lora_rank),
        kv_lora_rank,
        head_dim_k,
        head_dim_v,
        n_rot,
        kv_b,
    })
}

/// RoPE with YaRN's corrections as llama.cpp applies them to MLA models, and the q·k scale.
fn read_rope(
    k: &Keys<'_, '_>,
    rule: MscaleRule,
    shape: &LatentShape,
    n_ctx_train: usize,
) -> Result<(Rope, f32), ModelError> {
    let mut rope = k.rope(RopeStyle::Normal, shape.n_rot, n_ctx_train)?;
    // llama.cpp reads no YaRN beta keys for these architectures.
    rope.beta_fast = 32.0;
    rope.beta_slow = 1.0;
    let scaling = k.meta.opt_str(&k.key("rope.scaling.type"))?;
    if scaling == Some("none") {
        rope.freq_scale = 1.0;
    }
    let yarn = scaling == Some("yarn");
    let log_mul = match rule {
        MscaleRule::NoLogMultiplier => 0.0,
        _ => {
            k.opt_f32("rope.scaling.yarn_log_multiplier")?
                .unwrap_or(0.0)
                / 0.1
        }
    };
    let rope_attn_factor = k.opt_f32("rope.scaling.attn_factor")?.unwrap_or(1.0);
    let (attn_factor, kq_scale) = yarn_scales(
        rule,
        yarn,
        rope.freq_scale,
        log_mul,
        rope_attn_factor,
        shape.head_dim_k,
    );
    rope.attn_factor = attn_factor;
    Ok((rope, kq_scale))
}

/// Llama-4 style attention temperature (`attention.temperature_scale` and `_length`).
fn read_temperature(k: &Keys<'_, '_>) -> Result<Option<(f32, usize)>, ModelError> {
    match k.opt_f32("attention.temperature_scale")? {
        Some(scale) if scale != 0.0 => match k.opt_usize("attention.temperature_length")? {
            Some(length) if length > 0 => Ok(Some((scale, length))),
            _ => Err(ModelError::Config(format!(
                "`{}` is set but `{}` is missing or 0",
                k.key("attention.temperature_scale"),
                k.key("attention.temperature_length")
            ))),
        },
        _ => Ok(None),
    }
}

/// The dense FFN's width, each trunk layer's FFN (dense leading layers, then routed experts
/// with the shared ones) and the first multi-token-prediction block's.
fn read_ffn(
    k: &Keys<'_, '_>,
    n_layer_all: usize,
    nextn: usize,
) -> Result<(usize, Vec<FfnKind>, Option<FfnKind>), ModelError> {
    let n_layer = n_layer_all - nextn;
    let hp = MoeHparams::from_metadata(k.meta, k.arch).map_err(moe_error)?;
    let n_ff_exp = hp
        .n_ff_exp
        .filter(|&n| n > 0)
        .ok_or_else(|| missing(k.key("expert_feed_forward_length")))?;
    let n_expert_shared = k.usize("expert_shared_count")?;
    if hp.n_leading_dense > n_layer {
        return Err(k.bad_count(
            "leading_dense_block_count",
            hp.n_leading_dense,
            &format!("more than the {n_layer} layers"),
        ));
    }
    let n_dense = hp.n_leading_dense;
    let n_ff = match k.per_layer("feed_forward_length", n_layer_all)? {
        Some(v) => v[0],
        None if n_dense == 0 => 0,
        None => return Err(missing(k.key("feed_forward_length"))),
    };
    let moe = MoeFfnConfig {
        router: hp.router,
        n_ff_exp,
        n_ff_shexp: match n_expert_shared {
            0 => None,
            n => Some(n_ff_exp.checked_mul(n).ok_or_else(|| {
                k.bad_count(
                    "expert_shared_count",
                    n,
                    &format!("{n} shared experts of {n_ff_exp} overflow"),
                )
            })?),
        },
        shexp_gate: false,
    };
    let kind = |il: usize| {
        if il < n_dense {
            FfnKind::Dense
        } else {
            FfnKind::Moe(moe.clone())
        }
    };
    let ffn = (0..n_layer).map(kind).collect();
    // The first multi-token-prediction block follows the trunk's layers.
    let mtp_ffn = (nextn > 0).then(|| kind(n_layer));
    Ok((n_ff, ffn, mtp_ffn))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yarn_scales_follow_llama_cpp() {
        // DeepSeek-V3: factor 40, mscale_all_dim 1 (stored as 0.1), Dk 192.
        let (a, kq) = yarn_scales(MscaleRule::Deepseek2, true, 1.0 / 40.0, 1.0, 1.0, 192);
        let m = 1.0 + 0.1 * 40f32.ln();
        // RoPE multiplies its own 1 + 0.1 ln s back in: the net magnitude is 1.
        assert!((a * m - 1.0).abs() < 1e-6);
        assert!((kq - m * m / 192f32.sqrt()).abs() < 1e-6);
        // DeepSeek-V2-Lite: mscale_all_dim 0.707; deepseek2 keeps the magnitude at 1, other
        // architectures use mscale(s, 1) / mscale(s, 0.707).
        let (a2, _) = yarn_scales(MscaleRule::Deepseek2, true, 1.0 / 40.0, 0.707, 1.0, 192);
        assert!((a2 * m - 1.0).abs() < 1e-6);
        let (a3, kq3) = yarn_scales(MscaleRule::Other, true, 1.0 / 40.0, 0.707, 1.0, 192);
        let ratio = m / (1.0 + 0.0707 * 40f32.ln());
        assert!((a3 * m - ratio).abs() < 1e-5);
        let m3 = ratio * (1.0 + 0.0707 * 40f32.ln());
        assert!((kq3 - m3 * m3 / 192f32.sqrt()).abs() < 1e-5);
        // Without YaRN: 1/sqrt(Dk).
        let (a4, kq4) = yarn_scales(MscaleRule::Deepseek2, false, 1.0, 0.0, 1.0, 64);
        assert_eq!((a4, kq4), (1.0, 0.125));
    }
}
