//! What an encoder family reads from the file.

use ferrox_gguf::Metadata;

use crate::hparams::{read_rope, vocab_size, Keys};
use crate::layers::rope::{Rope, RopeStyle};
use crate::ModelError;

/// How positions enter.
#[derive(Clone, Debug)]
pub enum Positions {
    /// A learned row per position added to the token embedding (`position_embd`; BERT).
    Learned,
    /// Queries and keys rotated (nomic-bert: NeoX RoPE).
    Rotary(Rope),
    /// A bias of `-slope_h * |i - j|` on each head's scores (jina-bert-v2: ALiBi).
    Alibi { max_bias: f32 },
}

/// The feed-forward block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncoderFfn {
    /// `down(gelu(up x + b) ) + b` (BERT).
    Gelu,
    /// `down(silu(gate x) * up x)` (nomic-bert).
    SwiGlu,
    /// `down(gelu(gate x) * (up x + b)) + b`, the gate a matrix of its own or the first half
    /// of the up projection's rows (jina-bert-v2).
    GeGlu,
}

/// An encoder's shapes and settings.
#[derive(Clone, Debug)]
pub struct EncoderConfig {
    pub arch: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    /// LayerNorm's epsilon (`attention.layer_norm_epsilon`).
    pub norm_eps: f32,
    /// `attention.causal` (BERT files say false; llama.cpp defaults to true without it).
    pub causal: bool,
    pub positions: Positions,
    pub ffn: EncoderFfn,
    /// Layers whose FFN is routed experts instead (nomic-bert-moe).
    pub moe: Option<EncoderMoe>,
}

/// Routed experts on every `every_n`-th layer (from layer 1): ungated GELU experts of
/// `n_ff` hidden units, as llama.cpp runs nomic-bert-moe.
#[derive(Clone, Debug)]
pub struct EncoderMoe {
    pub router: ferrox_moe::RouterConfig,
    pub every_n: usize,
}

impl EncoderConfig {
    /// Whether layer `il`'s FFN is routed experts.
    pub fn is_moe_layer(&self, il: usize) -> bool {
        self.moe
            .as_ref()
            .is_some_and(|m| m.every_n > 0 && il % m.every_n == 1)
    }
}

/// How an encoder family gives positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PositionKind {
    Learned,
    Rotary,
    Alibi,
}

/// ALiBi's largest slope exponent, as llama.cpp sets it for jina-bert-v2.
const ALIBI_MAX_BIAS: f32 = 8.0;

/// Reads the keys every encoder family has.
pub fn read_encoder(
    meta: &Metadata<'_>,
    arch: &str,
    positions: PositionKind,
    ffn: EncoderFfn,
) -> Result<EncoderConfig, ModelError> {
    let k = Keys { meta, arch };
    let n_layer = k.count("block_count", Keys::MAX_LAYERS)?;
    let n_embd = k.usize("embedding_length")?;
    // Stored as one value or one per layer (as llama.cpp reads them); an encoder's layers
    // all have the same.
    let uniform = |name: &str| -> Result<usize, ModelError> {
        let values = k
            .per_layer(name, n_layer)?
            .ok_or_else(|| ferrox_gguf::GgufError::MissingKey(k.key(name)))?;
        match values.iter().all(|&v| v == values[0]) {
            true => Ok(values[0]),
            false => Err(ModelError::Config(format!(
                "`{}` differs between layers: an encoder's layers are alike",
                k.key(name)
            ))),
        }
    };
    let n_head = uniform("attention.head_count")?;
    let n_ctx_train = k.usize("context_length")?;
    if n_layer == 0 || n_embd == 0 || n_head == 0 || !n_embd.is_multiple_of(n_head) {
        return Err(ModelError::Config(format!(
            "`{arch}.block_count`, `{arch}.embedding_length` and `{arch}.attention.head_count` \
             must be positive, the width a multiple of the heads ({n_layer}, {n_embd}, {n_head})"
        )));
    }
    if let Some(kv) = k.opt_usize("attention.head_count_kv")? {
        if kv != n_head {
            return Err(k.bad_count(
                "attention.head_count_kv",
                kv,
                "an encoder's heads all have their own keys",
            ));
        }
    }
    let head_dim = n_embd / n_head;
    let max_dim = crate::layers::attention::MAX_HEAD_DIM;
    if head_dim > max_dim {
        return Err(ModelError::Config(format!(
            "a head of {head_dim} values: at most {max_dim}"
        )));
    }
    let positions = match positions {
        PositionKind::Learned => Positions::Learned,
        PositionKind::Alibi => Positions::Alibi {
            max_bias: ALIBI_MAX_BIAS,
        },
        PositionKind::Rotary => {
            let n_rot = k.opt_usize("rope.dimension_count")?.unwrap_or(head_dim);
            if n_rot > head_dim || n_rot % 2 != 0 {
                return Err(k.bad_count(
                    "rope.dimension_count",
                    n_rot,
                    &format!("must be even and at most the head size {head_dim}"),
                ));
            }
            Positions::Rotary(read_rope(&k, RopeStyle::Neox, n_rot, n_ctx_train)?)
        }
    };
    Ok(EncoderConfig {
        arch: arch.to_string(),
        n_layer,
        n_embd,
        n_head,
        head_dim,
        n_ff: uniform("feed_forward_length")?,
        n_vocab: vocab_size(meta, &k)?,
        n_ctx_train,
        norm_eps: k.f32("attention.layer_norm_epsilon")?,
        causal: meta.opt_bool(&k.key("attention.causal"))?.unwrap_or(true),
        positions,
        ffn,
        moe: None,
    })
}
