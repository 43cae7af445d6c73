//! DeepSeek-V2/V2.5/V3/R1 and the models converted under the same name (Kimi-K2,
//! GigaChat3, GLM-4.7-Lite): Multi-head Latent Attention, leading dense layers, then routed
//! experts with shared experts (V3: sigmoid gating, group-limited selection, a selection
//! bias).

use ferrox_gguf::Metadata;

use crate::mla::{config_for, MlaConfig, MscaleRule};
use crate::ModelError;

pub fn config(meta: &Metadata<'_>) -> Result<MlaConfig, ModelError> {
    config_for(meta, "deepseek2", MscaleRule::Deepseek2)
}
