#![allow(dead_code)]
//! A tiny Hugging Face checkpoint directory written from a GGUF file: the inverse of
//! llama.cpp's converters for `kimi-linear` and `kimi-k3` (tensor names and layouts as
//! Moonshot publishes them, `A_log` from `ssm_a`, `kv_b_proj` from `attn_k_b`/`attn_v_b`,
//! experts unstacked, K3's residual scores as a norm and a projection of ones, K3's weights
//! under `language_model.`), in two safetensors shards with an index, plus a small
//! `tiktoken.model` and a `tokenizer_config.json`.
//!
//! Shared by `tests/kimi_linear.rs` and the CLI's `tests/hf_dir.rs`.

use std::collections::BTreeMap;
use std::path::Path;

use ferrox_gguf::{Gguf, TensorInfo};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::{json, Value};

/// The multi-byte tokens of the tiny tiktoken vocabulary, ranks 256 onwards (single bytes
/// hold ranks 0-255, each its own value).
pub const MERGED: &[&str] = &[
    "he", "ll", "llo", "hello", " w", "or", " wor", "ld", " world", "in", "ing", " t", "th", " th",
    " the", "er", "at", "on", "an", "en", "es", " a", "re", "to",
];

/// The named special tokens (ids after the mergeable ranks; the rest are reserved).
pub const SPECIALS: &[&str] = &[
    "[BOS]",
    "[EOS]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
];

pub const CHAT_TEMPLATE: &str = "{% for m in messages %}<|im_{{ m.role }}|>{{ m.content }}<|im_end|>{% endfor %}{% if add_generation_prompt %}<|im_assistant|>{% endif %}";

