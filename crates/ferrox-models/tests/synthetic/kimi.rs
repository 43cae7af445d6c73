//! Tiny Kimi models with the keys and tensors llama.cpp's loader expects, every matrix F32:
//! `kimi-linear` (Kimi Linear: KDA linear-attention layers interleaved with NoPE MLA layers,
//! MoE FFN; `src/models/kimi-linear.cpp`, `conversion/kimi_linear.py`) and two `kimi-k3`
//! files (`src/models/kimi-k3.cpp`, `conversion/kimi_k3.py`).
//!
//! | | |
//! | --- | --- |
//! | sizes | n_embd 128, 2 heads; KDA heads of 32 (d_inner 64), short conv of 4 |
//! | MLA | latent 32, 16 rope dims (sized, never rotated), heads of 32 + 16 key and 32 value dims |
//! | FFN | layer 0 dense (256); then 4 experts of 64, 2 used, sigmoid routing with `exp_probs_b`, scale 2.446, one shared expert |
//! | vocabulary | the 288-token SentencePiece byte vocabulary of the other synthetic models |
//!
//! | model | layers (`head_count_kv`) | what it exercises |
//! | --- | --- | --- |
//! | kimi-linear | KDA, KDA, MLA, KDA | low-rank KDA output gate, no query LoRA |
//! | kimi-k3 | KDA, KDA, MLA, KDA, MLA | residual attention in blocks of 2, SiTU (β 1.5, λ 0.75), KDA decay lower bound −5 (`dt_bias` around −3, so most decays stay well above it), full-rank KDA gate, query LoRA (rank 32), MLA output gate, experts in a latent space of 64 with `ffn_routed_norm`, normalised expert weights |
//! | kimi-k3-plain | KDA, MLA, KDA, KDA, MLA | residual attention in blocks of 3, SiTU (β 2, λ 0: the up branch as is), the softplus decay, no query LoRA, no MLA gate, full-width experts, unnormalised weights |
//!
//! [`bench_gguf`] writes a `kimi-linear` file of Kimi-Linear-48B-A3B's per-layer shapes in
//! Q8_0, for speed measurements only.
//!
//! Values come from a seeded generator through exact arithmetic only, like the other
//! synthetic models, so the file's bytes do not depend on the platform.

use ferrox_gguf::{GgmlType, GgufWriter, OwnedArray, OwnedValue};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

use super::{add, matrix, vector, vocab, Values, BOS_ID};

/// The Kimi models, by name (`kimi-linear` is its own architecture, the others `kimi-k3`).
pub const KIMI_MODELS: &[&str] = &["kimi-linear", "kimi-k3", "kimi-k3-plain"];

/// The `kimi-k3` models.
pub const K3_MODELS: &[&str] = &["kimi-k3", "kimi-k3-plain"];

/// The sizes of a Kimi file and the type of its matrices.
struct Dims {
    n_embd: usize,
    n_head: usize,
    kda_head: usize,
    d_conv: usize,
    kv_lora: usize,
    rope: usize,
    nope: usize,
    v_head: usize,
    n_ff: usize,
    n_expert: usize,
    n_used: usize,
    n_ff_exp: usize,
    n_shared: usize,
    n_vocab: usize,
    n_ctx: u32,
    /// The type of every matrix but the routers (F32 always).
    ty: GgmlType,
}

/// The parity models' sizes (the module docs' table).
const TINY: Dims = Dims {
    n_embd: 128,
    n_head: 2,
    kda_head: 32,
    d_conv: 4,
    kv_lora: 32,
    rope: 16,
    nope: 32,
    v_head: 32,
    n_ff: 256,
    n_expert: 4,
    n_used: 2,
    n_ff_exp: 64,
    n_shared: 1,
    n_vocab: 288,
    n_ctx: 2048,
    ty: GgmlType::F32,
};

