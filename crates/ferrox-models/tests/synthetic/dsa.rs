//! Tiny all-F32 DeepSeek Sparse Attention models, for sweeping every context length against
//! llama.cpp (F32 weights and an f32 cache on both sides, so only summation order differs).
//!
//! Both have the MLA sweep models' shapes (n_embd 128, 2 heads, query LoRA 48, latent 64,
//! heads of 32 + 16 rotated key dims and 32 value dims, one leading dense layer, then 4
//! experts (2 used) in 2 groups with one shared expert, sigmoid routing with `exp_probs_b`,
//! normalised weights scaled by 2.5, YaRN factor 4 over an original context of 64), and a
//! lightning indexer of 4 heads of 64 selecting 32 positions, so every prompt longer than 32
//! tokens attends sparsely. Each file ends with one multi-token-prediction layer, which
//! neither engine runs.
//!
//! | model | layers | indexer |
//! | --- | --- | --- |
//! | deepseek32 | 3 + 1 MTP | every layer computes its selection; NeoX rotation |
//! | deepseek32-blocks | 3 + 1 MTP | as deepseek32, with 32 rotated key dims: latent rows of 96, whole blocks of a quantized cache |
//! | glm-dsa | 4 + 1 MTP | `indexer.types` [full, shared, full, shared]: shared layers have no indexer tensors and reuse the previous selection; interleaved rotation, key LayerNorm eps 0 |

use super::*;

/// The DSA models, by name (each named after its architecture).
pub const DSA_MODELS: &[&str] = &["deepseek32", "glm-dsa", "deepseek32-blocks"];

/// The lightning indexer of a DSA model.
#[derive(Clone, Debug)]
pub struct DsaSpec {
    pub n_head: usize,
    pub head_dim: usize,
    pub top_k: usize,
    /// Per trunk layer, whether it computes its own selection; written as
    /// `attention.indexer.types` when set (glm-dsa), every layer full otherwise.
    pub types: Option<Vec<bool>>,
    /// Multi-token-prediction layers after the trunk (`nextn_predict_layers`).
    pub nextn: usize,
}

impl DsaSpec {
    /// The indexer's metadata; `block_count` (`n_block`) counts the MTP layers too.
    pub(super) fn keys(&self, w: &mut GgufWriter, arch: &str, n_block: usize) {
        let key = |k: &str| format!("{arch}.{k}");
        w.set(key("attention.indexer.head_count"), self.n_head as u32);
        w.set(key("attention.indexer.key_length"), self.head_dim as u32);
        w.set(key("attention.indexer.top_k"), self.top_k as u32);
        if let Some(types) = &self.types {
            assert_eq!(types.len(), n_block - self.nextn);
            w.set(key("attention.indexer.types"), types.clone());
        }
        if self.nextn > 0 {
            w.set(key("nextn_predict_layers"), self.nextn as u32);
        }
    }

    /// Whether trunk layer `il` computes its own selection.
    fn full(&self, il: usize) -> bool {
        self.types.as_ref().is_none_or(|t| t[il])
    }

    /// Layer `il`'s indexer tensors (full layers; `deepseek32`'s MTP layers too, which
    /// llama.cpp requires), and an MTP layer's own projections.
    pub(super) fn layer_tensors(
        &self,
        w: &mut GgufWriter,
        v: &mut Values,
        s: &Spec,
        m: &MlaSpec,
        il: usize,
    ) {
        let n = |t: &str| format!("blk.{il}.{t}");
        let trunk = s.n_layer - self.nextn;
        let mtp = il >= trunk;
        let (hi, di) = (self.n_head, self.head_dim);
        let rank = m.q_lora_rank.expect("DSA models have a query LoRA");
        let ty = s.types.q;
        if (mtp && s.arch == "deepseek32") || (!mtp && self.full(il)) {
            vector(w, v, &n("indexer.k_norm.weight"), di, 1.0, 0.1);
            vector(w, v, &n("indexer.k_norm.bias"), di, 0.0, 0.1);
            matrix(w, v, &n("indexer.proj.weight"), ty, m.n_embd, hi, 0.1);
            matrix(w, v, &n("indexer.attn_k.weight"), ty, m.n_embd, di, 0.08);
            matrix(w, v, &n("indexer.attn_q_b.weight"), ty, rank, hi * di, 0.05);
        }
        if mtp {
            let e = m.n_embd;
            matrix(w, v, &n("nextn.eh_proj.weight"), ty, 2 * e, e, 0.06);
            vector(w, v, &n("nextn.enorm.weight"), e, 1.0, 0.1);
            vector(w, v, &n("nextn.hnorm.weight"), e, 1.0, 0.1);
        }
    }
}