/// HF tensors by name: type, PyTorch shape and little-endian bytes.
pub type Tensors = BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>;

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn le(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn torch_shape(t: &TensorInfo) -> Vec<usize> {
    t.shape.iter().rev().map(|&d| d as usize).collect()
}

/// `A_log` for a stored `ssm_a` value: the f32 nearest ln(-a) whose `-exp` the loader
/// maps back to `a` exactly, if one of the nearby values does.
fn a_log(a: f32) -> f32 {
    let back = |x: f32| (-(f64::from(x)).exp()) as f32;
    let guess = ((-f64::from(a)).ln()) as f32;
    let mut best = guess;
    for step in -4i32..=4 {
        let x = f32::from_bits((guess.to_bits() as i32 + step) as u32);
        if back(x) == a {
            return x;
        }
        if (back(x) - a).abs() < (back(best) - a).abs() {
            best = x;
        }
    }
    best
}

/// The HF tensors of a `kimi-linear` GGUF (every tensor F32).
pub fn kimi_linear_tensors(gguf: &Gguf) -> Tensors {
    kimi_tensors(gguf)
}

/// The HF tensors of a `kimi-linear` or `kimi-k3` GGUF (every tensor F32).
pub fn kimi_tensors(gguf: &Gguf) -> Tensors {
    let k3 = gguf.metadata().architecture().unwrap() == "kimi-k3";
    let prefix = if k3 { "language_model." } else { "" };
    let data = |t: &TensorInfo| gguf.tensor_data(t).unwrap().to_vec();
    let mut out = Tensors::new();
    let mut put = |name: String, shape: Vec<usize>, bytes: Vec<u8>| {
        assert_eq!(shape.iter().product::<usize>() * 4, bytes.len(), "{name}");
        out.insert(format!("{prefix}{name}"), (Dtype::F32, shape, bytes));
    };
    // A residual score s as the pair the converter fuses: s (the norm) and ones.
    let res_pair = |put: &mut dyn FnMut(String, Vec<usize>, Vec<u8>), src: &str, t: &TensorInfo| {
        let n = t.shape[0] as usize;
        put(format!("{src}_norm.weight"), vec![n], data(t));
        put(format!("{src}_proj.weight"), vec![1, n], le(&vec![1.0; n]));
    };
    let mut kv_b: BTreeMap<usize, [Option<TensorInfo>; 2]> = BTreeMap::new();
    for t in gguf.tensors() {
        let plain = |n: &str| Some(n.to_string());
        let renamed = match t.name.as_str() {
            "token_embd.weight" => plain("model.embed_tokens.weight"),
            "output_norm.weight" => plain("model.norm.weight"),
            "output.weight" => plain("lm_head.weight"),
            "output_res_score.weight" => {
                res_pair(&mut put, "model.output_attn_res", t);
                continue;
            }
            _ => None,
        };
        if let Some(name) = renamed {
            put(name, torch_shape(t), data(t));
            continue;
        }
        let rest = t.name.strip_prefix("blk.").expect("a layer tensor");
        let (il, leaf) = rest.split_once('.').unwrap();
        let il: usize = il.parse().unwrap();
        let layer = |s: &str| format!("model.layers.{il}.{s}");
        let attn = |s: &str| layer(&format!("self_attn.{s}"));
        let moe = |s: &str| layer(&format!("block_sparse_moe.{s}"));
        match leaf {
            "attn_res_score.weight" => res_pair(&mut put, &layer("self_attention_res"), t),
            "ffn_res_score.weight" => res_pair(&mut put, &layer("mlp_res"), t),
            _ => {}
        }
        let hf = match leaf {
            "attn_res_score.weight" | "ffn_res_score.weight" => continue,
            "ssm_g.weight" | "attn_gate.weight" => attn("g_proj.weight"),
            "attn_q_a.weight" => attn("q_a_proj.weight"),
            "attn_q_a_norm.weight" => attn("q_a_layernorm.weight"),
            "attn_q_b.weight" => attn("q_b_proj.weight"),
            "ffn_routed_down.weight" => moe("routed_expert_down_proj.weight"),
            "ffn_routed_up.weight" => moe("routed_expert_up_proj.weight"),
            "ffn_routed_norm.weight" => moe("routed_expert_norm.weight"),
            "attn_norm.weight" => layer("input_layernorm.weight"),
            "ffn_norm.weight" => layer("post_attention_layernorm.weight"),
            "attn_q.weight" => attn("q_proj.weight"),
            "attn_k.weight" => attn("k_proj.weight"),
            "attn_v.weight" => attn("v_proj.weight"),
            "attn_output.weight" => attn("o_proj.weight"),
            "ssm_f_a.weight" => attn("f_a_proj.weight"),
            "ssm_f_b.weight" => attn("f_b_proj.weight"),
            "ssm_beta.weight" => attn("b_proj.weight"),
            "ssm_g_a.weight" => attn("g_a_proj.weight"),
            "ssm_g_b.weight" => attn("g_b_proj.weight"),
            "ssm_norm.weight" => attn("o_norm.weight"),
            "attn_kv_a_mqa.weight" => attn("kv_a_proj_with_mqa.weight"),
            "attn_kv_a_norm.weight" => attn("kv_a_layernorm.weight"),
            "ffn_gate.weight" => layer("mlp.gate_proj.weight"),
            "ffn_up.weight" => layer("mlp.up_proj.weight"),
            "ffn_down.weight" => layer("mlp.down_proj.weight"),
            "ffn_gate_inp.weight" => moe("gate.weight"),
            "exp_probs_b.bias" => moe("gate.e_score_correction_bias"),
            "ffn_gate_shexp.weight" => moe("shared_experts.gate_proj.weight"),
            "ffn_up_shexp.weight" => moe("shared_experts.up_proj.weight"),
            "ffn_down_shexp.weight" => moe("shared_experts.down_proj.weight"),
            "ssm_dt.bias" => attn("dt_bias"),
            "ssm_conv1d_q.weight" | "ssm_conv1d_k.weight" | "ssm_conv1d_v.weight" => {
                // ggml {d_conv, 1, d_inner} is PyTorch's Conv1d weight [d_inner, 1, d_conv].
                let x = &leaf[11..12];
                let (d_conv, inner) = (t.shape[0] as usize, t.shape[2] as usize);
                put(
                    attn(&format!("{x}_conv1d.weight")),
                    vec![inner, 1, d_conv],
                    data(t),
                );
                continue;
            }
            "ssm_a" => {
                let a: Vec<f32> = f32s(&data(t)).into_iter().map(a_log).collect();
                put(attn("A_log"), vec![1, 1, a.len(), 1], le(&a));
                continue;
            }
            "attn_k_b.weight" | "attn_v_b.weight" => {
                let slot = usize::from(leaf == "attn_v_b.weight");
                kv_b.entry(il).or_default()[slot] = Some(t.clone());
                continue;
            }
            "ffn_gate_exps.weight" | "ffn_down_exps.weight" | "ffn_up_exps.weight" => {
                let w = match leaf {
                    "ffn_gate_exps.weight" => "w1",
                    "ffn_down_exps.weight" => "w2",
                    _ => "w3",
                };
                let (cols, rows, n) = (t.shape[0] as usize, t.shape[1] as usize, t.shape[2]);
                let bytes = data(t);
                for (x, chunk) in bytes.chunks_exact(rows * cols * 4).enumerate() {
                    assert!((x as u64) < n);
                    put(
                        moe(&format!("experts.{x}.{w}.weight")),
                        vec![rows, cols],
                        chunk.to_vec(),
                    );
                }
                continue;
            }
            other => panic!("no HF name for {other}"),
        };
        put(hf, torch_shape(t), data(t));
    }
    for (il, [k_b, v_b]) in kv_b {
        let (k_b, v_b) = (k_b.unwrap(), v_b.unwrap());
        // k_b: ggml {nope, lkv, H}, i.e. per head [lkv][nope]; v_b: ggml {lkv, v, H}.
        let (nope, lkv, h) = (
            k_b.shape[0] as usize,
            k_b.shape[1] as usize,
            k_b.shape[2] as usize,
        );
        let v_dim = v_b.shape[1] as usize;
        let (kb, vb) = (f32s(&data(&k_b)), f32s(&data(&v_b)));
        let mut rows = Vec::with_capacity(h * (nope + v_dim) * lkv);
        for head in 0..h {
            for n in 0..nope {
                rows.extend((0..lkv).map(|l| kb[(head * lkv + l) * nope + n]));
            }
            rows.extend_from_slice(&vb[head * v_dim * lkv..(head + 1) * v_dim * lkv]);
        }
        put(
            format!("model.layers.{il}.self_attn.kv_b_proj.weight"),
            vec![h * (nope + v_dim), lkv],
            le(&rows),
        );
    }
    out
}

/// `config.json` for a `kimi-linear` GGUF's hyperparameters.
pub fn kimi_linear_config(gguf: &Gguf) -> Value {
    kimi_config(gguf)
}

/// `config.json` for a `kimi-linear` or `kimi-k3` GGUF's hyperparameters (K3's in a
/// `text_config`, as multimodal checkpoints have it).
pub fn kimi_config(gguf: &Gguf) -> Value {
    let m = gguf.metadata();
    let a = m.architecture().unwrap();
    let u = |k: &str| m.get_u32(&format!("{a}.{k}")).unwrap();
    let f = |k: &str| m.get_f32(&format!("{a}.{k}")).unwrap();
    let kv_heads = m
        .get_array(&format!("{a}.attention.head_count_kv"))
        .unwrap();
    let kv_heads = kv_heads.as_slice::<u32>().unwrap();
    let full: Vec<usize> = (0..kv_heads.len())
        .filter(|&il| kv_heads[il] > 0)
        .map(|il| il + 1)
        .collect();
    let kda: Vec<usize> = (1..=kv_heads.len())
        .filter(|il| !full.contains(il))
        .collect();
    let (dk, rope) = (u("attention.key_length_mla"), u("rope.dimension_count"));
    let mut config = json!({
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "vocab_size": u("vocab_size"),
        "hidden_size": u("embedding_length"),
        "intermediate_size": u("feed_forward_length"),
        "num_hidden_layers": u("block_count"),
        "num_attention_heads": u("attention.head_count"),
        "num_key_value_heads": u("attention.head_count"),
        "rms_norm_eps": f("attention.layer_norm_rms_epsilon"),
        "max_position_embeddings": u("context_length"),
        "kv_lora_rank": u("attention.kv_lora_rank"),
        "q_lora_rank": null,
        "qk_nope_head_dim": dk - rope,
        "qk_rope_head_dim": rope,
        "v_head_dim": u("attention.value_length_mla"),
        "mla_use_nope": true,
        "linear_attn_config": {
            "full_attn_layers": full,
            "kda_layers": kda,
            "head_dim": u("kda.head_dim"),
            "num_heads": u("attention.head_count"),
            "short_conv_kernel_size": u("ssm.conv_kernel"),
        },
        "num_experts": u("expert_count"),
        "num_experts_per_token": u("expert_used_count"),
        "moe_intermediate_size": u("expert_feed_forward_length"),
        "num_shared_experts": u("expert_shared_count"),
        "first_k_dense_replace": u("leading_dense_block_count"),
        "routed_scaling_factor": f("expert_weights_scale"),
        "moe_router_activation_func": "sigmoid",
        "moe_renormalize": true,
        "num_expert_group": 1,
        "topk_group": 1,
        "tie_word_embeddings": false,
        "bos_token_id": 256 + MERGED.len(),
        "eos_token_id": 256 + MERGED.len() + 1,
        "torch_dtype": "float32",
    });
    if a != "kimi-k3" {
        return config;
    }
    let opt_f = |k: &str| m.opt_f32(&format!("{a}.{k}")).unwrap();
    let opt_u = |k: &str| m.opt_u32(&format!("{a}.{k}")).unwrap();
    config["hidden_act"] = json!("situ");
    config["activation_situ_beta"] = json!(f("activation.situ_beta"));
    config["activation_situ_linear_beta"] = json!(f("activation.situ_linear_beta"));
    config["attn_res_block_size"] = json!(u("attn_res.block_size"));
    let norm = m.opt_bool(&format!("{a}.expert_weights_norm")).unwrap();
    config["moe_renormalize"] = json!(norm.unwrap_or(false));
    config["q_lora_rank"] = json!(opt_u("attention.q_lora_rank"));
    config["routed_expert_hidden_size"] = json!(opt_u("expert_latent_length"));
    config.as_object_mut().unwrap().remove("architectures");
    if let Some(lb) = opt_f("kda.gate_lower_bound") {
        config["linear_attn_config"]["gate_lower_bound"] = json!(lb);
    }
    json!({
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3",
        "text_config": config,
    })
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `tiktoken.model`: every byte at its own value as rank, then [`MERGED`].
pub fn tiktoken_model() -> String {
    let bytes = (0..=255u8).map(|b| vec![b]);
    let merged = MERGED.iter().map(|t| t.as_bytes().to_vec());
    bytes
        .chain(merged)
        .enumerate()
        .map(|(rank, t)| format!("{} {rank}\n", base64(&t)))
        .collect()
}

/// `tokenizer_config.json`: [`SPECIALS`] as added tokens, BOS `[BOS]`, EOS `<|im_end|>`.
pub fn tokenizer_config() -> Value {
    let first = 256 + MERGED.len();
    let added: serde_json::Map<String, Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let token = json!({"content": s, "lstrip": false, "normalized": false,
                "rstrip": false, "single_word": false, "special": true});
            ((first + i).to_string(), token)
        })
        .collect();
    json!({
        "added_tokens_decoder": added,
        "bos_token": "[BOS]",
        "eos_token": "<|im_end|>",
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": 1048576,
        "tokenizer_class": "TikTokenTokenizer",
    })
}

