//! Hyperparameters of a dense decoder, read from GGUF metadata.
//!
//! Keys llama.cpp requires are required here too (a missing one is an error naming it);
//! keys llama.cpp treats as optional get llama.cpp's documented defaults.

use ferrox_gguf::{GgufError, Metadata, Value};
use ferrox_moe::{MoeHparams, RouterConfig};

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

/// A layer's feed-forward block.
#[derive(Clone, Debug, PartialEq)]
pub enum FfnKind {
    /// `down(act(gate x) * up x)` with `n_ff` hidden units.
    Dense,
    /// Routed experts (`ffn_gate_inp`, `ffn_{gate,up,down}_exps`), optionally plus a shared
    /// expert (`ffn_{gate,up,down}_shexp`).
    Moe(MoeFfnConfig),
}

#[derive(Clone, Debug, PartialEq)]
pub struct MoeFfnConfig {
    pub router: RouterConfig,
    /// Hidden units of each routed expert.
    pub n_ff_exp: usize,
    /// Hidden units of the shared expert, if the layer has one.
    pub n_ff_shexp: Option<usize>,
    /// The shared expert's output is scaled by `sigmoid(ffn_gate_inp_shexp · x)` (qwen2moe).
    pub shexp_gate: bool,
}

impl MoeFfnConfig {
    /// Reads the MoE hyperparameters of `arch` (llama.cpp's defaults: each expert has
    /// `n_ff / n_expert_used` hidden units unless `expert_feed_forward_length` says).
    pub fn from_metadata(
        meta: &Metadata<'_>,
        arch: &str,
        n_ff: usize,
    ) -> Result<MoeFfnConfig, ModelError> {
        let hp = MoeHparams::from_metadata(meta, arch).map_err(moe_error)?;
        if hp.router.n_expert == 0 || hp.router.n_used == 0 {
            return Err(ModelError::Config(format!(
                "{arch}: expert_count and expert_used_count must be positive"
            )));
        }
        Ok(MoeFfnConfig {
            router: hp.router,
            n_ff_exp: hp
                .n_ff_exp
                .filter(|&n| n > 0)
                .unwrap_or(n_ff / hp.router.n_used),
            n_ff_shexp: None,
            shexp_gate: false,
        })
    }
}

