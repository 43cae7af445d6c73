//! Locating a Kimi model's tensors: the Kimi Linear layout, and the Kimi-K3 layout (full-rank
//! KDA gate, MLA output gate, residual-attention scores, latent experts).

use crate::plan::Packing;
use ferrox_gguf::Gguf;

use super::config::KimiConfig;
use super::kda::{KdaWeights, OutputGate};
use super::latent::{self, LatentProjection};
use super::residual::ResidualScores;
use crate::layers::mla::weights::{load_ffn, load_layer, load_layer_with};
use crate::layers::mla::{MlaFfn, MlaLayer};
use crate::names::{Tensor, *};
use crate::tensors::{check_block_count, embedding_and_head_bytes, name_keys, Loader, MatrixRef};
use crate::ModelError;

const RES_SCORE: &[&str] = &["attn_res.block_size"];
const KDA_GATE: &[&str] = &["attention.head_count", "kda.head_dim"];
const MLA_GATE: &[&str] = &["attention.head_count", "attention.value_length_mla"];
/// Kimi-K3's full-rank KDA output gate.
pub const SSM_G: Tensor = Tensor {
    base: "ssm_g",
    sized_by: KDA_GATE,
};
/// Kimi-K3's MLA output gate.
pub const ATTN_GATE: Tensor = Tensor {
    base: "attn_gate",
    sized_by: MLA_GATE,
};
pub const ATTN_RES_SCORE: Tensor = Tensor {
    base: "attn_res_score",
    sized_by: RES_SCORE,
};
pub const FFN_RES_SCORE: Tensor = Tensor {
    base: "ffn_res_score",
    sized_by: RES_SCORE,
};
pub const OUTPUT_RES_SCORE: Tensor = Tensor {
    base: "output_res_score",
    sized_by: RES_SCORE,
};

/// A layer's attention: KDA (with its index among the KDA layers, its norms and FFN) or MLA
/// (with its index among the MLA layers; the MLA layer holds its norms and FFN).
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Mixer {
    Kda {
        index: usize,
        attn_norm: Vec<f32>,
        kda: KdaWeights,
        ffn_norm: Vec<f32>,
        ffn: MlaFfn,
    },
    Mla {
        index: usize,
        layer: MlaLayer,
    },
}

#[derive(Clone, Debug)]
pub struct KimiLayer {
    pub mixer: Mixer,
    /// Kimi-K3 with residual attention: the mixes' score vectors.
    pub res: Option<ResidualScores>,
    /// Kimi-K3's MLA output gate (`attn_gate`), if present.
    pub mla_gate: Option<MatrixRef>,
    /// Kimi-K3's latent expert projections, on MoE layers with a latent space.
    pub latent: Option<LatentProjection>,
}

impl KimiLayer {
    /// (attention norm, FFN norm, FFN).
    pub fn norms_and_ffn(&self) -> (&[f32], &[f32], &MlaFfn) {
        match &self.mixer {
            Mixer::Kda {
                attn_norm,
                ffn_norm,
                ffn,
                ..
            } => (attn_norm, ffn_norm, ffn),
            Mixer::Mla { layer, .. } => (&layer.attn_norm, &layer.ffn_norm, &layer.ffn),
        }
    }
}

#[derive(Clone, Debug)]
pub struct KimiWeights {
    pub token_embd: MatrixRef,
    pub output_norm: Vec<f32>,
    pub output: MatrixRef,
    /// Kimi-K3 with residual attention: the score vector of the mix before the head.
    pub output_res_score: Option<Vec<f32>>,
    pub layers: Vec<KimiLayer>,
}

fn load_kda(l: &Loader<'_>, c: &KimiConfig, il: usize) -> Result<KdaWeights, ModelError> {
    let n_embd = c.mla.n_embd;
    let (h, dh, d_conv) = (c.kda.n_head, c.kda.head_dim, c.kda.d_conv);
    let d_inner = c.kda.d_inner();
    // The file holds each channel's taps together; the engine runs tap by tap.
    let conv = |t: Tensor| {
        let by_channel = l.vector(&t.layer(il), d_conv * d_inner)?;
        let mut by_tap = vec![0f32; d_conv * d_inner];
        for (c, taps) in by_channel.chunks_exact(d_conv).enumerate() {
            for (j, &w) in taps.iter().enumerate() {
                by_tap[j * d_inner + c] = w;
            }
        }
        Ok::<_, ModelError>(by_tap)
    };
    let gate = match c.k3 {
        None => OutputGate::LowRank {
            a: l.matrix(&SSM_G_A.layer(il), n_embd, dh)?,
            b: l.matrix(&SSM_G_B.layer(il), dh, d_inner)?,
        },
        Some(_) => OutputGate::Full(l.matrix(&SSM_G.layer(il), n_embd, d_inner)?),
    };
    Ok(KdaWeights {
        q: l.matrix(&ATTN_Q.layer(il), n_embd, d_inner)?,
        k: l.matrix(&ATTN_K.layer(il), n_embd, d_inner)?,
        v: l.matrix(&ATTN_V.layer(il), n_embd, d_inner)?,
        conv: [
            conv(SSM_CONV1D_Q)?,
            conv(SSM_CONV1D_K)?,
            conv(SSM_CONV1D_V)?,
        ],
        f_a: l.matrix(&SSM_F_A.layer(il), n_embd, dh)?,
        f_b: l.matrix(&SSM_F_B.layer(il), dh, d_inner)?,
        beta: l.matrix(&SSM_BETA.layer(il), n_embd, h)?,
        a: l.vector(&SSM_A.layer_bare(il), h)?,
        dt_bias: l.vector(&SSM_DT.layer_bias(il), d_inner)?,
        gate,
        o_norm: l.vector(&SSM_NORM.layer(il), dh)?,
        wo: l.matrix(&ATTN_OUTPUT.layer(il), d_inner, n_embd)?,
    })
}

