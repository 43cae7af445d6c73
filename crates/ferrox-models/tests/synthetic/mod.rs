#![allow(dead_code)]
//! Tiny synthetic GGUF models, one per family (several for deepseek2), for logit parity with
//! llama.cpp.
//!
//! Shared by `tests/synthetic_parity.rs` (which rebuilds the files in memory) and
//! `examples/write_synthetic.rs` (which writes them for `scripts/reference/gen-synthetic-logits.sh`).
//! The bytes must not depend on the platform: values come from a seeded `StdRng` through
//! integer operations, additions and multiplications only (no `ln`/`cos`/`exp`, whose results
//! vary between math libraries), then through Ferrox's quantizers, which follow ggml's
//! reference code. A change here, in `rand`'s `StdRng` stream, or in a quantizer changes the
//! files' sha256, which the parity test checks against the manifest of the stored logits.
//!
//! Every model has n_embd 256 and n_ff 512 (so every matrix row is a whole number of 256-value
//! K-quant blocks), a 272-352 token SentencePiece-style vocabulary (llama.cpp refuses a file
//! without one), and the features of its family:
//!
//! | family | layers | heads (q/kv x dim) | tensor types | features |
//! | --- | --- | --- | --- | --- |
//! | llama | 3 | 4/2 x 64 | Q4_K, Q6_K (a Q4_K_M mix) | untied Q6_K output, `rope_freqs` (Llama 3 style) |
//! | qwen2 | 2 | 4/2 x 64 | Q8_0 | Q/K/V biases, tied output, rope base 1e6 |
//! | qwen3 | 3 | 8/2 x 64 (q width 512) | F16 embd, Q5_0, Q8_0 | Q/K norms, untied Q8_0 output |
//! | gemma2 | 4 | 4/2 x 64 | F16 | post norms, attn/final softcaps (10/5), SWA 16 on even layers, `rope.freq_base_swa` 5000 |
//! | gemma3 | 6 | 4/1 x 128 (q width 512) | Q8_0 embd, Q4_0, Q6_K | Q/K norms, SWA 16 with the default 5:1 pattern, global RoPE base 1e6 / local `rope.freq_base_swa` 2e4 |
//! | phi3 | 2 | 4/2 x 64 | F32 qkv, F16, Q4_K, Q6_K, Q5_0 embd, Q4_0 output | fused QKV and gate/up, `sliding_window` (ignored by llama.cpp) |
//! | qwen2moe | 2 | 4/2 x 64 | Q8_0, F32 routers | Q/K/V biases, 8 experts (2 used, n_ff_exp 128), shared expert (n_ff 256) with sigmoid gate |
//! | qwen3moe | 2 | 8/2 x 64 (q width 512) | F16 embd, Q5_0, Q4_0 experts, Q8_0 down/output, F32 router | Q/K norms, 8 experts (2 used, n_ff_exp 128, weights renormalised) |
//! | olmoe | 2 | 4/4 x 64 | Q4_K, Q8_0 expert down, Q6_K output, F32 router | Q/K norms over the whole projections, 8 experts (2 used, 128 wide: `feed_forward_length`, as llama.cpp reads it) |
//! | exaone | 2 | 4/2 x 64 | Q8_0 embd, Q4_K, Q6_K down | NeoX RoPE (base 1e6) with `rope_freqs`, tied output |
//!
//! The MoE families store their experts as stacked `blk.N.ffn_{gate,up,down}_exps.weight`
//! (ggml shapes `{n_embd, n_ff_exp, n_expert}` / `{n_ff_exp, n_embd, n_expert}`) with an F32
//! router `blk.N.ffn_gate_inp.weight` `{n_embd, n_expert}`; the matrix types of `Types` then
//! apply to the experts (and the shared expert).
//!
//! The Multi-head Latent Attention models (4 query heads; latent `kv_lora_rank` 128; heads of
//! 64 unrotated + 32 rotated key dims and 64 value dims; experts 128 wide with one shared
//! expert; F32 routers) are named after what they exercise:
//!
//! | model | arch | layers (dense) | tensor types | features |
//! | --- | --- | --- | --- | --- |
//! | deepseek2 | deepseek2 | 3 (1) | Q8_0, F16 `attn_k_b`/`attn_v_b`, Q4_K output/gate/up | query LoRA (rank 128), split `attn_k_b`/`attn_v_b`, softmax routing (8 experts, 2 used) |
//! | deepseek2-lite | deepseek2 | 2 (0) | Q8_0, tied output | one `attn_q` (q_lora_rank 0), no gating key (softmax by default) |
//! | deepseek2-v3 | deepseek2 | 3 (1) | Q8_0, Q5_0 queries, Q4_0 expert down | sigmoid routing over 16 experts in 4 groups (2 kept, 4 used), `exp_probs_b`, normalised weights scaled by 2.5, YaRN (factor 40, `mscale_all_dim` 1) |
//! | deepseek2-kvb | deepseek2 | 2 (1) | Q8_0 | one `attn_kv_b`, no `*_mla` keys (llama.cpp's multi-head path) |
//! | mistral4 | mistral4 | 3 (0) | Q8_0, Q5_0 `attn_kv_a_mqa` | fused `ffn_gate_up_exps`, YaRN (factor 16, `mscale_all_dim` 0.707), attention temperature (0.5, every 16 positions), normalised weights |
//!
//! The DeepSeek Sparse Attention models (`deepseek32`, `glm-dsa`: MLA plus a lightning
//! indexer) are described in [`dsa`]; `kimi-linear` in [`kimi`]; `deepseek4` in [`deepseek4`].
//! A Gemma 3 text model with its image projector (mmproj) and test images are in [`vision`].

pub mod bert;
pub mod codebook;
pub mod deepseek4;
pub mod dsa;
pub mod kimi;
pub mod large;
pub mod vision;

use ferrox_gguf::{GgmlType, GgufWriter, OwnedArray, OwnedValue};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

/// The families, in the order of the manifest.
pub const FAMILIES: &[&str] = &[
    "llama",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3",
    "phi3",
    "qwen2moe",
    "qwen3moe",
    "olmoe",
    "exaone",
    "deepseek2",
    "deepseek2-lite",
    "deepseek2-v3",
    "deepseek2-kvb",
    "mistral4",
];

/// The Multi-head Latent Attention models among [`FAMILIES`].
pub const MLA_MODELS: &[&str] = &[
    "deepseek2",
    "deepseek2-lite",
    "deepseek2-v3",
    "deepseek2-kvb",
    "mistral4",
];

/// Small all-F32 MLA models for sweeping every context length against llama.cpp (F32
/// weights and an f32 cache on both sides, so only summation order differs): 2 layers (1
/// dense), n_embd 128, 2 heads, query LoRA 48, latent 64, heads of 32 + 16 rotated key dims
/// and 32 value dims, 4 experts (2 used) in 2 groups (1 kept) with one shared expert, sigmoid
/// routing with `exp_probs_b`, normalised weights scaled by 2.5, YaRN (factor 4, original
/// context 64).
pub const SWEEP_MODELS: &[&str] = &[
    "deepseek2-sweep",
    "mistral4-sweep",
    "qwen2vl",
    "qwen3vl",
    "qwen3vlmoe",
];

