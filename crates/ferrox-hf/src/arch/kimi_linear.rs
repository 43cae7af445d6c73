//! Kimi Linear (`KimiLinearForCausalLM`, Moonshot's Kimi-Linear-48B-A3B): KDA layers and
//! NoPE MLA layers, dense then routed-expert FFNs. As llama.cpp's converter
//! (`conversion/kimi_linear.py`): MLA layers are those whose 1-based index is in
//! `linear_attn_config.full_attn_layers` (`head_count_kv` 1, the KDA layers 0), `A_log`
//! becomes `-exp(A_log)`, the short convolutions are read as `{d_conv, 1, d_inner, 1}`,
//! `kv_b_proj` is split into `attn_k_b` (transposed) and `attn_v_b`, experts are stacked.
//!
//! The layout is shared with Kimi-K3 ([`super::kimi_k3`]), which adds to it.

use ferrox_gguf::{OwnedArray, OwnedValue};

use super::{Architecture, Keys, MetadataKvs, Table};
use crate::config::Config;
use crate::error::Result;
use crate::plan::PlannedTensor;
use crate::shards::Shards;

pub const ARCH: Architecture = Architecture {
    classes: &["KimiLinearForCausalLM", "KimiLinearModel"],
    name: "kimi-linear",
    pre_tokenizer: "kimi-k2",
    eos_from_config: false,
    metadata,
    tensors,
};

/// Most layers a config may declare (llama.cpp's `LLAMA_MAX_LAYERS`).
const MAX_LAYERS: usize = 512;
/// Largest size any other dimension may declare: far above real models (vocabularies of
/// 262,144 are the largest), and low enough that products of three never overflow.
const MAX_DIM: usize = 1 << 20;

/// The sizes the tensor table is checked against.
pub(super) struct Dims {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub n_ff: usize,
    pub n_head: usize,
    /// Heads of `kv_b_proj` (`num_key_value_heads`, as the converter reads it).
    pub n_head_kv: usize,
    pub q_lora: Option<usize>,
    pub kv_lora: usize,
    pub nope: usize,
    pub rope: usize,
    pub v_head: usize,
    pub kda_head: usize,
    pub d_conv: usize,
    pub n_expert: usize,
    pub n_ff_exp: usize,
    pub n_shared: usize,
    pub n_dense: usize,
    /// Kimi-K3's latent expert width (`routed_expert_hidden_size`).
    pub latent: Option<usize>,
    /// Per layer: MLA (else KDA).
    pub mla: Vec<bool>,
    pub tied: bool,
    /// Kimi-K3's layout (residual scores, full-rank KDA gate, MLA gate, latent experts).
    pub k3: bool,
}

impl Dims {
    pub fn read(c: &Config, k3: bool) -> Result<Dims> {
        let n_layer = c.usize("num_hidden_layers")?;
        if n_layer == 0 || n_layer > MAX_LAYERS {
            return Err(c.error("num_hidden_layers", format!("must be 1 to {MAX_LAYERS}")));
        }
        let lin = c.sub("linear_attn_config")?;
        let full = lin.u32_list("full_attn_layers", MAX_LAYERS)?;
        let n_head = dim(c, "num_attention_heads")?;
        // llama.cpp sizes the KDA layers by `head_count` too.
        if let Some(h) = lin.opt_u32("num_heads")? {
            if h as usize != n_head {
                return Err(lin.error(
                    "num_heads",
                    format!("is {h}, but llama.cpp's layout needs num_attention_heads ({n_head})"),
                ));
            }
        }
        let q_lora = match c.get("q_lora_rank") {
            Some(_) if !k3 => {
                return Err(c.error(
                    "q_lora_rank",
                    "is set: Kimi Linear's graph has no query LoRA",
                ))
            }
            Some(_) => Some(dim(c, "q_lora_rank")?),
            None => None,
        };
        if let Some(freq) = c.opt_u32("moe_layer_freq")? {
            if freq != 1 {
                return Err(c.error("moe_layer_freq", format!("is {freq}: only 1 is supported")));
            }
        }
        let experts = ["num_local_experts", "num_experts", "n_routed_experts"];
        let n_expert = dim(c, c.find(&experts).unwrap_or(experts[0]))?;
        let latent = match c.get("routed_expert_hidden_size") {
            Some(_) if k3 => Some(dim(c, "routed_expert_hidden_size")?),
            _ => None,
        };
        Ok(Dims {
            n_layer,
            n_embd: dim(c, "hidden_size")?,
            n_vocab: dim(c, "vocab_size")?,
            n_ff: dim(c, "intermediate_size")?,
            n_head,
            n_head_kv: match c.get("num_key_value_heads") {
                Some(_) => dim(c, "num_key_value_heads")?,
                None => n_head,
            },
            q_lora,
            kv_lora: dim(c, "kv_lora_rank")?,
            nope: dim(c, "qk_nope_head_dim")?,
            rope: dim(c, "qk_rope_head_dim")?,
            v_head: dim(c, "v_head_dim")?,
            kda_head: dim(&lin, "head_dim")?,
            d_conv: dim(&lin, "short_conv_kernel_size")?,
            n_expert,
            n_ff_exp: dim(c, "moe_intermediate_size")?,
            n_shared: dim(c, "num_shared_experts")?,
            n_dense: c.opt_u32("first_k_dense_replace")?.unwrap_or(0) as usize,
            latent,
            mla: (1..=n_layer as u32).map(|il| full.contains(&il)).collect(),
            tied: c.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            k3,
        })
    }
}

