//! Locating and checking a dense decoder's tensors. Matrices stay in the mapped file,
//! quantized; only the small norm vectors and biases are decoded to f32 at load.

use ferrox_core::{can_dequantize, dequantize_row, WeightMatrix};
use ferrox_gguf::{Gguf, TensorInfo};

use super::config::DecoderConfig;
use crate::ModelError;

/// A 2-D weight tensor in the file: `rows` outputs, each a dot product over `cols` inputs.
#[derive(Clone, Debug)]
pub struct MatrixRef {
    tensor: TensorInfo,
    pub rows: usize,
    pub cols: usize,
}

impl MatrixRef {
    /// The matrix view over the mapped bytes (checked at load, so this cannot fail for a
    /// `MatrixRef` made from the same file).
    pub fn view<'g>(&self, gguf: &'g Gguf) -> Result<WeightMatrix<'g>, ModelError> {
        let bytes = gguf.tensor_data(&self.tensor)?;
        Ok(WeightMatrix::new(
            self.tensor.ty,
            self.rows,
            self.cols,
            bytes,
        )?)
    }

    pub fn name(&self) -> &str {
        &self.tensor.name
    }

    pub fn n_bytes(&self) -> u64 {
        self.tensor.n_bytes.unwrap_or(0)
    }
}

/// Query/key/value projections: separate, or fused into one matrix (phi3).
/// (Built once per layer at load, so the variants' size difference costs nothing.)
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum QkvWeights {
    Separate {
        q: MatrixRef,
        k: MatrixRef,
        v: MatrixRef,
    },
    Fused(MatrixRef),
}

/// Gate and up projections: separate (llama, gemma) or stacked in one matrix whose first
/// half of rows is the gate (phi3).
#[derive(Clone, Debug)]
pub enum GateUpWeights {
    Separate { gate: MatrixRef, up: MatrixRef },
    Fused(MatrixRef),
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
    pub gate_up: GateUpWeights,
    pub down: MatrixRef,
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

struct Loader<'g> {
    gguf: &'g Gguf,
}

impl Loader<'_> {
    fn find(&self, name: &str) -> Option<&TensorInfo> {
        self.gguf.tensor(name)
    }

    /// A matrix with `cols` inputs and `rows` outputs (ggml shape `[cols, rows]`).
    fn matrix(&self, name: &str, cols: usize, rows: usize) -> Result<MatrixRef, ModelError> {
        let t = self
            .find(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        self.check_matrix(t, cols, rows)
    }

    fn opt_matrix(
        &self,
        name: &str,
        cols: usize,
        rows: usize,
    ) -> Result<Option<MatrixRef>, ModelError> {
        self.find(name)
            .map(|t| self.check_matrix(t, cols, rows))
            .transpose()
    }

    fn check_matrix(
        &self,
        t: &TensorInfo,
        cols: usize,
        rows: usize,
    ) -> Result<MatrixRef, ModelError> {
        let shape = [cols as u64, rows as u64];
        let matches = t.shape == shape
            || (t.shape.len() > 2 && t.shape[..2] == shape && t.shape[2..].iter().all(|&d| d == 1));
        if !matches {
            return Err(ModelError::TensorShape {
                name: t.name.clone(),
                expected: shape.to_vec(),
                found: t.shape.clone(),
            });
        }
        if !can_dequantize(t.ty) {
            return Err(ModelError::UnsupportedTensorType {
                name: t.name.clone(),
                ty: t.ty.name().into_owned(),
            });
        }
        let m = MatrixRef {
            tensor: t.clone(),
            rows,
            cols,
        };
        m.view(self.gguf)?;
        Ok(m)
    }

    /// A 1-D tensor of `n` values, decoded to f32.
    fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
        let t = self
            .find(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        self.decode_vector(t, n)
    }

    fn opt_vector(&self, name: &str, n: usize) -> Result<Option<Vec<f32>>, ModelError> {
        self.find(name)
            .map(|t| self.decode_vector(t, n))
            .transpose()
    }

    fn decode_vector(&self, t: &TensorInfo, n: usize) -> Result<Vec<f32>, ModelError> {
        if t.n_elements != n as u64 {
            return Err(ModelError::TensorShape {
                name: t.name.clone(),
                expected: vec![n as u64],
                found: t.shape.clone(),
            });
        }
        if !can_dequantize(t.ty) {
            return Err(ModelError::UnsupportedTensorType {
                name: t.name.clone(),
                ty: t.ty.name().into_owned(),
            });
        }
        let mut out = vec![0.0; n];
        dequantize_row(t.ty, self.gguf.tensor_data(t)?, &mut out)?;
        Ok(out)
    }
}

