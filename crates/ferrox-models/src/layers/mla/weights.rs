//! Locating an MLA model's tensors. Matrices stay quantized in the mapped file; the one
//! exception is each layer's key decompression in the orientation the file lacks (see
//! [`Heads`]), which is transposed into a copy at load: f32 for an F32 file tensor (exact),
//! f16 otherwise (half the memory; the copy only serves the path llama.cpp does not run for
//! that file).

use crate::plan::Packing;
use ferrox_core::GgmlType;
use ferrox_gguf::Gguf;
use ferrox_moe::ExpertTensor;
use half::f16;

use super::config::{KvB, MlaConfig};
use crate::hparams::{moe_error, FfnKind};
use crate::names::*;
use crate::tensors::{
    check_block_count, embedding_and_head_bytes, name_keys, ExpertRef, Loader, MatrixRef,
    MoeWeights, SharedExpertWeights,
};
use crate::ModelError;

/// One matrix per attention head.
#[derive(Clone, Debug)]
pub enum Heads {
    /// Stacked in the file.
    File(ExpertRef),
    /// Made at load: `n` matrices of `rows × cols` (`ne = [cols, rows, n]`), stacked.
    Copy {
        ty: GgmlType,
        ne: [usize; 3],
        bytes: Vec<u8>,
    },
}

impl Heads {
    /// Packs the stacked matrices of the file (see [`ExpertRef::pack`]); copies made at
    /// load stay as they are.
    pub fn pack(&mut self, gguf: &Packing<'_>) -> Result<(), ModelError> {
        match self {
            Heads::File(r) => r.pack(gguf),
            Heads::Copy { .. } => Ok(()),
        }
    }

    pub fn view<'g>(&'g self, gguf: &'g Gguf) -> Result<ExpertTensor<'g>, ModelError> {
        match self {
            Heads::File(r) => r.view(gguf),
            Heads::Copy { ty, ne, bytes } => ExpertTensor::new(*ty, *ne, bytes).map_err(moe_error),
        }
    }

    /// Each head's matrix transposed, as a copy (f32 from F32, else f16).
    fn transposed(&self, gguf: &Gguf) -> Result<Heads, ModelError> {
        let src = self.view(gguf)?;
        let (rows, cols, n) = (src.rows(), src.cols(), src.n_expert());
        let mut out = vec![0f32; rows * cols * n];
        let mut row = vec![0f32; cols];
        for (h, dst) in out.chunks_exact_mut(rows * cols).enumerate() {
            let m = src.expert(h);
            for i in 0..rows {
                m.dequant_row(i, &mut row)?;
                for (j, &v) in row.iter().enumerate() {
                    dst[j * rows + i] = v;
                }
            }
        }
        let (ty, bytes) = if src.ty() == GgmlType::F32 {
            (
                GgmlType::F32,
                out.iter().flat_map(|v| v.to_le_bytes()).collect(),
            )
        } else {
            let halves = out.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes());
            (GgmlType::F16, halves.collect())
        };
        Ok(Heads::Copy {
            ty,
            ne: [rows, cols, n],
            bytes,
        })
    }

    pub(crate) fn n_bytes(&self) -> u64 {
        match self {
            Heads::File(r) => r.n_bytes(),
            Heads::Copy { bytes, .. } => bytes.len() as u64,
        }
    }
}

/// The query projection.
#[derive(Clone, Debug)]
pub enum QueryWeights {
    /// `attn_q_b · RMSNorm(attn_q_a · x; attn_q_a_norm)`.
    LoRa {
        a: MatrixRef,
        norm: Vec<f32>,
        b: MatrixRef,
    },
    /// `attn_q · x`.
    Plain(MatrixRef),
}

/// A layer's feed-forward weights: a plain SwiGLU FFN (the leading dense layers, computed as
/// an ungated shared expert) or routed experts.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum MlaFfn {
    Dense(SharedExpertWeights),
    Moe(MoeWeights),
}

impl MlaFfn {
    pub fn pack(&mut self, gguf: &Packing<'_>) -> Result<(), ModelError> {
        match self {
            MlaFfn::Dense(ffn) => ffn.pack(gguf),
            MlaFfn::Moe(moe) => moe.pack(gguf),
        }
    }
}

#[derive(Clone, Debug)]
pub struct MlaLayer {
    pub attn_norm: Vec<f32>,
    pub q: QueryWeights,
    /// `attn_kv_a_mqa`: x → [latent (Lkv) | rotated key (R)].
    pub kv_a: MatrixRef,
    pub kv_a_norm: Vec<f32>,
    /// Per head `Lkv × Dn`: projects a head's unrotated query into the latent space.
    pub k_absorb: Heads,
    /// Per head `Dn × Lkv`: a cached latent's unrotated key for the head.
    pub k_decompress: Heads,
    /// Per head `Dv × Lkv`: a latent (or an attention-weighted sum of latents) to the head's
    /// value.
    pub v: Heads,
    pub wo: MatrixRef,
    pub ffn_norm: Vec<f32>,
    pub ffn: MlaFfn,
}