/// Kimi-Linear-48B-A3B's per-layer attention shapes (hidden 2304, 32 heads; KDA heads of
/// 128 with a short convolution of 4; MLA latent 512, 64 rope dims, heads of 128 + 64 key
/// and 128 value dims) over a small MoE, so that attention dominates a token's cost.
const BENCH: Dims = Dims {
    n_embd: 2304,
    n_head: 32,
    kda_head: 128,
    d_conv: 4,
    kv_lora: 512,
    rope: 64,
    nope: 128,
    v_head: 128,
    n_ff: 2048,
    n_expert: 8,
    n_used: 2,
    n_ff_exp: 256,
    n_shared: 1,
    n_vocab: 288,
    n_ctx: 65536,
    ty: GgmlType::Q8_0,
};

const SEED: u64 = 0x011a_0030;
const DT_MEAN_LOWER_BOUND: f32 = -3.0;

/// One Kimi model.
struct Spec {
    arch: &'static str,
    /// Per layer: 0 for KDA, 1 for MLA.
    kv_heads: &'static [u32],
    seed: u64,
    k3: Option<K3Spec>,
}

/// What a `kimi-k3` file adds.
struct K3Spec {
    res_block: u32,
    situ_beta: f32,
    situ_linear_beta: f32,
    gate_lower_bound: Option<f32>,
    q_lora: Option<usize>,
    attn_gate: bool,
    /// The experts' latent width, with `ffn_routed_norm` when true.
    latent: Option<(usize, bool)>,
    weights_norm: bool,
}

/// Model `name`'s spec (a `-blocks` model's is its base model's).
fn spec(name: &str) -> Spec {
    match name.strip_suffix("-blocks").unwrap_or(name) {
        "kimi-linear" => Spec {
            arch: "kimi-linear",
            kv_heads: &[0, 0, 1, 0],
            seed: SEED,
            k3: None,
        },
        "kimi-k3" => Spec {
            arch: "kimi-k3",
            kv_heads: &[0, 0, 1, 0, 1],
            seed: SEED ^ 0x0003,
            k3: Some(K3Spec {
                res_block: 2,
                situ_beta: 1.5,
                situ_linear_beta: 0.75,
                gate_lower_bound: Some(-5.0),
                q_lora: Some(32),
                attn_gate: true,
                latent: Some((64, true)),
                weights_norm: true,
            }),
        },
        "kimi-k3-plain" => Spec {
            arch: "kimi-k3",
            kv_heads: &[0, 1, 0, 0, 1],
            seed: SEED ^ 0x0033,
            k3: Some(K3Spec {
                res_block: 3,
                situ_beta: 2.0,
                situ_linear_beta: 0.0,
                gate_lower_bound: None,
                q_lora: None,
                attn_gate: false,
                latent: None,
                weights_norm: false,
            }),
        },
        _ => panic!("no Kimi model named {name}"),
    }
}

/// `kimi-linear` and `kimi-k3` with 32 rope dims, so a latent row (32 + 32) is whole
/// blocks of a quantized cache type (the others' rows of 48 are not).
pub const BLOCK_MODELS: &[&str] = &["kimi-linear-blocks", "kimi-k3-blocks"];

/// The `kimi-linear` file.
pub fn kimi_linear_gguf_bytes() -> Vec<u8> {
    gguf_bytes("kimi-linear")
}

/// The file of the Kimi model `name` (one of [`KIMI_MODELS`] or [`BLOCK_MODELS`]).
pub fn gguf_bytes(name: &str) -> Vec<u8> {
    match name.ends_with("-blocks") {
        true => write(&spec(name), &Dims { rope: 32, ..TINY }),
        false => write(&spec(name), &TINY),
    }
}

/// A `kimi-linear` file of Kimi-Linear-48B-A3B's attention shapes on a small trunk, for
/// speed measurements, not for parity: 4 layers in the model's 3:1 ratio (KDA, KDA, KDA,
/// MLA; layer 0 dense with n_ff 2048), n_embd 2304, 32 heads (KDA heads of 128, short
/// convolution of 4; NoPE MLA with latent 512, 64 rope dims, heads of 128 + 64 key and 128
/// value dims), 8 experts of 256 (2 used) with one shared expert; Q8_0 matrices, F32
/// routers.
pub fn bench_gguf() -> Vec<u8> {
    let spec = Spec {
        arch: "kimi-linear",
        kv_heads: &[0, 0, 0, 1],
        seed: SEED ^ 0x0100,
        k3: None,
    };
    write(&spec, &BENCH)
}