impl DecoderWeights {
    pub fn load(gguf: &Gguf, config: &DecoderConfig) -> Result<DecoderWeights, ModelError> {
        let l = Loader { gguf };
        let n_embd = config.n_embd;
        let n_vocab = config.n_vocab;
        let token_embd = l.matrix("token_embd.weight", n_embd, n_vocab)?;
        let output = l
            .opt_matrix("output.weight", n_embd, n_vocab)?
            .unwrap_or_else(|| token_embd.clone());
        let output_norm = l.vector("output_norm.weight", n_embd)?;
        let rope_dims = config.layers[0].rope.n_dims;
        let rope_freqs = l.opt_vector("rope_freqs.weight", rope_dims / 2)?;

        let mut layers = Vec::with_capacity(config.n_layer());
        for (il, lc) in config.layers.iter().enumerate() {
            let name = |s: &str| format!("blk.{il}.{s}");
            let q_width = lc.n_head * lc.head_dim_k;
            let k_width = lc.n_head_kv * lc.head_dim_k;
            let v_width = lc.n_head_kv * lc.head_dim_v;
            let qkv = match l.opt_matrix(
                &name("attn_qkv.weight"),
                n_embd,
                q_width + k_width + v_width,
            )? {
                Some(fused) => QkvWeights::Fused(fused),
                None => QkvWeights::Separate {
                    q: l.matrix(&name("attn_q.weight"), n_embd, q_width)?,
                    k: l.matrix(&name("attn_k.weight"), n_embd, k_width)?,
                    v: l.matrix(&name("attn_v.weight"), n_embd, v_width)?,
                },
            };
            let gate_up = match l.opt_matrix(&name("ffn_gate.weight"), n_embd, lc.n_ff)? {
                Some(gate) => GateUpWeights::Separate {
                    gate,
                    up: l.matrix(&name("ffn_up.weight"), n_embd, lc.n_ff)?,
                },
                None => {
                    GateUpWeights::Fused(l.matrix(&name("ffn_up.weight"), n_embd, 2 * lc.n_ff)?)
                }
            };
            let norm_or_missing =
                |tensor: &str, wanted: bool, n: usize| -> Result<Option<Vec<f32>>, ModelError> {
                    if wanted {
                        l.vector(&name(tensor), n).map(Some)
                    } else {
                        Ok(None)
                    }
                };
            layers.push(LayerWeights {
                attn_norm: l.vector(&name("attn_norm.weight"), n_embd)?,
                qkv,
                q_bias: l.opt_vector(&name("attn_q.bias"), q_width)?,
                k_bias: l.opt_vector(&name("attn_k.bias"), k_width)?,
                v_bias: l.opt_vector(&name("attn_v.bias"), v_width)?,
                q_norm: norm_or_missing("attn_q_norm.weight", config.qk_norm, lc.head_dim_k)?,
                k_norm: norm_or_missing("attn_k_norm.weight", config.qk_norm, lc.head_dim_k)?,
                wo: l.matrix(
                    &name("attn_output.weight"),
                    lc.n_head * lc.head_dim_v,
                    n_embd,
                )?,
                attn_post_norm: norm_or_missing(
                    "post_attention_norm.weight",
                    config.post_norms,
                    n_embd,
                )?,
                ffn_norm: l.vector(&name("ffn_norm.weight"), n_embd)?,
                gate_up,
                down: l.matrix(&name("ffn_down.weight"), lc.n_ff, n_embd)?,
                ffn_post_norm: norm_or_missing("post_ffw_norm.weight", config.post_norms, n_embd)?,
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

    /// Bytes of weights one decoded token reads (every matrix once, one embedding row).
    pub fn bytes_per_token(&self) -> u64 {
        let mut total =
            self.output.n_bytes() + self.token_embd.n_bytes() / self.token_embd.rows.max(1) as u64;
        for l in &self.layers {
            total += match &l.qkv {
                QkvWeights::Separate { q, k, v } => q.n_bytes() + k.n_bytes() + v.n_bytes(),
                QkvWeights::Fused(m) => m.n_bytes(),
            };
            total += match &l.gate_up {
                GateUpWeights::Separate { gate, up } => gate.n_bytes() + up.n_bytes(),
                GateUpWeights::Fused(m) => m.n_bytes(),
            };
            total += l.wo.n_bytes() + l.down.n_bytes();
        }
        total
    }
}