/// Tokens in a sweep model's sequence: every prompt length up to this is checked.
pub const SWEEP_TOKENS: usize = 160;

/// Families swept with low-bit matrices, as `<family>.<type>`: a MoE family's experts in that
/// type (what `llama-quantize ... MXFP4_MOE` makes of them), a dense family's every matrix
/// but the embedding and the output; every other matrix F32.
pub const LOW_BIT_SWEEPS: &[(&str, GgmlType)] =
    &[("qwen3moe", GgmlType::Mxfp4), ("llama", GgmlType::Tq2_0)];

/// Dense models whose matrix kinds each have a different low-bit type, as the dynamic quants
/// people download mix them: `(name, [q, k, v, o, gate, up, down])`, the embedding and the
/// output F32. Together they hold every type llama-quantize writes that the others lack.
pub const MIXED_SWEEPS: &[(&str, [GgmlType; 7])] = {
    use GgmlType as T;
    &[
        (
            "llama.iq-mix",
            [
                T::Iq2Xxs,
                T::Iq2Xs,
                T::Iq2S,
                T::Iq3Xxs,
                T::Iq3S,
                T::Iq1S,
                T::Iq1M,
            ],
        ),
        (
            "llama.tq1-mix",
            [
                T::Tq1_0,
                T::Nvfp4,
                T::Q1_0,
                T::Q2_0,
                T::Q2K,
                T::Q3K,
                T::Tq1_0,
            ],
        ),
    ]
};

/// The types of a mixed sweep model from [`MIXED_SWEEPS`].
pub fn mixed_types(name: &str) -> Option<[GgmlType; 7]> {
    MIXED_SWEEPS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
}

/// The context-length sweep's models: every family as `<family>.f32` (every matrix F32), then
/// [`SWEEP_MODELS`], then [`LOW_BIT_SWEEPS`], then [`MIXED_SWEEPS`].
pub fn sweep_models() -> Vec<String> {
    FAMILIES
        .iter()
        .map(|f| format!("{f}.f32"))
        .chain(SWEEP_MODELS.iter().map(|m| m.to_string()))
        .chain(
            LOW_BIT_SWEEPS
                .iter()
                .map(|(f, ty)| format!("{f}.{}", ty.name().to_ascii_lowercase())),
        )
        .chain(MIXED_SWEEPS.iter().map(|(name, _)| name.to_string()))
        .collect()
}

/// The family a sweep model is built from.
pub fn sweep_arch(name: &str) -> &str {
    name.split_once('.').map_or(name, |(family, _)| family)
}

/// The low-bit type of a sweep model from [`LOW_BIT_SWEEPS`].
pub fn low_bit_type(name: &str) -> Option<GgmlType> {
    let (family, ty) = name.split_once('.')?;
    LOW_BIT_SWEEPS
        .iter()
        .find(|(f, t)| *f == family && t.name().eq_ignore_ascii_case(ty))
        .map(|(_, t)| *t)
}

/// A sweep model's GGUF bytes.
pub fn sweep_gguf_bytes(name: &str) -> Vec<u8> {
    if let Some([q, k, v, o, gate, up, down]) = mixed_types(name) {
        let mut s = spec(sweep_arch(name));
        let f32 = GgmlType::F32;
        s.types = Types {
            embd: f32,
            output: Some(f32),
            q,
            k,
            v,
            o,
            gate,
            up,
            down,
        };
        return spec_gguf_bytes(s);
    }
    if let Some(ty) = low_bit_type(name) {
        let mut s = spec(sweep_arch(name));
        let f32 = GgmlType::F32;
        s.types = match s.moe {
            Some(_) => Types {
                output: s.types.output.map(|_| f32),
                gate: ty,
                up: ty,
                down: ty,
                ..Types::same(f32)
            },
            None => Types {
                embd: f32,
                output: Some(f32),
                ..Types::same(ty)
            },
        };
        return spec_gguf_bytes(s);
    }
    match name.strip_suffix(".f32") {
        Some(family) => gguf_bytes_with(family, Some(GgmlType::F32)),
        None => gguf_bytes(name),
    }
}

/// Tokens in the reference sequence (BOS first).
pub const N_TOKENS: usize = 64;

/// The vocabulary's BOS id (SentencePiece layout: `<unk>`, `<s>`, `</s>`, then bytes).
pub const BOS_ID: u32 = 1;
pub const EOS_ID: u32 = 2;

const N_EMBD: usize = 256;
const N_FF: usize = 512;
/// Three special tokens and 256 byte tokens.
const N_FIXED_TOKENS: usize = 3 + 256;

/// One family's tiny model.
#[derive(Clone, Debug)]
pub struct Spec {
    pub arch: &'static str,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_vocab: usize,
    pub seed: u64,
    pub rms_eps: f32,
    pub rope_base: f32,
    pub types: Types,
    /// Mixture-of-experts FFNs instead of dense ones.
    pub moe: Option<MoeSpec>,
    /// Multi-head Latent Attention (then `n_head` counts query heads, `head_dim` is unused
    /// and `moe` gives the routed experts).
    pub mla: Option<MlaSpec>,
}

impl MlaSpec {
    /// The tiny test models' shapes: query LoRA, split `attn_k_b`/`attn_v_b`, one leading
    /// dense layer, one shared expert, softmax routing, no YaRN.
    fn base() -> MlaSpec {
        MlaSpec {
            n_embd: N_EMBD,
            n_ff: N_FF,
            q_lora_rank: Some(128),
            kv_lora_rank: 128,
            qk_nope: 64,
            qk_rope: 32,
            v_head: 64,
            split_kv_b: true,
            n_leading_dense: 1,
            n_shared: 1,
            gating_func: Some(1),
            groups: None,
            probs_bias: false,
            norm_weights: false,
            weights_scale: None,
            fused_gate_up: false,
            yarn: None,
            temperature: None,
            dsa: None,
            mtp: false,
            chat: None,
        }
    }
}

