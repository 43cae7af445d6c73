//! Locating and checking a dense decoder's tensors. Matrices stay in the mapped file,
//! quantized; only the small norm vectors and biases are decoded to f32 at load.

use ferrox_core::{can_dequantize, dequantize_row, WeightMatrix};
use ferrox_gguf::{Gguf, TensorInfo};

use ferrox_moe::{Activation as MoeActivation, ExpertTensor, MoeExperts, SharedExpert};

use super::config::{moe_error, DecoderConfig, FfnKind, MoeFfnConfig};
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

/// A stacked 3-D expert tensor (ggml shape `{cols, rows, n_expert}`).
#[derive(Clone, Debug)]
pub struct ExpertRef {
    tensor: TensorInfo,
}

impl ExpertRef {
    pub fn view<'g>(&self, gguf: &'g Gguf) -> Result<ExpertTensor<'g>, ModelError> {
        ExpertTensor::from_tensor(&self.tensor, gguf.tensor_data(&self.tensor)?).map_err(moe_error)
    }

    pub fn n_bytes(&self) -> u64 {
        self.tensor.n_bytes.unwrap_or(0)
    }
}

/// Routed experts, their router and an optional shared expert.
#[derive(Clone, Debug)]
pub struct MoeWeights {
    /// `ffn_gate_inp`: `n_expert` rows of `n_embd`.
    pub gate_inp: MatrixRef,
    pub gate_exps: ExpertRef,
    pub up_exps: ExpertRef,
    pub down_exps: ExpertRef,
    pub shared: Option<SharedExpertWeights>,
}

#[derive(Clone, Debug)]
pub struct SharedExpertWeights {
    pub gate: MatrixRef,
    pub up: MatrixRef,
    pub down: MatrixRef,
    /// `ffn_gate_inp_shexp`: one row of `n_embd`.
    pub gate_inp: Option<MatrixRef>,
}

impl MoeWeights {
    pub fn experts<'g>(&self, gguf: &'g Gguf) -> Result<MoeExperts<'g>, ModelError> {
        MoeExperts::new(
            self.gate_exps.view(gguf)?,
            self.up_exps.view(gguf)?,
            self.down_exps.view(gguf)?,
            MoeActivation::SwiGlu,
        )
        .map_err(moe_error)
    }

    pub fn shared_expert<'g>(
        &self,
        gguf: &'g Gguf,
    ) -> Result<Option<SharedExpert<'g>>, ModelError> {
        let Some(sh) = &self.shared else {
            return Ok(None);
        };
        Ok(Some(SharedExpert {
            gate: sh.gate.view(gguf)?,
            up: sh.up.view(gguf)?,
            down: sh.down.view(gguf)?,
            activation: MoeActivation::SwiGlu,
            gate_inp: sh.gate_inp.as_ref().map(|g| g.view(gguf)).transpose()?,
        }))
    }

    /// Bytes read per decoded token: the router, `n_used` experts, the shared expert.
    fn bytes_per_token(&self, n_expert: usize, n_used: usize) -> u64 {
        let per_expert =
            (self.gate_exps.n_bytes() + self.up_exps.n_bytes() + self.down_exps.n_bytes())
                / n_expert.max(1) as u64;
        let mut total = self.gate_inp.n_bytes() + per_expert * n_used as u64;
        if let Some(sh) = &self.shared {
            total += sh.gate.n_bytes() + sh.up.n_bytes() + sh.down.n_bytes();
            total += sh.gate_inp.as_ref().map_or(0, MatrixRef::n_bytes);
        }
        total
    }
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

/// Refuses, naming the tensor, a type we cannot decode.
fn check_type(t: &TensorInfo) -> Result<(), ModelError> {
    if !can_dequantize(t.ty) {
        return Err(ModelError::UnsupportedTensorType {
            name: t.name.clone(),
            ty: t.ty.name().into_owned(),
        });
    }
    Ok(())
}

struct Loader<'g> {
    gguf: &'g Gguf,
}

