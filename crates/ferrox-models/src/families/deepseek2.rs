//! DeepSeek-V2/V2.5/V3/R1 and the models converted under the same name (Kimi-K2,
//! GigaChat3, GLM-4.7-Lite): Multi-head Latent Attention, leading dense layers, then routed
//! experts with shared experts (V3: sigmoid gating, group-limited selection, a selection
//! bias).

use ferrox_gguf::Metadata;

use crate::layers::mla::{config_for, MlaConfig, MscaleRule};
use crate::ModelError;

/// `deepseek2`, run by the Multi-head Latent Attention engine.
pub const ARCH: super::Architecture = super::Architecture {
    name: "deepseek2",
    load: |gguf, options| super::mla(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<MlaConfig, ModelError> {
    config_for(meta, "deepseek2", MscaleRule::Deepseek2)
}