/// A DeepSeek-2-style model's attention and routing.
#[derive(Clone, Debug)]
pub struct MlaSpec {
    pub n_embd: usize,
    /// Hidden units of the leading dense layers' FFN.
    pub n_ff: usize,
    /// `None`: one `attn_q` (q_lora_rank 0).
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope: usize,
    pub qk_rope: usize,
    pub v_head: usize,
    /// `attn_k_b` / `attn_v_b` with the `*_mla` keys; otherwise one `attn_kv_b`.
    pub split_kv_b: bool,
    pub n_leading_dense: usize,
    pub n_shared: usize,
    /// `expert_gating_func` (1 softmax, 2 sigmoid); `None` leaves the key out.
    pub gating_func: Option<u32>,
    /// `(expert_group_count, expert_group_used_count)`.
    pub groups: Option<(usize, usize)>,
    /// `exp_probs_b.bias` on every MoE layer.
    pub probs_bias: bool,
    pub norm_weights: bool,
    pub weights_scale: Option<f32>,
    /// `ffn_gate_up_exps` instead of separate gate and up experts.
    pub fused_gate_up: bool,
    /// YaRN: (factor, original context, yarn_log_multiplier as stored).
    pub yarn: Option<(f32, u32, f32)>,
    /// (attention.temperature_scale, attention.temperature_length).
    pub temperature: Option<(f32, u32)>,
    /// DeepSeek Sparse Attention's indexer (`deepseek32`, `glm-dsa`).
    pub dsa: Option<dsa::DsaSpec>,
    /// One multi-token-prediction block (`blk.{n_layer}`, `nextn_predict_layers` 1).
    pub mtp: bool,
    /// A chat model's control tokens and template (otherwise the plain vocabulary).
    pub chat: Option<ChatVocab>,
}

/// Control tokens after the byte tokens of the vocabulary (turn and image markers), then
/// the word-start mark as a piece of its own, and a chat template.
#[derive(Clone, Copy, Debug)]
pub struct ChatVocab {
    pub control: &'static [&'static str],
    pub template: &'static str,
}

/// The experts of an MoE family's layers.
#[derive(Clone, Debug)]
pub struct MoeSpec {
    pub n_expert: usize,
    pub n_used: usize,
    pub n_ff_exp: usize,
    /// Hidden size of a shared expert with a sigmoid gate (qwen2moe).
    pub n_ff_shexp: Option<usize>,
}

/// Tensor types of the matrices (vectors are always F32).
#[derive(Clone, Debug)]
pub struct Types {
    pub embd: GgmlType,
    /// `None`: the output head is the token embedding (no `output.weight`).
    pub output: Option<GgmlType>,
    pub q: GgmlType,
    pub k: GgmlType,
    pub v: GgmlType,
    pub o: GgmlType,
    pub gate: GgmlType,
    pub up: GgmlType,
    pub down: GgmlType,
}

impl Types {
    /// Every matrix `t`, the output head tied to the embedding.
    pub fn same(t: GgmlType) -> Types {
        Types {
            embd: t,
            output: None,
            q: t,
            k: t,
            v: t,
            o: t,
            gate: t,
            up: t,
            down: t,
        }
    }

    /// Every matrix `t`, with an `output.weight` of its own.
    pub fn untied(t: GgmlType) -> Types {
        Types {
            output: Some(t),
            ..Types::same(t)
        }
    }
}

pub fn spec(arch: &str) -> Spec {
    use GgmlType as T;
    let same = Types::same;
    match arch {
        "llama" => Spec {
            arch: "llama",
            n_layer: 3,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_vocab: 320,
            seed: 0x011a_0001,
            moe: None,
            mla: None,
            rms_eps: 1e-5,
            rope_base: 500000.0,
            types: Types {
                embd: T::Q4K,
                output: Some(T::Q6K),
                v: T::Q6K,
                down: T::Q6K,
                ..same(T::Q4K)
            },
        },
        "qwen2" => Spec {
            arch: "qwen2",
            n_layer: 2,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_vocab: 288,
            seed: 0x011a_0002,
            moe: None,
            mla: None,
            rms_eps: 1e-6,
            rope_base: 1000000.0,
            types: same(T::Q8_0),
        },
        // Qwen-VL language models (M-RoPE sections), every matrix F32: text-only sweeps.
        // llama.cpp reads no RMS epsilon for qwen2vl (it normalises with 0): the file says 0
        // too, so that both engines compute the same.
        "qwen2vl" => Spec {
            arch: "qwen2vl",
            n_layer: 2,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_vocab: 288,
            seed: 0x011a_0a02,
            moe: None,
            mla: None,
            rms_eps: 0.0,
            rope_base: 1000000.0,
            types: same(T::F32),
        },
        "qwen3vl" => Spec {
            arch: "qwen3vl",
            n_layer: 3,
            n_head: 8,
            n_head_kv: 2,
            head_dim: 64,
            n_vocab: 352,
            seed: 0x011a_0a03,
            moe: None,
            mla: None,
            rms_eps: 1e-6,
            rope_base: 5000000.0,
            types: same(T::F32),
        },
        // Qwen3-VL's attention and M-RoPE with qwen3moe's experts, every matrix F32.
        "qwen3vlmoe" => Spec {
            arch: "qwen3vlmoe",
            seed: 0x011a_0a04,
            mla: None,
            rms_eps: 1e-6,
            rope_base: 5000000.0,
            types: same(T::F32),
            ..spec("qwen3moe")
        },
        "qwen3" => Spec {
            arch: "qwen3",
            n_layer: 3,
            n_head: 8,
            n_head_kv: 2,
            head_dim: 64,
            n_vocab: 352,
            seed: 0x011a_0003,
            moe: None,
            mla: None,
            rms_eps: 1e-6,
            rope_base: 1000000.0,
            types: Types {
                embd: T::F16,
                output: Some(T::Q8_0),
                down: T::Q8_0,
                ..same(T::Q5_0)
            },
        },
        "gemma2" => Spec {
            arch: "gemma2",
            n_layer: 4,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_vocab: 272,
            seed: 0x011a_0004,
            moe: None,
            mla: None,
            rms_eps: 1e-6,
            rope_base: 10000.0,
            types: same(T::F16),
        },
        "gemma3" => Spec {
            arch: "gemma3",
            n_layer: 6,
            n_head: 4,
            n_head_kv: 1,
            head_dim: 128,
            n_vocab: 304,
            seed: 0x011a_0005,
            moe: None,
            mla: None,
            rms_eps: 1e-6,
            rope_base: 1000000.0,
            types: Types {
                embd: T::Q8_0,
                v: T::Q6K,
                down: T::Q6K,
                ..same(T::Q4_0)
            },
        },
        "phi3" => Spec {
            arch: "phi3",
            n_layer: 2,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_vocab: 336,
            seed: 0x011a_0006,
            moe: None,
            mla: None,
            rms_eps: 1e-5,
            rope_base: 10000.0,
            types: Types {
                embd: T::Q5_0,
                output: Some(T::Q4_0),
                // q/k/v are one fused F32 matrix; gate/up one fused Q4_K matrix.
                q: T::F32,
                k: T::F32,
                v: T::F32,
                o: T::F16,
                gate: T::Q4K,
                up: T::Q4K,
                down: T::Q6K,
            },
        },
        "qwen2moe" => Spec {
            arch: "qwen2moe",
            n_layer: 2,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_vocab: 296,
            seed: 0x011a_0007,
            moe: Some(MoeSpec {
                n_expert: 8,
                n_used: 2,
                n_ff_exp: 128,
                n_ff_shexp: Some(256),
            }),
            mla: None,
            rms_eps: 1e-6,
            rope_base: 1000000.0,
            // llama.cpp requires `output.weight` for qwen2moe.
            types: Types {
                output: Some(T::Q8_0),
                ..same(T::Q8_0)
            },
        },
        "qwen3moe" => Spec {
            arch: "qwen3moe",
            n_layer: 2,
            n_head: 8,
            n_head_kv: 2,
            head_dim: 64,
            n_vocab: 312,
            seed: 0x011a_0008,
            moe: Some(MoeSpec {
                n_expert: 8,
                n_used: 2,
                n_ff_exp: 128,
                n_ff_shexp: None,
            }),
            mla: None,
            rms_eps: 1e-6,
            rope_base: 1000000.0,
            types: Types {
                embd: T::F16,
                output: Some(T::Q8_0),
                gate: T::Q4_0,
                up: T::Q4_0,
                down: T::Q8_0,
                ..same(T::Q5_0)
            },
        },
        "olmoe" => Spec {
            arch: "olmoe",
            n_layer: 2,
            n_head: 4,
            n_head_kv: 4,
            head_dim: 64,
            n_vocab: 328,
            seed: 0x011a_0009,
            moe: Some(MoeSpec {
                n_expert: 8,
                n_used: 2,
                n_ff_exp: 128,
                n_ff_shexp: None,
            }),
            mla: None,
            rms_eps: 1e-5,
            rope_base: 10000.0,
            // Expert down projections have 128 inputs: no K-quant there.
            types: Types {
                output: Some(T::Q6K),
                down: T::Q8_0,
                ..same(T::Q4K)
            },
        },
        "exaone" => Spec {
            arch: "exaone",
            n_layer: 2,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_vocab: 344,
            seed: 0x011a_000a,
            moe: None,
            mla: None,
            rms_eps: 1e-5,
            rope_base: 1000000.0,
            // Tied output (EXAONE 3.5's small models tie it).
            types: Types {
                embd: T::Q8_0,
                output: None,
                down: T::Q6K,
                ..same(T::Q4K)
            },
        },
        name if MLA_MODELS.contains(&name) || SWEEP_MODELS.contains(&name) => mla_spec(name),
        // deepseek2-v3 with a multi-token-prediction block after its layers (the trunk's
        // tensors are the same).
        "deepseek2-mtp" => {
            let s = spec("deepseek2-v3");
            let mla = s.mla.clone().map(|m| MlaSpec { mtp: true, ..m });
            Spec { mla, ..s }
        }
        name if dsa::DSA_MODELS.contains(&name) => dsa::spec(name),
        other => panic!("no synthetic model for `{other}`"),
    }
}

