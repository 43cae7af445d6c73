//! Hyperparameters of a DeepSeek-V4 model, read as llama.cpp's `deepseek4` loader reads them,
//! every count bounded before it sizes anything.

use ferrox_gguf::Gguf;
use ferrox_moe::{Gating, MoeHparams, RouterConfig};

use crate::hparams::{moe_error, Keys};
use crate::layers::attention::MAX_HEAD_DIM;
use crate::layers::rope::{Rope, RopeStyle};
use crate::ModelError;

/// `hyper_connection.count`: llama.cpp's graph asserts 4 streams.
pub const HC_STREAMS: usize = 4;
/// Most heads (query or indexer) a file may declare.
const MAX_HEADS: usize = 4096;
/// Most Sinkhorn iterations a file may ask for (DeepSeek-V4 uses 20).
const MAX_SINKHORN_ITERATIONS: usize = 1000;

/// How a layer's attention reaches past its sliding window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// Ratio 0: the window only.
    None,
    /// Ratio 4 (CSA): overlapping 4x compressed rows, the indexer's top-k of them.
    Sparse,
    /// Ratio 128 (HCA): every 128x compressed row.
    Heavy,
}

impl Compression {
    /// Source positions per compressed row (0: none).
    pub fn ratio(self) -> usize {
        match self {
            Compression::None => 0,
            Compression::Sparse => 4,
            Compression::Heavy => 128,
        }
    }

