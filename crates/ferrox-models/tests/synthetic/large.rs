//! A `qwen3moe` model of real shapes, as large as asked, for the memory planner's runs on
//! files larger than memory and for MoE speed at frontier expert shapes: written to disk
//! tensor by tensor (the routed experts as random blocks of their type, streamed), never
//! held whole in memory. For speed and memory measurements, not parity.

use std::io::Write;
use std::path::Path;

use ferrox_gguf::{GgmlType, GgufWriter};
use rand::{rngs::StdRng, RngCore, SeedableRng};

use super::{matrix, vector, vocab, Values};

/// The shapes of a large MoE file.
#[derive(Clone, Copy, Debug)]
pub struct LargeMoe {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_expert: usize,
    pub n_used: usize,
    pub n_ff_exp: usize,
    /// The routed experts' type: Q4_0, Q4_K or IQ2_XXS.
    pub expert_type: GgmlType,
}

impl LargeMoe {
    /// Qwen3-30B-A3B's widths with wider experts (as the example): 4096 wide, 32
    /// query heads and 4 KV heads of 128, 128 experts of 1536, 8 used.
    pub fn qwen3moe(n_layer: usize) -> LargeMoe {
        LargeMoe {
            n_layer,
            n_embd: 4096,
            n_expert: 128,
            n_used: 8,
            n_ff_exp: 1536,
            expert_type: GgmlType::Q4_0,
        }
    }

    /// DeepSeek-V3's routed experts (7168 wide, 256 experts of 2048, 8 used) in a
    /// `qwen3moe` body (56 query heads of 128; no MLA, shared expert or dense layers).
    pub fn deepseek_v3_experts(n_layer: usize, expert_type: GgmlType) -> LargeMoe {
        LargeMoe {
            n_layer,
            n_embd: 7168,
            n_expert: 256,
            n_used: 8,
            n_ff_exp: 2048,
            expert_type,
        }
    }

    /// Kimi-K2's routed experts (7168 wide, 384 experts of 2048, 8 used), likewise.
    pub fn kimi_k2_experts(n_layer: usize, expert_type: GgmlType) -> LargeMoe {
        LargeMoe {
            n_expert: 384,
            ..Self::deepseek_v3_experts(n_layer, expert_type)
        }
    }

    /// Bytes of one layer's routed experts.
    pub fn expert_layer_bytes(&self) -> u64 {
        let (block_values, block_bytes) = random_block_shape(self.expert_type);
        3 * (self.n_expert * self.n_ff_exp * self.n_embd / block_values * block_bytes) as u64
    }
}

const HEAD_DIM: usize = 128;
const N_HEAD_KV: usize = 4;
const N_VOCAB: usize = 448;

/// Writes the model to `path`.
pub fn write(path: &Path, s: LargeMoe) -> ferrox_gguf::Result<()> {
    let a = "qwen3moe";
    let key = |k: &str| format!("{a}.{k}");
    let n_head = s.n_embd / HEAD_DIM;
    let mut w = GgufWriter::new();
    w.set("general.architecture", a);
    w.set("general.name", "ferrox synthetic large moe");
    w.set(key("context_length"), 4096u32);
    w.set(key("embedding_length"), s.n_embd as u32);
    w.set(key("block_count"), s.n_layer as u32);
    w.set(key("feed_forward_length"), (s.n_ff_exp * 4) as u32);
    w.set(key("attention.head_count"), n_head as u32);
    w.set(key("attention.head_count_kv"), N_HEAD_KV as u32);
    w.set(key("rope.dimension_count"), HEAD_DIM as u32);
    w.set(key("rope.freq_base"), 1_000_000f32);
    w.set(key("attention.layer_norm_rms_epsilon"), 1e-6f32);
    w.set(key("expert_count"), s.n_expert as u32);
    w.set(key("expert_used_count"), s.n_used as u32);
    w.set(key("expert_feed_forward_length"), s.n_ff_exp as u32);
    vocab(&mut w, N_VOCAB);

    let v = &mut Values(StdRng::seed_from_u64(0x1a29e));
    let d = s.n_embd;
    let (q_w, kv_w) = (n_head * HEAD_DIM, N_HEAD_KV * HEAD_DIM);
    let q4 = GgmlType::Q4_0;
    matrix(
        &mut w,
        v,
        "token_embd.weight",
        GgmlType::Q8_0,
        d,
        N_VOCAB,
        0.08,
    );
    vector(&mut w, v, "output_norm.weight", d, 1.0, 0.1);
    matrix(&mut w, v, "output.weight", GgmlType::Q8_0, d, N_VOCAB, 0.1);
    for il in 0..s.n_layer {
        let n = |t: &str| format!("blk.{il}.{t}");
        vector(&mut w, v, &n("attn_norm.weight"), d, 1.0, 0.1);
        // Deviations of 1/sqrt(inputs): activations keep their scale through the layers.
        let std = |inputs: usize| 1.0 / (inputs as f32).sqrt();
        matrix(&mut w, v, &n("attn_q.weight"), q4, d, q_w, std(d));
        matrix(&mut w, v, &n("attn_k.weight"), q4, d, kv_w, std(d));
        matrix(&mut w, v, &n("attn_v.weight"), q4, d, kv_w, std(d));
        vector(&mut w, v, &n("attn_q_norm.weight"), HEAD_DIM, 1.0, 0.1);
        vector(&mut w, v, &n("attn_k_norm.weight"), HEAD_DIM, 1.0, 0.1);
        matrix(&mut w, v, &n("attn_output.weight"), q4, q_w, d, std(q_w));
        vector(&mut w, v, &n("ffn_norm.weight"), d, 1.0, 0.1);
        matrix(
            &mut w,
            v,
            &n("ffn_gate_inp.weight"),
            GgmlType::F32,
            d,
            s.n_expert,
            std(d) * 2.0,
        );
        let (e, f) = (s.n_expert as u64, s.n_ff_exp as u64);
        let ty = s.expert_type;
        let (block_values, block_bytes) = random_block_shape(ty);
        for (k, (name, shape, inputs)) in [
            ("ffn_gate_exps.weight", [d as u64, f, e], d),
            ("ffn_up_exps.weight", [d as u64, f, e], d),
            ("ffn_down_exps.weight", [f, d as u64, e], s.n_ff_exp),
        ]
        .into_iter()
        .enumerate()
        {
            let blocks = shape[0] * shape[1] * shape[2] / block_values as u64;
            let seed = 0x5eed ^ ((il as u64) << 8) ^ k as u64;
            let scales = random_block_scales(ty, std(inputs));
            let len = blocks * block_bytes as u64;
            w.add_streamed_tensor(n(name), ty, &shape, len, move |out| {
                random_blocks(out, (blocks, block_bytes), &scales, seed)
            })?;
        }
    }
    w.write_file(path)
}