/// The MLA models: 4 heads, latent 128, query rank 128 (when used), head parts 64 unrotated +
/// 32 rotated for keys and 64 for values, 8 or 16 experts of 128 with one shared expert.
fn mla_spec(name: &str) -> Spec {
    use GgmlType as T;
    let base = MlaSpec::base();
    let moe = |n_expert, n_used| {
        Some(MoeSpec {
            n_expert,
            n_used,
            n_ff_exp: 128,
            n_ff_shexp: None,
        })
    };
    let types = Types::untied;
    let model = |arch, n_layer, n_vocab, seed, mla, moe, types| Spec {
        arch,
        n_layer,
        n_head: 4,
        n_head_kv: 1,
        head_dim: 0,
        n_vocab,
        seed,
        rms_eps: 1e-6,
        rope_base: 10000.0,
        types,
        moe,
        mla: Some(mla),
    };
    match name {
        // q LoRA, split attn_k_b/attn_v_b, softmax routing, one leading dense layer.
        "deepseek2" => model(
            "deepseek2",
            3,
            296,
            0x011a_0010,
            base,
            moe(8, 2),
            Types {
                v: T::F16,
                o: T::Q4K,
                gate: T::Q4K,
                up: T::Q4K,
                ..types(T::Q8_0)
            },
        ),
        // No q LoRA (attn_q), no gating key (softmax by default), tied output, no dense layer.
        "deepseek2-lite" => model(
            "deepseek2",
            2,
            280,
            0x011a_0011,
            MlaSpec {
                q_lora_rank: None,
                n_leading_dense: 0,
                gating_func: None,
                ..base
            },
            moe(8, 2),
            Types {
                output: None,
                ..types(T::Q8_0)
            },
        ),
        // DeepSeek-V3 routing: sigmoid, 4 groups of 4 experts (2 kept), selection bias,
        // normalised and scaled weights; YaRN (factor 40, mscale_all_dim 1).
        "deepseek2-v3" => model(
            "deepseek2",
            3,
            304,
            0x011a_0012,
            MlaSpec {
                gating_func: Some(2),
                groups: Some((4, 2)),
                probs_bias: true,
                norm_weights: true,
                weights_scale: Some(2.5),
                yarn: Some((40.0, 4096, 0.1)),
                ..base
            },
            moe(16, 4),
            Types {
                q: T::Q5_0,
                down: T::Q4_0,
                ..types(T::Q8_0)
            },
        ),
        // An older file: one attn_kv_b and no *_mla keys (llama.cpp runs it as plain
        // multi-head attention with a full K/V cache).
        "deepseek2-kvb" => model(
            "deepseek2",
            2,
            288,
            0x011a_0013,
            MlaSpec {
                split_kv_b: false,
                ..base
            },
            moe(8, 2),
            types(T::Q8_0),
        ),
        // Mistral-4: fused gate/up experts, YaRN with mscale_all_dim 0.707 (the attention
        // factor rule differs from deepseek2's), attention temperature.
        "mistral4" => model(
            "mistral4",
            3,
            312,
            0x011a_0014,
            MlaSpec {
                n_leading_dense: 0,
                norm_weights: true,
                fused_gate_up: true,
                yarn: Some((16.0, 1024, 0.0707)),
                temperature: Some((0.5, 16)),
                ..base
            },
            moe(8, 2),
            Types {
                k: T::Q5_0,
                ..types(T::Q8_0)
            },
        ),
        "deepseek2-sweep" | "mistral4-sweep" => {
            let mistral = name.starts_with("mistral4");
            Spec {
                n_head: 2,
                ..model(
                    if mistral { "mistral4" } else { "deepseek2" },
                    2,
                    288,
                    if mistral { 0x011a_0021 } else { 0x011a_0020 },
                    MlaSpec {
                        n_embd: 128,
                        n_ff: 256,
                        q_lora_rank: Some(48),
                        kv_lora_rank: 64,
                        qk_nope: 32,
                        qk_rope: 16,
                        v_head: 32,
                        gating_func: Some(2),
                        groups: Some((2, 1)),
                        probs_bias: true,
                        norm_weights: true,
                        weights_scale: Some(2.5),
                        yarn: Some((4.0, 64, if mistral { 0.0707 } else { 0.1 })),
                        ..base
                    },
                    Some(MoeSpec {
                        n_expert: 4,
                        n_used: 2,
                        n_ff_exp: 64,
                        n_ff_shexp: None,
                    }),
                    Types::untied(T::F32),
                )
            }
        }
        other => panic!("no MLA model `{other}`"),
    }
}

