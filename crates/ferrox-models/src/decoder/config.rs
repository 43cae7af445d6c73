//! Hyperparameters of a dense decoder, read from GGUF metadata.
//!
//! Keys llama.cpp requires are required here too (a missing one is an error naming it);
//! keys llama.cpp treats as optional get llama.cpp's documented defaults.

use ferrox_gguf::{GgufError, Metadata, Value};

use crate::hparams::{check_count, read_rope, vocab_size};
pub use crate::hparams::{moe_error, FfnKind, Keys, MoeFfnConfig};
use crate::layers::activation::Activation;
use crate::layers::rope::{Rope, RopeStyle};
use crate::ModelError;

/// What differs between the dense families, beyond the numbers in the metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderConfig {
    pub arch: String,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub norm_eps: f32,
    pub layers: Vec<LayerConfig>,
    pub activation: Activation,
    /// Token embeddings are multiplied by this (gemma: sqrt(n_embd)).
    pub embedding_scale: Option<f32>,
    /// Queries are multiplied by this after RoPE and q·k is not scaled again (gemma, phi3);
    /// when `None`, q·k is scaled by 1/sqrt(head_dim).
    pub query_scale: Option<f32>,
    /// Per-head RMSNorm of queries and keys before RoPE (qwen3, gemma3).
    pub qk_norm: bool,
    /// With `qk_norm`: the norm spans the whole query / key projection (one weight of
    /// `n_head * head_dim` values) instead of each head (olmoe).
    pub qk_norm_whole: bool,
    /// RMSNorm of the attention and FFN outputs before the residual add (gemma2, gemma3).
    pub post_norms: bool,
    pub attn_softcap: Option<f32>,
    pub final_logit_softcap: Option<f32>,
    /// A reranker's scores go through a softmax (the Qwen3 rerankers, as llama.cpp).
    pub rank_softmax: bool,
    /// Qwen3-VL's deepstack: given input rows hold `1 + deepstack_layers` slices of
    /// `n_embd`; the first is the input, slice `i + 1` is added to the hidden state after
    /// layer `i` (token rows have zeros there).
    pub deepstack_layers: usize,
}

/// Per-layer attention and FFN geometry.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerConfig {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub n_ff: usize,
    /// Dense FFN or mixture of experts.
    pub ffn: FfnKind,
    /// Keys further back than this many positions are masked (sliding-window layers).
    pub sliding_window: Option<usize>,
    pub rope: Rope,
}

impl DecoderConfig {
    pub fn n_layer(&self) -> usize {
        self.layers.len()
    }

    /// Widest per-token key/value rows over the layers (the KV cache's row sizes).
    pub fn kv_widths(&self) -> (usize, usize) {
        let k = self
            .layers
            .iter()
            .map(|l| l.n_head_kv * l.head_dim_k)
            .max()
            .unwrap_or(0);
        let v = self
            .layers
            .iter()
            .map(|l| l.n_head_kv * l.head_dim_v)
            .max()
            .unwrap_or(0);
        (k, v)
    }
}