/// Layer `il`'s FFN (with Kimi-K3's latent projections).
fn load_layer_ffn(
    l: &Loader<'_>,
    c: &KimiConfig,
    il: usize,
) -> Result<(MlaFfn, Option<LatentProjection>), ModelError> {
    match c.k3 {
        None => Ok((load_ffn(l, &c.mla, &c.mla.ffn[il], il)?, None)),
        Some(k3) => {
            let (m, kind) = (&c.mla, &c.mla.ffn[il]);
            latent::load(l, m.n_embd, m.n_ff, kind, k3.expert_latent, il)
        }
    }
}

impl KimiWeights {
    pub fn load(gguf: &Gguf, c: &KimiConfig) -> Result<KimiWeights, ModelError> {
        let arch = &c.mla.arch;
        check_block_count(gguf, arch, c.recurrent.len())?;
        Self::load_checked(gguf, c).map_err(|e| name_keys(e, arch))
    }

    fn load_checked(gguf: &Gguf, c: &KimiConfig) -> Result<KimiWeights, ModelError> {
        let l = Loader { gguf };
        let (n_embd, n_vocab) = (c.mla.n_embd, c.mla.n_vocab);
        let residual = c.k3.is_some_and(|k3| k3.res_block > 0);
        let (mut n_kda, mut n_mla) = (0, 0);
        let mut layers = Vec::with_capacity(c.recurrent.len());
        for (il, &recurrent) in c.recurrent.iter().enumerate() {
            let (ffn, latent) = load_layer_ffn(&l, c, il)?;
            let mut mla_gate = None;
            let mixer = if recurrent {
                n_kda += 1;
                Mixer::Kda {
                    index: n_kda - 1,
                    attn_norm: l.vector(&ATTN_NORM.layer(il), n_embd)?,
                    kda: load_kda(&l, c, il)?,
                    ffn_norm: l.vector(&FFN_NORM.layer(il), n_embd)?,
                    ffn,
                }
            } else {
                n_mla += 1;
                let layer = match c.k3 {
                    None => load_layer(&l, &c.mla, il)?,
                    Some(_) => {
                        let width = c.mla.n_head * c.mla.head_dim_v;
                        mla_gate = l.opt_matrix(&ATTN_GATE.layer(il), n_embd, width)?;
                        load_layer_with(&l, &c.mla, il, ffn)?
                    }
                };
                Mixer::Mla {
                    index: n_mla - 1,
                    layer,
                }
            };
            let res = match residual {
                true => Some(ResidualScores {
                    attn: l.vector(&ATTN_RES_SCORE.layer(il), n_embd)?,
                    ffn: l.vector(&FFN_RES_SCORE.layer(il), n_embd)?,
                }),
                false => None,
            };
            layers.push(KimiLayer {
                mixer,
                res,
                mla_gate,
                latent,
            });
        }
        let output_res_score = match residual {
            true => Some(l.vector(&OUTPUT_RES_SCORE.weight(), n_embd)?),
            false => None,
        };
        Ok(KimiWeights {
            token_embd: l.matrix(&TOKEN_EMBD.weight(), n_embd, n_vocab)?,
            output_norm: l.vector(&OUTPUT_NORM.weight(), n_embd)?,
            output: l.matrix(&OUTPUT.weight(), n_embd, n_vocab)?,
            output_res_score,
            layers,
        })
    }

    /// Packs what multiplies faster packed (see [`MatrixRef::pack`]), as the MLA engine
    /// does: the output head, every layer's projections, the MLA layers' per-head matrices,
    /// the FFNs and experts.
    pub fn pack(&mut self, gguf: &Packing<'_>) -> Result<(), ModelError> {
        self.output.pack(gguf)?;
        for layer in &mut self.layers {
            match &mut layer.mixer {
                Mixer::Kda { kda, ffn, .. } => {
                    kda.pack(gguf)?;
                    ffn.pack(gguf)?;
                }
                Mixer::Mla { layer, .. } => layer.pack(gguf)?,
            }
            if let Some(gate) = &mut layer.mla_gate {
                gate.pack(gguf)?;
            }
            if let Some(latent) = &mut layer.latent {
                latent.pack(gguf)?;
            }
        }
        Ok(())
    }

    pub fn bytes_per_token(&self, c: &KimiConfig) -> u64 {
        let mut total = embedding_and_head_bytes(&self.token_embd, &self.output);
        for (layer, kind) in self.layers.iter().zip(&c.mla.ffn) {
            let (attn, ffn) = match &layer.mixer {
                Mixer::Kda { kda, ffn, .. } => (kda.n_bytes(), ffn),
                Mixer::Mla { layer, .. } => (
                    layer.kv_a.n_bytes()
                        + layer.k_absorb.n_bytes()
                        + layer.v.n_bytes()
                        + layer.wo.n_bytes(),
                    &layer.ffn,
                ),
            };
            total +=
                attn + match ffn {
                    MlaFfn::Dense(d) => d.n_bytes(),
                    MlaFfn::Moe(m) => m.bytes_per_token_in(kind),
                } + layer.mla_gate.as_ref().map_or(0, MatrixRef::n_bytes)
                    + layer.latent.as_ref().map_or(0, LatentProjection::n_bytes);
        }
        total
    }
}
