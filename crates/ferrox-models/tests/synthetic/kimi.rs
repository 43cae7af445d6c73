//! A tiny `kimi-linear` model (Kimi Linear: KDA linear-attention layers interleaved with NoPE
//! MLA layers, MoE FFN) with the keys and tensors llama.cpp's loader expects
//! (`src/models/kimi-linear.cpp`, `conversion/kimi_linear.py`), every matrix F32:
//!
//! | | |
//! | --- | --- |
//! | layers | 4: KDA, KDA, MLA, KDA (`attention.head_count_kv` = [0, 0, 1, 0]) |
//! | sizes | n_embd 128, 2 heads; KDA heads of 32 (d_inner 64), short conv of 4 |
//! | MLA | no query LoRA, latent 32, 16 rope dims (sized, never rotated), heads of 32 + 16 key and 32 value dims |
//! | FFN | layer 0 dense (256); then 4 experts of 64, 2 used, sigmoid routing with `exp_probs_b`, scale 2.446, one shared expert |
//! | vocabulary | the 288-token SentencePiece byte vocabulary of the other synthetic models |
//!
//! Values come from a seeded generator through exact arithmetic only, like the other
//! synthetic models, so the file's bytes do not depend on the platform.

use ferrox_gguf::{GgmlType, GgufWriter, OwnedArray, OwnedValue};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

use super::{add, matrix, vector, vocab, Values, BOS_ID};

/// The Kimi models, by name (each is its own architecture).
pub const KIMI_MODELS: &[&str] = &["kimi-linear"];

const N_EMBD: usize = 128;
const N_HEAD: usize = 2;
const KDA_HEAD: usize = 32;
const D_CONV: usize = 4;
const LAYER_KV_HEADS: [u32; 4] = [0, 0, 1, 0];
const KV_LORA: usize = 32;
const ROPE: usize = 16;
const NOPE: usize = 32;
const V_HEAD: usize = 32;
const N_FF: usize = 256;
const N_EXPERT: usize = 4;
const N_USED: usize = 2;
const N_FF_EXP: usize = 64;
const N_SHARED: usize = 1;
const N_VOCAB: usize = 288;
const SEED: u64 = 0x011a_0030;

