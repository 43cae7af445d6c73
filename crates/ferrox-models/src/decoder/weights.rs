//! Locating and checking a dense decoder's tensors. Matrices stay in the mapped file,
//! quantized; only the small norm vectors and biases are decoded to f32 at load.

use crate::plan::Packing;
use ferrox_gguf::Gguf;

use super::config::{DecoderConfig, FfnKind};
use crate::names::*;
use crate::tensors::{
    check_block_count, embedding_and_head_bytes, name_keys, Loader, MatrixRef, MoeWeights,
    QkvWeights,
};
use crate::ModelError;

/// Gate and up projections: separate (llama, gemma) or stacked in one matrix whose first
/// half of rows is the gate (phi3).
#[derive(Clone, Debug)]
pub enum GateUpWeights {
    Separate { gate: MatrixRef, up: MatrixRef },
    Fused(MatrixRef),
}

/// A layer's feed-forward weights (see [`FfnKind`]).
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum FfnWeights {
    Dense {
        gate_up: GateUpWeights,
        down: MatrixRef,
    },
    Moe(MoeWeights),
}

#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub qkv: QkvWeights,
    pub q_bias: Option<Vec<f32>>,
    pub k_bias: Option<Vec<f32>>,
    pub v_bias: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub wo: MatrixRef,
    pub attn_post_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub ffn: FfnWeights,
    pub ffn_post_norm: Option<Vec<f32>>,
}

#[derive(Clone, Debug)]
pub struct DecoderWeights {
    pub token_embd: MatrixRef,
    pub output_norm: Vec<f32>,
    /// The output head; the token embedding when the model ties them.
    pub output: MatrixRef,
    pub layers: Vec<LayerWeights>,
    /// Llama 3.1 style RoPE frequency divisors.
    pub rope_freqs: Option<Vec<f32>>,
}

/// `a × b + c`, for the widths of activations made from counts in the metadata: an overflow
/// is an error naming what was being sized, never a wrapped size.
fn width(a: usize, b: usize, c: usize, what: impl Fn() -> String) -> Result<usize, ModelError> {
    a.checked_mul(b)
        .and_then(|ab| ab.checked_add(c))
        .ok_or_else(|| ModelError::Config(format!("{} overflows", what())))
}

impl DecoderWeights {
    pub fn load(gguf: &Gguf, config: &DecoderConfig) -> Result<DecoderWeights, ModelError> {
        check_block_count(gguf, &config.arch, config.n_layer())?;
        Self::load_checked(gguf, config).map_err(|e| name_keys(e, &config.arch))
    }

