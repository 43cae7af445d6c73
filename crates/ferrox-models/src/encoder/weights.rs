//! Locating and checking an encoder's tensors. Matrices stay in the mapped file; norms,
//! biases and the token-type row are decoded to f32 at load.

use crate::plan::Packing;
use ferrox_gguf::Gguf;

use super::config::{EncoderConfig, EncoderFfn, Positions};
use crate::names::*;
use crate::tensors::{check_block_count, name_keys, ExpertRef, Loader, MatrixRef, QkvWeights};
use crate::ModelError;

/// A LayerNorm's weight and bias.
#[derive(Clone, Debug)]
pub struct LayerNormWeights {
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
}

#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub qkv: QkvWeights,
    /// The query, key and value biases, one after the other (split from a fused bias or
    /// read separately), if the file has them.
    pub qkv_bias: Option<Vec<f32>>,
    pub wo: MatrixRef,
    pub wo_bias: Option<Vec<f32>>,
    pub attn_out_norm: LayerNormWeights,
    /// LayerNorms of the whole query and key projections (jina-bert-v2).
    pub q_norm: Option<LayerNormWeights>,
    pub k_norm: Option<LayerNormWeights>,
    /// A second post-attention norm, the layer's input added again before it (jina-bert-v2).
    pub attn_norm_2: Option<LayerNormWeights>,
    pub ffn: FfnWeights,
    pub out_norm: LayerNormWeights,
}

/// A layer's feed-forward weights.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum FfnWeights {
    Dense(DenseFfn),
    /// Routed experts (nomic-bert-moe).
    Experts(ExpertFfn),
}

#[derive(Clone, Debug)]
pub struct DenseFfn {
    pub up: MatrixRef,
    pub up_bias: Option<Vec<f32>>,
    /// The gate of a gated FFN with its own gate matrix (nomic-bert; some jina-bert-v2); a
    /// GEGLU FFN without one has the gate as the first half of `up`'s rows.
    pub gate: Option<MatrixRef>,
    pub down: MatrixRef,
    pub down_bias: Option<Vec<f32>>,
}

/// Ungated routed experts and their router.
#[derive(Clone, Debug)]
pub struct ExpertFfn {
    pub router: MatrixRef,
    pub up: ExpertRef,
    pub down: ExpertRef,
}

#[derive(Clone, Debug)]
pub struct EncoderWeights {
    pub token_embd: MatrixRef,
    /// Token type 0's row ("sentence A"), added to every token as llama.cpp does.
    pub token_type: Option<Vec<f32>>,
    /// Learned positions (BERT).
    pub position_embd: Option<MatrixRef>,
    pub embd_norm: LayerNormWeights,
    pub layers: Vec<LayerWeights>,
}

impl EncoderWeights {
    pub fn load(gguf: &Gguf, config: &EncoderConfig) -> Result<EncoderWeights, ModelError> {
        check_block_count(gguf, &config.arch, config.n_layer)?;
        Self::load_checked(gguf, config).map_err(|e| name_keys(e, &config.arch))
    }