impl MlaLayer {
    /// Packs the layer's projections, per-head matrices and FFN or experts.
    pub fn pack(&mut self, gguf: &Packing<'_>) -> Result<(), ModelError> {
        match &mut self.q {
            QueryWeights::LoRa { a, b, .. } => {
                a.pack(gguf)?;
                b.pack(gguf)?;
            }
            QueryWeights::Plain(w) => w.pack(gguf)?,
        }
        self.kv_a.pack(gguf)?;
        self.wo.pack(gguf)?;
        for heads in [&mut self.k_absorb, &mut self.k_decompress, &mut self.v] {
            heads.pack(gguf)?;
        }
        self.ffn.pack(gguf)
    }
}

/// A multi-token-prediction block (DeepSeek-V3's NextN, `blk.{n_layer}`): a position's
/// normed final hidden state and the embedding of the token after it, projected together
/// (`eh_proj`) into one more MLA layer, whose normed output gives the logits of the token
/// after that.
#[derive(Clone, Debug)]
pub struct MtpBlock {
    pub layer: MlaLayer,
    pub eh_proj: MatrixRef,
    pub enorm: Vec<f32>,
    pub hnorm: Vec<f32>,
    /// `shared_head_norm`, or the model's output norm.
    pub head_norm: Vec<f32>,
    /// `shared_head_head` and `embed_tokens`, when the block has its own.
    pub head: Option<MatrixRef>,
    pub embd: Option<MatrixRef>,
}

#[derive(Clone, Debug)]
pub struct MlaWeights {
    pub token_embd: MatrixRef,
    pub output_norm: Vec<f32>,
    pub output: MatrixRef,
    pub layers: Vec<MlaLayer>,
    /// Loaded when asked for and the file has one.
    pub mtp: Option<MtpBlock>,
}

impl MlaWeights {
    /// Packs what multiplies faster packed (see [`MatrixRef::pack`]): the output head, the
    /// query, compressed-KV and output projections, the per-head matrices stacked in the
    /// file, the FFNs and experts.
    pub fn pack(&mut self, gguf: &Packing<'_>) -> Result<(), ModelError> {
        self.output.pack(gguf)?;
        if let Some(mtp) = &mut self.mtp {
            mtp.layer.pack(gguf)?;
            mtp.eh_proj.pack(gguf)?;
        }
        self.layers
            .iter_mut()
            .try_for_each(|layer| layer.pack(gguf))?;
        crate::tensors::link_lookahead(self.layers.iter_mut().filter_map(|l| match &mut l.ffn {
            MlaFfn::Moe(moe) => Some(moe),
            MlaFfn::Dense(_) => None,
        }));
        Ok(())
    }

    pub fn load(gguf: &Gguf, c: &MlaConfig) -> Result<MlaWeights, ModelError> {
        check_block_count(gguf, &c.arch, c.n_layer())?;
        Self::load_checked(gguf, c).map_err(|e| name_keys(e, &c.arch))
    }

    /// The weights with the file's multi-token-prediction block: an error naming what is
    /// missing when the file has none.
    pub fn load_with_mtp(gguf: &Gguf, c: &MlaConfig) -> Result<MlaWeights, ModelError> {
        let mut weights = Self::load(gguf, c)?;
        let l = Loader { gguf };
        weights.mtp =
            Some(load_mtp(&l, c, &weights.output_norm).map_err(|e| name_keys(e, &c.arch))?);
        Ok(weights)
    }

    fn load_checked(gguf: &Gguf, c: &MlaConfig) -> Result<MlaWeights, ModelError> {
        let l = Loader { gguf };
        let (n_embd, n_vocab) = (c.n_embd, c.n_vocab);
        let token_embd = l.matrix(&TOKEN_EMBD.weight(), n_embd, n_vocab)?;
        let output = l
            .opt_matrix(&OUTPUT.weight(), n_embd, n_vocab)?
            .unwrap_or_else(|| token_embd.clone());
        let layers = (0..c.n_layer())
            .map(|il| load_layer(&l, c, il))
            .collect::<Result<_, _>>()?;
        Ok(MlaWeights {
            token_embd,
            output_norm: l.vector(&OUTPUT_NORM.weight(), n_embd)?,
            output,
            layers,
            mtp: None,
        })
    }

    /// Bytes of weights one decoded token reads (the absorbed path: each layer's query,
    /// latent, absorption and output matrices, its FFN's active part).
    pub fn bytes_per_token(&self, c: &MlaConfig) -> u64 {
        let mut total = embedding_and_head_bytes(&self.token_embd, &self.output);
        for (l, kind) in self.layers.iter().zip(&c.ffn) {
            total += match &l.q {
                QueryWeights::LoRa { a, b, .. } => a.n_bytes() + b.n_bytes(),
                QueryWeights::Plain(q) => q.n_bytes(),
            };
            total += l.kv_a.n_bytes() + l.k_absorb.n_bytes() + l.v.n_bytes() + l.wo.n_bytes();
            total += match &l.ffn {
                MlaFfn::Dense(d) => d.n_bytes(),
                MlaFfn::Moe(m) => m.bytes_per_token_in(kind),
            };
        }
        total
    }
}