    fn load_checked(gguf: &Gguf, config: &DecoderConfig) -> Result<DecoderWeights, ModelError> {
        let l = Loader { gguf };
        let n_embd = config.n_embd;
        let n_vocab = config.n_vocab;
        let token_embd = l.matrix(&TOKEN_EMBD.weight(), n_embd, n_vocab)?;
        let output = l
            .opt_matrix(&OUTPUT.weight(), n_embd, n_vocab)?
            .unwrap_or_else(|| token_embd.clone());
        let output_norm = l.vector(&OUTPUT_NORM.weight(), n_embd)?;
        let rope_dims = config.layers[0].rope.n_dims;
        let rope_freqs = l.opt_vector(&ROPE_FREQS.weight(), rope_dims / 2)?;

        let mut layers = Vec::with_capacity(config.n_layer());
        for (il, lc) in config.layers.iter().enumerate() {
            let heads = |n: usize, dim: usize, what: &'static str| {
                width(n, dim, 0, || {
                    format!("layer {il}: {what} width ({n} heads of {dim})")
                })
            };
            let q_width = heads(lc.n_head, lc.head_dim_k, "query")?;
            let k_width = heads(lc.n_head_kv, lc.head_dim_k, "key")?;
            let v_width = heads(lc.n_head_kv, lc.head_dim_v, "value")?;
            let o_width = heads(lc.n_head, lc.head_dim_v, "attention output")?;
            let ff2 = width(2, lc.n_ff, 0, || format!("layer {il}: fused gate/up width"))?;
            let qkv = l.qkv(il, n_embd, (q_width, k_width, v_width))?;
            let ffn = match &lc.ffn {
                FfnKind::Dense => FfnWeights::Dense {
                    gate_up: match l.opt_matrix(&FFN_GATE.layer(il), n_embd, lc.n_ff)? {
                        Some(gate) => GateUpWeights::Separate {
                            gate,
                            up: l.matrix(&FFN_UP.layer(il), n_embd, lc.n_ff)?,
                        },
                        None => GateUpWeights::Fused(l.matrix(&FFN_UP.layer(il), n_embd, ff2)?),
                    },
                    down: l.matrix(&FFN_DOWN.layer(il), lc.n_ff, n_embd)?,
                },
                FfnKind::Moe(mc) => FfnWeights::Moe(l.moe(il, n_embd, mc)?),
            };
            let (q_norm_len, k_norm_len) = if config.qk_norm_whole {
                (q_width, k_width)
            } else {
                (lc.head_dim_k, lc.head_dim_k)
            };
            let norm_or_missing =
                |tensor: Tensor, wanted: bool, n: usize| -> Result<Option<Vec<f32>>, ModelError> {
                    if wanted {
                        l.vector(&tensor.layer(il), n).map(Some)
                    } else {
                        Ok(None)
                    }
                };
            layers.push(LayerWeights {
                attn_norm: l.vector(&ATTN_NORM.layer(il), n_embd)?,
                qkv,
                q_bias: l.opt_vector(&ATTN_Q.layer_bias(il), q_width)?,
                k_bias: l.opt_vector(&ATTN_K.layer_bias(il), k_width)?,
                v_bias: l.opt_vector(&ATTN_V.layer_bias(il), v_width)?,
                q_norm: norm_or_missing(ATTN_Q_NORM, config.qk_norm, q_norm_len)?,
                k_norm: norm_or_missing(ATTN_K_NORM, config.qk_norm, k_norm_len)?,
                wo: l.matrix(&ATTN_OUTPUT.layer(il), o_width, n_embd)?,
                attn_post_norm: norm_or_missing(ATTN_POST_NORM, config.post_norms, n_embd)?,
                ffn_norm: l.vector(&FFN_NORM.layer(il), n_embd)?,
                ffn,
                ffn_post_norm: norm_or_missing(FFN_POST_NORM, config.post_norms, n_embd)?,
            });
        }
        Ok(DecoderWeights {
            token_embd,
            output_norm,
            output,
            layers,
            rope_freqs,
        })
    }

    /// Packs the matrices this machine multiplies faster packed (see [`MatrixRef::pack`]):
    /// the output head, every layer's projections and experts (not the routers). The token
    /// embedding keeps its rows in the file, where lookups read them.
    pub fn pack(&mut self, gguf: &Packing<'_>) -> Result<(), ModelError> {
        let mut matrices: Vec<&mut MatrixRef> = vec![&mut self.output];
        for layer in &mut self.layers {
            matrices.extend(layer.qkv.matrices_mut());
            matrices.push(&mut layer.wo);
            match &mut layer.ffn {
                FfnWeights::Dense { gate_up, down } => {
                    match gate_up {
                        GateUpWeights::Separate { gate, up } => matrices.extend([gate, up]),
                        GateUpWeights::Fused(m) => matrices.push(m),
                    }
                    matrices.push(down);
                }
                FfnWeights::Moe(moe) => moe.pack(gguf)?,
            }
        }
        matrices.into_iter().try_for_each(|m| m.pack(gguf))?;
        crate::tensors::link_lookahead(self.layers.iter_mut().filter_map(|l| match &mut l.ffn {
            FfnWeights::Moe(moe) => Some(moe),
            FfnWeights::Dense { .. } => None,
        }));
        Ok(())
    }

    /// Bytes of weights one decoded token reads (every matrix once, one embedding row).
    pub fn bytes_per_token(&self, config: &DecoderConfig) -> u64 {
        let mut total = embedding_and_head_bytes(&self.token_embd, &self.output);
        for (l, lc) in self.layers.iter().zip(&config.layers) {
            total += l.qkv.n_bytes();
            total += match (&l.ffn, &lc.ffn) {
                (FfnWeights::Dense { gate_up, down }, _) => {
                    down.n_bytes()
                        + match gate_up {
                            GateUpWeights::Separate { gate, up } => gate.n_bytes() + up.n_bytes(),
                            GateUpWeights::Fused(m) => m.n_bytes(),
                        }
                }
                (FfnWeights::Moe(m), kind) => m.bytes_per_token_in(kind),
            };
            total += l.wo.n_bytes();
        }
        total
    }
}