    fn load_checked(gguf: &Gguf, c: &EncoderConfig) -> Result<EncoderWeights, ModelError> {
        let l = Loader { gguf };
        let e = c.n_embd;
        let norm = |weight: String, bias: String| -> Result<LayerNormWeights, ModelError> {
            Ok(LayerNormWeights {
                weight: l.vector(&weight, e)?,
                bias: l.vector(&bias, e)?,
            })
        };
        let token_type = match l.find(&TOKEN_TYPES.weight()) {
            Some(t) => {
                let types = l.matrix(
                    &TOKEN_TYPES.weight(),
                    e,
                    t.shape.get(1).map_or(1, |&n| n as usize),
                )?;
                let mut row = vec![0.0; e];
                types.view(gguf)?.dequant_row(0, &mut row)?;
                Some(row)
            }
            None => None,
        };
        let position_embd = match c.positions {
            Positions::Learned => Some(l.matrix(&POSITION_EMBD.weight(), e, c.n_ctx_train)?),
            Positions::Rotary(_) | Positions::Alibi { .. } => None,
        };
        let mut layers = Vec::with_capacity(c.n_layer);
        for il in 0..c.n_layer {
            let qkv = l.qkv(il, e, (e, e, e))?;
            // One bias for the fused projection, or one each: q's, k's and v's in a row.
            let qkv_bias = match l.opt_vector(&ATTN_QKV.layer_bias(il), 3 * e)? {
                Some(b) => Some(b),
                None => {
                    let biases = [ATTN_Q, ATTN_K, ATTN_V]
                        .iter()
                        .map(|t| l.opt_vector(&t.layer_bias(il), e))
                        .collect::<Result<Vec<_>, _>>()?;
                    match biases.iter().all(Option::is_some) {
                        true => Some(biases.into_iter().flatten().flatten().collect()),
                        false => None,
                    }
                }
            };
            // llama.cpp's SwiGLU FFN adds no biases, whatever the file holds.
            let (gate, up_rows, ffn_biases) = match c.ffn {
                EncoderFfn::SwiGlu => (
                    Some(l.matrix(&FFN_GATE.layer(il), e, c.n_ff)?),
                    c.n_ff,
                    false,
                ),
                EncoderFfn::Gelu => (None, c.n_ff, true),
                // A gate of its own, or the first half of the up projection's rows.
                EncoderFfn::GeGlu => match l.opt_matrix(&FFN_GATE.layer(il), e, c.n_ff)? {
                    Some(gate) => (Some(gate), c.n_ff, true),
                    None => (None, 2 * c.n_ff, true),
                },
            };
            let ffn_bias = |t: Tensor, n: usize| match ffn_biases {
                true => l.opt_vector(&t.layer_bias(il), n),
                false => Ok(None),
            };
            let opt_norm = |t: Tensor| -> Result<Option<LayerNormWeights>, ModelError> {
                match l.find(&t.layer(il)) {
                    Some(_) => norm(t.layer(il), t.layer_bias(il)).map(Some),
                    None => Ok(None),
                }
            };
            layers.push(LayerWeights {
                qkv,
                qkv_bias,
                wo: l.matrix(&ATTN_OUTPUT.layer(il), e, e)?,
                wo_bias: l.opt_vector(&ATTN_OUTPUT.layer_bias(il), e)?,
                attn_out_norm: norm(ATTN_OUTPUT_NORM.layer(il), ATTN_OUTPUT_NORM.layer_bias(il))?,
                q_norm: opt_norm(ATTN_Q_NORM)?,
                k_norm: opt_norm(ATTN_K_NORM)?,
                attn_norm_2: opt_norm(ATTN_NORM_2)?,
                ffn: match (&c.moe, c.is_moe_layer(il)) {
                    (Some(moe), true) => {
                        let n = moe.router.n_expert;
                        FfnWeights::Experts(ExpertFfn {
                            router: l.matrix(&FFN_GATE_INP.layer(il), e, n)?,
                            up: l.experts(&FFN_UP_EXPS.layer(il), e, c.n_ff, n)?,
                            down: l.experts(&FFN_DOWN_EXPS.layer(il), c.n_ff, e, n)?,
                        })
                    }
                    _ => FfnWeights::Dense(DenseFfn {
                        up: l.matrix(&FFN_UP.layer(il), e, up_rows)?,
                        up_bias: ffn_bias(FFN_UP, up_rows)?,
                        gate,
                        down: l.matrix(&FFN_DOWN.layer(il), c.n_ff, e)?,
                        down_bias: ffn_bias(FFN_DOWN, e)?,
                    }),
                },
                out_norm: norm(
                    LAYER_OUTPUT_NORM.layer(il),
                    LAYER_OUTPUT_NORM.layer_bias(il),
                )?,
            });
        }
        Ok(EncoderWeights {
            token_embd: l.matrix(&TOKEN_EMBD.weight(), e, c.n_vocab)?,
            token_type,
            position_embd,
            embd_norm: norm(TOKEN_EMBD_NORM.weight(), TOKEN_EMBD_NORM.bias())?,
            layers,
        })
    }

    /// The layers' matrices and expert tensors.
    fn tensors(&mut self) -> (Vec<&mut MatrixRef>, Vec<&mut ExpertRef>) {
        let (mut matrices, mut experts) = (Vec::new(), Vec::new());
        for layer in &mut self.layers {
            matrices.extend(layer.qkv.matrices_mut());
            matrices.push(&mut layer.wo);
            match &mut layer.ffn {
                FfnWeights::Dense(d) => {
                    matrices.extend([&mut d.up, &mut d.down]);
                    matrices.extend(d.gate.as_mut());
                }
                FfnWeights::Experts(x) => {
                    matrices.push(&mut x.router);
                    experts.extend([&mut x.up, &mut x.down]);
                }
            }
        }
        (matrices, experts)
    }

    /// Packs the layers' matrices and experts this machine multiplies faster packed.
    pub fn pack(&mut self, gguf: &Packing<'_>) -> Result<(), ModelError> {
        let (matrices, experts) = self.tensors();
        matrices.into_iter().try_for_each(|m| m.pack(gguf))?;
        experts.into_iter().try_for_each(|x| x.pack(gguf))
    }

    /// Bytes of weights a pass reads (every layer tensor once, one embedding row).
    pub fn bytes_per_token(&mut self) -> u64 {
        let row = self.token_embd.n_bytes() / self.token_embd.rows.max(1) as u64;
        let (matrices, experts) = self.tensors();
        row + matrices.iter().map(|m| m.n_bytes()).sum::<u64>()
            + experts.iter().map(|x| x.n_bytes()).sum::<u64>()
    }
}
