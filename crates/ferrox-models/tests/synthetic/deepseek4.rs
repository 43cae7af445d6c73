//! A tiny all-F32 DeepSeek-V4 model (`deepseek4`), for sweeping every context length
//! against llama.cpp (F32 weights and an f32 cache on both sides, so only summation order
//! differs).
//!
//! n_embd 64 in 4 hyper-connection streams (3 Sinkhorn iterations), 4 query heads of 64 (the
//! last 16 dims rotated) over one shared key-value head, query LoRA 32, a sliding window of
//! 32, the output projected in 2 groups through a rank of 16; 4 experts of 32 (2 used,
//! sqrt-softplus gating, normalised weights scaled by 1.5, SwiGLU clamped at 0.4, the shared
//! expert at 0.6) and one shared expert; YaRN (factor 4 over an original context of 64) on the
//! compressed layers. Layers by compression ratio:
//!
//! | layer | ratio | attention | routing |
//! | --- | --- | --- | --- |
//! | 0 | 4 | window + the indexer's top 8 of the 4x compressed rows (indexer: 2 heads of 128) | hashed by token id (`tid2eid`) |
//! | 1 | 0 | window only | top-k with `exp_probs_b` |
//! | 2 | 128 | window + every 128x compressed row (the first fills at position 127) | top-k |
//! | 3 | 4 | as layer 0 | top-k |
//!
//! `key_length` (64) differs from `indexer.key_length` (128), as llama.cpp requires.

use super::*;

/// The model's name (its architecture).
pub const NAME: &str = "deepseek4";

/// Its shapes.
pub const N_EMBD: usize = 64;
pub const N_HEAD: usize = 4;
pub const HEAD_DIM: usize = 64;
pub const N_ROT: usize = 16;
pub const Q_LORA: usize = 32;
pub const WINDOW: usize = 32;
pub const O_GROUPS: usize = 2;
pub const O_LORA: usize = 16;
pub const HC: usize = 4;
pub const INDEXER_HEADS: usize = 2;
pub const INDEXER_DIM: usize = 128;
pub const TOP_K: usize = 8;
pub const RATIOS: [u32; 4] = [4, 0, 128, 4];
pub const HASH_LAYERS: usize = 1;
pub const N_EXPERT: usize = 4;
pub const N_USED: usize = 2;
pub const N_FF_EXP: usize = 32;
pub const N_VOCAB: usize = 288;
const SEED: u64 = 0x011a_0040;

/// The experts token `t` is routed to in the hash-routed layers: two distinct ones.
pub fn hashed_experts(t: usize) -> [u32; 2] {
    let first = (t * 7 + 3) % N_EXPERT;
    let second = (first + 1 + (t / 3) % (N_EXPERT - 1)) % N_EXPERT;
    [first as u32, second as u32]
}