/// A DeepSeek-V2-Lite-shaped model for speed measurements, not for parity: hidden 2048,
/// 16 heads (no query LoRA, latent 512, heads of 128 + 64 rotated key dims and 128 value
/// dims), one leading dense layer (10944 wide), then `n_layer - 1` MoE layers of `n_expert`
/// experts (1408 wide, `n_used` per token) and two shared experts; every matrix `ty`
/// (routers F32), a 448-token vocabulary.
pub fn moe_bench_gguf(n_layer: usize, n_expert: usize, n_used: usize, ty: GgmlType) -> Vec<u8> {
    let mla = MlaSpec {
        n_embd: 2048,
        n_ff: 10944,
        q_lora_rank: None,
        kv_lora_rank: 512,
        qk_nope: 128,
        qk_rope: 64,
        v_head: 128,
        n_shared: 2,
        ..MlaSpec::base()
    };
    let spec = Spec {
        arch: "deepseek2",
        n_layer,
        n_head: 16,
        n_head_kv: 1,
        head_dim: 0,
        n_vocab: 448,
        seed: 0x011a_0100,
        rms_eps: 1e-6,
        rope_base: 10000.0,
        types: Types::untied(ty),
        moe: Some(MoeSpec {
            n_expert,
            n_used,
            n_ff_exp: 1408,
            n_ff_shexp: None,
        }),
        mla: Some(mla.clone()),
    };
    mla_gguf_bytes(&spec, &mla)
}

/// Uniform and roughly normal values from a seeded generator, with exact arithmetic only.
struct Values(StdRng);

impl Values {
    /// Uniform in [0, 1), 24 random bits (exactly representable).
    fn uniform(&mut self) -> f32 {
        (self.0.next_u32() >> 8) as f32 * (1.0 / 16_777_216.0)
    }

    /// Mean 0, standard deviation 1: the sum of four uniforms (Irwin-Hall), centred and
    /// scaled by sqrt(3), within +-3.46.
    fn normal(&mut self) -> f32 {
        let s = self.uniform() + self.uniform() + self.uniform() + self.uniform();
        (s - 2.0) * 1.732_050_8
    }

    fn normals(&mut self, n: usize, mean: f32, std: f32) -> Vec<f32> {
        (0..n).map(|_| mean + std * self.normal()).collect()
    }
}

/// Adds a `rows` x `cols` matrix (ggml shape `[cols, rows]`) of `ty`, entries of deviation `std`.
fn matrix(
    w: &mut GgufWriter,
    vals: &mut Values,
    name: &str,
    ty: GgmlType,
    cols: usize,
    rows: usize,
    std: f32,
) {
    let data = vals.normals(rows * cols, 0.0, std);
    add(w, name, ty, &[cols as u64, rows as u64], &data);
}

/// Adds an F32 vector.
fn vector(w: &mut GgufWriter, vals: &mut Values, name: &str, n: usize, mean: f32, std: f32) {
    let data = vals.normals(n, mean, std);
    add(w, name, GgmlType::F32, &[n as u64], &data);
}

fn add(w: &mut GgufWriter, name: &str, ty: GgmlType, shape: &[u64], data: &[f32]) {
    let out = if codebook::is_codebook_type(ty) {
        codebook::codebook_blocks(ty, data)
    } else {
        let bytes = ty.bytes_for(data.len() as u64).expect("known type") as usize;
        let mut out = vec![0u8; bytes];
        ferrox_core::quantize_row(ty, data, &mut out).unwrap_or_else(|e| panic!("{name}: {e}"));
        out
    };
    w.add_tensor(name, ty, shape, out)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
}

/// A SentencePiece-style vocabulary: `<unk>` `<s>` `</s>`, the 256 byte tokens `<0xXX>`
/// (llama.cpp looks up `<0x0A>` as the newline token), then two-letter pieces with and
/// without the word-start mark.
fn vocab(w: &mut GgufWriter, n_vocab: usize) {
    spm_vocab(w, n_vocab, &[], &[]);
}

/// [`vocab`] with `control` tokens after the byte tokens and `pieces` (normal tokens) before
/// the two-letter ones.
pub fn spm_vocab(w: &mut GgufWriter, n_vocab: usize, control: &[&str], pieces: &[&str]) {
    let n_fixed = N_FIXED_TOKENS + control.len();
    assert!(n_vocab > n_fixed);
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types: Vec<i32> = vec![2, 3, 3]; // unknown, control, control
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6); // byte
    }
    for t in control {
        tokens.push(t.to_string());
        types.push(3);
    }
    for t in pieces {
        tokens.push(t.to_string());
        types.push(1);
    }
    'outer: for c in "bcdfghjklmnprstvwxyz".chars() {
        for v in "aeiou".chars() {
            for prefix in ["\u{2581}", ""] {
                if tokens.len() == n_vocab {
                    break 'outer;
                }
                tokens.push(format!("{prefix}{c}{v}"));
                types.push(1); // normal
            }
        }
    }
    assert_eq!(
        tokens.len(),
        n_vocab,
        "vocabulary too large for the piece list"
    );
    let scores: Vec<f32> = (0..n_vocab)
        .map(|i| {
            if i < n_fixed {
                0.0
            } else {
                -((i - n_fixed) as f32)
            }
        })
        .collect();
    w.set("tokenizer.ggml.model", "llama");
    w.set(
        "tokenizer.ggml.tokens",
        OwnedValue::Array(OwnedArray::String(tokens)),
    );
    w.set("tokenizer.ggml.scores", scores);
    w.set("tokenizer.ggml.token_type", types);
    w.set("tokenizer.ggml.bos_token_id", BOS_ID);
    w.set("tokenizer.ggml.eos_token_id", EOS_ID);
    w.set("tokenizer.ggml.unknown_token_id", 0u32);
    w.set("tokenizer.ggml.add_bos_token", true);
    w.set("tokenizer.ggml.add_eos_token", false);
}

/// The GGUF file of `arch`'s synthetic model.
pub fn gguf_bytes(arch: &str) -> Vec<u8> {
    gguf_bytes_with(arch, None)
}

/// The same model with every matrix stored as `all` (for investigations: with F32 matrices
/// neither engine quantizes activations, so rounding differences are not amplified).
pub fn gguf_bytes_with(arch: &str, all: Option<GgmlType>) -> Vec<u8> {
    let mut s = spec(arch);
    if let Some(ty) = all {
        s.types = Types {
            output: s.types.output.map(|_| ty),
            ..Types::same(ty)
        };
    }
    spec_gguf_bytes(s)
}

/// The model a spec describes.
fn spec_gguf_bytes(s: Spec) -> Vec<u8> {
    spec_gguf_bytes_with(s, |_, _| {})
}

