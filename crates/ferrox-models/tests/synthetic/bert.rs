//! Tiny encoder models (every matrix F32, or a quantized type for the default-settings runs),
//! with a WordPiece vocabulary, for embedding tests against llama.cpp.
//!
//! | model | positions | QKV | FFN | pooling |
//! | --- | --- | --- | --- | --- |
//! | bert | learned (`position_embd`), token types | separate, biased | GELU, biased | cls |
//! | nomic-bert | NeoX RoPE (base 1000) | fused, no bias | SwiGLU, no bias | mean |
//! | bert-reranker | as bert, plus a classification head (`cls`, `cls.output`) | | | rank |
//! | jina-bert-v2 | ALiBi (max bias 8) | separate, biased, LayerNorms of q and k | GEGLU in one up matrix, biased | mean |
//!
//! | nomic-bert-moe | as nomic-bert | | layer 0 GELU, biased; layer 1 four ungated GELU experts, two used | mean |
//!
//! jina-bert-v2 also has the second post-attention norm (`attn_norm_2`).
//!
//! Both: 128 wide, 4 heads of 32, FFN 256, 2 layers, LayerNorm eps 1e-12, not causal,
//! context 512.

use super::*;

/// The encoder models, by name (each named after its architecture).
pub const ENCODER_MODELS: &[&str] = &[
    "bert",
    "nomic-bert",
    "bert-reranker",
    "jina-bert-v2",
    "nomic-bert-moe",
];

const E: usize = 128;
const FF: usize = 256;
const N_LAYER: usize = 2;
const N_HEAD: usize = 4;
const N_CTX: usize = 512;

/// `[PAD]`, `[UNK]`, `[CLS]`, `[SEP]`, `[MASK]`, then two-letter pieces as converted
/// WordPiece vocabularies hold them: `▁ba` starts a word, `ba` continues one.
pub const CLS_ID: u32 = 2;
pub const SEP_ID: u32 = 3;

fn wpm_vocab(w: &mut GgufWriter) -> usize {
    let mut tokens: Vec<String> = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        .iter()
        .map(|t| t.to_string())
        .collect();
    let mut types: Vec<i32> = vec![3, 2, 3, 3, 3];
    for c in "bcdfghjklmnprstvwxyz".chars() {
        for v in "aeiou".chars() {
            for prefix in ["\u{2581}", ""] {
                tokens.push(format!("{prefix}{c}{v}"));
                types.push(1);
            }
        }
    }
    let n = tokens.len();
    w.set("tokenizer.ggml.model", "bert");
    w.set(
        "tokenizer.ggml.tokens",
        OwnedValue::Array(OwnedArray::String(tokens)),
    );
    w.set("tokenizer.ggml.token_type", types);
    w.set("tokenizer.ggml.token_type_count", 2u32);
    w.set("tokenizer.ggml.bos_token_id", CLS_ID);
    w.set("tokenizer.ggml.seperator_token_id", SEP_ID);
    w.set("tokenizer.ggml.unknown_token_id", 1u32);
    w.set("tokenizer.ggml.padding_token_id", 0u32);
    w.set("tokenizer.ggml.mask_token_id", 4u32);
    n
}

/// The vocabulary, then from values seeded with `seed`: the token embedding, the token types,
/// learned positions (if `positions`) and the embedding norm. The values go on to the layers.
fn embeddings(w: &mut GgufWriter, seed: u64, ty: GgmlType, positions: bool) -> Values {
    let n_vocab = wpm_vocab(w);
    let mut vals = Values(StdRng::seed_from_u64(seed));
    let v = &mut vals;
    matrix(w, v, "token_embd.weight", ty, E, n_vocab, 0.5);
    matrix(w, v, "token_types.weight", GgmlType::F32, E, 2, 0.2);
    if positions {
        matrix(w, v, "position_embd.weight", ty, E, N_CTX, 0.2);
    }
    vector(w, v, "token_embd_norm.weight", E, 1.0, 0.1);
    vector(w, v, "token_embd_norm.bias", E, 0.0, 0.1);
    vals
}

