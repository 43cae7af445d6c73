//! A `qwen3moe` model of real shapes, as large as asked, for the memory planner's runs on
//! files larger than memory: written to disk tensor by tensor (the routed experts as random
//! Q4_0 blocks, streamed), never held whole in memory. For speed and memory measurements,
//! not parity.

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
        }
    }

    /// Bytes of one layer's routed experts.
    pub fn expert_layer_bytes(&self) -> u64 {
        3 * (self.n_expert * self.n_ff_exp * self.n_embd / 32 * 18) as u64
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
        for (k, (name, shape, inputs)) in [
            ("ffn_gate_exps.weight", [d as u64, f, e], d),
            ("ffn_up_exps.weight", [d as u64, f, e], d),
            ("ffn_down_exps.weight", [f, d as u64, e], s.n_ff_exp),
        ]
        .into_iter()
        .enumerate()
        {
            let blocks = shape[0] * shape[1] * shape[2] / 32;
            let seed = 0x5eed ^ ((il as u64) << 8) ^ k as u64;
            // Codes uniform in -8..8 have a deviation of about 4.6.
            let scale = q4_0_scale(std(inputs) / 4.6);
            w.add_streamed_tensor(n(name), q4, &shape, blocks * 18, move |out| {
                random_q4_0(out, blocks, scale, seed)
            })?;
        }
    }
    w.write_file(path)
}

/// The f16 bytes of a Q4_0 block's scale `d`: those of a block whose largest value is `-8d`.
fn q4_0_scale(d: f32) -> [u8; 2] {
    let mut values = [0f32; 32];
    values[0] = -8.0 * d;
    let mut block = [0u8; 18];
    ferrox_core::quantize_row(GgmlType::Q4_0, &values, &mut block).expect("one Q4_0 block");
    [block[0], block[1]]
}

/// `blocks` Q4_0 blocks of scale `scale` and random codes.
fn random_q4_0(out: &mut dyn Write, blocks: u64, scale: [u8; 2], seed: u64) -> std::io::Result<()> {
    const CHUNK: u64 = 1 << 16;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut codes = vec![0u8; (CHUNK * 16) as usize];
    let mut buf = vec![0u8; (CHUNK * 18) as usize];
    let mut left = blocks;
    while left > 0 {
        let n = left.min(CHUNK) as usize;
        rng.fill_bytes(&mut codes[..n * 16]);
        for (block, code) in buf.chunks_exact_mut(18).zip(codes.chunks_exact(16)).take(n) {
            block[..2].copy_from_slice(&scale);
            block[2..].copy_from_slice(code);
        }
        out.write_all(&buf[..n * 18])?;
        left -= n as u64;
    }
    Ok(())
}