/// A required size, at most [`MAX_DIM`].
fn dim(c: &Config, key: &str) -> Result<usize> {
    let n = c.usize(key)?;
    if n > MAX_DIM {
        return Err(c.error(key, format!("is {n}, more than {MAX_DIM}")));
    }
    Ok(n)
}

fn metadata(c: &Config) -> Result<MetadataKvs> {
    let d = Dims::read(c, false)?;
    let mut k = common_metadata(c, &d, ARCH.name)?;
    if let Some(scale) = c.opt_f32("routed_scaling_factor")? {
        k.set("expert_weights_scale", scale);
    }
    Ok(k.out)
}

/// The keys both Kimi converters write: `TextModel.set_gguf_parameters`' common ones, then
/// the KDA and MLA sizes.
pub(super) fn common_metadata(c: &Config, d: &Dims, arch: &'static str) -> Result<Keys> {
    let mut k = Keys::new(arch);
    k.set("block_count", d.n_layer as u32);
    let ctx_keys = [
        "max_position_embeddings",
        "n_ctx",
        "n_positions",
        "max_length",
        "max_sequence_length",
        "model_max_length",
    ];
    if let Some(n_ctx) = c.find_u32(&ctx_keys)? {
        k.set("context_length", n_ctx);
    }
    k.set("embedding_length", d.n_embd as u32);
    k.set("feed_forward_length", d.n_ff as u32);
    k.set("attention.head_count", d.n_head as u32);
    if let Some(theta) = c.opt_f32("rope_theta")? {
        k.set("rope.freq_base", theta);
    }
    if let Some(eps) = c.opt_f32("rms_norm_eps")? {
        k.set("attention.layer_norm_rms_epsilon", eps);
    }
    k.set("expert_count", d.n_expert as u32);
    let used = [
        "num_experts_per_tok",
        "num_experts_per_token",
        "top_k_experts",
    ];
    if let Some(n) = c.find_u32(&used)? {
        k.set("expert_used_count", n);
    }
    if let Some(n) = c.opt_u32("n_group")? {
        k.set("expert_group_count", n);
    }
    if let Some(n) = c.opt_u32("topk_group")? {
        k.set("expert_group_used_count", n);
    }
    let score = [
        "score_function",
        "scoring_func",
        "score_func",
        "moe_router_activation",
        "moe_router_activation_func",
    ];
    if let Some(key) = c.find(&score) {
        let gating: u32 = match c.opt_str(key)? {
            Some("softmax") => 1,
            Some("sigmoid") => 2,
            other => return Err(c.error(key, format!("is {other:?}, expected sigmoid or softmax"))),
        };
        k.set("expert_gating_func", gating);
    }
    if let Some(head_dim) = c.opt_u32("head_dim")? {
        k.set("key_length", head_dim);
        k.set("value_length", head_dim);
    }
    k.set("vocab_size", d.n_vocab as u32);
    let kv_heads: Vec<u32> = d.mla.iter().map(|&m| u32::from(m)).collect();
    k.set(
        "attention.head_count_kv",
        OwnedValue::Array(OwnedArray::U32(kv_heads)),
    );
    k.set("ssm.conv_kernel", d.d_conv as u32);
    k.set("kda.head_dim", d.kda_head as u32);
    if let Some(rank) = d.q_lora {
        k.set("attention.q_lora_rank", rank as u32);
    }
    k.set("attention.kv_lora_rank", d.kv_lora as u32);
    k.set("rope.dimension_count", d.rope as u32);
    k.set("attention.key_length", (d.kv_lora + d.rope) as u32);
    k.set("attention.key_length_mla", (d.nope + d.rope) as u32);
    k.set("attention.value_length_mla", d.v_head as u32);
    k.set("expert_feed_forward_length", d.n_ff_exp as u32);
    k.set("expert_shared_count", d.n_shared as u32);
    k.set("leading_dense_block_count", d.n_dense as u32);
    Ok(k)
}

