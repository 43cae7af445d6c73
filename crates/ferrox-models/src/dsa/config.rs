//! Hyperparameters of a DeepSeek Sparse Attention model: the MLA model's, plus the lightning
//! indexer's and which layers compute their own selection.

use ferrox_core::hadamard::Hadamard;
use ferrox_gguf::{GgufError, Metadata, Value};
use ferrox_moe::Gating;

use crate::hparams::{FfnKind, Keys};
use crate::layers::attention::MAX_HEAD_DIM;
use crate::layers::mla::{config_for, KvB, MlaConfig, MscaleRule};
use crate::layers::rope::{Rope, RopeStyle};
use crate::ModelError;

/// Most indexer heads a file may declare (DeepSeek-V3.2 and GLM-5 have 64 and 32).
const MAX_INDEXER_HEADS: usize = 4096;

/// Where the architectures built on DeepSeek Sparse Attention differ, as llama.cpp loads
/// them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DsaRules {
    /// RoPE layout of the indexer's rotated slice.
    pub indexer_rope: RopeStyle,
    /// Epsilon of the indexer key's LayerNorm.
    pub k_norm_eps: f32,
    /// `expert_gating_func` must be present; otherwise its absence (or 0) means sigmoid.
    pub gating_required: bool,
    /// Layers may share the selection of the last layer that computes one
    /// (`attention.indexer.types`); otherwise every layer computes its own.
    pub shared_indexers: bool,
    pub mscale: MscaleRule,
}

/// The lightning indexer's shapes.
#[derive(Clone, Debug, PartialEq)]
pub struct IndexerConfig {
    /// Hi: indexer heads per token.
    pub n_head: usize,
    /// Di: width of an indexer head (query and key), its first R dims rotated.
    pub head_dim: usize,
    /// Most positions a token attends to; shorter contexts are attended densely.
    pub top_k: usize,
    /// The MLA's rotation (same frequencies and YaRN corrections) in the indexer's layout.
    pub rope: Rope,
    pub k_norm_eps: f32,
    /// The Hadamard rotation of queries and keys after RoPE, which llama.cpp always applies
    /// to these indexers; it has one for power-of-two heads of at least 64 and cannot run
    /// other sizes, which go unrotated here.
    pub rotation: Option<Hadamard>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DsaConfig {
    pub mla: MlaConfig,
    pub indexer: IndexerConfig,
    /// Per layer: computes its own selection (`true`), or reuses the last one computed.
    pub full: Vec<bool>,
}

impl DsaConfig {
    /// Layers that compute a selection (and keep indexer keys).
    pub fn n_indexer_layers(&self) -> usize {
        self.full.iter().filter(|&&f| f).count()
    }