/// Writes `tensors` as `n_shards` safetensors files with an index (one file, no index,
/// when `n_shards` is 1).
pub fn write_shards(dir: &Path, tensors: &Tensors, n_shards: usize) {
    let names: Vec<&String> = tensors.keys().collect();
    let per = names.len().div_ceil(n_shards);
    let mut weight_map = serde_json::Map::new();
    for (i, chunk) in names.chunks(per).enumerate() {
        let file = if n_shards == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{n_shards:05}.safetensors", i + 1)
        };
        let views: Vec<(String, TensorView<'_>)> = chunk
            .iter()
            .map(|name| {
                let (dtype, shape, bytes) = &tensors[*name];
                let view = TensorView::new(*dtype, shape.clone(), bytes).unwrap();
                weight_map.insert((*name).clone(), file.clone().into());
                ((*name).clone(), view)
            })
            .collect();
        let bytes = safetensors::serialize(views, None).unwrap();
        std::fs::write(dir.join(&file), bytes).unwrap();
    }
    if n_shards > 1 {
        let index = json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
        let text = serde_json::to_string_pretty(&index).unwrap();
        std::fs::write(dir.join("model.safetensors.index.json"), text).unwrap();
    }
}

/// Writes the whole directory for a `kimi-linear` or `kimi-k3` GGUF: config, two shards
/// and index, tokenizer files.
pub fn write_kimi_linear_dir(dir: &Path, gguf: &Gguf) {
    let config = serde_json::to_string_pretty(&kimi_config(gguf)).unwrap();
    std::fs::write(dir.join("config.json"), config).unwrap();
    write_shards(dir, &kimi_tensors(gguf), 2);
    std::fs::write(dir.join("tiktoken.model"), tiktoken_model()).unwrap();
    let tc = serde_json::to_string_pretty(&tokenizer_config()).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), tc).unwrap();
}

/// Every position's logits of `tokens` run as one batch (f32 cache).
#[allow(dead_code)] // not every including test compares logits
pub fn all_logits(gguf: Gguf, tokens: &[u32]) -> Vec<f32> {
    use ferrox_core::KvStorage;
    use ferrox_models::{AnyEngine, EngineExt, EngineOptions, LogitsFor};
    use std::sync::Arc;

    let options = EngineOptions {
        n_ctx: 128,
        threads: 2,
        kv_storage: KvStorage::F32,
        ..EngineOptions::default()
    };
    let engine = AnyEngine::from_gguf(Arc::new(gguf), &options).unwrap();
    let mut state = engine.new_state().unwrap();
    engine
        .forward_batch(tokens, 0, &mut state, LogitsFor::All)
        .unwrap()
        .to_vec()
}
