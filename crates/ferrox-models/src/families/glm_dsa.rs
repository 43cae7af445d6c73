//! GLM-5, GLM-5.1 and GLM-5.2: the DeepSeek-V3.2 layout (MLA, DeepSeek Sparse Attention,
//! routed and shared experts) where some layers reuse the previous layer's selection
//! (`attention.indexer.types`; GLM-5.2's pattern when a long-context file does not say).
//! Run by [`crate::dsa`].

use ferrox_gguf::Metadata;

use crate::dsa::{DsaConfig, DsaRules};
use crate::layers::mla::MscaleRule;
use crate::layers::rope::RopeStyle;
use crate::ModelError;

/// How llama.cpp loads `glm-dsa`: the indexer rotates interleaved pairs; the key LayerNorm's
/// epsilon is never read and stays 0; routing defaults to sigmoid; the YaRN log multiplier
/// is not read either.
pub const RULES: DsaRules = DsaRules {
    indexer_rope: RopeStyle::Normal,
    k_norm_eps: 0.0,
    gating_required: false,
    shared_indexers: true,
    mscale: MscaleRule::NoLogMultiplier,
};

/// `glm-dsa`, run by the DeepSeek Sparse Attention engine.
pub const ARCH: super::Architecture = super::Architecture {
    name: "glm-dsa",
    load: |gguf, options| super::dsa(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<DsaConfig, ModelError> {
    DsaConfig::read(meta, "glm-dsa", RULES)
}