    /// Halves of each token's compressor projections: 2 for the overlapping compressor (the
    /// first half feeds the next row, the second this one), 1 otherwise.
    pub fn overlap(self) -> usize {
        match self {
            Compression::Sparse => 2,
            _ => 1,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Deepseek4Config {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_head: usize,
    /// D: the width of a query head and of the shared key-value head.
    pub head_dim: usize,
    /// R: the rotated tail of each head, dims `[D - R, D)`.
    pub n_rot: usize,
    pub q_lora_rank: usize,
    /// W: a token sees the raw keys of positions `pos - W + 1 ..= pos`.
    pub window: usize,
    pub norm_eps: f32,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    pub sinkhorn_iterations: usize,
    pub hc_eps: f32,
    pub compression: Vec<Compression>,
    /// Leading layers whose experts are chosen by token id (`tid2eid`).
    pub n_hash_layers: usize,
    pub indexer_heads: usize,
    pub indexer_dim: usize,
    pub indexer_top_k: usize,
    /// The size of the Hadamard rotation llama.cpp always applies, block by block, to the
    /// indexer's queries and keys (the largest power-of-two multiple of 64 that divides Di;
    /// none where Di is not a multiple of 64, which llama.cpp does not run).
    pub indexer_rotation: Option<usize>,
    /// RoPE of the window-only layers.
    pub rope_window: Rope,
    /// RoPE of the compressed layers, their compressors and the indexer (YaRN if the file
    /// says, with its magnitude cancelled).
    pub rope_compressed: Rope,
    pub router: RouterConfig,
    pub n_ff_exp: usize,
    /// Hidden units of the shared expert (`n_ff_exp · expert_shared_count`).
    pub n_ff_shexp: usize,
    /// Per layer: the SwiGLU clamp of the routed experts and of the shared expert (0: none).
    pub clamp_exp: Vec<f32>,
    pub clamp_shexp: Vec<f32>,
}

impl Deepseek4Config {
    /// Reads the file's configuration. Its multi-token-prediction layers
    /// (`nextn_predict_layers`) count only where the file holds them: as in llama.cpp, the
    /// count is ignored when `blk.{first MTP layer}.nextn.eh_proj.weight` is absent.
    pub fn read(gguf: &Gguf) -> Result<Deepseek4Config, ModelError> {
        let meta = &gguf.metadata();
        let arch = "deepseek4";
        let k = Keys { meta, arch };
        let n_all = k.count("block_count", Keys::MAX_LAYERS)?;
        let declared = k.opt_usize("nextn_predict_layers")?.unwrap_or(0);
        let first_mtp = n_all.saturating_sub(declared);
        let present = gguf
            .tensor(&format!("blk.{first_mtp}.nextn.eh_proj.weight"))
            .is_some();
        let n_nextn = if declared > 0 && present { declared } else { 0 };
        // The multi-token-prediction blocks at the end are a draft head, never the trunk.
        let n_layer = n_all
            .checked_sub(n_nextn)
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                k.bad_count("nextn_predict_layers", n_nextn, "leaves no trunk layers")
            })?;
        let n_embd = k.count("embedding_length", Keys::MAX_COUNT)?;
        let n_head = k.count("attention.head_count", MAX_HEADS)?;
        let n_head_kv = k.usize("attention.head_count_kv")?;
        if n_head_kv != 1 {
            return Err(k.bad_count("attention.head_count_kv", n_head_kv, "must be 1"));
        }
        let head_dim = k.count("attention.key_length", MAX_HEAD_DIM)?;
        let value_dim = k.usize("attention.value_length")?;
        if value_dim != head_dim {
            return Err(k.bad_count(
                "attention.value_length",
                value_dim,
                "must equal attention.key_length",
            ));
        }
        let n_rot = k.usize("rope.dimension_count")?;
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(k.bad_count(
                "rope.dimension_count",
                n_rot,
                "must be even and at most attention.key_length",
            ));
        }
        let positive = |name: &str, max: usize| -> Result<usize, ModelError> {
            let n = k.count(name, max)?;
            if n == 0 {
                return Err(k.bad_count(name, n, "must be positive"));
            }
            Ok(n)
        };
        if n_embd == 0 || n_head == 0 || head_dim == 0 {
            return Err(ModelError::Config(
                "deepseek4: embedding_length, attention.head_count and attention.key_length must be positive"
                    .into(),
            ));
        }
        let q_lora_rank = positive("attention.q_lora_rank", Keys::MAX_COUNT)?;
        let window = positive("attention.sliding_window", Keys::MAX_COUNT)?;
        let o_groups = positive("attention.output_group_count", n_head)?;
        if n_head % o_groups != 0 {
            return Err(k.bad_count(
                "attention.output_group_count",
                o_groups,
                "must divide attention.head_count",
            ));
        }
        let o_lora_rank = positive("attention.output_lora_rank", Keys::MAX_COUNT)?;
        let hc = k.usize("hyper_connection.count")?;
        if hc != HC_STREAMS {
            return Err(k.bad_count("hyper_connection.count", hc, "must be 4"));
        }
        let sinkhorn_iterations = positive(
            "hyper_connection.sinkhorn_iterations",
            MAX_SINKHORN_ITERATIONS,
        )?;
        let hc_eps = k.f32("hyper_connection.epsilon")?;
        let n_hash_layers = k.count("hash_layer_count", n_layer)?;
        let compression = compress_ratios(&k, n_all)?[..n_layer].to_vec();
        let any_sparse = compression.contains(&Compression::Sparse);
        let indexer_heads = positive("attention.indexer.head_count", MAX_HEADS)?;
        let indexer_dim = k.count("attention.indexer.key_length", MAX_HEAD_DIM)?;
        if any_sparse && indexer_dim < n_rot {
            return Err(k.bad_count(
                "attention.indexer.key_length",
                indexer_dim,
                &format!("smaller than the {n_rot} rotated dimensions"),
            ));
        }
        let indexer_top_k = positive("attention.indexer.top_k", Keys::MAX_COUNT)?;

        let n_ctx_train = k.usize("context_length")?;
        let mut rope_compressed = k.rope(RopeStyle::Normal, n_rot, n_ctx_train)?;
        let rope_window = Rope::plain(RopeStyle::Normal, n_rot, rope_compressed.freq_base);
        rope_compressed.freq_base = k.f32("attention.compress_rope_freq_base")?;
        // llama.cpp's fixed YaRN ramp, and a magnitude that cancels YaRN's own.
        rope_compressed.beta_fast = 32.0;
        rope_compressed.beta_slow = 1.0;
        rope_compressed.attn_factor = if rope_compressed.ext_factor == 0.0 {
            1.0
        } else {
            1.0 / (1.0 + 0.1 * (1.0 / rope_compressed.freq_scale).ln())
        };

        let moe = MoeHparams::from_metadata(meta, arch).map_err(moe_error)?;
        let router = moe.router;
        if router.gating != Gating::SqrtSoftplus {
            return Err(ModelError::Config(format!(
                "`{}` must be 4 (sqrt-softplus), as llama.cpp requires",
                k.key("expert_gating_func")
            )));
        }
        let n_ff_exp = positive("expert_feed_forward_length", Keys::MAX_COUNT)?;
        let n_shared = positive("expert_shared_count", 1 << 16)?;
        let n_ff_shexp = n_ff_exp.checked_mul(n_shared).ok_or_else(|| {
            k.bad_count("expert_shared_count", n_shared, "too many shared experts")
        })?;
        let clamp_exp = per_layer_f32(&k, "swiglu_clamp_exp", n_all)?
            .ok_or_else(|| ferrox_gguf::GgufError::MissingKey(k.key("swiglu_clamp_exp")))?;
        let clamp_shexp =
            per_layer_f32(&k, "swiglu_clamp_shexp", n_all)?.unwrap_or_else(|| clamp_exp.clone());
        Ok(Deepseek4Config {
            n_layer,
            n_embd,
            n_vocab: k.vocab_size()?,
            n_ctx_train,
            n_head,
            head_dim,
            n_rot,
            q_lora_rank,
            window,
            norm_eps: k.f32("attention.layer_norm_rms_epsilon")?,
            o_groups,
            o_lora_rank,
            sinkhorn_iterations,
            hc_eps,
            compression,
            n_hash_layers,
            indexer_heads,
            indexer_dim,
            indexer_top_k,
            indexer_rotation: rotation_blocks(indexer_dim),
            rope_window,
            rope_compressed,
            router,
            n_ff_exp,
            n_ff_shexp,
            clamp_exp,
            clamp_shexp,
        })
    }