impl Loader<'_> {
    fn find(&self, name: &str) -> Option<&TensorInfo> {
        self.gguf.tensor(name)
    }

    fn require(&self, name: &str) -> Result<&TensorInfo, ModelError> {
        self.find(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    /// Checks a tensor's shape (trailing dimensions of 1 ignored on both sides, so `[n]` is
    /// a one-row `[n, 1]`) and that we can decode its type.
    fn check(&self, t: &TensorInfo, expected: &[u64]) -> Result<(), ModelError> {
        fn trimmed(shape: &[u64]) -> &[u64] {
            let len = shape.iter().rposition(|&d| d != 1).map_or(0, |i| i + 1);
            &shape[..len]
        }
        if trimmed(&t.shape) != trimmed(expected) {
            return Err(ModelError::TensorShape {
                name: t.name.clone(),
                expected: expected.to_vec(),
                found: t.shape.clone(),
            });
        }
        check_type(t)
    }

    /// A matrix with `cols` inputs and `rows` outputs (ggml shape `[cols, rows]`).
    fn matrix(&self, name: &str, cols: usize, rows: usize) -> Result<MatrixRef, ModelError> {
        self.check_matrix(self.require(name)?, cols, rows)
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
        self.check(t, &[cols as u64, rows as u64])?;
        let m = MatrixRef {
            tensor: t.clone(),
            rows,
            cols,
        };
        m.view(self.gguf)?;
        Ok(m)
    }

    /// A 1-D tensor of `n` values used as a one-row matrix (ggml shape `[n]` or `[n, 1]`).
    fn row_matrix(&self, name: &str, n: usize) -> Result<MatrixRef, ModelError> {
        self.matrix(name, n, 1)
    }

    /// A stacked expert tensor of ggml shape `[cols, rows, n_expert]`.
    fn experts(
        &self,
        name: &str,
        cols: usize,
        rows: usize,
        n_expert: usize,
    ) -> Result<ExpertRef, ModelError> {
        let t = self.require(name)?;
        self.check(t, &[cols as u64, rows as u64, n_expert as u64])?;
        let r = ExpertRef { tensor: t.clone() };
        r.view(self.gguf)?;
        Ok(r)
    }

    fn moe(&self, il: usize, n_embd: usize, mc: &MoeFfnConfig) -> Result<MoeWeights, ModelError> {
        let name = |s: &str| format!("blk.{il}.{s}");
        let n_expert = mc.router.n_expert;
        let shared = match mc.n_ff_shexp {
            None => None,
            Some(n_sh) => Some(SharedExpertWeights {
                gate: self.matrix(&name("ffn_gate_shexp.weight"), n_embd, n_sh)?,
                up: self.matrix(&name("ffn_up_shexp.weight"), n_embd, n_sh)?,
                down: self.matrix(&name("ffn_down_shexp.weight"), n_sh, n_embd)?,
                gate_inp: if mc.shexp_gate {
                    Some(self.row_matrix(&name("ffn_gate_inp_shexp.weight"), n_embd)?)
                } else {
                    None
                },
            }),
        };
        Ok(MoeWeights {
            gate_inp: self.matrix(&name("ffn_gate_inp.weight"), n_embd, n_expert)?,
            gate_exps: self.experts(
                &name("ffn_gate_exps.weight"),
                n_embd,
                mc.n_ff_exp,
                n_expert,
            )?,
            up_exps: self.experts(&name("ffn_up_exps.weight"), n_embd, mc.n_ff_exp, n_expert)?,
            down_exps: self.experts(
                &name("ffn_down_exps.weight"),
                mc.n_ff_exp,
                n_embd,
                n_expert,
            )?,
            shared,
        })
    }

    /// A 1-D tensor of `n` values, decoded to f32.
    fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
        self.decode_vector(self.require(name)?, n)
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
        check_type(t)?;
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
            let ffn = match &lc.ffn {
                FfnKind::Dense => FfnWeights::Dense {
                    gate_up: match l.opt_matrix(&name("ffn_gate.weight"), n_embd, lc.n_ff)? {
                        Some(gate) => GateUpWeights::Separate {
                            gate,
                            up: l.matrix(&name("ffn_up.weight"), n_embd, lc.n_ff)?,
                        },
                        None => GateUpWeights::Fused(l.matrix(
                            &name("ffn_up.weight"),
                            n_embd,
                            2 * lc.n_ff,
                        )?),
                    },
                    down: l.matrix(&name("ffn_down.weight"), lc.n_ff, n_embd)?,
                },
                FfnKind::Moe(mc) => FfnWeights::Moe(l.moe(il, n_embd, mc)?),
            };
            let (q_norm_len, k_norm_len) = if config.qk_norm_whole {
                (q_width, k_width)
            } else {
                (lc.head_dim_k, lc.head_dim_k)
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
                q_norm: norm_or_missing("attn_q_norm.weight", config.qk_norm, q_norm_len)?,
                k_norm: norm_or_missing("attn_k_norm.weight", config.qk_norm, k_norm_len)?,
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
                ffn,
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
    pub fn bytes_per_token(&self, config: &DecoderConfig) -> u64 {
        let mut total =
            self.output.n_bytes() + self.token_embd.n_bytes() / self.token_embd.rows.max(1) as u64;
        for (l, lc) in self.layers.iter().zip(&config.layers) {
            total += match &l.qkv {
                QkvWeights::Separate { q, k, v } => q.n_bytes() + k.n_bytes() + v.n_bytes(),
                QkvWeights::Fused(m) => m.n_bytes(),
            };
            total += match (&l.ffn, &lc.ffn) {
                (FfnWeights::Dense { gate_up, down }, _) => {
                    down.n_bytes()
                        + match gate_up {
                            GateUpWeights::Separate { gate, up } => gate.n_bytes() + up.n_bytes(),
                            GateUpWeights::Fused(m) => m.n_bytes(),
                        }
                }
                (FfnWeights::Moe(m), FfnKind::Moe(mc)) => {
                    m.bytes_per_token(mc.router.n_expert, mc.router.n_used)
                }
                (FfnWeights::Moe(m), FfnKind::Dense) => m.bytes_per_token(1, 1),
            };
            total += l.wo.n_bytes();
        }
        total
    }
}