/// A new file with the keys every encoder model has (`pooling` as llama.cpp numbers it).
fn header(a: &str, pooling: u32) -> GgufWriter {
    let mut w = GgufWriter::new();
    let key = |k: &str| format!("{a}.{k}");
    w.set("general.architecture", a);
    w.set("general.name", "ferrox synthetic test model");
    w.set(key("context_length"), N_CTX as u32);
    w.set(key("embedding_length"), E as u32);
    w.set(key("block_count"), N_LAYER as u32);
    w.set(key("feed_forward_length"), FF as u32);
    w.set(key("attention.head_count"), N_HEAD as u32);
    w.set(key("attention.layer_norm_epsilon"), 1e-12f32);
    w.set(key("attention.causal"), false);
    w.set(key("pooling_type"), pooling);
    w
}

/// The nomic-bert-moe model: layer 0 a dense GELU FFN, layer 1 four ungated GELU experts
/// (two used per token).
fn nomic_bert_moe(ty: GgmlType) -> Vec<u8> {
    let a = "nomic-bert-moe";
    let mut w = header(a, 1);
    w.set(format!("{a}.rope.freq_base"), 1000.0f32);
    w.set(format!("{a}.moe_every_n_layers"), 2u32);
    w.set(format!("{a}.expert_count"), 4u32);
    w.set(format!("{a}.expert_used_count"), 2u32);
    let mut vals = embeddings(&mut w, 0x0e_4b_e7, ty, false);
    let v = &mut vals;
    for il in 0..N_LAYER {
        let n = |t: &str| format!("blk.{il}.{t}");
        matrix(&mut w, v, &n("attn_qkv.weight"), ty, E, 3 * E, 0.1);
        matrix(&mut w, v, &n("attn_output.weight"), ty, E, E, 0.08);
        vector(&mut w, v, &n("attn_output_norm.weight"), E, 1.0, 0.1);
        vector(&mut w, v, &n("attn_output_norm.bias"), E, 0.0, 0.1);
        if il % 2 == 1 {
            let experts =
                |w: &mut GgufWriter, v: &mut Values, name: &str, cols: usize, rows: usize| {
                    let data = v.normals(cols * rows * 4, 0.0, 0.08);
                    add(w, &n(name), ty, &[cols as u64, rows as u64, 4], &data);
                };
            matrix(
                &mut w,
                v,
                &n("ffn_gate_inp.weight"),
                GgmlType::F32,
                E,
                4,
                0.3,
            );
            experts(&mut w, v, "ffn_up_exps.weight", E, FF);
            experts(&mut w, v, "ffn_down_exps.weight", FF, E);
        } else {
            matrix(&mut w, v, &n("ffn_up.weight"), ty, E, FF, 0.08);
            vector(&mut w, v, &n("ffn_up.bias"), FF, 0.0, 0.1);
            matrix(&mut w, v, &n("ffn_down.weight"), ty, FF, E, 0.06);
            vector(&mut w, v, &n("ffn_down.bias"), E, 0.0, 0.1);
        }
        vector(&mut w, v, &n("layer_output_norm.weight"), E, 1.0, 0.1);
        vector(&mut w, v, &n("layer_output_norm.bias"), E, 0.0, 0.1);
    }
    w.to_bytes()
}