/// A Qwen3-Reranker-style model: the qwen3 sweep model (F32) with a two-label
/// classification head (`cls.output`, as converters write the yes/no rows) and rank pooling.
pub fn qwen3_reranker_bytes() -> Vec<u8> {
    let mut s = spec("qwen3");
    s.types = Types {
        output: s.types.output.map(|_| GgmlType::F32),
        ..Types::same(GgmlType::F32)
    };
    spec_gguf_bytes_with(s, |w, v| {
        w.set("qwen3.pooling_type", 4u32);
        let labels = vec!["yes".to_string(), "no".to_string()];
        w.set(
            "qwen3.classifier.output_labels",
            OwnedValue::Array(OwnedArray::String(labels)),
        );
        matrix(w, v, "cls.output.weight", GgmlType::F32, N_EMBD, 2, 0.3);
    })
}

/// The model a spec describes, with `extra` keys and tensors added after the rest.
fn spec_gguf_bytes_with(s: Spec, extra: impl FnOnce(&mut GgufWriter, &mut Values)) -> Vec<u8> {
    if let Some(m) = s.mla.clone() {
        return mla_gguf_bytes(&s, &m);
    }
    let a = s.arch;
    let mut w = GgufWriter::new();
    let key = |k: &str| format!("{a}.{k}");
    common_keys(&mut w, &s, N_EMBD);
    // OLMoE's experts are `feed_forward_length` wide (llama.cpp reads no expert width).
    let n_ff = match (&s.moe, a) {
        (Some(m), "olmoe") => m.n_ff_exp,
        _ => N_FF,
    };
    w.set(key("feed_forward_length"), n_ff as u32);
    w.set(key("attention.head_count"), s.n_head as u32);
    w.set(key("attention.head_count_kv"), s.n_head_kv as u32);
    if s.n_head * s.head_dim != N_EMBD {
        w.set(key("attention.key_length"), s.head_dim as u32);
        w.set(key("attention.value_length"), s.head_dim as u32);
    }
    w.set(key("rope.dimension_count"), s.head_dim as u32);
    w.set(key("rope.freq_base"), s.rope_base);
    w.set(key("attention.layer_norm_rms_epsilon"), s.rms_eps);
    match a {
        "gemma2" => {
            w.set(key("attention.sliding_window"), 16u32);
            // Caps well below the defaults (50, 30), so that they bend these small scores and
            // logits noticeably.
            w.set(key("attn_logit_softcapping"), 10.0f32);
            w.set(key("final_logit_softcapping"), 5.0f32);
            w.set(key("rope.freq_base_swa"), 5000.0f32);
        }
        "gemma3" => {
            // No pattern key: llama.cpp's default (5 local layers, then 1 global) applies. The
            // local RoPE base is written as recent converters do, with a value other than the
            // 10000 a reader assumes without it.
            w.set(key("attention.sliding_window"), 16u32);
            w.set(key("rope.freq_base_swa"), 20000.0f32);
        }
        "phi3" => {
            // Phi-3 files carry a window; llama.cpp disables Phi's SWA, so it must not matter.
            w.set(key("attention.sliding_window"), 16u32);
        }
        "qwen2vl" | "qwen3vl" | "qwen3vlmoe" => {
            // Time, height, width and a fourth section, in rotated pairs (Qwen2.5-VL's
            // [16, 24, 24, 0] at head size 128, halved). Interleaved (qwen3vl), pairs 24, 27
            // and 30 take the fourth position: text leaves them still.
            w.set(
                key("rope.dimension_sections"),
                OwnedValue::Array(OwnedArray::I32(vec![8, 12, 12, 0])),
            );
        }
        _ => {}
    }
    if let Some(m) = &s.moe {
        w.set(key("expert_count"), m.n_expert as u32);
        w.set(key("expert_used_count"), m.n_used as u32);
        if a != "olmoe" {
            w.set(key("expert_feed_forward_length"), m.n_ff_exp as u32);
        }
        if let Some(n) = m.n_ff_shexp {
            w.set(key("expert_shared_feed_forward_length"), n as u32);
        }
    }
    vocab(&mut w, s.n_vocab);

    let mut vals = Values(StdRng::seed_from_u64(s.seed));
    let v = &mut vals;
    let gemma = a.starts_with("gemma");
    let t = &s.types;
    let (q_w, kv_w) = (s.n_head * s.head_dim, s.n_head_kv * s.head_dim);
    // Gemma scales the embeddings by sqrt(n_embd) = 16 and ties the output head to them: with
    // larger embeddings the current token's own logit dominates every row.
    let embd_std = if gemma { 0.03 } else { 0.08 };
    matrix(
        &mut w,
        v,
        "token_embd.weight",
        t.embd,
        N_EMBD,
        s.n_vocab,
        embd_std,
    );
    vector(&mut w, v, "output_norm.weight", N_EMBD, 1.0, 0.1);
    if let Some(ty) = t.output {
        matrix(&mut w, v, "output.weight", ty, N_EMBD, s.n_vocab, 0.1);
    }
    if a == "llama" || a == "exaone" {
        // Llama 3.1 style frequency divisors: 1 for the fastest pairs, rising to 8 for the
        // slow ones. The ramp starts early so that the divisors change angles a lot within 64
        // positions (with base 5e5, pair 4 turns by ~0.19 rad per position).
        let factors: Vec<f32> = (0..s.head_dim / 2)
            .map(|i| {
                if i < 4 {
                    1.0
                } else if i >= 12 {
                    8.0
                } else {
                    1.0 + (i - 4) as f32 * (7.0 / 8.0)
                }
            })
            .collect();
        add(
            &mut w,
            "rope_freqs.weight",
            GgmlType::F32,
            &[factors.len() as u64],
            &factors,
        );
    }
    for il in 0..s.n_layer {
        let n = |t: &str| format!("blk.{il}.{t}");
        vector(&mut w, v, &n("attn_norm.weight"), N_EMBD, 1.0, 0.1);
        if a == "phi3" {
            matrix(
                &mut w,
                v,
                &n("attn_qkv.weight"),
                t.q,
                N_EMBD,
                q_w + 2 * kv_w,
                0.08,
            );
        } else {
            matrix(&mut w, v, &n("attn_q.weight"), t.q, N_EMBD, q_w, 0.08);
            matrix(&mut w, v, &n("attn_k.weight"), t.k, N_EMBD, kv_w, 0.08);
            matrix(&mut w, v, &n("attn_v.weight"), t.v, N_EMBD, kv_w, 0.06);
        }
        if a == "qwen2" || a == "qwen2moe" || a == "qwen2vl" {
            vector(&mut w, v, &n("attn_q.bias"), q_w, 0.0, 0.2);
            vector(&mut w, v, &n("attn_k.bias"), kv_w, 0.0, 0.2);
            vector(&mut w, v, &n("attn_v.bias"), kv_w, 0.0, 0.1);
        }
        if a == "olmoe" {
            // One norm over the whole projection.
            vector(&mut w, v, &n("attn_q_norm.weight"), q_w, 1.0, 0.1);
            vector(&mut w, v, &n("attn_k_norm.weight"), kv_w, 1.0, 0.1);
        }
        if matches!(
            a,
            "qwen3" | "gemma3" | "qwen3moe" | "qwen3vl" | "qwen3vlmoe"
        ) {
            vector(&mut w, v, &n("attn_q_norm.weight"), s.head_dim, 1.0, 0.1);
            vector(&mut w, v, &n("attn_k_norm.weight"), s.head_dim, 1.0, 0.1);
        }
        matrix(&mut w, v, &n("attn_output.weight"), t.o, q_w, N_EMBD, 0.06);
        if gemma {
            vector(
                &mut w,
                v,
                &n("post_attention_norm.weight"),
                N_EMBD,
                1.0,
                0.1,
            );
        }
        vector(&mut w, v, &n("ffn_norm.weight"), N_EMBD, 1.0, 0.1);
        if let Some(m) = &s.moe {
            moe_layer(&mut w, v, il, t, m);
        } else if a == "phi3" {
            matrix(&mut w, v, &n("ffn_up.weight"), t.up, N_EMBD, 2 * N_FF, 0.06);
        } else {
            matrix(&mut w, v, &n("ffn_gate.weight"), t.gate, N_EMBD, N_FF, 0.06);
            matrix(&mut w, v, &n("ffn_up.weight"), t.up, N_EMBD, N_FF, 0.06);
        }
        if s.moe.is_none() {
            matrix(&mut w, v, &n("ffn_down.weight"), t.down, N_FF, N_EMBD, 0.05);
        }
        if gemma {
            vector(&mut w, v, &n("post_ffw_norm.weight"), N_EMBD, 1.0, 0.1);
        }
    }
    extra(&mut w, v);
    w.to_bytes()
}