    /// The RoPE of layer `il`'s queries and keys.
    pub fn rope(&self, il: usize) -> &Rope {
        match self.compression[il] {
            Compression::None => &self.rope_window,
            _ => &self.rope_compressed,
        }
    }

    /// The hyper-connection mixing width: `(2 + hc) · hc`.
    pub fn hc_mix(&self) -> usize {
        (2 + HC_STREAMS) * HC_STREAMS
    }
}

/// `attention.compress_ratios`: one per block (at least `block_count` entries), each 0, 4
/// or 128.
fn compress_ratios(k: &Keys<'_, '_>, n_all: usize) -> Result<Vec<Compression>, ModelError> {
    let key = k.key("attention.compress_ratios");
    let a = k.meta.get_array(&key)?;
    if a.len() < n_all || a.len() > Keys::MAX_LAYERS {
        return Err(ModelError::Config(format!(
            "`{key}` has {} entries for {n_all} layers",
            a.len()
        )));
    }
    a.iter()
        .enumerate()
        .map(|(il, v)| match v.as_i128() {
            Some(0) => Ok(Compression::None),
            Some(4) => Ok(Compression::Sparse),
            Some(128) => Ok(Compression::Heavy),
            _ => Err(ModelError::Config(format!(
                "`{key}`[{il}]: compression ratios are 0, 4 or 128"
            ))),
        })
        .collect()
}

/// A per-layer float stored as one value or as an array of one per layer.
fn per_layer_f32(
    k: &Keys<'_, '_>,
    name: &str,
    n_layer: usize,
) -> Result<Option<Vec<f32>>, ModelError> {
    let key = k.key(name);
    match k.meta.get(&key) {
        None => Ok(None),
        Some(ferrox_gguf::Value::Array(a)) => {
            let values: Option<Vec<f32>> = a.iter().map(|v| v.as_f64().map(|f| f as f32)).collect();
            let values =
                values.ok_or_else(|| ModelError::Config(format!("`{key}` must hold numbers")))?;
            if values.len() != n_layer {
                return Err(ModelError::Config(format!(
                    "`{key}` has {} entries for {n_layer} layers",
                    values.len()
                )));
            }
            Ok(Some(values))
        }
        Some(_) => Ok(Some(vec![k.f32(name)?; n_layer])),
    }
}

/// The size of llama.cpp's rotation blocks for an indexer of `dim`: 64, doubled while it
/// divides `dim` twice over.
fn rotation_blocks(dim: usize) -> Option<usize> {
    if dim == 0 || !dim.is_multiple_of(64) {
        return None;
    }
    let mut n = 64;
    while dim.is_multiple_of(2 * n) {
        n *= 2;
    }
    Some(n)
}
