//! DeepSeek-V4's tensors, found and shape-checked at load.

use crate::plan::Packing;
use ferrox_gguf::{GgmlType, Gguf};

use super::config::{Compression, Deepseek4Config, HC_STREAMS as HC};
use super::hyper::{HcWeights, MIX};
use crate::hparams::MoeFfnConfig;
use crate::names::*;
use crate::tensors::{ExpertRef, Loader, MatrixRef, MoeWeights};
use crate::ModelError;

/// A compressor: per token, `overlap` halves of key-value projections and of gate scores
/// (plus a learned score per position in the block), pooled into one row every `ratio`
/// positions, then RMS-normed.
#[derive(Clone, Debug)]
pub struct CompressorWeights {
    pub kv: MatrixRef,
    pub gate: MatrixRef,
    /// `ratio` rows of `overlap · width`: the score offset of each position in a block.
    pub ape: Vec<f32>,
    pub norm: Vec<f32>,
}

impl CompressorWeights {
    fn load(
        l: &Loader<'_>,
        names: [Tensor; 4],
        il: usize,
        n_embd: usize,
        width: usize,
        c: Compression,
    ) -> Result<Self, ModelError> {
        let [kv, gate, ape, norm] = names;
        let projected = c.overlap() * width;
        Ok(CompressorWeights {
            kv: l.matrix(&kv.layer(il), n_embd, projected)?,
            gate: l.matrix(&gate.layer(il), n_embd, projected)?,
            ape: l.vector(&ape.layer(il), c.ratio() * projected)?,
            norm: l.vector(&norm.layer(il), width)?,
        })
    }

    fn pack(&mut self, gguf: &Packing<'_>) -> Result<(), ModelError> {
        self.kv.pack(gguf)?;
        self.gate.pack(gguf)
    }

    fn n_bytes(&self) -> u64 {
        self.kv.n_bytes() + self.gate.n_bytes()
    }
}

/// A sparse layer's lightning indexer: its queries and head weights, and its own
/// compressor of keys.
#[derive(Clone, Debug)]
pub struct IndexerWeights {
    /// Query LoRA latent → `Hi` heads of `Di`.
    pub q_b: MatrixRef,
    /// Normed input → one weight per head.
    pub proj: MatrixRef,
    pub compressor: CompressorWeights,
}

#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub sinks: Vec<f32>,
    pub q_a: MatrixRef,
    pub q_a_norm: Vec<f32>,
    pub q_b: MatrixRef,
    pub kv: MatrixRef,
    pub kv_norm: Vec<f32>,
    /// `o_groups` matrices of `o_lora_rank × (H·D / o_groups)`.
    pub out_a: ExpertRef,
    pub out_b: MatrixRef,
    pub hc_attn: HcWeights,
    pub hc_ffn: HcWeights,
    pub compressor: Option<CompressorWeights>,
    pub indexer: Option<IndexerWeights>,
    pub ffn_norm: Vec<f32>,
    pub moe: MoeWeights,
    /// Hash-routed layers: `n_used` experts per token id.
    pub tid2eid: Option<Vec<usize>>,
}

#[derive(Clone, Debug)]
pub struct Deepseek4Weights {
    pub token_embd: MatrixRef,
    pub output_norm: Vec<f32>,
    pub output: MatrixRef,
    pub hc_head: HcWeights,
    pub layers: Vec<LayerWeights>,
}

fn hc(
    l: &Loader<'_>,
    [mix, base, scale]: [String; 3],
    n_embd: usize,
    outputs: usize,
    n_scales: usize,
) -> Result<HcWeights, ModelError> {
    Ok(HcWeights {
        mix: l.matrix(&mix, HC * n_embd, outputs)?,
        base: l.vector(&base, outputs)?,
        scale: l.vector(&scale, n_scales)?,
    })
}