/// One MoE layer's FFN: the F32 router, the stacked experts and the optional shared expert.
fn moe_layer(w: &mut GgufWriter, v: &mut Values, il: usize, t: &Types, m: &MoeSpec) {
    let n = |t: &str| format!("blk.{il}.{t}");
    let (e, f) = (m.n_expert as u64, m.n_ff_exp as u64);
    let d = N_EMBD as u64;
    // Router logits of deviation ~1.6: distinct enough that routing is not decided by noise.
    matrix(
        w,
        v,
        &n("ffn_gate_inp.weight"),
        GgmlType::F32,
        N_EMBD,
        m.n_expert,
        0.1,
    );
    let mut stacked = |name: &str, ty: GgmlType, shape: [u64; 3], std: f32| {
        let data = v.normals((shape[0] * shape[1] * shape[2]) as usize, 0.0, std);
        add(w, &n(name), ty, &shape, &data);
    };
    stacked("ffn_gate_exps.weight", t.gate, [d, f, e], 0.06);
    stacked("ffn_up_exps.weight", t.up, [d, f, e], 0.06);
    stacked("ffn_down_exps.weight", t.down, [f, d, e], 0.08);
    if let Some(sh) = m.n_ff_shexp {
        vector(w, v, &n("ffn_gate_inp_shexp.weight"), N_EMBD, 0.0, 0.06);
        matrix(w, v, &n("ffn_gate_shexp.weight"), t.gate, N_EMBD, sh, 0.06);
        matrix(w, v, &n("ffn_up_shexp.weight"), t.up, N_EMBD, sh, 0.06);
        matrix(w, v, &n("ffn_down_shexp.weight"), t.down, sh, N_EMBD, 0.05);
    }
}

/// Metadata every model starts with: architecture, name, context, width, depth.
fn common_keys(w: &mut GgufWriter, s: &Spec, n_embd: usize) {
    let a = s.arch;
    w.set("general.architecture", a);
    // A neutral name: llama.cpp keys some vocabulary fix-ups on the model name (a name
    // containing "phi3" makes it look up `<|endoftext|>`, which this vocabulary lacks).
    w.set("general.name", "ferrox synthetic test model");
    w.set(format!("{a}.context_length"), 2048u32);
    w.set(format!("{a}.embedding_length"), n_embd as u32);
    w.set(format!("{a}.block_count"), s.n_layer as u32);
}

