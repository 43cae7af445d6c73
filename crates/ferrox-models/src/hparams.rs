//! Reading hyperparameters from GGUF metadata, shared by every engine: `{arch}.*` keys with
//! every count bounded before it sizes anything, RoPE settings, the vocabulary size, and the
//! feed-forward kinds (dense or mixture of experts).
//!
//! Keys llama.cpp requires are required here too (a missing one is an error naming it);
//! keys llama.cpp treats as optional get llama.cpp's documented defaults.

use ferrox_gguf::{GgufError, Metadata, Value};
use ferrox_moe::{MoeHparams, RouterConfig};

use crate::layers::rope::{Rope, RopeStyle};
use crate::ModelError;

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

pub(crate) fn check_count(key: &str, n: usize, max: usize) -> Result<usize, ModelError> {
    if n > max {
        return Err(bad_count(key, n, &format!("more than the {max} allowed")));
    }
    Ok(n)
}

pub(crate) fn vocab_size(meta: &Metadata<'_>, k: &Keys<'_, '_>) -> Result<usize, ModelError> {
    if let Some(n) = k.opt_usize("vocab_size")? {
        return Ok(n);
    }
    Ok(meta.get_array("tokenizer.ggml.tokens")?.len())
}

pub(crate) fn read_rope(
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