/// `blk.{il}.ffn_gate_tid2eid.weight`: an I32 `{n_used, n_vocab}` table of expert ids, each
/// below `n_expert`.
fn tid2eid(l: &Loader<'_>, il: usize, c: &Deepseek4Config) -> Result<Vec<usize>, ModelError> {
    let name = FFN_GATE_TID2EID.layer(il);
    let t = l.require(&name)?;
    let (k, v) = (c.router.n_used, c.n_vocab);
    if t.ty != GgmlType::I32 || t.shape != [k as u64, v as u64] {
        return Err(ModelError::TensorShape {
            name,
            expected: vec![k as u64, v as u64],
            found: t.shape.clone(),
        });
    }
    let bytes = l.gguf.tensor_data(t)?;
    bytes
        .chunks_exact(4)
        .map(|b| {
            let e = i32::from_le_bytes(b.try_into().expect("four bytes"));
            usize::try_from(e)
                .ok()
                .filter(|&e| e < c.router.n_expert)
                .ok_or_else(|| {
                    ModelError::Config(format!(
                        "`{name}` routes to expert {e} of {}",
                        c.router.n_expert
                    ))
                })
        })
        .collect()
}

impl LayerWeights {
    fn load(l: &Loader<'_>, c: &Deepseek4Config, il: usize) -> Result<Self, ModelError> {
        let (e, d, h) = (c.n_embd, c.head_dim, c.n_head);
        let names3 = |a: Tensor, b: Tensor, s: Tensor| [a.layer(il), b.layer(il), s.layer(il)];
        let compression = c.compression[il];
        let compressor = match compression {
            Compression::None => None,
            _ => Some(CompressorWeights::load(
                l,
                [
                    ATTN_COMPRESSOR_KV,
                    ATTN_COMPRESSOR_GATE,
                    ATTN_COMPRESSOR_APE,
                    ATTN_COMPRESSOR_NORM,
                ],
                il,
                e,
                d,
                compression,
            )?),
        };
        let indexer = match compression {
            Compression::Sparse => {
                let (hi, di) = (c.indexer_heads, c.indexer_dim);
                Some(IndexerWeights {
                    q_b: l.matrix(&INDEXER_ATTN_Q_B.layer(il), c.q_lora_rank, hi * di)?,
                    proj: l.matrix(&INDEXER_PROJ.layer(il), e, hi)?,
                    compressor: CompressorWeights::load(
                        l,
                        [
                            INDEXER_COMPRESSOR_KV,
                            INDEXER_COMPRESSOR_GATE,
                            INDEXER_COMPRESSOR_APE,
                            INDEXER_COMPRESSOR_NORM,
                        ],
                        il,
                        e,
                        di,
                        compression,
                    )?,
                })
            }
            _ => None,
        };
        let moe_config = MoeFfnConfig {
            router: c.router,
            n_ff_exp: c.n_ff_exp,
            n_ff_shexp: Some(c.n_ff_shexp),
            shexp_gate: false,
        };
        let hashed = il < c.n_hash_layers;
        let moe = l.moe(il, e, &moe_config)?;
        if !hashed && moe.selection_bias.is_none() {
            return Err(ModelError::MissingTensor(FFN_EXP_PROBS_B.layer_bias(il)));
        }
        Ok(LayerWeights {
            attn_norm: l.vector(&ATTN_NORM.layer(il), e)?,
            sinks: l.vector(&ATTN_SINKS.layer(il), h)?,
            q_a: l.matrix(&ATTN_Q_A.layer(il), e, c.q_lora_rank)?,
            q_a_norm: l.vector(&ATTN_Q_A_NORM.layer(il), c.q_lora_rank)?,
            q_b: l.matrix(&ATTN_Q_B.layer(il), c.q_lora_rank, h * d)?,
            kv: l.matrix(&ATTN_KV.layer(il), e, d)?,
            kv_norm: l.vector(&ATTN_KV_A_NORM.layer(il), d)?,
            out_a: l.stacked(
                &ATTN_OUTPUT_A.layer(il),
                h * d / c.o_groups,
                c.o_lora_rank,
                c.o_groups,
            )?,
            out_b: l.matrix(&ATTN_OUTPUT_B.layer(il), c.o_groups * c.o_lora_rank, e)?,
            hc_attn: hc(
                l,
                names3(HC_ATTN_FN, HC_ATTN_BASE, HC_ATTN_SCALE),
                e,
                MIX,
                3,
            )?,
            hc_ffn: hc(l, names3(HC_FFN_FN, HC_FFN_BASE, HC_FFN_SCALE), e, MIX, 3)?,
            compressor,
            indexer,
            ffn_norm: l.vector(&FFN_NORM.layer(il), e)?,
            moe,
            tid2eid: hashed.then(|| tid2eid(l, il, c)).transpose()?,
        })
    }