fn tensors(c: &Config, shards: &Shards) -> Result<Vec<PlannedTensor>> {
    table(c, &Dims::read(c, false)?, shards)
}

/// Every tensor of a Kimi checkpoint.
pub(super) fn table(c: &Config, d: &Dims, shards: &Shards) -> Result<Vec<PlannedTensor>> {
    if d.n_expert > shards.tensor_count() {
        // Checked before any per-expert name is made: a hostile count cannot allocate.
        return Err(c.error(
            "num_experts",
            format!("is {}, more than the checkpoint's tensors", d.n_expert),
        ));
    }
    let mut t = Table::new(shards);
    let (e, v) = (d.n_embd, d.n_vocab);
    t.stored(
        "model.embed_tokens.weight",
        "token_embd.weight".into(),
        &[v, e],
    )?;
    t.stored("model.norm.weight", "output_norm.weight".into(), &[e])?;
    let head = match (d.tied, t.has("lm_head.weight")) {
        (true, false) => "model.embed_tokens.weight",
        _ => "lm_head.weight",
    };
    t.stored(head, "output.weight".into(), &[v, e])?;
    if d.k3 {
        res_score(
            &mut t,
            "model.output_attn_res",
            "output_res_score.weight",
            e,
        )?;
    }
    for il in 0..d.n_layer {
        let hf = |s: &str| format!("model.layers.{il}.{s}");
        let gg = |s: &str| format!("blk.{il}.{s}");
        t.stored(&hf("input_layernorm.weight"), gg("attn_norm.weight"), &[e])?;
        t.stored(
            &hf("post_attention_layernorm.weight"),
            gg("ffn_norm.weight"),
            &[e],
        )?;
        if d.k3 {
            let attn = gg("attn_res_score.weight");
            res_score(&mut t, &hf("self_attention_res"), &attn, e)?;
            res_score(&mut t, &hf("mlp_res"), &gg("ffn_res_score.weight"), e)?;
        }
        if d.mla[il] {
            mla_layer(&mut t, d, il)?;
        } else {
            kda_layer(&mut t, d, il)?;
        }
        if il < d.n_dense {
            let f = d.n_ff;
            t.stored(&hf("mlp.gate_proj.weight"), gg("ffn_gate.weight"), &[f, e])?;
            t.stored(&hf("mlp.up_proj.weight"), gg("ffn_up.weight"), &[f, e])?;
            t.stored(&hf("mlp.down_proj.weight"), gg("ffn_down.weight"), &[e, f])?;
        } else {
            moe_layer(&mut t, d, il)?;
        }
    }
    Ok(t.out)
}

/// Kimi-K3's residual-attention score: `{src}_norm * {src}_proj` fused into one vector, as
/// the converter does (the two are only used as their product).
fn res_score(t: &mut Table<'_>, src: &str, dst: &str, n_embd: usize) -> Result<()> {
    let (norm, proj) = (format!("{src}_norm.weight"), format!("{src}_proj.weight"));
    t.product(&norm, &proj, dst.to_string(), n_embd)
}

fn kda_layer(t: &mut Table<'_>, d: &Dims, il: usize) -> Result<()> {
    let hf = |s: &str| format!("model.layers.{il}.self_attn.{s}");
    let gg = |s: &str| format!("blk.{il}.{s}");
    let (e, h, dh) = (d.n_embd, d.n_head, d.kda_head);
    let inner = h * dh;
    for (x, dst) in [("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v")] {
        let proj = hf(&format!("{x}_proj.weight"));
        t.stored(&proj, gg(&format!("{dst}.weight")), &[inner, e])?;
        // Stored as [d_inner, d_conv] or [d_inner, 1, d_conv]: d_conv values per channel.
        let conv_shape = [d.d_conv as u64, 1, inner as u64, 1];
        t.reshaped(
            &hf(&format!("{x}_conv1d.weight")),
            gg(&format!("ssm_conv1d_{x}.weight")),
            inner * d.d_conv,
            &conv_shape,
        )?;
    }
    t.stored(&hf("f_a_proj.weight"), gg("ssm_f_a.weight"), &[dh, e])?;
    t.stored(&hf("f_b_proj.weight"), gg("ssm_f_b.weight"), &[inner, dh])?;
    t.stored(&hf("b_proj.weight"), gg("ssm_beta.weight"), &[h, e])?;
    if d.k3 {
        // K3's converter keeps the first `num_attention_heads` values, as a vector.
        t.neg_exp_first(&hf("A_log"), gg("ssm_a"), h)?;
        t.stored(&hf("g_proj.weight"), gg("ssm_g.weight"), &[inner, e])?;
    } else {
        t.neg_exp(&hf("A_log"), gg("ssm_a"), h)?;
        t.stored(&hf("g_a_proj.weight"), gg("ssm_g_a.weight"), &[dh, e])?;
        t.stored(&hf("g_b_proj.weight"), gg("ssm_g_b.weight"), &[inner, dh])?;
    }
    t.reshaped(&hf("dt_bias"), gg("ssm_dt.bias"), inner, &[inner as u64])?;
    t.stored(&hf("o_norm.weight"), gg("ssm_norm.weight"), &[dh])?;
    t.stored(&hf("o_proj.weight"), gg("attn_output.weight"), &[e, inner])
}

