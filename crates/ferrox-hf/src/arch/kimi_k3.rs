//! Kimi-K3 (`KimiK3ForConditionalGeneration`, text model only): Kimi Linear's layout
//! ([`super::kimi_linear`]) with residual attention scores (`*_res_norm * *_res_proj`,
//! fused), a full-rank KDA output gate and an optional MLA one (both `g_proj`, told apart
//! by layer type), an optional query LoRA and latent experts, as llama.cpp's converter
//! (`conversion/kimi_k3.py`) writes them. Weights may sit under `language_model.`; the
//! config's `text_config` is read at the top level.

use super::kimi_linear::{common_metadata, table, Dims};
use super::{Architecture, MetadataKvs};
use crate::config::Config;
use crate::error::Result;
use crate::plan::PlannedTensor;
use crate::shards::Shards;

pub const ARCH: Architecture = Architecture {
    classes: &["KimiK3ForConditionalGeneration"],
    name: "kimi-k3",
    pre_tokenizer: "kimi-k2",
    eos_from_config: true,
    metadata,
    tensors,
};

fn metadata(c: &Config) -> Result<MetadataKvs> {
    let d = Dims::read(c, true)?;
    let mut k = common_metadata(c, &d, ARCH.name)?;
    let lin = c.sub("linear_attn_config")?;
    if let Some(lb) = lin.opt_f32("gate_lower_bound")? {
        k.set("kda.gate_lower_bound", lb);
    }
    // The cache holds the compressed latent.
    k.set("attention.value_length", d.kv_lora as u32);
    if let Some(scale) = c.opt_f32("routed_scaling_factor")? {
        k.set("expert_weights_scale", scale);
    }
    if let Some(norm) = c.opt_bool("moe_renormalize")? {
        k.set("expert_weights_norm", norm);
    }
    if c.opt_str("moe_router_activation_func")? != Some("sigmoid") {
        return Err(c.error("moe_router_activation_func", "must be sigmoid for Kimi-K3"));
    }
    k.set("expert_gating_func", 2u32);
    if let Some(latent) = d.latent {
        k.set("expert_latent_length", latent as u32);
    }
    if c.opt_str("hidden_act")? != Some("situ") {
        return Err(c.error("hidden_act", "must be situ for Kimi-K3"));
    }
    let required = |key: &str| c.opt_f32(key)?.ok_or_else(|| c.error(key, "is missing"));
    k.set("activation.situ_beta", required("activation_situ_beta")?);
    k.set(
        "activation.situ_linear_beta",
        required("activation_situ_linear_beta")?,
    );
    k.set("attn_res.block_size", c.u32("attn_res_block_size")?);
    Ok(k.out)
}

fn tensors(c: &Config, shards: &Shards) -> Result<Vec<PlannedTensor>> {
    table(c, &Dims::read(c, true)?, shards)
}