/// The metadata every dense family shares. Families then adjust the result.
pub fn read_common(
    meta: &Metadata<'_>,
    arch: &str,
    rope_style: RopeStyle,
) -> Result<DecoderConfig, ModelError> {
    let k = Keys { meta, arch };
    let n_layer = k.count("block_count", Keys::MAX_LAYERS)?;
    let n_embd = k.usize("embedding_length")?;
    let n_ctx_train = k.usize("context_length")?;
    if n_layer == 0 || n_embd == 0 {
        return Err(ModelError::Config(
            "block_count and embedding_length must be positive".into(),
        ));
    }
    let required = |name: &str| ModelError::Gguf(GgufError::MissingKey(k.key(name)));
    let n_head = k
        .per_layer("attention.head_count", n_layer)?
        .ok_or_else(|| required("attention.head_count"))?;
    let n_head_kv = k
        .per_layer("attention.head_count_kv", n_layer)?
        .unwrap_or_else(|| n_head.clone());
    let n_ff = k
        .per_layer("feed_forward_length", n_layer)?
        .ok_or_else(|| required("feed_forward_length"))?;
    let max_dim = crate::layers::attention::MAX_HEAD_DIM;
    // A head size the file states, else the embedding split over the first layer's heads.
    let head_dim = |name: &str| -> Result<usize, ModelError> {
        let (dim, source) = match k.opt_usize(name)? {
            Some(dim) => (dim, format!("`{}`", k.key(name))),
            None => (
                n_embd / n_head[0].max(1),
                format!(
                    "`{}` / `{}`",
                    k.key("embedding_length"),
                    k.key("attention.head_count")
                ),
            ),
        };
        if dim == 0 || dim > max_dim {
            return Err(ModelError::Config(format!(
                "{source} = {dim}: a head size must be 1 to {max_dim}"
            )));
        }
        Ok(dim)
    };
    let head_dim_k = head_dim("attention.key_length")?;
    let head_dim_v = head_dim("attention.value_length")?;
    let n_rot = k.opt_usize("rope.dimension_count")?.unwrap_or(head_dim_k);
    if n_rot > head_dim_k || n_rot % 2 != 0 {
        return Err(k.bad_count(
            "rope.dimension_count",
            n_rot,
            &format!("must be even and at most the head size {head_dim_k}"),
        ));
    }
    let rope = read_rope(&k, rope_style, n_rot, n_ctx_train)?;
    let norm_eps = k.f32("attention.layer_norm_rms_epsilon")?;
    let n_vocab = vocab_size(meta, &k)?;

    let mut layers = Vec::with_capacity(n_layer);
    for il in 0..n_layer {
        let (h, hkv) = (n_head[il], n_head_kv[il]);
        if h == 0 || hkv == 0 || h % hkv != 0 {
            return Err(ModelError::Config(format!(
                "`{}` = {h} and `{}` = {hkv}: layer {il}'s query heads cannot share its KV \
                 heads",
                k.key("attention.head_count"),
                k.key("attention.head_count_kv")
            )));
        }
        layers.push(LayerConfig {
            n_head: h,
            n_head_kv: hkv,
            head_dim_k,
            head_dim_v,
            n_ff: n_ff[il],
            ffn: FfnKind::Dense,
            sliding_window: None,
            rope: rope.clone(),
        });
    }
    Ok(DecoderConfig {
        arch: arch.to_string(),
        n_embd,
        n_vocab,
        n_ctx_train,
        norm_eps,
        layers,
        activation: Activation::Silu,
        embedding_scale: None,
        query_scale: None,
        qk_norm: false,
        qk_norm_whole: false,
        post_norms: false,
        attn_softcap: None,
        final_logit_softcap: None,
        rank_softmax: false,
        deepstack_layers: 0,
    })
}

/// Marks layers as sliding-window from llama.cpp's pattern rule: with pattern `n`, every
/// `n`-th layer (the last of each group) uses full attention. An explicit
/// `attention.sliding_window_pattern` array or integer in the metadata wins.
pub fn apply_swa_pattern(
    config: &mut DecoderConfig,
    meta: &Metadata<'_>,
    window: usize,
    default_pattern: usize,
) -> Result<(), ModelError> {
    let key = format!("{}.attention.sliding_window_pattern", config.arch);
    let n_layer = config.n_layer();
    let is_swa: Vec<bool> = match meta.get(&key) {
        Some(Value::Array(a)) => {
            let flags = a
                .as_bools()
                .ok_or_else(|| ModelError::Config(format!("`{key}` must be an array of bools")))?;
            if flags.len() != n_layer {
                return Err(ModelError::Config(format!(
                    "`{key}` has {} entries for {n_layer} layers",
                    flags.len()
                )));
            }
            flags
        }
        _ => {
            let n = match meta.opt_usize(&key)? {
                Some(n) => check_count(&key, n, Keys::MAX_COUNT)?,
                None => default_pattern,
            };
            (0..n_layer).map(|il| n == 0 || il % n < n - 1).collect()
        }
    };
    for (layer, swa) in config.layers.iter_mut().zip(is_swa) {
        layer.sliding_window = swa.then_some(window);
    }
    Ok(())
}