fn mla_layer(t: &mut Table<'_>, d: &Dims, il: usize) -> Result<()> {
    let hf = |s: &str| format!("model.layers.{il}.self_attn.{s}");
    let gg = |s: &str| format!("blk.{il}.{s}");
    let (e, h) = (d.n_embd, d.n_head);
    let dk = d.nope + d.rope;
    match d.q_lora {
        Some(r) => {
            t.stored(&hf("q_a_proj.weight"), gg("attn_q_a.weight"), &[r, e])?;
            t.stored(
                &hf("q_a_layernorm.weight"),
                gg("attn_q_a_norm.weight"),
                &[r],
            )?;
            t.stored(&hf("q_b_proj.weight"), gg("attn_q_b.weight"), &[h * dk, r])?;
        }
        None => t.stored(&hf("q_proj.weight"), gg("attn_q.weight"), &[h * dk, e])?,
    }
    t.stored(
        &hf("kv_a_proj_with_mqa.weight"),
        gg("attn_kv_a_mqa.weight"),
        &[d.kv_lora + d.rope, e],
    )?;
    t.stored(
        &hf("kv_a_layernorm.weight"),
        gg("attn_kv_a_norm.weight"),
        &[d.kv_lora],
    )?;
    t.kv_b_split(
        &hf("kv_b_proj.weight"),
        [gg("attn_k_b.weight"), gg("attn_v_b.weight")],
        [d.n_head_kv, d.nope, d.v_head, d.kv_lora],
    )?;
    // K3's optional MLA output gate shares the HF name of the KDA layers' gate.
    if d.k3 && t.has(&hf("g_proj.weight")) {
        let width = h * d.v_head;
        t.stored(&hf("g_proj.weight"), gg("attn_gate.weight"), &[width, e])?;
    }
    t.stored(
        &hf("o_proj.weight"),
        gg("attn_output.weight"),
        &[e, h * d.v_head],
    )
}

fn moe_layer(t: &mut Table<'_>, d: &Dims, il: usize) -> Result<()> {
    let hf = |s: &str| format!("model.layers.{il}.block_sparse_moe.{s}");
    let gg = |s: &str| format!("blk.{il}.{s}");
    let (e, x, f) = (d.n_embd, d.n_expert, d.n_ff_exp);
    t.stored(&hf("gate.weight"), gg("ffn_gate_inp.weight"), &[x, e])?;
    t.stored(
        &hf("gate.e_score_correction_bias"),
        gg("exp_probs_b.bias"),
        &[x],
    )?;
    // Latent experts work in a narrower space, entered and left through two projections.
    let width = d.latent.unwrap_or(e);
    if let Some(lat) = d.latent {
        let down = hf("routed_expert_down_proj.weight");
        t.stored(&down, gg("ffn_routed_down.weight"), &[lat, e])?;
        let up = hf("routed_expert_up_proj.weight");
        t.stored(&up, gg("ffn_routed_up.weight"), &[e, lat])?;
        let norm = hf("routed_expert_norm.weight");
        if t.has(&norm) {
            t.stored(&norm, gg("ffn_routed_norm.weight"), &[lat])?;
        }
    }
    // w1: gate, w2: down, w3: up.
    for (w, dst, shape) in [
        ("w1", "ffn_gate_exps", [f, width]),
        ("w2", "ffn_down_exps", [width, f]),
        ("w3", "ffn_up_exps", [f, width]),
    ] {
        let srcs = (0..x)
            .map(|i| hf(&format!("experts.{i}.{w}.weight")))
            .collect();
        t.stacked(srcs, gg(&format!("{dst}.weight")), &shape)?;
    }
    if d.n_shared > 0 {
        let sh = f * d.n_shared;
        let s = |p: &str| hf(&format!("shared_experts.{p}.weight"));
        t.stored(&s("gate_proj"), gg("ffn_gate_shexp.weight"), &[sh, e])?;
        t.stored(&s("up_proj"), gg("ffn_up_shexp.weight"), &[sh, e])?;
        t.stored(&s("down_proj"), gg("ffn_down_shexp.weight"), &[e, sh])?;
    }
    Ok(())
}
