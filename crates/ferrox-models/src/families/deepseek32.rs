//! DeepSeek-V3.2 / V3.2-Exp: DeepSeek-V3 (MLA, leading dense layers, routed and shared
//! experts) with DeepSeek Sparse Attention, every layer's lightning indexer selecting the
//! positions its attention reads. Run by [`crate::dsa`].

use ferrox_gguf::Metadata;

use crate::dsa::{DsaConfig, DsaRules};
use crate::layers::mla::MscaleRule;
use crate::layers::rope::RopeStyle;
use crate::ModelError;

/// How llama.cpp loads `deepseek32`: the indexer rotates NeoX-style, its key LayerNorm
/// uses a fixed epsilon of 1e-6, the gating function must be stated.
pub const RULES: DsaRules = DsaRules {
    indexer_rope: RopeStyle::Neox,
    k_norm_eps: 1e-6,
    gating_required: true,
    shared_indexers: false,
    mscale: MscaleRule::Other,
};

/// `deepseek32`, run by the DeepSeek Sparse Attention engine.
pub const ARCH: super::Architecture = super::Architecture {
    name: "deepseek32",
    load: |gguf, options| super::dsa(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<DsaConfig, ModelError> {
    DsaConfig::read(meta, "deepseek32", RULES)
}