fn write(s: &Spec, d: &Dims) -> Vec<u8> {
    let a = s.arch;
    let key = |k: &str| format!("{a}.{k}");
    let mut w = GgufWriter::new();
    let n_layer = s.kv_heads.len();
    w.set("general.architecture", a);
    w.set("general.name", "ferrox synthetic test model");
    w.set(key("context_length"), d.n_ctx);
    w.set(key("embedding_length"), d.n_embd as u32);
    w.set(key("block_count"), n_layer as u32);
    w.set(key("feed_forward_length"), d.n_ff as u32);
    w.set(key("attention.head_count"), d.n_head as u32);
    w.set(
        key("attention.head_count_kv"),
        OwnedValue::Array(OwnedArray::U32(s.kv_heads.to_vec())),
    );
    w.set(key("attention.layer_norm_rms_epsilon"), 1e-6f32);
    w.set(key("attention.kv_lora_rank"), d.kv_lora as u32);
    w.set(key("attention.key_length"), (d.kv_lora + d.rope) as u32);
    w.set(key("attention.key_length_mla"), (d.nope + d.rope) as u32);
    w.set(key("attention.value_length_mla"), d.v_head as u32);
    w.set(key("rope.dimension_count"), d.rope as u32);
    w.set(key("ssm.conv_kernel"), d.d_conv as u32);
    w.set(key("kda.head_dim"), d.kda_head as u32);
    w.set(key("expert_count"), d.n_expert as u32);
    w.set(key("expert_used_count"), d.n_used as u32);
    w.set(key("expert_feed_forward_length"), d.n_ff_exp as u32);
    w.set(key("expert_shared_count"), d.n_shared as u32);
    w.set(key("leading_dense_block_count"), 1u32);
    w.set(key("expert_weights_scale"), 2.446f32);
    w.set(
        key("expert_weights_norm"),
        s.k3.as_ref().is_none_or(|k| k.weights_norm),
    );
    w.set(key("expert_gating_func"), 2u32);
    w.set(key("vocab_size"), d.n_vocab as u32);
    if let Some(k3) = &s.k3 {
        w.set(key("attention.value_length"), d.kv_lora as u32);
        w.set(key("attn_res.block_size"), k3.res_block);
        w.set(key("activation.situ_beta"), k3.situ_beta);
        w.set(key("activation.situ_linear_beta"), k3.situ_linear_beta);
        if let Some(lb) = k3.gate_lower_bound {
            w.set(key("kda.gate_lower_bound"), lb);
        }
        if let Some(rank) = k3.q_lora {
            w.set(key("attention.q_lora_rank"), rank as u32);
        }
        if let Some((latent, _)) = k3.latent {
            w.set(key("expert_latent_length"), latent as u32);
        }
    }
    vocab(&mut w, d.n_vocab);

    let mut vals = Values(StdRng::seed_from_u64(s.seed));
    let v = &mut vals;
    let ty = d.ty;
    matrix(
        &mut w,
        v,
        "token_embd.weight",
        ty,
        d.n_embd,
        d.n_vocab,
        0.08,
    );
    vector(&mut w, v, "output_norm.weight", d.n_embd, 1.0, 0.1);
    matrix(&mut w, v, "output.weight", ty, d.n_embd, d.n_vocab, 0.1);
    let residual = s.k3.as_ref().is_some_and(|k| k.res_block > 0);
    if residual {
        vector(&mut w, v, "output_res_score.weight", d.n_embd, 0.0, 0.1);
    }
    for (il, &kv_heads) in s.kv_heads.iter().enumerate() {
        let n = |t: &str| format!("blk.{il}.{t}");
        vector(&mut w, v, &n("attn_norm.weight"), d.n_embd, 1.0, 0.1);
        if residual {
            vector(&mut w, v, &n("attn_res_score.weight"), d.n_embd, 0.0, 0.1);
            vector(&mut w, v, &n("ffn_res_score.weight"), d.n_embd, 0.0, 0.1);
        }
        if kv_heads == 0 {
            kda_layer(&mut w, v, d, il, s.k3.as_ref());
        } else {
            mla_layer(&mut w, v, d, il, s.k3.as_ref());
        }
        vector(&mut w, v, &n("ffn_norm.weight"), d.n_embd, 1.0, 0.1);
        if il == 0 {
            matrix(&mut w, v, &n("ffn_gate.weight"), ty, d.n_embd, d.n_ff, 0.08);
            matrix(&mut w, v, &n("ffn_up.weight"), ty, d.n_embd, d.n_ff, 0.08);
            matrix(&mut w, v, &n("ffn_down.weight"), ty, d.n_ff, d.n_embd, 0.06);
        } else {
            let latent = s.k3.as_ref().and_then(|k| k.latent);
            moe_layer(&mut w, v, d, il, latent);
        }
    }
    w.to_bytes()
}