/// A DSA model's spec (see the module docs).
pub fn spec(name: &str) -> Spec {
    let glm = name == "glm-dsa";
    let (arch, trunk, seed, types) = match name {
        "deepseek32" => ("deepseek32", 3, 0x011a_0030, None),
        "deepseek32-blocks" => ("deepseek32", 3, 0x011a_0032, None),
        "glm-dsa" => (
            "glm-dsa",
            4,
            0x011a_0031,
            Some(vec![true, false, true, false]),
        ),
        other => panic!("no DSA model `{other}`"),
    };
    let dsa = DsaSpec {
        n_head: 4,
        head_dim: 64,
        top_k: 32,
        types,
        nextn: 1,
    };
    let mla = MlaSpec {
        n_embd: 128,
        n_ff: 256,
        q_lora_rank: Some(48),
        kv_lora_rank: 64,
        qk_nope: 32,
        // deepseek32-blocks: latent rows of 64 + 32, whole blocks of the quantized caches.
        qk_rope: if name == "deepseek32-blocks" { 32 } else { 16 },
        v_head: 32,
        gating_func: Some(2),
        groups: Some((2, 1)),
        probs_bias: true,
        norm_weights: true,
        weights_scale: Some(2.5),
        // glm-dsa's loader never reads the log multiplier: it must not matter there.
        yarn: Some((4.0, 64, if glm { 0.0707 } else { 0.1 })),
        dsa: Some(dsa),
        ..MlaSpec::base()
    };
    Spec {
        arch,
        n_layer: trunk + 1,
        n_head: 2,
        n_head_kv: 1,
        head_dim: 0,
        n_vocab: 288,
        seed,
        rms_eps: 1e-6,
        rope_base: 10000.0,
        types: Types::untied(GgmlType::F32),
        moe: Some(MoeSpec {
            n_expert: 4,
            n_used: 2,
            n_ff_exp: 64,
            n_ff_shexp: None,
        }),
        mla: Some(mla),
    }
}

/// A DSA model's GGUF bytes.
pub fn gguf_bytes(name: &str) -> Vec<u8> {
    super::gguf_bytes(name)
}

/// The first `n` tokens of a DSA model's reference sequence.
pub fn token_ids(name: &str, n: usize) -> Vec<u32> {
    token_ids_n(name, n)
}

/// A `deepseek32` file with DeepSeek-V3.2's attention shapes on a small trunk, for speed
/// measurements, not for parity: 2 layers (1 dense), n_embd 1024, 16 heads (query LoRA 512,
/// latent 512, heads of 128 + 64 rotated key dims and 128 value dims), an indexer of 64
/// heads of 128 selecting `top_k` positions, 8 experts of 256 (2 used) with one shared
/// expert; Q8_0 matrices.
pub fn bench_gguf(top_k: usize) -> Vec<u8> {
    let mla = MlaSpec {
        n_embd: 1024,
        n_ff: 2048,
        q_lora_rank: Some(512),
        kv_lora_rank: 512,
        qk_nope: 128,
        qk_rope: 64,
        v_head: 128,
        gating_func: Some(2),
        dsa: Some(DsaSpec {
            n_head: 64,
            head_dim: 128,
            top_k,
            types: None,
            nextn: 0,
        }),
        ..MlaSpec::base()
    };
    let spec = Spec {
        arch: "deepseek32",
        n_layer: 2,
        n_head: 16,
        n_head_kv: 1,
        head_dim: 0,
        n_vocab: 288,
        seed: 0x011a_0130,
        rms_eps: 1e-6,
        rope_base: 10000.0,
        types: Types::untied(GgmlType::Q8_0),
        moe: Some(MoeSpec {
            n_expert: 8,
            n_used: 2,
            n_ff_exp: 256,
            n_ff_shexp: None,
        }),
        mla: Some(mla.clone()),
    };
    mla_gguf_bytes(&spec, &mla)
}