/// MoE errors as model errors.
pub fn moe_error(e: ferrox_moe::MoeError) -> ModelError {
    ModelError::Config(format!("mixture of experts: {e}"))
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

/// A count in the metadata that cannot be right: the error names the key and its value.
fn bad_count(key: &str, value: impl std::fmt::Display, reason: &str) -> ModelError {
    ModelError::Config(format!("`{key}` = {value}: {reason}"))
}

/// Reads `{arch}.{name}` keys.
pub struct Keys<'m, 'a> {
    pub meta: &'m Metadata<'a>,
    pub arch: &'m str,
}

impl Keys<'_, '_> {
    /// Most layers a file may declare (llama.cpp's `LLAMA_MAX_LAYERS`). The per-layer
    /// settings are sized by `block_count` before any tensor is looked at; loading the
    /// weights then checks that the file holds every layer's tensors.
    pub const MAX_LAYERS: usize = 512;

    /// Largest value any count in the metadata may hold. llama.cpp keeps these
    /// hyperparameters in 32-bit integers, and below 2^32 the product of two counts cannot
    /// overflow.
    pub const MAX_COUNT: usize = u32::MAX as usize;

    pub fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.arch)
    }

    /// The error for `{arch}.{name}` holding `value`, which cannot be right.
    pub fn bad_count(&self, name: &str, value: impl std::fmt::Display, reason: &str) -> ModelError {
        bad_count(&self.key(name), value, reason)
    }

    /// A required count, at most [`Keys::MAX_COUNT`].
    pub fn usize(&self, name: &str) -> Result<usize, ModelError> {
        self.count(name, Self::MAX_COUNT)
    }

    /// An optional count, at most [`Keys::MAX_COUNT`].
    pub fn opt_usize(&self, name: &str) -> Result<Option<usize>, ModelError> {
        self.opt_count(name, Self::MAX_COUNT)
    }

    /// A required count, at most `max` (an error naming the key and value otherwise).
    pub fn count(&self, name: &str, max: usize) -> Result<usize, ModelError> {
        self.opt_count(name, max)?
            .ok_or_else(|| GgufError::MissingKey(self.key(name)).into())
    }

    /// An optional count, at most `max`.
    pub fn opt_count(&self, name: &str, max: usize) -> Result<Option<usize>, ModelError> {
        let key = self.key(name);
        let Some(n) = self.meta.opt_usize(&key)? else {
            return Ok(None);
        };
        check_count(&key, n, max).map(Some)
    }

    pub fn f32(&self, name: &str) -> Result<f32, ModelError> {
        Ok(self.meta.get_f32(&self.key(name))?)
    }

    pub fn opt_f32(&self, name: &str) -> Result<Option<f32>, ModelError> {
        Ok(self.meta.opt_f32(&self.key(name))?)
    }

    /// The vocabulary size: `{arch}.vocab_size`, else the tokenizer's token count.
    pub fn vocab_size(&self) -> Result<usize, ModelError> {
        vocab_size(self.meta, self)
    }

    /// RoPE settings from `{arch}.rope.*` (base, linear or YaRN scaling).
    pub fn rope(
        &self,
        style: RopeStyle,
        n_dims: usize,
        n_ctx_train: usize,
    ) -> Result<Rope, ModelError> {
        read_rope(self, style, n_dims, n_ctx_train)
    }

    /// A per-layer count stored either as one integer or as an array with one per layer,
    /// each at most [`Keys::MAX_COUNT`]. `n_layer` must already be bounded (see
    /// [`Keys::MAX_LAYERS`]).
    pub fn per_layer(&self, name: &str, n_layer: usize) -> Result<Option<Vec<usize>>, ModelError> {
        let key = self.key(name);
        match self.meta.get(&key) {
            None => Ok(None),
            Some(Value::Array(a)) => {
                if a.len() != n_layer {
                    return Err(ModelError::Config(format!(
                        "`{key}` has {} entries for {n_layer} layers",
                        a.len()
                    )));
                }
                a.iter()
                    .enumerate()
                    .map(|(il, v)| {
                        let n = v.as_i128().and_then(|i| usize::try_from(i).ok());
                        let n = n.ok_or_else(|| {
                            ModelError::Config(format!(
                                "`{key}`[{il}] must be a non-negative integer"
                            ))
                        })?;
                        check_count(&format!("{key}[{il}]"), n, Self::MAX_COUNT)
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(Some)
            }
            Some(_) => Ok(Some(vec![self.usize(name)?; n_layer])),
        }
    }
}

fn check_count(key: &str, n: usize, max: usize) -> Result<usize, ModelError> {
    if n > max {
        return Err(bad_count(key, n, &format!("more than the {max} allowed")));
    }
    Ok(n)
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
    })
}

fn vocab_size(meta: &Metadata<'_>, k: &Keys<'_, '_>) -> Result<usize, ModelError> {
    if let Some(n) = k.opt_usize("vocab_size")? {
        return Ok(n);
    }
    Ok(meta.get_array("tokenizer.ggml.tokens")?.len())
}

fn read_rope(
    k: &Keys<'_, '_>,
    style: RopeStyle,
    n_dims: usize,
    n_ctx_train: usize,
) -> Result<Rope, ModelError> {
    let mut rope = Rope::plain(
        style,
        n_dims,
        k.opt_f32("rope.freq_base")?.unwrap_or(10000.0),
    );
    let factor = match k.opt_f32("rope.scaling.factor")? {
        Some(f) => f,
        None => k.opt_f32("rope.scale_linear")?.unwrap_or(0.0),
    };
    rope.freq_scale = if factor == 0.0 { 1.0 } else { 1.0 / factor };
    let scaling = k
        .meta
        .opt_str(&k.key("rope.scaling.type"))?
        .unwrap_or("linear");
    rope.n_ctx_orig = k
        .opt_usize("rope.scaling.original_context_length")?
        .unwrap_or(n_ctx_train);
    match scaling {
        "none" | "linear" => {}
        "yarn" => {
            rope.ext_factor = 1.0;
            if let Some(a) = k.opt_f32("rope.scaling.attn_factor")? {
                rope.attn_factor = a;
            }
            if let Some(b) = k.opt_f32("rope.scaling.yarn_beta_fast")? {
                rope.beta_fast = b;
            }
            if let Some(b) = k.opt_f32("rope.scaling.yarn_beta_slow")? {
                rope.beta_slow = b;
            }
        }
        other => {
            return Err(ModelError::Config(format!(
                "rope scaling type `{other}` is not supported"
            )));
        }
    }
    Ok(rope)
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