/// A KDA layer: Kimi Linear's low-rank output gate, or Kimi-K3's full-rank one (and its
/// 1-D `ssm_a`).
fn kda_layer(w: &mut GgufWriter, v: &mut Values, d: &Dims, il: usize, k3_spec: Option<&K3Spec>) {
    let k3 = k3_spec.is_some();
    let n = |t: &str| format!("blk.{il}.{t}");
    let (f32_, ty) = (GgmlType::F32, d.ty);
    let d_inner = d.n_head * d.kda_head;
    for t in ["attn_q", "attn_k", "attn_v"] {
        let name = n(&format!("{t}.weight"));
        matrix(w, v, &name, ty, d.n_embd, d_inner, 0.08);
    }
    for t in ["ssm_conv1d_q", "ssm_conv1d_k", "ssm_conv1d_v"] {
        let data = v.normals(d.d_conv * d_inner, 0.0, 0.3);
        let shape = [d.d_conv as u64, 1, d_inner as u64];
        add(w, &n(&format!("{t}.weight")), f32_, &shape, &data);
    }
    matrix(w, v, &n("ssm_f_a.weight"), ty, d.n_embd, d.kda_head, 0.08);
    matrix(w, v, &n("ssm_f_b.weight"), ty, d.kda_head, d_inner, 0.1);
    matrix(w, v, &n("ssm_beta.weight"), ty, d.n_embd, d.n_head, 0.1);
    // -exp(A_log), as the converter stores it: negative decay rates.
    let a_neg: Vec<f32> = (0..d.n_head).map(|_| -(0.25 + v.uniform())).collect();
    let a_shape: &[u64] = if k3 {
        &[d.n_head as u64]
    } else {
        &[1, d.n_head as u64]
    };
    add(w, &n("ssm_a"), f32_, a_shape, &a_neg);
    // With the lower bound, a bias that keeps most decays well above it (a longer memory).
    let dt_mean = match k3_spec.and_then(|k| k.gate_lower_bound) {
        Some(_) => DT_MEAN_LOWER_BOUND,
        None => 0.0,
    };
    vector(w, v, &n("ssm_dt.bias"), d_inner, dt_mean, 0.5);
    if k3 {
        matrix(w, v, &n("ssm_g.weight"), ty, d.n_embd, d_inner, 0.1);
    } else {
        matrix(w, v, &n("ssm_g_a.weight"), ty, d.n_embd, d.kda_head, 0.08);
        matrix(w, v, &n("ssm_g_b.weight"), ty, d.kda_head, d_inner, 0.1);
    }
    vector(w, v, &n("ssm_norm.weight"), d.kda_head, 1.0, 0.1);
    let wo = n("attn_output.weight");
    matrix(w, v, &wo, ty, d_inner, d.n_embd, 0.06);
}