pub(crate) fn load_layer(l: &Loader<'_>, c: &MlaConfig, il: usize) -> Result<MlaLayer, ModelError> {
    load_layer_with(l, c, il, load_ffn(l, c, &c.ffn[il], il)?)
}

/// The multi-token-prediction block after the trunk's layers.
fn load_mtp(l: &Loader<'_>, c: &MlaConfig, output_norm: &[f32]) -> Result<MtpBlock, ModelError> {
    let il = c.n_layer();
    let Some(kind) = &c.mtp_ffn else {
        return Err(ModelError::Config(format!(
            "the file declares no multi-token-prediction layer ({}.nextn_predict_layers)",
            c.arch
        )));
    };
    let n_embd = c.n_embd;
    let layer = load_layer_with(l, c, il, load_ffn(l, c, kind, il)?)?;
    Ok(MtpBlock {
        layer,
        eh_proj: l.matrix(&NEXTN_EH_PROJ.layer(il), 2 * n_embd, n_embd)?,
        enorm: l.vector(&NEXTN_ENORM.layer(il), n_embd)?,
        hnorm: l.vector(&NEXTN_HNORM.layer(il), n_embd)?,
        head_norm: l
            .opt_vector(&NEXTN_SHARED_HEAD_NORM.layer(il), n_embd)?
            .unwrap_or_else(|| output_norm.to_vec()),
        head: l.opt_matrix(&NEXTN_SHARED_HEAD_HEAD.layer(il), n_embd, c.n_vocab)?,
        embd: l.opt_matrix(&NEXTN_EMBED_TOKENS.layer(il), n_embd, c.n_vocab)?,
    })
}

/// Layer `il` with an FFN its family loaded itself (Kimi-K3's latent experts).
pub(crate) fn load_layer_with(
    l: &Loader<'_>,
    c: &MlaConfig,
    il: usize,
    ffn: MlaFfn,
) -> Result<MlaLayer, ModelError> {
    let (n_embd, h) = (c.n_embd, c.n_head);
    let (lkv, dn, dv) = (c.kv_lora_rank, c.head_dim_nope(), c.head_dim_v);
    let q = match c.q_lora_rank {
        Some(rank) => QueryWeights::LoRa {
            a: l.matrix(&ATTN_Q_A.layer(il), n_embd, rank)?,
            norm: l.vector(&ATTN_Q_A_NORM.layer(il), rank)?,
            b: l.matrix(&ATTN_Q_B.layer(il), rank, h * c.head_dim_k)?,
        },
        None => QueryWeights::Plain(l.matrix(&ATTN_Q.layer(il), n_embd, h * c.head_dim_k)?),
    };
    let (k_absorb, k_decompress, v) = match c.kv_b {
        KvB::Split => {
            let k = Heads::File(l.experts(&ATTN_K_B.layer(il), dn, lkv, h)?);
            let v = Heads::File(l.experts(&ATTN_V_B.layer(il), lkv, dv, h)?);
            let decompress = k.transposed(l.gguf)?;
            (k, decompress, v)
        }
        KvB::Fused => {
            let kv = l.stacked(&ATTN_KV_B.layer(il), lkv, dn + dv, h)?;
            let k = Heads::File(kv.with_rows(0, dn));
            (k.transposed(l.gguf)?, k, Heads::File(kv.with_rows(dn, dv)))
        }
    };
    Ok(MlaLayer {
        attn_norm: l.vector(&ATTN_NORM.layer(il), n_embd)?,
        q,
        kv_a: l.matrix(&ATTN_KV_A_MQA.layer(il), n_embd, lkv + c.n_rot)?,
        kv_a_norm: l.vector(&ATTN_KV_A_NORM.layer(il), lkv)?,
        k_absorb,
        k_decompress,
        v,
        wo: l.matrix(&ATTN_OUTPUT.layer(il), h * dv, n_embd)?,
        ffn_norm: l.vector(&FFN_NORM.layer(il), n_embd)?,
        ffn,
    })
}

/// Layer `il`'s FFN of kind `kind`: dense SwiGLU for the leading layers, routed and shared
/// experts after.
pub(crate) fn load_ffn(
    l: &Loader<'_>,
    c: &MlaConfig,
    kind: &FfnKind,
    il: usize,
) -> Result<MlaFfn, ModelError> {
    let n_embd = c.n_embd;
    Ok(match kind {
        FfnKind::Dense => MlaFfn::Dense(SharedExpertWeights {
            gate: l.matrix(&FFN_GATE.layer(il), n_embd, c.n_ff)?,
            up: l.matrix(&FFN_UP.layer(il), n_embd, c.n_ff)?,
            down: l.matrix(&FFN_DOWN.layer(il), c.n_ff, n_embd)?,
            gate_inp: None,
        }),
        FfnKind::Moe(mc) => MlaFfn::Moe(l.moe(il, n_embd, mc)?),
    })
}
