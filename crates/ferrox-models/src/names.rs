//! Tensor names as GGUF files spell them (the names of llama.cpp's `llama-arch.cpp`), with
//! the metadata keys that size each: one table for every engine.

/// A tensor of the file: `{base}.weight` (or `.bias`), or inside layer `il`
/// `blk.{il}.{base}.weight`.
#[derive(Clone, Copy, Debug)]
pub struct Tensor {
    pub base: &'static str,
    /// The `{arch}.*` keys (besides `embedding_length`) its expected shape comes from.
    pub sized_by: &'static [&'static str],
}

impl Tensor {
    const fn new(base: &'static str, sized_by: &'static [&'static str]) -> Tensor {
        Tensor { base, sized_by }
    }

    pub fn weight(self) -> String {
        format!("{}.weight", self.base)
    }

    pub fn layer(self, il: usize) -> String {
        format!("blk.{il}.{}.weight", self.base)
    }

    /// `blk.{il}.{base}`, for the tensors stored without a suffix.
    pub fn layer_bare(self, il: usize) -> String {
        format!("blk.{il}.{}", self.base)
    }

    pub fn layer_bias(self, il: usize) -> String {
        format!("blk.{il}.{}.bias", self.base)
    }

    pub fn bias(self) -> String {
        format!("{}.bias", self.base)
    }
}

const VOCAB: &[&str] = &["vocab_size"];
const FFN: &[&str] = &["feed_forward_length"];
const ATTN: &[&str] = &[
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
];
const QK_NORM: &[&str] = &["attention.head_count", "attention.key_length"];
const EXPERTS: &[&str] = &[
    "expert_count",
    "expert_feed_forward_length",
    "feed_forward_length",
];
const ROUTER: &[&str] = &["expert_count"];
const SHARED: &[&str] = &[
    "expert_shared_feed_forward_length",
    "expert_shared_count",
    "feed_forward_length",
];
const Q_LORA: &[&str] = &["attention.q_lora_rank"];
const KV_LORA: &[&str] = &["attention.kv_lora_rank", "rope.dimension_count"];
const KV_B: &[&str] = &[
    "attention.head_count",
    "attention.kv_lora_rank",
    "attention.key_length_mla",
    "attention.value_length_mla",
];

pub const TOKEN_EMBD: Tensor = Tensor::new("token_embd", VOCAB);
pub const OUTPUT: Tensor = Tensor::new("output", VOCAB);
pub const OUTPUT_NORM: Tensor = Tensor::new("output_norm", &[]);
pub const ROPE_FREQS: Tensor = Tensor::new("rope_freqs", &["rope.dimension_count"]);

pub const ATTN_NORM: Tensor = Tensor::new("attn_norm", &[]);
pub const ATTN_Q: Tensor = Tensor::new("attn_q", ATTN);
pub const ATTN_K: Tensor = Tensor::new("attn_k", ATTN);
pub const ATTN_V: Tensor = Tensor::new("attn_v", ATTN);
pub const ATTN_QKV: Tensor = Tensor::new("attn_qkv", ATTN);
pub const ATTN_OUTPUT: Tensor = Tensor::new("attn_output", ATTN);
pub const ATTN_Q_NORM: Tensor = Tensor::new("attn_q_norm", QK_NORM);
pub const ATTN_K_NORM: Tensor = Tensor::new("attn_k_norm", QK_NORM);
pub const ATTN_POST_NORM: Tensor = Tensor::new("post_attention_norm", &[]);

pub const ATTN_Q_A: Tensor = Tensor::new("attn_q_a", Q_LORA);

/// The multi-token-prediction block's own tensors (`blk.{n_layer}.nextn.*`).
pub const NEXTN_EH_PROJ: Tensor = Tensor::new("nextn.eh_proj", &[]);
pub const NEXTN_ENORM: Tensor = Tensor::new("nextn.enorm", &[]);
pub const NEXTN_HNORM: Tensor = Tensor::new("nextn.hnorm", &[]);
pub const NEXTN_EMBED_TOKENS: Tensor = Tensor::new("nextn.embed_tokens", VOCAB);
pub const NEXTN_SHARED_HEAD_HEAD: Tensor = Tensor::new("nextn.shared_head_head", VOCAB);
pub const NEXTN_SHARED_HEAD_NORM: Tensor = Tensor::new("nextn.shared_head_norm", &[]);
pub const ATTN_Q_A_NORM: Tensor = Tensor::new("attn_q_a_norm", Q_LORA);
pub const ATTN_Q_B: Tensor = Tensor::new("attn_q_b", Q_LORA);
pub const ATTN_KV_A_MQA: Tensor = Tensor::new("attn_kv_a_mqa", KV_LORA);
pub const ATTN_KV_A_NORM: Tensor = Tensor::new("attn_kv_a_norm", KV_LORA);
pub const ATTN_K_B: Tensor = Tensor::new("attn_k_b", KV_B);
pub const ATTN_V_B: Tensor = Tensor::new("attn_v_b", KV_B);
pub const ATTN_KV_B: Tensor = Tensor::new("attn_kv_b", KV_B);

pub const FFN_NORM: Tensor = Tensor::new("ffn_norm", &[]);
pub const FFN_POST_NORM: Tensor = Tensor::new("post_ffw_norm", &[]);
pub const FFN_GATE: Tensor = Tensor::new("ffn_gate", FFN);
pub const FFN_UP: Tensor = Tensor::new("ffn_up", FFN);
pub const FFN_DOWN: Tensor = Tensor::new("ffn_down", FFN);

pub const FFN_GATE_INP: Tensor = Tensor::new("ffn_gate_inp", ROUTER);
pub const FFN_EXP_PROBS_B: Tensor = Tensor::new("exp_probs_b", ROUTER);
pub const FFN_GATE_EXPS: Tensor = Tensor::new("ffn_gate_exps", EXPERTS);
pub const FFN_UP_EXPS: Tensor = Tensor::new("ffn_up_exps", EXPERTS);
pub const FFN_GATE_UP_EXPS: Tensor = Tensor::new("ffn_gate_up_exps", EXPERTS);
pub const FFN_DOWN_EXPS: Tensor = Tensor::new("ffn_down_exps", EXPERTS);

/// Whether `name` is a layer's routed experts (`blk.N.ffn_*_exps.weight`).
pub fn is_routed_experts(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("blk.") else {
        return false;
    };
    let Some((layer, tail)) = rest.split_once('.') else {
        return false;
    };
    layer.bytes().all(|b| b.is_ascii_digit())
        && [FFN_GATE_EXPS, FFN_UP_EXPS, FFN_GATE_UP_EXPS, FFN_DOWN_EXPS]
            .iter()
            .any(|t| tail.strip_suffix(".weight") == Some(t.base))
}
pub const FFN_GATE_SHEXP: Tensor = Tensor::new("ffn_gate_shexp", SHARED);
pub const FFN_UP_SHEXP: Tensor = Tensor::new("ffn_up_shexp", SHARED);
pub const FFN_DOWN_SHEXP: Tensor = Tensor::new("ffn_down_shexp", SHARED);
pub const FFN_GATE_INP_SHEXP: Tensor = Tensor::new("ffn_gate_inp_shexp", SHARED);

const INDEXER: &[&str] = &[
    "attention.indexer.head_count",
    "attention.indexer.key_length",
];
const INDEXER_Q: &[&str] = &[
    "attention.q_lora_rank",
    "attention.indexer.head_count",
    "attention.indexer.key_length",
];

/// DeepSeek Sparse Attention's lightning indexer.
pub const INDEXER_K_NORM: Tensor = Tensor::new("indexer.k_norm", INDEXER);
pub const INDEXER_PROJ: Tensor = Tensor::new("indexer.proj", INDEXER);
pub const INDEXER_ATTN_K: Tensor = Tensor::new("indexer.attn_k", INDEXER);
pub const INDEXER_ATTN_Q_B: Tensor = Tensor::new("indexer.attn_q_b", INDEXER_Q);

const DS4_ATTN: &[&str] = &["attention.head_count", "attention.key_length"];
const DS4_OUT: &[&str] = &[
    "attention.head_count",
    "attention.key_length",
    "attention.output_group_count",
    "attention.output_lora_rank",
];
const DS4_COMPRESSOR: &[&str] = &["attention.key_length", "attention.compress_ratios"];
const DS4_INDEXER_COMPRESSOR: &[&str] =
    &["attention.indexer.key_length", "attention.compress_ratios"];
const HC: &[&str] = &["hyper_connection.count"];

/// DeepSeek-V4's attention: one key-value head, the grouped low-rank output, the sinks.
pub const ATTN_KV: Tensor = Tensor::new("attn_kv", DS4_ATTN);
pub const ATTN_OUTPUT_A: Tensor = Tensor::new("attn_output_a", DS4_OUT);
pub const ATTN_OUTPUT_B: Tensor = Tensor::new("attn_output_b", DS4_OUT);
pub const ATTN_SINKS: Tensor = Tensor::new("attn_sinks", &["attention.head_count"]);
/// Its compressors (key rows every 4 or 128 positions) and the indexer's.
pub const ATTN_COMPRESSOR_KV: Tensor = Tensor::new("attn_compressor_kv", DS4_COMPRESSOR);
pub const ATTN_COMPRESSOR_GATE: Tensor = Tensor::new("attn_compressor_gate", DS4_COMPRESSOR);
pub const ATTN_COMPRESSOR_APE: Tensor = Tensor::new("attn_compressor_ape", DS4_COMPRESSOR);
pub const ATTN_COMPRESSOR_NORM: Tensor = Tensor::new("attn_compressor_norm", DS4_COMPRESSOR);
pub const INDEXER_COMPRESSOR_KV: Tensor =
    Tensor::new("indexer_compressor_kv", DS4_INDEXER_COMPRESSOR);
pub const INDEXER_COMPRESSOR_GATE: Tensor =
    Tensor::new("indexer_compressor_gate", DS4_INDEXER_COMPRESSOR);
pub const INDEXER_COMPRESSOR_APE: Tensor =
    Tensor::new("indexer_compressor_ape", DS4_INDEXER_COMPRESSOR);
pub const INDEXER_COMPRESSOR_NORM: Tensor =
    Tensor::new("indexer_compressor_norm", DS4_INDEXER_COMPRESSOR);
/// Its hyper-connections (per sub-block, and the output head's).
pub const HC_ATTN_FN: Tensor = Tensor::new("hc_attn_fn", HC);
pub const HC_ATTN_BASE: Tensor = Tensor::new("hc_attn_base", HC);
pub const HC_ATTN_SCALE: Tensor = Tensor::new("hc_attn_scale", HC);
pub const HC_FFN_FN: Tensor = Tensor::new("hc_ffn_fn", HC);
pub const HC_FFN_BASE: Tensor = Tensor::new("hc_ffn_base", HC);
pub const HC_FFN_SCALE: Tensor = Tensor::new("hc_ffn_scale", HC);
pub const OUTPUT_HC_FN: Tensor = Tensor::new("output_hc_fn", HC);
pub const OUTPUT_HC_BASE: Tensor = Tensor::new("output_hc_base", HC);
pub const OUTPUT_HC_SCALE: Tensor = Tensor::new("output_hc_scale", HC);
/// Its hash routing: token id → experts.
pub const FFN_GATE_TID2EID: Tensor =
    Tensor::new("ffn_gate_tid2eid", &["expert_used_count", "vocab_size"]);

const KDA: &[&str] = &["attention.head_count", "kda.head_dim"];
const KDA_CONV: &[&str] = &["attention.head_count", "kda.head_dim", "ssm.conv_kernel"];

pub const SSM_CONV1D_Q: Tensor = Tensor::new("ssm_conv1d_q", KDA_CONV);
pub const SSM_CONV1D_K: Tensor = Tensor::new("ssm_conv1d_k", KDA_CONV);
pub const SSM_CONV1D_V: Tensor = Tensor::new("ssm_conv1d_v", KDA_CONV);
pub const SSM_F_A: Tensor = Tensor::new("ssm_f_a", KDA);
pub const SSM_F_B: Tensor = Tensor::new("ssm_f_b", KDA);
pub const SSM_BETA: Tensor = Tensor::new("ssm_beta", KDA);
/// Stored without a `.weight` suffix (`blk.N.ssm_a`).
pub const SSM_A: Tensor = Tensor::new("ssm_a", KDA);
pub const SSM_DT: Tensor = Tensor::new("ssm_dt", KDA);
pub const SSM_G_A: Tensor = Tensor::new("ssm_g_a", KDA);
pub const SSM_G_B: Tensor = Tensor::new("ssm_g_b", KDA);
pub const SSM_NORM: Tensor = Tensor::new("ssm_norm", KDA);

/// The encoders' (BERT's) own: learned positions, token types, the post-norms.
pub const POSITION_EMBD: Tensor = Tensor::new("position_embd", &["context_length"]);
pub const TOKEN_TYPES: Tensor = Tensor::new("token_types", &[]);
pub const TOKEN_EMBD_NORM: Tensor = Tensor::new("token_embd_norm", &[]);
pub const ATTN_OUTPUT_NORM: Tensor = Tensor::new("attn_output_norm", &[]);
pub const LAYER_OUTPUT_NORM: Tensor = Tensor::new("layer_output_norm", &[]);
/// A second post-attention LayerNorm (jina-bert-v2).
pub const ATTN_NORM_2: Tensor = Tensor::new("attn_norm_2", &[]);
/// A reranker's classification head: a dense layer with tanh (`cls`), then the scores
/// (`cls.output`, one row per label).
pub const CLS: Tensor = Tensor::new("cls", &[]);
pub const CLS_OUTPUT: Tensor = Tensor::new("cls.output", &[]);

/// Every tensor ferrox reads.
pub const ALL: &[Tensor] = &[
    TOKEN_EMBD,
    OUTPUT,
    OUTPUT_NORM,
    ROPE_FREQS,
    ATTN_NORM,
    ATTN_Q,
    ATTN_K,
    ATTN_V,
    ATTN_QKV,
    ATTN_OUTPUT,
    ATTN_Q_NORM,
    ATTN_K_NORM,
    ATTN_POST_NORM,
    ATTN_Q_A,
    ATTN_Q_A_NORM,
    ATTN_Q_B,
    ATTN_KV_A_MQA,
    ATTN_KV_A_NORM,
    ATTN_K_B,
    ATTN_V_B,
    ATTN_KV_B,
    FFN_NORM,
    FFN_POST_NORM,
    FFN_GATE,
    FFN_UP,
    FFN_DOWN,
    FFN_GATE_INP,
    FFN_EXP_PROBS_B,
    FFN_GATE_EXPS,
    FFN_UP_EXPS,
    FFN_GATE_UP_EXPS,
    FFN_DOWN_EXPS,
    FFN_GATE_SHEXP,
    FFN_UP_SHEXP,
    FFN_DOWN_SHEXP,
    FFN_GATE_INP_SHEXP,
    INDEXER_K_NORM,
    INDEXER_PROJ,
    INDEXER_ATTN_K,
    INDEXER_ATTN_Q_B,
    SSM_CONV1D_Q,
    SSM_CONV1D_K,
    SSM_CONV1D_V,
    SSM_F_A,
    SSM_F_B,
    SSM_BETA,
    SSM_A,
    SSM_DT,
    SSM_G_A,
    SSM_G_B,
    SSM_NORM,
    ATTN_KV,
    ATTN_OUTPUT_A,
    ATTN_OUTPUT_B,
    ATTN_SINKS,
    ATTN_COMPRESSOR_KV,
    ATTN_COMPRESSOR_GATE,
    ATTN_COMPRESSOR_APE,
    ATTN_COMPRESSOR_NORM,
    INDEXER_COMPRESSOR_KV,
    INDEXER_COMPRESSOR_GATE,
    INDEXER_COMPRESSOR_APE,
    INDEXER_COMPRESSOR_NORM,
    HC_ATTN_FN,
    HC_ATTN_BASE,
    HC_ATTN_SCALE,
    HC_FFN_FN,
    HC_FFN_BASE,
    HC_FFN_SCALE,
    OUTPUT_HC_FN,
    OUTPUT_HC_BASE,
    OUTPUT_HC_SCALE,
    FFN_GATE_TID2EID,
    POSITION_EMBD,
    TOKEN_TYPES,
    TOKEN_EMBD_NORM,
    ATTN_OUTPUT_NORM,
    LAYER_OUTPUT_NORM,
    ATTN_NORM_2,
    CLS,
    CLS_OUTPUT,
];

/// The table entry of a tensor named in the file (`blk.N.` prefix and suffix removed).
pub fn lookup(name: &str) -> Option<Tensor> {
    let name = match name.strip_prefix("blk.") {
        Some(rest) => rest.split_once('.').map_or(rest, |(_, t)| t),
        None => name,
    };
    let base = name.rsplit_once('.').map_or(name, |(b, _)| b);
    ALL.iter().copied().find(|t| t.base == base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_unique() {
        for t in ALL {
            assert_eq!(lookup(&t.layer(3)).map(|f| f.base), Some(t.base));
            assert_eq!(lookup(&t.weight()).map(|f| f.base), Some(t.base));
            assert_eq!(
                ALL.iter().filter(|u| u.base == t.base).count(),
                1,
                "{}",
                t.base
            );
        }
        assert_eq!(
            lookup("blk.0.exp_probs_b.bias").map(|t| t.base),
            Some("exp_probs_b")
        );
        assert!(lookup("blk.1.something_else.weight").is_none());
    }
}