/// A NoPE MLA layer, with Kimi-K3's optional query LoRA and output gate.
fn mla_layer(w: &mut GgufWriter, v: &mut Values, d: &Dims, il: usize, k3: Option<&K3Spec>) {
    let n = |t: &str| format!("blk.{il}.{t}");
    let ty = d.ty;
    let dk = d.nope + d.rope;
    match k3.and_then(|k| k.q_lora) {
        Some(rank) => {
            matrix(w, v, &n("attn_q_a.weight"), ty, d.n_embd, rank, 0.08);
            vector(w, v, &n("attn_q_a_norm.weight"), rank, 1.0, 0.1);
            matrix(w, v, &n("attn_q_b.weight"), ty, rank, d.n_head * dk, 0.1);
        }
        None => matrix(w, v, &n("attn_q.weight"), ty, d.n_embd, d.n_head * dk, 0.08),
    }
    let kv_a = n("attn_kv_a_mqa.weight");
    matrix(w, v, &kv_a, ty, d.n_embd, d.kv_lora + d.rope, 0.08);
    vector(w, v, &n("attn_kv_a_norm.weight"), d.kv_lora, 1.0, 0.1);
    let data = v.normals(d.nope * d.kv_lora * d.n_head, 0.0, 0.1);
    let shape = [d.nope as u64, d.kv_lora as u64, d.n_head as u64];
    add(w, &n("attn_k_b.weight"), ty, &shape, &data);
    let data = v.normals(d.kv_lora * d.v_head * d.n_head, 0.0, 0.1);
    let shape = [d.kv_lora as u64, d.v_head as u64, d.n_head as u64];
    add(w, &n("attn_v_b.weight"), ty, &shape, &data);
    if k3.is_some_and(|k| k.attn_gate) {
        let gate = n("attn_gate.weight");
        matrix(w, v, &gate, ty, d.n_embd, d.n_head * d.v_head, 0.1);
    }
    let wo = n("attn_output.weight");
    matrix(w, v, &wo, ty, d.n_head * d.v_head, d.n_embd, 0.06);
}

/// Routed experts (of `latent` inputs and outputs, with their projections, if set) and the
/// shared expert.
fn moe_layer(
    w: &mut GgufWriter,
    v: &mut Values,
    d: &Dims,
    il: usize,
    latent: Option<(usize, bool)>,
) {
    let n = |t: &str| format!("blk.{il}.{t}");
    let (f32_, ty) = (GgmlType::F32, d.ty);
    let gate_inp = n("ffn_gate_inp.weight");
    matrix(w, v, &gate_inp, f32_, d.n_embd, d.n_expert, 0.1);
    vector(w, v, &n("exp_probs_b.bias"), d.n_expert, 0.0, 0.05);
    let width = latent.map_or(d.n_embd, |(l, _)| l);
    let (e, f, x) = (width as u64, d.n_ff_exp as u64, d.n_expert as u64);
    for (t, shape, std) in [
        ("ffn_gate_exps", [e, f, x], 0.08),
        ("ffn_up_exps", [e, f, x], 0.08),
        ("ffn_down_exps", [f, e, x], 0.06),
    ] {
        let data = v.normals((e * f * x) as usize, 0.0, std);
        add(w, &n(&format!("{t}.weight")), ty, &shape, &data);
    }
    if let Some((lat, norm)) = latent {
        matrix(w, v, &n("ffn_routed_down.weight"), ty, d.n_embd, lat, 0.1);
        matrix(w, v, &n("ffn_routed_up.weight"), ty, lat, d.n_embd, 0.1);
        if norm {
            vector(w, v, &n("ffn_routed_norm.weight"), lat, 1.0, 0.1);
        }
    }
    let n_sh = d.n_ff_exp * d.n_shared;
    matrix(w, v, &n("ffn_gate_shexp.weight"), ty, d.n_embd, n_sh, 0.08);
    matrix(w, v, &n("ffn_up_shexp.weight"), ty, d.n_embd, n_sh, 0.08);
    matrix(w, v, &n("ffn_down_shexp.weight"), ty, n_sh, d.n_embd, 0.06);
}

/// `n` tokens of the `kimi-linear` model's reference sequence (BOS, then ids drawn from the
/// regular tokens).
pub fn token_ids(n: usize) -> Vec<u32> {
    token_ids_of("kimi-linear", n)
}

/// `n` tokens of model `name`'s reference sequence.
pub fn token_ids_of(name: &str, n: usize) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(spec(name).seed ^ 0x0070_15e4_5eed);
    let mut ids = vec![BOS_ID];
    ids.extend((1..n).map(|_| 3 + rng.next_u32() % (TINY.n_vocab as u32 - 3)));
    ids
}