/// Values and bytes per block of the expert types [`write`] can fill with random blocks.
fn random_block_shape(ty: GgmlType) -> (usize, usize) {
    match ty {
        GgmlType::Q4_0 => (32, 18),
        GgmlType::Q4K => (256, 144),
        GgmlType::Iq2Xxs => (256, 66),
        other => panic!("no random blocks of {other:?}"),
    }
}

/// The fixed leading bytes of every random block of `ty` whose values have a deviation
/// near `std`: the f16 scales, the rest of each block being random codes.
fn random_block_scales(ty: GgmlType, std: f32) -> Vec<u8> {
    let f16 = |x: f32| f16_bytes(x).to_vec();
    match ty {
        // The scale of a block whose largest value is -8d: codes uniform in -8..8 have a
        // deviation of about 4.6.
        GgmlType::Q4_0 => {
            let mut values = [0f32; 32];
            values[0] = -8.0 * std / 4.6;
            let mut block = [0u8; 18];
            ferrox_core::quantize_row(GgmlType::Q4_0, &values, &mut block).expect("a block");
            block[..2].to_vec()
        }
        // d and dmin: random 6-bit sub-block scales (mean 31.5) times codes uniform in
        // 0..16 (deviation 4.6), minus random minimums.
        GgmlType::Q4K => [f16(std / (31.5 * 4.6)), f16(std / (31.5 * 4.6) * 7.5)].concat(),
        // d: random 4-bit scales (0.25·(s + 0.5), mean 2) times grid values near 25.
        GgmlType::Iq2Xxs => f16(std / (2.0 * 25.0)),
        other => panic!("no random blocks of {other:?}"),
    }
}

/// The f16 nearest below a positive `x` in f16's normal range (a scale need not round).
fn f16_bytes(x: f32) -> [u8; 2] {
    assert!(
        (6.2e-5..65000.0).contains(&x),
        "a scale of {x} is outside f16's normal range"
    );
    let bits = x.to_bits();
    let exponent = (bits >> 23) as i32 - 127 + 15;
    (((exponent as u32) << 10 | (bits >> 13) & 0x3FF) as u16).to_le_bytes()
}

/// `blocks` blocks of `block_bytes` each: `scales` first, random bytes after.
fn random_blocks(
    out: &mut dyn Write,
    (blocks, block_bytes): (u64, usize),
    scales: &[u8],
    seed: u64,
) -> std::io::Result<()> {
    const CHUNK: u64 = 1 << 16;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut buf = vec![0u8; CHUNK as usize * block_bytes];
    let mut left = blocks;
    while left > 0 {
        let n = left.min(CHUNK) as usize;
        let buf = &mut buf[..n * block_bytes];
        rng.fill_bytes(buf);
        for block in buf.chunks_exact_mut(block_bytes) {
            block[..scales.len()].copy_from_slice(scales);
        }
        out.write_all(buf)?;
        left -= n as u64;
    }
    Ok(())
}