    /// Reads a DSA model of architecture `arch`.
    pub fn read(meta: &Metadata<'_>, arch: &str, rules: DsaRules) -> Result<DsaConfig, ModelError> {
        let k = Keys { meta, arch };
        let mut mla = config_for(meta, arch, rules.mscale)?;
        if mla.kv_b != KvB::Split {
            return Err(ModelError::Config(format!(
                "{arch} requires MLA: `{}` and `{}` must be set",
                k.key("attention.key_length_mla"),
                k.key("attention.value_length_mla")
            )));
        }
        if mla.q_lora_rank.is_none() {
            return Err(ModelError::Config(format!(
                "{arch} requires a query LoRA (`{}` > 0): the indexer's queries start from it",
                k.key("attention.q_lora_rank")
            )));
        }
        read_gating(&k, &rules, &mut mla)?;

        let n_head = k.count("attention.indexer.head_count", MAX_INDEXER_HEADS)?;
        let head_dim = k.count("attention.indexer.key_length", MAX_HEAD_DIM)?;
        let top_k = k.usize("attention.indexer.top_k")?;
        if n_head == 0 {
            return Err(k.bad_count("attention.indexer.head_count", n_head, "must be positive"));
        }
        if head_dim < mla.n_rot {
            return Err(k.bad_count(
                "attention.indexer.key_length",
                head_dim,
                &format!("smaller than the {} rotated dimensions", mla.n_rot),
            ));
        }
        if top_k == 0 {
            return Err(k.bad_count("attention.indexer.top_k", top_k, "must be positive"));
        }
        let full = if rules.shared_indexers {
            indexer_types(&k, mla.n_layer(), mla.n_ctx_train)?
        } else {
            vec![true; mla.n_layer()]
        };
        if full.first() != Some(&true) {
            return Err(ModelError::Config(format!(
                "`{}`: layer 0 must compute its own selection",
                k.key("attention.indexer.types")
            )));
        }
        let rope = Rope {
            style: rules.indexer_rope,
            ..mla.rope.clone()
        };
        Ok(DsaConfig {
            indexer: IndexerConfig {
                n_head,
                head_dim,
                top_k,
                rope,
                k_norm_eps: rules.k_norm_eps,
                rotation: Hadamard::new(head_dim).filter(|_| head_dim >= 64),
            },
            mla,
            full,
        })
    }
}

/// The routers' gating: required by some architectures, sigmoid by default in others.
fn read_gating(k: &Keys<'_, '_>, rules: &DsaRules, mla: &mut MlaConfig) -> Result<(), ModelError> {
    let key = k.key("expert_gating_func");
    let value = k.meta.opt_u32(&key)?;
    if rules.gating_required {
        return match value {
            Some(_) => Ok(()),
            None => Err(GgufError::MissingKey(key).into()),
        };
    }
    if matches!(value, None | Some(0)) {
        for ffn in &mut mla.ffn {
            if let FfnKind::Moe(moe) = ffn {
                moe.router.gating = Gating::Sigmoid;
            }
        }
    }
    Ok(())
}

/// Context lengths from which a file without `attention.indexer.types` is a GLM-5.2 (shared
/// indexers); shorter ones are GLM-5 / GLM-5.1 (every layer full).
const GLM_5_2_CONTEXT: usize = 1 << 20;

/// GLM-5.2's layers that compute a selection when the file does not say: 0, 1, 2, then every
/// fourth layer from 6 to 74.
fn glm_5_2_full(il: usize) -> bool {
    il < 78 && (il < 3 || (il - 2).is_multiple_of(4))
}

/// `attention.indexer.types`: one flag (bool or integer, nonzero meaning "full") for every
/// layer of the trunk, or one for all.
fn indexer_types(
    k: &Keys<'_, '_>,
    n_layer: usize,
    n_ctx_train: usize,
) -> Result<Vec<bool>, ModelError> {
    let key = k.key("attention.indexer.types");
    let flag = |v: &Value<'_>| match v {
        Value::Bool(b) => Some(*b),
        v => v.as_i128().map(|i| i != 0),
    };
    let bad = |what: String| ModelError::Config(format!("`{key}`: {what}"));
    match k.meta.get(&key) {
        None if n_ctx_train < GLM_5_2_CONTEXT => Ok(vec![true; n_layer]),
        None => Ok((0..n_layer).map(glm_5_2_full).collect()),
        Some(Value::Array(a)) => {
            if a.len() != n_layer {
                return Err(bad(format!("{} entries for {n_layer} layers", a.len())));
            }
            if let Some(bools) = a.as_bools() {
                return Ok(bools);
            }
            a.iter()
                .enumerate()
                .map(|(il, v)| flag(&v).ok_or_else(|| bad(format!("entry {il} is not a flag"))))
                .collect()
        }
        Some(v) => match flag(&v) {
            Some(f) => Ok(vec![f; n_layer]),
            None => Err(bad(format!("a {} is not a flag", v.type_description()))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glm_5_2_defaults() {
        let full: Vec<usize> = (0..80).filter(|&il| glm_5_2_full(il)).collect();
        let mut expected = vec![0, 1, 2];
        expected.extend((6..=74).step_by(4));
        assert_eq!(full, expected);
    }
}