    fn pack(&mut self, gguf: &Packing<'_>) -> Result<(), ModelError> {
        for m in [&mut self.q_a, &mut self.q_b, &mut self.kv, &mut self.out_b] {
            m.pack(gguf)?;
        }
        self.out_a.pack(gguf)?;
        if let Some(c) = &mut self.compressor {
            c.pack(gguf)?;
        }
        if let Some(ix) = &mut self.indexer {
            ix.q_b.pack(gguf)?;
            ix.proj.pack(gguf)?;
            ix.compressor.pack(gguf)?;
        }
        self.moe.pack(gguf)
    }

    fn n_bytes(&self, c: &Deepseek4Config) -> u64 {
        let attention = self.q_a.n_bytes()
            + self.q_b.n_bytes()
            + self.kv.n_bytes()
            + self.out_a.n_bytes()
            + self.out_b.n_bytes()
            + self.hc_attn.mix.n_bytes()
            + self.hc_ffn.mix.n_bytes();
        let compressors = self
            .compressor
            .as_ref()
            .map_or(0, CompressorWeights::n_bytes)
            + self.indexer.as_ref().map_or(0, |ix| {
                ix.q_b.n_bytes() + ix.proj.n_bytes() + ix.compressor.n_bytes()
            });
        let moe = crate::hparams::FfnKind::Moe(MoeFfnConfig {
            router: c.router,
            n_ff_exp: c.n_ff_exp,
            n_ff_shexp: Some(c.n_ff_shexp),
            shexp_gate: false,
        });
        attention + compressors + self.moe.bytes_per_token_in(&moe)
    }
}

impl Deepseek4Weights {
    pub fn load(gguf: &Gguf, c: &Deepseek4Config) -> Result<Self, ModelError> {
        let l = Loader { gguf };
        let e = c.n_embd;
        let layers = (0..c.n_layer)
            .map(|il| LayerWeights::load(&l, c, il))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| crate::tensors::name_keys(err, "deepseek4"))?;
        Ok(Deepseek4Weights {
            token_embd: l.matrix(&TOKEN_EMBD.weight(), e, c.n_vocab)?,
            output_norm: l.vector(&OUTPUT_NORM.weight(), e)?,
            output: l.matrix(&OUTPUT.weight(), e, c.n_vocab)?,
            hc_head: hc(
                &l,
                [
                    OUTPUT_HC_FN.weight(),
                    OUTPUT_HC_BASE.weight(),
                    OUTPUT_HC_SCALE.weight(),
                ],
                e,
                HC,
                1,
            )?,
            layers,
        })
    }

    pub fn pack(&mut self, gguf: &Packing<'_>) -> Result<(), ModelError> {
        self.output.pack(gguf)?;
        self.layers.iter_mut().try_for_each(|l| l.pack(gguf))
    }

    /// Bytes of weights one decoded token reads.
    pub fn bytes_per_token(&self, c: &Deepseek4Config) -> u64 {
        crate::tensors::embedding_and_head_bytes(&self.token_embd, &self.output)
            + self.hc_head.mix.n_bytes()
            + self.layers.iter().map(|l| l.n_bytes(c)).sum::<u64>()
    }
}