/// The encoder model `name`, its matrices of type `ty`.
pub fn gguf_bytes_with(name: &str, ty: GgmlType) -> Vec<u8> {
    let (a, nomic, reranker) = match name {
        "bert" => ("bert", false, false),
        "nomic-bert" => ("nomic-bert", true, false),
        "bert-reranker" => ("bert", false, true),
        "jina-bert-v2" => return jina_bert_v2(ty),
        "nomic-bert-moe" => return nomic_bert_moe(ty),
        _ => panic!("no encoder model {name}"),
    };
    let key = |k: &str| format!("{a}.{k}");
    let pooling = match (nomic, reranker) {
        (true, _) => 1u32,
        (_, true) => 4,
        _ => 2,
    };
    let mut w = header(a, pooling);
    if nomic {
        w.set(key("rope.freq_base"), 1000.0f32);
    }
    let seed = 0xb3_21 + 6 * u64::from(nomic) + 11 * u64::from(reranker);
    let mut vals = embeddings(&mut w, seed, ty, !nomic);
    let v = &mut vals;
    for il in 0..N_LAYER {
        let n = |t: &str| format!("blk.{il}.{t}");
        if nomic {
            matrix(&mut w, v, &n("attn_qkv.weight"), ty, E, 3 * E, 0.1);
        } else {
            for (t, std) in [("attn_q", 0.1), ("attn_k", 0.1), ("attn_v", 0.08)] {
                matrix(&mut w, v, &n(&format!("{t}.weight")), ty, E, E, std);
                vector(&mut w, v, &n(&format!("{t}.bias")), E, 0.0, 0.1);
            }
        }
        matrix(&mut w, v, &n("attn_output.weight"), ty, E, E, 0.08);
        if !nomic {
            vector(&mut w, v, &n("attn_output.bias"), E, 0.0, 0.1);
        }
        vector(&mut w, v, &n("attn_output_norm.weight"), E, 1.0, 0.1);
        vector(&mut w, v, &n("attn_output_norm.bias"), E, 0.0, 0.1);
        matrix(&mut w, v, &n("ffn_up.weight"), ty, E, FF, 0.08);
        if nomic {
            matrix(&mut w, v, &n("ffn_gate.weight"), ty, E, FF, 0.08);
        } else {
            vector(&mut w, v, &n("ffn_up.bias"), FF, 0.0, 0.1);
        }
        matrix(&mut w, v, &n("ffn_down.weight"), ty, FF, E, 0.06);
        if !nomic {
            vector(&mut w, v, &n("ffn_down.bias"), E, 0.0, 0.1);
        }
        vector(&mut w, v, &n("layer_output_norm.weight"), E, 1.0, 0.1);
        vector(&mut w, v, &n("layer_output_norm.bias"), E, 0.0, 0.1);
    }
    if reranker {
        matrix(&mut w, v, "cls.weight", ty, E, E, 0.1);
        vector(&mut w, v, "cls.bias", E, 0.0, 0.1);
        matrix(&mut w, v, "cls.output.weight", GgmlType::F32, E, 1, 0.3);
        vector(&mut w, v, "cls.output.bias", 1, 0.0, 0.1);
    }
    w.to_bytes()
}

/// The jina-bert-v2 model.
fn jina_bert_v2(ty: GgmlType) -> Vec<u8> {
    let mut w = header("jina-bert-v2", 1);
    let mut vals = embeddings(&mut w, 0x1a_2b_3c, ty, false);
    let v = &mut vals;
    for il in 0..N_LAYER {
        let n = |t: &str| format!("blk.{il}.{t}");
        for (t, std) in [("attn_q", 0.1), ("attn_k", 0.1), ("attn_v", 0.08)] {
            matrix(&mut w, v, &n(&format!("{t}.weight")), ty, E, E, std);
            vector(&mut w, v, &n(&format!("{t}.bias")), E, 0.0, 0.1);
        }
        for t in ["attn_q_norm", "attn_k_norm"] {
            vector(&mut w, v, &n(&format!("{t}.weight")), E, 1.0, 0.1);
            vector(&mut w, v, &n(&format!("{t}.bias")), E, 0.0, 0.1);
        }
        matrix(&mut w, v, &n("attn_output.weight"), ty, E, E, 0.08);
        vector(&mut w, v, &n("attn_output.bias"), E, 0.0, 0.1);
        for t in ["attn_output_norm", "attn_norm_2", "layer_output_norm"] {
            vector(&mut w, v, &n(&format!("{t}.weight")), E, 1.0, 0.1);
            vector(&mut w, v, &n(&format!("{t}.bias")), E, 0.0, 0.1);
        }
        matrix(&mut w, v, &n("ffn_up.weight"), ty, E, 2 * FF, 0.08);
        vector(&mut w, v, &n("ffn_up.bias"), 2 * FF, 0.0, 0.1);
        matrix(&mut w, v, &n("ffn_down.weight"), ty, FF, E, 0.06);
        vector(&mut w, v, &n("ffn_down.bias"), E, 0.0, 0.1);
    }
    w.to_bytes()
}

/// The encoder model `name` with F32 matrices.
pub fn gguf_bytes(name: &str) -> Vec<u8> {
    gguf_bytes_with(name, GgmlType::F32)
}

/// `n` token ids of `name`'s reference sequence: `[CLS]`, words, `[SEP]`, as the tokenizer
/// adds them.
pub fn token_ids(name: &str, n: usize) -> Vec<u32> {
    assert!(n >= 2);
    let mut rng = StdRng::seed_from_u64(0x7e57 ^ name.len() as u64);
    let n_words = 2 * 20 * 5;
    let mut ids = vec![CLS_ID];
    ids.extend((0..n - 2).map(|_| 5 + rng.next_u32() % n_words));
    ids.push(SEP_ID);
    ids
}