/// The `kimi-linear` file.
pub fn kimi_linear_gguf_bytes() -> Vec<u8> {
    let a = "kimi-linear";
    let key = |k: &str| format!("{a}.{k}");
    let mut w = GgufWriter::new();
    let n_layer = LAYER_KV_HEADS.len();
    w.set("general.architecture", a);
    w.set("general.name", "ferrox synthetic test model");
    w.set(key("context_length"), 2048u32);
    w.set(key("embedding_length"), N_EMBD as u32);
    w.set(key("block_count"), n_layer as u32);
    w.set(key("feed_forward_length"), N_FF as u32);
    w.set(key("attention.head_count"), N_HEAD as u32);
    w.set(
        key("attention.head_count_kv"),
        OwnedValue::Array(OwnedArray::U32(LAYER_KV_HEADS.to_vec())),
    );
    w.set(key("attention.layer_norm_rms_epsilon"), 1e-6f32);
    w.set(key("attention.kv_lora_rank"), KV_LORA as u32);
    w.set(key("attention.key_length"), (KV_LORA + ROPE) as u32);
    w.set(key("attention.key_length_mla"), (NOPE + ROPE) as u32);
    w.set(key("attention.value_length_mla"), V_HEAD as u32);
    w.set(key("rope.dimension_count"), ROPE as u32);
    w.set(key("ssm.conv_kernel"), D_CONV as u32);
    w.set(key("kda.head_dim"), KDA_HEAD as u32);
    w.set(key("expert_count"), N_EXPERT as u32);
    w.set(key("expert_used_count"), N_USED as u32);
    w.set(key("expert_feed_forward_length"), N_FF_EXP as u32);
    w.set(key("expert_shared_count"), N_SHARED as u32);
    w.set(key("leading_dense_block_count"), 1u32);
    w.set(key("expert_weights_scale"), 2.446f32);
    w.set(key("expert_weights_norm"), true);
    w.set(key("expert_gating_func"), 2u32);
    w.set(key("vocab_size"), N_VOCAB as u32);
    vocab(&mut w, N_VOCAB);

    let mut vals = Values(StdRng::seed_from_u64(SEED));
    let v = &mut vals;
    let f32_ = GgmlType::F32;
    let d_inner = N_HEAD * KDA_HEAD;
    matrix(&mut w, v, "token_embd.weight", f32_, N_EMBD, N_VOCAB, 0.08);
    vector(&mut w, v, "output_norm.weight", N_EMBD, 1.0, 0.1);
    matrix(&mut w, v, "output.weight", f32_, N_EMBD, N_VOCAB, 0.1);
    for (il, &kv_heads) in LAYER_KV_HEADS.iter().enumerate() {
        let n = |t: &str| format!("blk.{il}.{t}");
        vector(&mut w, v, &n("attn_norm.weight"), N_EMBD, 1.0, 0.1);
        if kv_heads == 0 {
            for t in ["attn_q", "attn_k", "attn_v"] {
                matrix(
                    &mut w,
                    v,
                    &n(&format!("{t}.weight")),
                    f32_,
                    N_EMBD,
                    d_inner,
                    0.08,
                );
            }
            for t in ["ssm_conv1d_q", "ssm_conv1d_k", "ssm_conv1d_v"] {
                let data = v.normals(D_CONV * d_inner, 0.0, 0.3);
                let shape = [D_CONV as u64, 1, d_inner as u64];
                add(&mut w, &n(&format!("{t}.weight")), f32_, &shape, &data);
            }
            matrix(
                &mut w,
                v,
                &n("ssm_f_a.weight"),
                f32_,
                N_EMBD,
                KDA_HEAD,
                0.08,
            );
            matrix(
                &mut w,
                v,
                &n("ssm_f_b.weight"),
                f32_,
                KDA_HEAD,
                d_inner,
                0.1,
            );
            matrix(&mut w, v, &n("ssm_beta.weight"), f32_, N_EMBD, N_HEAD, 0.1);
            // -exp(A_log), as the converter stores it: negative decay rates.
            let a_neg: Vec<f32> = (0..N_HEAD).map(|_| -(0.25 + v.uniform())).collect();
            add(&mut w, &n("ssm_a"), f32_, &[1, N_HEAD as u64], &a_neg);
            vector(&mut w, v, &n("ssm_dt.bias"), d_inner, 0.0, 0.5);
            matrix(
                &mut w,
                v,
                &n("ssm_g_a.weight"),
                f32_,
                N_EMBD,
                KDA_HEAD,
                0.08,
            );
            matrix(
                &mut w,
                v,
                &n("ssm_g_b.weight"),
                f32_,
                KDA_HEAD,
                d_inner,
                0.1,
            );
            vector(&mut w, v, &n("ssm_norm.weight"), KDA_HEAD, 1.0, 0.1);
            matrix(
                &mut w,
                v,
                &n("attn_output.weight"),
                f32_,
                d_inner,
                N_EMBD,
                0.06,
            );
        } else {
            let dk = NOPE + ROPE;
            matrix(
                &mut w,
                v,
                &n("attn_q.weight"),
                f32_,
                N_EMBD,
                N_HEAD * dk,
                0.08,
            );
            let kv_a = n("attn_kv_a_mqa.weight");
            matrix(&mut w, v, &kv_a, f32_, N_EMBD, KV_LORA + ROPE, 0.08);
            vector(&mut w, v, &n("attn_kv_a_norm.weight"), KV_LORA, 1.0, 0.1);
            let data = v.normals(NOPE * KV_LORA * N_HEAD, 0.0, 0.1);
            let shape = [NOPE as u64, KV_LORA as u64, N_HEAD as u64];
            add(&mut w, &n("attn_k_b.weight"), f32_, &shape, &data);
            let data = v.normals(KV_LORA * V_HEAD * N_HEAD, 0.0, 0.1);
            let shape = [KV_LORA as u64, V_HEAD as u64, N_HEAD as u64];
            add(&mut w, &n("attn_v_b.weight"), f32_, &shape, &data);
            let wo = n("attn_output.weight");
            matrix(&mut w, v, &wo, f32_, N_HEAD * V_HEAD, N_EMBD, 0.06);
        }
        vector(&mut w, v, &n("ffn_norm.weight"), N_EMBD, 1.0, 0.1);
        if il == 0 {
            matrix(&mut w, v, &n("ffn_gate.weight"), f32_, N_EMBD, N_FF, 0.08);
            matrix(&mut w, v, &n("ffn_up.weight"), f32_, N_EMBD, N_FF, 0.08);
            matrix(&mut w, v, &n("ffn_down.weight"), f32_, N_FF, N_EMBD, 0.06);
        } else {
            matrix(
                &mut w,
                v,
                &n("ffn_gate_inp.weight"),
                f32_,
                N_EMBD,
                N_EXPERT,
                0.1,
            );
            vector(&mut w, v, &n("exp_probs_b.bias"), N_EXPERT, 0.0, 0.05);
            let (e, f, x) = (N_EMBD as u64, N_FF_EXP as u64, N_EXPERT as u64);
            for (t, shape, std) in [
                ("ffn_gate_exps", [e, f, x], 0.08),
                ("ffn_up_exps", [e, f, x], 0.08),
                ("ffn_down_exps", [f, e, x], 0.06),
            ] {
                let data = v.normals((e * f * x) as usize, 0.0, std);
                add(&mut w, &n(&format!("{t}.weight")), f32_, &shape, &data);
            }
            let n_sh = N_FF_EXP * N_SHARED;
            matrix(
                &mut w,
                v,
                &n("ffn_gate_shexp.weight"),
                f32_,
                N_EMBD,
                n_sh,
                0.08,
            );
            matrix(
                &mut w,
                v,
                &n("ffn_up_shexp.weight"),
                f32_,
                N_EMBD,
                n_sh,
                0.08,
            );
            matrix(
                &mut w,
                v,
                &n("ffn_down_shexp.weight"),
                f32_,
                n_sh,
                N_EMBD,
                0.06,
            );
        }
    }
    w.to_bytes()
}

/// `n` tokens of the model's reference sequence (BOS, then ids drawn from the regular
/// tokens).
pub fn token_ids(n: usize) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(SEED ^ 0x0070_15e4_5eed);
    let mut ids = vec![BOS_ID];
    ids.extend((1..n).map(|_| 3 + rng.next_u32() % (N_VOCAB as u32 - 3)));
    ids
}