/// The GGUF file.
pub fn gguf_bytes() -> Vec<u8> {
    let a = NAME;
    let n_layer = RATIOS.len();
    let mut w = GgufWriter::new();
    let key = |k: &str| format!("{a}.{k}");
    w.set("general.architecture", a);
    w.set("general.name", "ferrox synthetic test model");
    w.set(key("context_length"), 2048u32);
    w.set(key("embedding_length"), N_EMBD as u32);
    w.set(key("block_count"), n_layer as u32);
    w.set(key("attention.head_count"), N_HEAD as u32);
    w.set(key("attention.head_count_kv"), 1u32);
    w.set(key("attention.key_length"), HEAD_DIM as u32);
    w.set(key("attention.value_length"), HEAD_DIM as u32);
    w.set(key("attention.layer_norm_rms_epsilon"), 1e-6f32);
    w.set(key("rope.dimension_count"), N_ROT as u32);
    w.set(key("rope.freq_base"), 10000.0f32);
    w.set(key("rope.scaling.type"), "yarn");
    w.set(key("rope.scaling.factor"), 4.0f32);
    w.set(key("rope.scaling.original_context_length"), 64u32);
    w.set(key("attention.q_lora_rank"), Q_LORA as u32);
    w.set(key("attention.sliding_window"), WINDOW as u32);
    w.set(key("expert_feed_forward_length"), N_FF_EXP as u32);
    w.set(key("expert_shared_count"), 1u32);
    w.set(key("expert_count"), N_EXPERT as u32);
    w.set(key("expert_used_count"), N_USED as u32);
    w.set(key("expert_weights_scale"), 1.5f32);
    w.set(key("expert_weights_norm"), true);
    w.set(key("expert_gating_func"), 4u32);
    w.set(key("swiglu_clamp_exp"), 0.4f32);
    w.set(key("swiglu_clamp_shexp"), 0.6f32);
    w.set(key("attention.indexer.head_count"), INDEXER_HEADS as u32);
    w.set(key("attention.indexer.key_length"), INDEXER_DIM as u32);
    w.set(key("attention.indexer.top_k"), TOP_K as u32);
    w.set(key("attention.output_group_count"), O_GROUPS as u32);
    w.set(key("attention.output_lora_rank"), O_LORA as u32);
    w.set(key("attention.compress_rope_freq_base"), 160000.0f32);
    w.set(key("attention.compress_ratios"), RATIOS.to_vec());
    w.set(key("hyper_connection.count"), HC as u32);
    w.set(key("hyper_connection.sinkhorn_iterations"), 3u32);
    w.set(key("hyper_connection.epsilon"), 1e-6f32);
    w.set(key("hash_layer_count"), HASH_LAYERS as u32);
    vocab(&mut w, N_VOCAB);

    let mut v = Values(StdRng::seed_from_u64(SEED));
    let f32 = GgmlType::F32;
    let (e, d, hc_dim, mix) = (N_EMBD, HEAD_DIM, HC * N_EMBD, (2 + HC) * HC);
    matrix(&mut w, &mut v, "token_embd.weight", f32, e, N_VOCAB, 1.0);
    vector(&mut w, &mut v, "output_norm.weight", e, 1.0, 0.1);
    matrix(&mut w, &mut v, "output.weight", f32, e, N_VOCAB, 0.15);
    matrix(&mut w, &mut v, "output_hc_fn.weight", f32, hc_dim, HC, 0.1);
    vector(&mut w, &mut v, "output_hc_base.weight", HC, 0.0, 0.5);
    vector(&mut w, &mut v, "output_hc_scale.weight", 1, 0.5, 0.1);
    for (il, &ratio) in RATIOS.iter().enumerate() {
        let n = |t: &str| format!("blk.{il}.{t}");
        let (w, v) = (&mut w, &mut v);
        vector(w, v, &n("attn_norm.weight"), e, 1.0, 0.1);
        vector(w, v, &n("attn_sinks.weight"), N_HEAD, 0.0, 0.5);
        matrix(w, v, &n("attn_q_a.weight"), f32, e, Q_LORA, 0.15);
        vector(w, v, &n("attn_q_a_norm.weight"), Q_LORA, 1.0, 0.1);
        matrix(w, v, &n("attn_q_b.weight"), f32, Q_LORA, N_HEAD * d, 0.2);
        matrix(w, v, &n("attn_kv.weight"), f32, e, d, 0.15);
        vector(w, v, &n("attn_kv_a_norm.weight"), d, 1.0, 0.1);
        // Stored as llama.cpp's converter writes it: {H·D/G, R·G}.
        let group_dim = N_HEAD * d / O_GROUPS;
        matrix(
            w,
            v,
            &n("attn_output_a.weight"),
            f32,
            group_dim,
            O_LORA * O_GROUPS,
            0.08,
        );
        matrix(
            w,
            v,
            &n("attn_output_b.weight"),
            f32,
            O_GROUPS * O_LORA,
            e,
            0.2,
        );
        for part in ["attn", "ffn"] {
            matrix(
                w,
                v,
                &n(&format!("hc_{part}_fn.weight")),
                f32,
                hc_dim,
                mix,
                0.1,
            );
            vector(w, v, &n(&format!("hc_{part}_base.weight")), mix, 0.0, 0.5);
            vector(w, v, &n(&format!("hc_{part}_scale.weight")), 3, 0.5, 0.2);
        }
        if ratio != 0 {
            let coff = if ratio == 4 { 2 } else { 1 };
            matrix(
                w,
                v,
                &n("attn_compressor_kv.weight"),
                f32,
                e,
                coff * d,
                0.15,
            );
            matrix(
                w,
                v,
                &n("attn_compressor_gate.weight"),
                f32,
                e,
                coff * d,
                0.15,
            );
            matrix(
                w,
                v,
                &n("attn_compressor_ape.weight"),
                f32,
                coff * d,
                ratio as usize,
                0.5,
            );
            vector(w, v, &n("attn_compressor_norm.weight"), d, 1.0, 0.1);
        }
        if ratio == 4 {
            let (hi, di) = (INDEXER_HEADS, INDEXER_DIM);
            matrix(w, v, &n("indexer.proj.weight"), f32, e, hi, 0.2);
            matrix(
                w,
                v,
                &n("indexer.attn_q_b.weight"),
                f32,
                Q_LORA,
                hi * di,
                0.2,
            );
            matrix(
                w,
                v,
                &n("indexer_compressor_kv.weight"),
                f32,
                e,
                2 * di,
                0.15,
            );
            matrix(
                w,
                v,
                &n("indexer_compressor_gate.weight"),
                f32,
                e,
                2 * di,
                0.15,
            );
            matrix(
                w,
                v,
                &n("indexer_compressor_ape.weight"),
                f32,
                2 * di,
                4,
                0.5,
            );
            vector(w, v, &n("indexer_compressor_norm.weight"), di, 1.0, 0.1);
        }
        matrix(w, v, &n("ffn_gate_inp.weight"), f32, e, N_EXPERT, 0.3);
        if il < HASH_LAYERS {
            let ids: Vec<u8> = (0..N_VOCAB)
                .flat_map(hashed_experts)
                .flat_map(|x| (x as i32).to_le_bytes())
                .collect();
            w.add_tensor(
                n("ffn_gate_tid2eid.weight"),
                GgmlType::I32,
                &[N_USED as u64, N_VOCAB as u64],
                ids,
            )
            .expect("tid2eid");
        } else {
            vector(w, v, &n("exp_probs_b.bias"), N_EXPERT, 0.0, 0.2);
        }
        vector(w, v, &n("ffn_norm.weight"), e, 1.0, 0.1);
        let (x, f) = (N_EXPERT as u64, N_FF_EXP as u64);
        let mut stacked = |name: &str, shape: [u64; 3], std: f32| {
            let data = v.normals((shape[0] * shape[1] * shape[2]) as usize, 0.0, std);
            add(w, &n(name), f32, &shape, &data);
        };
        stacked("ffn_gate_exps.weight", [e as u64, f, x], 0.15);
        stacked("ffn_up_exps.weight", [e as u64, f, x], 0.15);
        stacked("ffn_down_exps.weight", [f, e as u64, x], 0.2);
        matrix(w, v, &n("ffn_gate_shexp.weight"), f32, e, N_FF_EXP, 0.15);
        matrix(w, v, &n("ffn_up_shexp.weight"), f32, e, N_FF_EXP, 0.15);
        matrix(w, v, &n("ffn_down_shexp.weight"), f32, N_FF_EXP, e, 0.2);
    }
    w.to_bytes()
}

/// The first `n` tokens of the model's reference sequence: BOS, then ids drawn from the
/// non-special tokens.
pub fn token_ids(n: usize) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(SEED ^ 0x0070_15e4_5eed);
    let n_regular = (N_VOCAB - 3) as u32;
    let mut ids = vec![BOS_ID];
    ids.extend((1..n).map(|_| 3 + rng.next_u32() % n_regular));
    ids
}