/// A DeepSeek-2-style model (`deepseek2` or `mistral4`), with the keys and tensors
/// llama.cpp's loader for those architectures expects.
fn mla_gguf_bytes(s: &Spec, m: &MlaSpec) -> Vec<u8> {
    let a = s.arch;
    let moe = s.moe.as_ref().expect("MLA models have experts");
    let mut w = GgufWriter::new();
    let key = |k: &str| format!("{a}.{k}");
    common_keys(&mut w, s, m.n_embd);
    w.set(key("attention.head_count"), s.n_head as u32);
    w.set(key("attention.layer_norm_rms_epsilon"), s.rms_eps);
    let (h, lkv, rope) = (s.n_head, m.kv_lora_rank, m.qk_rope);
    let dk = m.qk_nope + m.qk_rope;
    w.set(key("feed_forward_length"), m.n_ff as u32);
    w.set(
        key("attention.q_lora_rank"),
        m.q_lora_rank.unwrap_or(0) as u32,
    );
    w.set(key("attention.kv_lora_rank"), lkv as u32);
    if m.split_kv_b {
        // What current converters write: one "KV head" holding the latent and rope part.
        w.set(key("attention.head_count_kv"), 1u32);
        w.set(key("attention.key_length"), (lkv + rope) as u32);
        w.set(key("attention.value_length"), lkv as u32);
        w.set(key("attention.key_length_mla"), dk as u32);
        w.set(key("attention.value_length_mla"), m.v_head as u32);
    } else {
        w.set(key("attention.head_count_kv"), h as u32);
        w.set(key("attention.key_length"), dk as u32);
        w.set(key("attention.value_length"), m.v_head as u32);
    }
    w.set(key("rope.dimension_count"), rope as u32);
    w.set(key("rope.freq_base"), s.rope_base);
    if let Some((factor, orig, log_mul)) = m.yarn {
        w.set(key("rope.scaling.type"), "yarn");
        w.set(key("rope.scaling.factor"), factor);
        w.set(key("rope.scaling.original_context_length"), orig);
        w.set(key("rope.scaling.yarn_log_multiplier"), log_mul);
    }
    if let Some((scale, length)) = m.temperature {
        w.set(key("attention.temperature_scale"), scale);
        w.set(key("attention.temperature_length"), length);
    }
    w.set(key("leading_dense_block_count"), m.n_leading_dense as u32);
    w.set(key("expert_count"), moe.n_expert as u32);
    w.set(key("expert_used_count"), moe.n_used as u32);
    w.set(key("expert_feed_forward_length"), moe.n_ff_exp as u32);
    w.set(key("expert_shared_count"), m.n_shared as u32);
    w.set(key("expert_weights_norm"), m.norm_weights);
    if let Some(scale) = m.weights_scale {
        w.set(key("expert_weights_scale"), scale);
    }
    if let Some(g) = m.gating_func {
        w.set(key("expert_gating_func"), g);
    }
    if let Some((n_group, n_used)) = m.groups {
        w.set(key("expert_group_count"), n_group as u32);
        w.set(key("expert_group_used_count"), n_used as u32);
    }
    if let Some(d) = &m.dsa {
        d.keys(&mut w, a, s.n_layer);
    }
    let n_blocks = s.n_layer + usize::from(m.mtp);
    if m.mtp {
        w.set(key("block_count"), n_blocks as u32);
        w.set(key("nextn_predict_layers"), 1u32);
    }
    match m.chat {
        None => vocab(&mut w, s.n_vocab),
        Some(chat) => {
            spm_vocab(&mut w, s.n_vocab, chat.control, &["\u{2581}"]);
            w.set("tokenizer.chat_template", chat.template);
        }
    }

    let mut vals = Values(StdRng::seed_from_u64(s.seed));
    let v = &mut vals;
    let t = &s.types;
    matrix(
        &mut w,
        v,
        "token_embd.weight",
        t.embd,
        m.n_embd,
        s.n_vocab,
        0.08,
    );
    vector(&mut w, v, "output_norm.weight", m.n_embd, 1.0, 0.1);
    if let Some(ty) = t.output {
        matrix(&mut w, v, "output.weight", ty, m.n_embd, s.n_vocab, 0.1);
    }
    for il in 0..n_blocks {
        let n = |t: &str| format!("blk.{il}.{t}");
        if il == s.n_layer {
            // The block's own tensors; its layer tensors follow as any layer's.
            let e = m.n_embd;
            matrix(&mut w, v, &n("nextn.eh_proj.weight"), t.o, 2 * e, e, 0.06);
            vector(&mut w, v, &n("nextn.enorm.weight"), e, 1.0, 0.1);
            vector(&mut w, v, &n("nextn.hnorm.weight"), e, 1.0, 0.1);
            vector(&mut w, v, &n("nextn.shared_head_norm.weight"), e, 1.0, 0.1);
        }
        vector(&mut w, v, &n("attn_norm.weight"), m.n_embd, 1.0, 0.1);
        match m.q_lora_rank {
            Some(r) => {
                matrix(&mut w, v, &n("attn_q_a.weight"), t.q, m.n_embd, r, 0.08);
                vector(&mut w, v, &n("attn_q_a_norm.weight"), r, 1.0, 0.1);
                matrix(&mut w, v, &n("attn_q_b.weight"), t.q, r, h * dk, 0.1);
            }
            None => matrix(&mut w, v, &n("attn_q.weight"), t.q, m.n_embd, h * dk, 0.08),
        }
        matrix(
            &mut w,
            v,
            &n("attn_kv_a_mqa.weight"),
            t.k,
            m.n_embd,
            lkv + rope,
            0.08,
        );
        vector(&mut w, v, &n("attn_kv_a_norm.weight"), lkv, 1.0, 0.1);
        if m.split_kv_b {
            let shape = [m.qk_nope as u64, lkv as u64, h as u64];
            let data = v.normals(m.qk_nope * lkv * h, 0.0, 0.1);
            add(&mut w, &n("attn_k_b.weight"), t.v, &shape, &data);
            let shape = [lkv as u64, m.v_head as u64, h as u64];
            let data = v.normals(lkv * m.v_head * h, 0.0, 0.1);
            add(&mut w, &n("attn_v_b.weight"), t.v, &shape, &data);
        } else {
            let rows = h * (m.qk_nope + m.v_head);
            matrix(&mut w, v, &n("attn_kv_b.weight"), t.v, lkv, rows, 0.1);
        }
        matrix(
            &mut w,
            v,
            &n("attn_output.weight"),
            t.o,
            h * m.v_head,
            m.n_embd,
            0.06,
        );
        if let Some(d) = &m.dsa {
            d.layer_tensors(&mut w, v, s, m, il);
        }
        vector(&mut w, v, &n("ffn_norm.weight"), m.n_embd, 1.0, 0.1);
        if il < m.n_leading_dense {
            matrix(
                &mut w,
                v,
                &n("ffn_gate.weight"),
                t.gate,
                m.n_embd,
                m.n_ff,
                0.06,
            );
            matrix(&mut w, v, &n("ffn_up.weight"), t.up, m.n_embd, m.n_ff, 0.06);
            matrix(
                &mut w,
                v,
                &n("ffn_down.weight"),
                t.down,
                m.n_ff,
                m.n_embd,
                0.05,
            );
            continue;
        }
        let (e, f, d) = (moe.n_expert as u64, moe.n_ff_exp as u64, m.n_embd as u64);
        matrix(
            &mut w,
            v,
            &n("ffn_gate_inp.weight"),
            GgmlType::F32,
            m.n_embd,
            moe.n_expert,
            0.1,
        );
        if m.probs_bias {
            vector(&mut w, v, &n("exp_probs_b.bias"), moe.n_expert, 0.0, 0.05);
        }
        let mut stacked = |name: &str, ty: GgmlType, shape: [u64; 3], std: f32| {
            let data = v.normals((shape[0] * shape[1] * shape[2]) as usize, 0.0, std);
            add(&mut w, &n(name), ty, &shape, &data);
        };
        if m.fused_gate_up {
            stacked("ffn_gate_up_exps.weight", t.gate, [d, 2 * f, e], 0.06);
        } else {
            stacked("ffn_gate_exps.weight", t.gate, [d, f, e], 0.06);
            stacked("ffn_up_exps.weight", t.up, [d, f, e], 0.06);
        }
        stacked("ffn_down_exps.weight", t.down, [f, d, e], 0.08);
        let sh = moe.n_ff_exp * m.n_shared;
        matrix(
            &mut w,
            v,
            &n("ffn_gate_shexp.weight"),
            t.gate,
            m.n_embd,
            sh,
            0.06,
        );
        matrix(
            &mut w,
            v,
            &n("ffn_up_shexp.weight"),
            t.up,
            m.n_embd,
            sh,
            0.06,
        );
        matrix(
            &mut w,
            v,
            &n("ffn_down_shexp.weight"),
            t.down,
            sh,
            m.n_embd,
            0.05,
        );
    }
    w.to_bytes()
}

/// The reference token sequence of `arch`: BOS, then 63 ids drawn from the model's
/// non-special tokens.
pub fn token_ids(arch: &str) -> Vec<u32> {
    token_ids_n(arch, N_TOKENS)
}

/// `n` tokens of `arch`'s reference sequence (the first [`N_TOKENS`] are [`token_ids`]).
pub fn token_ids_n(arch: &str, n: usize) -> Vec<u32> {
    let s = spec(arch);
    let mut rng = StdRng::seed_from_u64(s.seed ^ 0x0070_15e4_5eed);
    let n_regular = (s.n_vocab - 3) as u32;
    let mut ids = vec![BOS_ID];
    ids.extend((1..n).map(|_| 3 + rng.next_u32() % n_regular));
    ids
}
