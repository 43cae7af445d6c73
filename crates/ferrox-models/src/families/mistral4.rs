//! Mistral-4 (Mistral Small 4): llama.cpp runs it as DeepSeek-2 under its own name. Its
//! experts come fused (`ffn_gate_up_exps`), and YaRN's attention factor uses `mscale = 1`
//! (llama.cpp's special case for `mscale_all_dim` applies to `deepseek2` only).

use ferrox_gguf::Metadata;

use crate::layers::mla::{config_for, MlaConfig, MscaleRule};
use crate::ModelError;

/// `mistral4`, run by the Multi-head Latent Attention engine.
pub const ARCH: super::Architecture = super::Architecture {
    name: "mistral4",
    load: |gguf, options| super::mla(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<MlaConfig, ModelError> {
    config_for(meta, "mistral4", MscaleRule::Other)
}
