//! A tiny Gemma 3 with image input: an all-F32 `gemma3` text model, its mmproj (a SigLIP
//! vision tower with Gemma 3's pooling projector, as llama.cpp's `clip` loader reads
//! `clip.projector_type = "gemma3"`), and test images as PNG files. The reference outputs
//! llama.cpp computes from them are in `fixtures/vision/` (`scripts/reference/gen-vision-refs.sh`).
//!
//! Text model (`gemma3`): n_embd 128, 6 layers (llama.cpp's default pattern: 5 sliding-window
//! layers, then 1 global), 4 query heads / 1 KV head of 64 (query width 256), n_ff 256, window
//! 8 (smaller than the 16 image tokens, so that it cuts through an image), RoPE base 1e6 global
//! and 1e4 local, every matrix F32, output tied to the embedding. Its vocabulary is
//! the SentencePiece-style one of the other synthetic models with Gemma's control tokens
//! `<start_of_turn>`, `<end_of_turn>`, `<start_of_image>`, `<end_of_image>` after the byte
//! tokens (see [`START_OF_IMAGE_ID`] etc.), and `add_space_prefix` false as in Gemma files.
//!
//! Projector (`clip`, `gemma3`): 64x64 images in 8x8 patches (8x8 = 64 patches), width 64,
//! 2 layers of 4 heads (head dim 16), FFN 128 with GELU, LayerNorm eps 1e-6, then 2x2 average
//! pooling (`projector.scale_factor` 2: 16 image tokens), RMS norm with `mm.soft_emb_norm` and
//! the `mm.input_projection` to the text width.
//!
//! The FFN tensors are in the current orientation: `ffn_up` is SigLIP's `fc1` (ggml
//! `[n_embd, n_ff]`), `ffn_down` its `fc2` (`[n_ff, n_embd]`), which is what
//! `convert_hf_to_gguf.py` writes today. llama.cpp swaps up and down (and their biases) when it
//! finds `ffn_down.ne[0] == n_embd` (files from older converters, which named `fc1` "down");
//! these files do not trigger that.
//!
//! Benchmark files, for speed and not parity ([`gemma3_bench_mmproj_bytes`],
//! [`gemma3_bench_text_bytes`], [`bench_image_png`]): projectors of SigLIP-so400m's layer
//! shapes at 224, 448 or 896 pixels with fewer layers than the real 27, and a Gemma 3 4B-wide
//! text model of few layers to serve them with (`scripts/bench-vision.sh`).
//!
//! Deterministic as the rest of the synthetic models: seeded `StdRng`, exact arithmetic.

use ferrox_gguf::{GgmlType, GgufWriter};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{add, matrix, vector, Values, BOS_ID, EOS_ID};

/// The text model's width (= the projector's `projection_dim`).
pub const TEXT_N_EMBD: usize = 128;
pub const TEXT_N_FF: usize = 256;
pub const TEXT_N_LAYER: usize = 6;
pub const TEXT_N_HEAD: usize = 4;
pub const TEXT_N_HEAD_KV: usize = 1;
pub const TEXT_HEAD_DIM: usize = 64;
pub const TEXT_SLIDING_WINDOW: usize = 8;
pub const TEXT_N_VOCAB: usize = 320;

/// The control tokens after `<unk>` `<s>` `</s>` and the 256 byte tokens.
pub const CONTROL_TOKENS: [&str; 4] = [
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
];
pub const START_OF_TURN_ID: u32 = 259;
pub const END_OF_TURN_ID: u32 = 260;
pub const START_OF_IMAGE_ID: u32 = 261;
pub const END_OF_IMAGE_ID: u32 = 262;
pub const TEXT_BOS_ID: u32 = BOS_ID;
pub const TEXT_EOS_ID: u32 = EOS_ID;

/// The projector's shapes.
pub const IMAGE_SIZE: usize = 64;
pub const PATCH_SIZE: usize = 8;
pub const VISION_N_EMBD: usize = 64;
pub const VISION_N_FF: usize = 128;
pub const VISION_N_LAYER: usize = 2;
pub const VISION_N_HEAD: usize = 4;
pub const VISION_EPS: f32 = 1e-6;
/// Pooling kernel per side: (64 / 8) / 2 = 4 tokens per side.
pub const SCALE_FACTOR: usize = 2;
pub const IMAGE_MEAN: [f32; 3] = [0.48, 0.46, 0.41];
pub const IMAGE_STD: [f32; 3] = [0.27, 0.26, 0.28];
/// Patches per side and image tokens.
pub const N_PATCHES_SIDE: usize = IMAGE_SIZE / PATCH_SIZE;
pub const N_IMAGE_TOKENS: usize = (N_PATCHES_SIDE / SCALE_FACTOR) * (N_PATCHES_SIDE / SCALE_FACTOR);

const TEXT_SEED: u64 = 0x011a_0301;
const MMPROJ_SEED: u64 = 0x011a_0302;

/// A `gemma3` text model's shapes and matrix type.
#[derive(Clone, Copy, Debug)]
pub struct TextShape {
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub sliding_window: usize,
    pub context_length: usize,
    /// Every matrix (the embedding too); norms are F32.
    pub ty: GgmlType,
}

/// The tiny test model's shapes.
pub const TEXT: TextShape = TextShape {
    n_embd: TEXT_N_EMBD,
    n_ff: TEXT_N_FF,
    n_layer: TEXT_N_LAYER,
    n_head: TEXT_N_HEAD,
    n_head_kv: TEXT_N_HEAD_KV,
    head_dim: TEXT_HEAD_DIM,
    sliding_window: TEXT_SLIDING_WINDOW,
    context_length: 2048,
    ty: GgmlType::F32,
};

/// The benchmark text model: Gemma 3 4B's widths (n_embd 2560, n_ff 10240, 8 query heads and
/// 4 KV heads of 256, window 1024) with [`BENCH_TEXT_N_LAYER`] layers instead of 34, Q8_0
/// matrices, the tiny model's 320-token vocabulary.
pub const BENCH_TEXT: TextShape = TextShape {
    n_embd: 2560,
    n_ff: 10240,
    n_layer: BENCH_TEXT_N_LAYER,
    n_head: 8,
    n_head_kv: 4,
    head_dim: 256,
    sliding_window: 1024,
    context_length: 8192,
    ty: GgmlType::Q8_0,
};
pub const BENCH_TEXT_N_LAYER: usize = 4;

/// The `gemma3` text model (every matrix F32).
pub fn gemma3_text_bytes() -> Vec<u8> {
    gemma3_text_bytes_with(&TEXT)
}

/// The benchmark text model ([`BENCH_TEXT`]), for `mm.input_projection` of the benchmark
/// projectors ([`gemma3_bench_mmproj_bytes`]).
pub fn gemma3_bench_text_bytes() -> Vec<u8> {
    gemma3_text_bytes_with(&BENCH_TEXT)
}

/// Deviation of weights with `fan_in` inputs that keeps the tiny model's scale of outputs,
/// given the deviation the tiny model uses at `tiny_fan_in` (exactly 1 for the tiny shapes).
fn gain(tiny_fan_in: usize, fan_in: usize) -> f32 {
    (tiny_fan_in as f32 / fan_in as f32).sqrt()
}

fn gemma3_text_bytes_with(s: &TextShape) -> Vec<u8> {
    let a = "gemma3";
    let key = |k: &str| format!("{a}.{k}");
    let mut w = GgufWriter::new();
    w.set("general.architecture", a);
    w.set("general.name", "ferrox synthetic test model");
    w.set(key("context_length"), s.context_length as u32);
    w.set(key("embedding_length"), s.n_embd as u32);
    w.set(key("block_count"), s.n_layer as u32);
    w.set(key("feed_forward_length"), s.n_ff as u32);
    w.set(key("attention.head_count"), s.n_head as u32);
    w.set(key("attention.head_count_kv"), s.n_head_kv as u32);
    w.set(key("attention.key_length"), s.head_dim as u32);
    w.set(key("attention.value_length"), s.head_dim as u32);
    w.set(key("rope.dimension_count"), s.head_dim as u32);
    w.set(key("rope.freq_base"), 1_000_000.0f32);
    w.set(key("rope.freq_base_swa"), 10_000.0f32);
    w.set(key("attention.layer_norm_rms_epsilon"), 1e-6f32);
    // No pattern key, as Gemma 3 converters write: llama.cpp's default (5 local, 1 global).
    w.set(key("attention.sliding_window"), s.sliding_window as u32);
    vocab(&mut w);

    let mut vals = Values(StdRng::seed_from_u64(TEXT_SEED));
    let v = &mut vals;
    let ty = s.ty;
    let (e, f, hd) = (s.n_embd, s.n_ff, s.head_dim);
    let (q_w, kv_w) = (s.n_head * hd, s.n_head_kv * hd);
    let (g_e, g_q, g_f) = (
        gain(TEXT_N_EMBD, e),
        gain(TEXT_N_HEAD * TEXT_HEAD_DIM, q_w),
        gain(TEXT_N_FF, f),
    );
    // Token rows are scaled by sqrt(128) ~ 11.3 on input: ~0.45 per value (image embedding
    // rows from the projector hold ~0.8). Larger rows make the tied output favour the tokens
    // already in the context, and greedy decoding repeats one token.
    matrix(
        &mut w,
        v,
        "token_embd.weight",
        ty,
        e,
        TEXT_N_VOCAB,
        0.04 * g_e,
    );
    vector(&mut w, v, "output_norm.weight", e, 1.0, 0.1);
    for il in 0..s.n_layer {
        let n = |t: &str| format!("blk.{il}.{t}");
        vector(&mut w, v, &n("attn_norm.weight"), e, 1.0, 0.1);
        matrix(&mut w, v, &n("attn_q.weight"), ty, e, q_w, 0.1 * g_e);
        matrix(&mut w, v, &n("attn_k.weight"), ty, e, kv_w, 0.1 * g_e);
        matrix(&mut w, v, &n("attn_v.weight"), ty, e, kv_w, 0.08 * g_e);
        // Q/K norm weights around 2: scores of deviation ~4 rather than ~1, attention sharp
        // enough that the image and the recent tokens matter to what is generated.
        vector(&mut w, v, &n("attn_q_norm.weight"), hd, 2.0, 0.2);
        vector(&mut w, v, &n("attn_k_norm.weight"), hd, 2.0, 0.2);
        matrix(&mut w, v, &n("attn_output.weight"), ty, q_w, e, 0.06 * g_q);
        vector(&mut w, v, &n("post_attention_norm.weight"), e, 1.0, 0.1);
        vector(&mut w, v, &n("ffn_norm.weight"), e, 1.0, 0.1);
        matrix(&mut w, v, &n("ffn_gate.weight"), ty, e, f, 0.08 * g_e);
        matrix(&mut w, v, &n("ffn_up.weight"), ty, e, f, 0.08 * g_e);
        matrix(&mut w, v, &n("ffn_down.weight"), ty, f, e, 0.06 * g_f);
        vector(&mut w, v, &n("post_ffw_norm.weight"), e, 1.0, 0.1);
    }
    w.to_bytes()
}

/// `<unk>` `<s>` `</s>`, the 256 byte tokens, Gemma's four control tokens, the word-start mark
/// `▁` (alone, so that a space is one token: the two-letter pieces cannot grow from single
/// characters by SentencePiece merges, words would be unreachable), then two-letter pieces
/// with and without it.
fn vocab(w: &mut GgufWriter) {
    super::spm_vocab(w, TEXT_N_VOCAB, &CONTROL_TOKENS, &["\u{2581}"]);
    w.set("tokenizer.ggml.add_space_prefix", false);
    w.set("tokenizer.chat_template", CHAT_TEMPLATE);
}

/// Gemma's turn format, short (llama.cpp's tools refuse a model without a template; this one
/// is recognised as Gemma's by its `<start_of_turn>`).
pub const CHAT_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}\
{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}\
{{ '<start_of_turn>' + role + '\\n' + message['content'] + '<end_of_turn>\\n' }}{% endfor %}\
{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}";

/// The Gemma 3 mmproj. `ty` F32: every tensor F32. `ty` F16: what `convert_hf_to_gguf.py
/// --outtype f16` makes of a Gemma 3 vision tower: the attention and FFN matrices and
/// `mm.input_projection.weight` F16; the patch embedding, the position embeddings (the
/// converter keeps every `.embeddings.` tensor F32 for Gemma 3), the norms and the biases F32.
/// (The real converter stores `mm.input_projection.weight` as F16 even with `--outtype f32`;
/// the F32 file here does not, so that it is F32 throughout.)
///
/// Tensors, in ggml shape order:
///
/// | name | ne | F16 file |
/// | --- | --- | --- |
/// | `v.patch_embd.weight` | [8, 8, 3, 64] | F32 |
/// | `v.patch_embd.bias` | [64] | F32 |
/// | `v.position_embd.weight` | [64, 64] | F32 |
/// | `v.blk.N.ln1.{weight,bias}` | [64] | F32 |
/// | `v.blk.N.attn_{q,k,v,out}.weight` | [64, 64] | F16 |
/// | `v.blk.N.attn_{q,k,v,out}.bias` | [64] | F32 |
/// | `v.blk.N.ln2.{weight,bias}` | [64] | F32 |
/// | `v.blk.N.ffn_up.weight` | [64, 128] | F16 |
/// | `v.blk.N.ffn_up.bias` | [128] | F32 |
/// | `v.blk.N.ffn_down.weight` | [128, 64] | F16 |
/// | `v.blk.N.ffn_down.bias` | [64] | F32 |
/// | `v.post_ln.{weight,bias}` | [64] | F32 |
/// | `mm.soft_emb_norm.weight` | [64] | F32 |
/// | `mm.input_projection.weight` | [128, 64] | F16 |
///
/// `mm.input_projection.weight` is Gemma's `mm_input_projection_weight` as stored (vision
/// width x text width, applied as `x @ W`), so its ggml `ne[0]` is the text width; llama.cpp
/// multiplies by its transpose. `mm.soft_emb_norm.weight` holds the full multiplier (the
/// converter adds Gemma's `1 +`).
pub fn gemma3_mmproj_bytes(ty: GgmlType) -> Vec<u8> {
    assert!(
        ty == GgmlType::F32 || ty == GgmlType::F16,
        "mmproj type must be F32 or F16"
    );
    mmproj_bytes(&MMPROJ, ty)
}

/// A Gemma 3 projector's shapes.
#[derive(Clone, Copy, Debug)]
pub struct MmprojShape {
    pub image_size: usize,
    pub patch_size: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub n_head: usize,
    /// `clip.vision.projector.scale_factor`; `None` leaves the key out, as the converter does
    /// for every real Gemma 3 (llama.cpp's default, 4).
    pub scale_factor: Option<usize>,
    /// The text model's width.
    pub projection_dim: usize,
}

/// The tiny test projector's shapes.
pub const MMPROJ: MmprojShape = MmprojShape {
    image_size: IMAGE_SIZE,
    patch_size: PATCH_SIZE,
    n_embd: VISION_N_EMBD,
    n_ff: VISION_N_FF,
    n_layer: VISION_N_LAYER,
    n_head: VISION_N_HEAD,
    scale_factor: Some(SCALE_FACTOR),
    projection_dim: TEXT_N_EMBD,
};

/// The image sizes of the benchmark projectors: 16, 32 and 64 patches a side, 16, 64 and 256
/// image tokens (896 is every real Gemma 3's).
pub const BENCH_IMAGE_SIZES: [usize; 3] = [224, 448, 896];

/// The shapes of a benchmark projector: SigLIP-so400m's layers as every Gemma 3 mmproj has
/// them (width 1152, FFN 4304, 16 heads of 72, 14-pixel patches) for `image_size`
/// (a multiple of 56: 4x4 pooling), `n_layer` layers (real files: 27) and the benchmark text
/// model's width ([`BENCH_TEXT`]).
pub fn bench_mmproj_shape(image_size: usize, n_layer: usize) -> MmprojShape {
    assert!(
        image_size > 0 && image_size.is_multiple_of(14 * 4),
        "image size {image_size} is not a multiple of 56"
    );
    MmprojShape {
        image_size,
        patch_size: 14,
        n_embd: 1152,
        n_ff: 4304,
        n_layer,
        n_head: 16,
        scale_factor: None,
        projection_dim: BENCH_TEXT.n_embd,
    }
}

/// A benchmark projector ([`bench_mmproj_shape`]), stored as the converter writes
/// `mmproj-*-F16.gguf` ([`gemma3_mmproj_bytes`] with F16). For speed, not parity: the weights
/// are random, of the tiny projector's deviations scaled to keep activations of the same size.
pub fn gemma3_bench_mmproj_bytes(image_size: usize, n_layer: usize) -> Vec<u8> {
    mmproj_bytes(&bench_mmproj_shape(image_size, n_layer), GgmlType::F16)
}

fn mmproj_bytes(s: &MmprojShape, ty: GgmlType) -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set("general.architecture", "clip");
    w.set("general.type", "mmproj");
    w.set("general.name", "ferrox synthetic test projector");
    w.set(
        "general.file_type",
        if ty == GgmlType::F16 { 1u32 } else { 0u32 },
    );
    w.set("clip.has_vision_encoder", true);
    w.set("clip.projector_type", "gemma3");
    w.set("clip.use_gelu", true);
    w.set("clip.vision.projection_dim", s.projection_dim as u32);
    w.set("clip.vision.image_size", s.image_size as u32);
    w.set("clip.vision.patch_size", s.patch_size as u32);
    w.set("clip.vision.embedding_length", s.n_embd as u32);
    w.set("clip.vision.feed_forward_length", s.n_ff as u32);
    w.set("clip.vision.block_count", s.n_layer as u32);
    w.set("clip.vision.attention.head_count", s.n_head as u32);
    w.set("clip.vision.attention.layer_norm_epsilon", VISION_EPS);
    w.set("clip.vision.image_mean", IMAGE_MEAN.to_vec());
    w.set("clip.vision.image_std", IMAGE_STD.to_vec());
    if let Some(scale) = s.scale_factor {
        w.set("clip.vision.projector.scale_factor", scale as u32);
    }

    let mut vals = Values(StdRng::seed_from_u64(MMPROJ_SEED));
    let v = &mut vals;
    let f32 = GgmlType::F32;
    let (e, f, p) = (s.n_embd, s.n_ff, s.patch_size);
    let side = s.image_size / p;
    let n_pos = side * side;
    let (g_e, g_f) = (gain(VISION_N_EMBD, e), gain(VISION_N_FF, f));
    // A patch sums 8 x 8 x 3 = 192 normalized pixels (about +-2): deviation ~1 out.
    let g_p = gain(PATCH_SIZE * PATCH_SIZE * 3, p * p * 3);
    let patch = v.normals(p * p * 3 * e, 0.0, 0.07 * g_p);
    add(
        &mut w,
        "v.patch_embd.weight",
        f32,
        &[p as u64, p as u64, 3, e as u64],
        &patch,
    );
    vector(&mut w, v, "v.patch_embd.bias", e, 0.0, 0.1);
    matrix(&mut w, v, "v.position_embd.weight", f32, e, n_pos, 0.3);
    for il in 0..s.n_layer {
        let n = |t: &str| format!("v.blk.{il}.{t}");
        vector(&mut w, v, &n("ln1.weight"), e, 1.0, 0.1);
        vector(&mut w, v, &n("ln1.bias"), e, 0.0, 0.05);
        for (name, std) in [("attn_q", 0.15), ("attn_k", 0.15), ("attn_v", 0.12)] {
            matrix(
                &mut w,
                v,
                &n(&format!("{name}.weight")),
                ty,
                e,
                e,
                std * g_e,
            );
            vector(&mut w, v, &n(&format!("{name}.bias")), e, 0.0, 0.05);
        }
        matrix(&mut w, v, &n("attn_out.weight"), ty, e, e, 0.1 * g_e);
        vector(&mut w, v, &n("attn_out.bias"), e, 0.0, 0.05);
        vector(&mut w, v, &n("ln2.weight"), e, 1.0, 0.1);
        vector(&mut w, v, &n("ln2.bias"), e, 0.0, 0.05);
        matrix(&mut w, v, &n("ffn_up.weight"), ty, e, f, 0.125 * g_e);
        vector(&mut w, v, &n("ffn_up.bias"), f, 0.0, 0.05);
        matrix(&mut w, v, &n("ffn_down.weight"), ty, f, e, 0.07 * g_f);
        vector(&mut w, v, &n("ffn_down.bias"), e, 0.0, 0.05);
    }
    vector(&mut w, v, "v.post_ln.weight", e, 1.0, 0.1);
    vector(&mut w, v, "v.post_ln.bias", e, 0.0, 0.05);
    vector(&mut w, v, "mm.soft_emb_norm.weight", e, 1.0, 0.1);
    // RMS-normed rows of 64 values times deviation 0.1: ~0.8 per output value.
    matrix(
        &mut w,
        v,
        "mm.input_projection.weight",
        ty,
        s.projection_dim,
        e,
        0.1 * g_e,
    );
    w.to_bytes()
}

/// One test image: its file stem and PNG bytes.
pub struct TestImage {
    pub name: &'static str,
    pub width: usize,
    pub height: usize,
    /// PNG colour type: 0 grey, 2 RGB, 6 RGBA.
    pub color_type: u8,
    pub png: Vec<u8>,
}

/// The test images: exactly the model's size, larger and wider (downscaled, padded top and
/// bottom), smaller and narrow (upscaled, padded left and right), RGBA (alpha dropped on
/// load) and greyscale (replicated to RGB on load).
pub const IMAGES: &[(&str, usize, usize, u8)] = &[
    ("rgb64", 64, 64, 2),
    ("rgb100x60", 100, 60, 2),
    ("rgb37x51", 37, 51, 2),
    ("rgba80", 80, 80, 6),
    ("gray48", 48, 48, 0),
];

pub fn test_images() -> Vec<TestImage> {
    IMAGES
        .iter()
        .enumerate()
        .map(|(i, &(name, width, height, color_type))| TestImage {
            name,
            width,
            height,
            color_type,
            png: png_bytes(
                width,
                height,
                color_type,
                &pixels(i, width, height, color_type),
            ),
        })
        .collect()
}

/// A `size` x `size` RGB test image as PNG bytes, for the benchmarks: the test images'
/// pattern, `variant` choosing among its variations (position and colour of the disc,
/// phase of the stripes).
pub fn bench_image_png(size: usize, variant: usize) -> Vec<u8> {
    png_bytes(size, size, 2, &pixels(variant, size, size, 2))
}

/// Smooth gradients with a pattern on top (a disc, diagonal stripes, a checkerboard in one
/// corner), different for each image; integer arithmetic only.
fn pixels(seed: usize, w: usize, h: usize, color_type: u8) -> Vec<u8> {
    let channels = match color_type {
        0 => 1,
        2 => 3,
        6 => 4,
        _ => unreachable!(),
    };
    let mut out = Vec::with_capacity(w * h * channels);
    let (cx, cy) = ((w * (2 + seed % 3)) / 6, (h * (3 + seed % 2)) / 7);
    let r2 = (w.min(h) / 4).pow(2);
    for y in 0..h {
        for x in 0..w {
            let gx = (x * 255 / (w - 1)) as i32;
            let gy = (y * 255 / (h - 1)) as i32;
            let mut r = gx;
            let mut g = gy;
            let mut b = (gx + gy) / 2;
            let (dx, dy) = (x.abs_diff(cx), y.abs_diff(cy));
            if dx * dx + dy * dy < r2 {
                // a disc of another colour, shaded by distance
                let d = ((dx * dx + dy * dy) * 96 / r2.max(1)) as i32;
                r = 230 - d;
                g = 40 + d + 20 * seed as i32;
                b = 90;
            }
            if (x + 2 * y + 3 * seed) % 11 < 3 {
                // diagonal stripes
                b = 255 - b;
            }
            if x < w / 4 && y < h / 4 && ((x / 3) + (y / 3)) % 2 == 0 {
                // a small checkerboard in the top-left corner
                r /= 3;
                g /= 3;
            }
            let clamp = |v: i32| v.clamp(0, 255) as u8;
            match channels {
                1 => out.push(clamp((r * 3 + g * 5 + b * 2) / 10)),
                3 => out.extend([clamp(r), clamp(g), clamp(b)]),
                _ => {
                    // alpha varies too; llama.cpp ignores it (no blending)
                    let alpha = 255 - ((x * 7 + y * 3) % 200) as i32;
                    out.extend([clamp(r), clamp(g), clamp(b), clamp(alpha)]);
                }
            }
        }
    }
    out
}

/// A PNG file (8 bits per channel, no interlace, filter 0 on every row) whose zlib stream
/// uses stored (uncompressed) deflate blocks, so that the bytes depend on nothing but the
/// pixels.
fn png_bytes(w: usize, h: usize, color_type: u8, pixels: &[u8]) -> Vec<u8> {
    let channels = pixels.len() / (w * h);
    let mut raw = Vec::with_capacity(h * (1 + w * channels));
    for row in pixels.chunks(w * channels) {
        raw.push(0); // filter: none
        raw.extend_from_slice(row);
    }
    let mut zlib = vec![0x78, 0x01];
    let mut blocks = raw.chunks(65535).peekable();
    while let Some(block) = blocks.next() {
        zlib.push(u8::from(blocks.peek().is_none())); // BFINAL, BTYPE 00
        let len = block.len() as u16;
        zlib.extend(len.to_le_bytes());
        zlib.extend((!len).to_le_bytes());
        zlib.extend_from_slice(block);
    }
    zlib.extend(adler32(&raw).to_be_bytes());

    let mut out = vec![0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];
    let mut ihdr = Vec::new();
    ihdr.extend((w as u32).to_be_bytes());
    ihdr.extend((h as u32).to_be_bytes());
    ihdr.extend([8, color_type, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &zlib);
    chunk(&mut out, b"IEND", &[]);
    out
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend((data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&out[start..]);
    out.extend(crc.to_be_bytes());
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &x in data {
        a = (a + u32::from(x)) % 65521;
        b = (b + a) % 65521;
    }
    (b << 16) | a
}

/// A tiny Qwen-VL pair: a `qwen2vl` text model and Qwen2.5-VL / Qwen2-VL projectors (llama.cpp's
/// `qwen2.5vl_merger` and `qwen2vl_merger`), all F32.
///
/// Text model (`qwen2vl`): n_embd 128, 2 layers, 4 query heads / 2 KV heads of 32, n_ff 256,
/// Q/K/V biases, M-RoPE sections [4, 6, 6, 0] (Qwen2.5-VL's [16, 24, 24, 0] over 32-wide
/// heads), base 1e6, untied output. RMS epsilon 0: llama.cpp reads none for `qwen2vl`.
/// Vocabulary: the SentencePiece-style one with `<|im_start|>`, `<|im_end|>`,
/// `<|vision_start|>` and `<|vision_end|>` after the byte tokens ([`QWEN_VISION_START_ID`]...).
///
/// Projectors: 14-pixel patches (two temporal kernels, no bias), width 64, 3 layers of 4
/// heads (head dim 16: 2D RoPE over quarters), FFN 128, eps 1e-6, 2x2 merge to the text
/// width through a 256-wide MLP. Qwen2.5-VL: RMS norms, gated SiLU feed-forward, windows in
/// layers 0 and 2 (`n_wa_pattern` 2: layer 1 attends to everything); Qwen2-VL: LayerNorms,
/// quick GELU, no windows. Windows are 112 pixels (4 merged tokens) a side, so an image wider
/// or taller than 112 pixels has several.
pub const QWEN_CONTROL_TOKENS: [&str; 4] = [
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
];
pub const QWEN_IM_START_ID: u32 = 259;
pub const QWEN_IM_END_ID: u32 = 260;
pub const QWEN_VISION_START_ID: u32 = 261;
pub const QWEN_VISION_END_ID: u32 = 262;
pub const QWEN_TEXT_N_EMBD: usize = 128;
pub const QWEN_TEXT_N_LAYER: usize = 2;
pub const QWEN_TEXT_N_HEAD: usize = 4;
pub const QWEN_TEXT_N_HEAD_KV: usize = 2;
pub const QWEN_TEXT_HEAD_DIM: usize = 32;
pub const QWEN_TEXT_N_FF: usize = 256;
pub const QWEN_MROPE_SECTIONS: [i32; 4] = [4, 6, 6, 0];
pub const QWEN_PATCH_SIZE: usize = 14;
pub const QWEN_VISION_N_EMBD: usize = 64;
pub const QWEN_VISION_N_FF: usize = 128;
pub const QWEN_VISION_N_LAYER: usize = 3;
pub const QWEN_VISION_N_HEAD: usize = 4;
pub const QWEN_N_WA_PATTERN: usize = 2;
/// Larger than the Gemma images, for several attention windows: 7x5, 6x5 and 3x9 merged
/// tokens.
pub const QWEN_EXTRA_IMAGES: &[(&str, usize, usize, u8)] = &[
    ("rgb200x150", 200, 150, 2),
    ("rgb160x130", 160, 130, 2),
    ("rgb90x240", 90, 240, 2),
];

const QWEN_TEXT_SEED: u64 = 0x011a_0311;
const QWEN_MMPROJ_SEED: u64 = 0x011a_0312;

/// Which Qwen-VL projector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QwenVision {
    Qwen2Vl,
    Qwen25Vl,
}

/// The `qwen2vl` text model of the Qwen-VL pair.
pub fn qwen2vl_text_bytes() -> Vec<u8> {
    qwen2vl_text_bytes_with(QWEN_TEXT_N_EMBD, QWEN_TEXT_N_LAYER)
}

/// A `qwen2vl` text model of `n_embd` (4 heads of `n_embd / 4`, 2 KV heads) and `n_layer`
/// layers, the tiny pair's otherwise: a benchmark projector's text model, which
/// `mtmd-ref embed` needs for its width.
pub fn qwen2vl_text_bytes_with(n_embd: usize, n_layer: usize) -> Vec<u8> {
    let scale = (n_embd / QWEN_TEXT_N_HEAD / QWEN_TEXT_HEAD_DIM) as i32;
    qwen_text_bytes(&QwenText {
        arch: "qwen2vl",
        n_embd,
        n_layer,
        qwen3: false,
        deepstack: 0,
        sections: QWEN_MROPE_SECTIONS.map(|c| c * scale),
        rope_base: 1_000_000.0,
        eps: 0.0,
        seed: QWEN_TEXT_SEED,
    })
}

/// A Qwen-VL text model's settings: Qwen2-VL's (Q/K/V biases) or Qwen3-VL's (Q/K norms,
/// explicit head sizes, `deepstack` layers).
struct QwenText {
    arch: &'static str,
    n_embd: usize,
    n_layer: usize,
    qwen3: bool,
    deepstack: usize,
    sections: [i32; 4],
    rope_base: f32,
    eps: f32,
    seed: u64,
}

fn qwen_text_bytes(t: &QwenText) -> Vec<u8> {
    use ferrox_gguf::{OwnedArray, OwnedValue};
    let a = t.arch;
    let key = |k: &str| format!("{a}.{k}");
    let mut w = GgufWriter::new();
    w.set("general.architecture", a);
    w.set("general.name", "ferrox synthetic test model");
    w.set(key("context_length"), 4096u32);
    w.set(key("embedding_length"), t.n_embd as u32);
    w.set(key("block_count"), t.n_layer as u32);
    w.set(key("feed_forward_length"), QWEN_TEXT_N_FF as u32);
    w.set(key("attention.head_count"), QWEN_TEXT_N_HEAD as u32);
    w.set(key("attention.head_count_kv"), QWEN_TEXT_N_HEAD_KV as u32);
    let head_dim = t.n_embd / QWEN_TEXT_N_HEAD;
    if t.qwen3 {
        w.set(key("attention.key_length"), head_dim as u32);
        w.set(key("attention.value_length"), head_dim as u32);
    }
    w.set(key("rope.dimension_count"), head_dim as u32);
    w.set(key("rope.freq_base"), t.rope_base);
    w.set(key("attention.layer_norm_rms_epsilon"), t.eps);
    if t.deepstack > 0 {
        w.set(key("n_deepstack_layers"), t.deepstack as u32);
    }
    w.set(
        key("rope.dimension_sections"),
        OwnedValue::Array(OwnedArray::I32(t.sections.to_vec())),
    );
    super::spm_vocab(&mut w, TEXT_N_VOCAB, &QWEN_CONTROL_TOKENS, &["\u{2581}"]);
    w.set("tokenizer.ggml.add_space_prefix", false);
    w.set("tokenizer.chat_template", QWEN_CHAT_TEMPLATE);

    let mut vals = Values(StdRng::seed_from_u64(t.seed));
    let v = &mut vals;
    let ty = GgmlType::F32;
    let (e, f) = (t.n_embd, QWEN_TEXT_N_FF);
    let kv_w = QWEN_TEXT_N_HEAD_KV * head_dim;
    matrix(&mut w, v, "token_embd.weight", ty, e, TEXT_N_VOCAB, 0.5);
    vector(&mut w, v, "output_norm.weight", e, 1.0, 0.1);
    matrix(&mut w, v, "output.weight", ty, e, TEXT_N_VOCAB, 0.1);
    for il in 0..t.n_layer {
        let n = |t: &str| format!("blk.{il}.{t}");
        vector(&mut w, v, &n("attn_norm.weight"), e, 1.0, 0.1);
        for (name, rows, std) in [
            ("attn_q", e, 0.15),
            ("attn_k", kv_w, 0.15),
            ("attn_v", kv_w, 0.1),
        ] {
            matrix(&mut w, v, &n(&format!("{name}.weight")), ty, e, rows, std);
            if !t.qwen3 {
                vector(&mut w, v, &n(&format!("{name}.bias")), rows, 0.0, 0.1);
            }
        }
        if t.qwen3 {
            vector(&mut w, v, &n("attn_q_norm.weight"), head_dim, 1.5, 0.2);
            vector(&mut w, v, &n("attn_k_norm.weight"), head_dim, 1.5, 0.2);
        }
        matrix(&mut w, v, &n("attn_output.weight"), ty, e, e, 0.08);
        vector(&mut w, v, &n("ffn_norm.weight"), e, 1.0, 0.1);
        matrix(&mut w, v, &n("ffn_gate.weight"), ty, e, f, 0.08);
        matrix(&mut w, v, &n("ffn_up.weight"), ty, e, f, 0.08);
        matrix(&mut w, v, &n("ffn_down.weight"), ty, f, e, 0.06);
    }
    w.to_bytes()
}

/// Qwen's turn format, short.
pub const QWEN_CHAT_TEMPLATE: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// A Qwen-VL projector (every tensor F32). Tensors, in ggml shape order:
///
/// | name | ne |
/// | --- | --- |
/// | `v.patch_embd.weight`, `v.patch_embd.weight.1` | [14, 14, 3, 64] |
/// | `v.blk.N.ln1.weight`, `ln2.weight` (and `.bias`, Qwen2-VL) | [64] |
/// | `v.blk.N.attn_{q,k,v,out}.{weight,bias}` | [64, 64], [64] |
/// | `v.blk.N.ffn_up.{weight,bias}` (and `ffn_gate`, Qwen2.5-VL) | [64, 128], [128] |
/// | `v.blk.N.ffn_down.{weight,bias}` | [128, 64], [64] |
/// | `v.post_ln.weight` (and `.bias`, Qwen2-VL) | [64] |
/// | `mm.0.{weight,bias}` | [256, 256], [256] |
/// | `mm.2.{weight,bias}` | [256, 128], [128] |
pub fn qwen_mmproj_bytes(kind: QwenVision) -> Vec<u8> {
    qwen_mmproj_bytes_with(kind, &QWEN_MMPROJ, GgmlType::F32)
}

/// A Qwen-VL projector's shapes.
#[derive(Clone, Copy, Debug)]
pub struct QwenMmprojShape {
    pub patch_size: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_wa_pattern: usize,
    /// The text model's width.
    pub projection_dim: usize,
}

/// The tiny test projectors' shapes.
pub const QWEN_MMPROJ: QwenMmprojShape = QwenMmprojShape {
    patch_size: QWEN_PATCH_SIZE,
    n_embd: QWEN_VISION_N_EMBD,
    n_ff: QWEN_VISION_N_FF,
    n_layer: QWEN_VISION_N_LAYER,
    n_head: QWEN_VISION_N_HEAD,
    n_wa_pattern: QWEN_N_WA_PATTERN,
    projection_dim: QWEN_TEXT_N_EMBD,
};

/// A benchmark projector: Qwen2.5-VL-7B's vision tower (width 1280, FFN 3420, 16 heads of
/// 80, 14-pixel patches, full attention every 8th layer) with `n_layer` layers instead of 32,
/// projecting to a 2048-wide text model (Qwen2.5-VL-3B's), stored as the converter writes
/// `mmproj-*-F16.gguf` (F16 matrices, F32 norms and biases).
pub fn qwen25vl_bench_shape(n_layer: usize) -> QwenMmprojShape {
    QwenMmprojShape {
        patch_size: 14,
        n_embd: 1280,
        n_ff: 3420,
        n_layer,
        n_head: 16,
        n_wa_pattern: 8,
        projection_dim: QWEN_BENCH_TEXT_N_EMBD,
    }
}

/// The benchmark projectors' text width.
pub const QWEN_BENCH_TEXT_N_EMBD: usize = 2048;

/// A Qwen-VL projector of the given shapes; `ty` is the attention, FFN and merger
/// matrices' type (F32 or F16); patch kernels, norms and biases are F32.
pub fn qwen_mmproj_bytes_with(kind: QwenVision, shape: &QwenMmprojShape, ty: GgmlType) -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set("general.architecture", "clip");
    w.set("general.type", "mmproj");
    w.set("general.name", "ferrox synthetic test projector");
    w.set("general.file_type", 0u32);
    w.set("clip.has_vision_encoder", true);
    let layer_norm = kind == QwenVision::Qwen2Vl;
    match kind {
        QwenVision::Qwen2Vl => {
            w.set("clip.projector_type", "qwen2vl_merger");
        }
        QwenVision::Qwen25Vl => {
            w.set("clip.projector_type", "qwen2.5vl_merger");
            w.set("clip.use_silu", true);
            w.set("clip.vision.n_wa_pattern", shape.n_wa_pattern as u32);
        }
    }
    let (e, f, p) = (shape.n_embd, shape.n_ff, shape.patch_size);
    w.set("clip.vision.projection_dim", shape.projection_dim as u32);
    w.set("clip.vision.image_size", 560u32);
    w.set("clip.vision.patch_size", p as u32);
    w.set("clip.vision.embedding_length", e as u32);
    w.set("clip.vision.feed_forward_length", f as u32);
    w.set("clip.vision.block_count", shape.n_layer as u32);
    w.set("clip.vision.attention.head_count", shape.n_head as u32);
    w.set("clip.vision.attention.layer_norm_epsilon", VISION_EPS);
    w.set("clip.vision.image_mean", IMAGE_MEAN.to_vec());
    w.set("clip.vision.image_std", IMAGE_STD.to_vec());

    let mut vals = Values(StdRng::seed_from_u64(QWEN_MMPROJ_SEED));
    let v = &mut vals;
    let f32 = GgmlType::F32;
    // Deviations that keep the tiny projector's scale of activations at other widths.
    let (g_e, g_f) = (gain(QWEN_VISION_N_EMBD, e), gain(QWEN_VISION_N_FF, f));
    let g_m = gain(4 * QWEN_VISION_N_EMBD, 4 * e);
    // Two kernels of 14 x 14 x 3 = 588 normalized pixels each: deviation ~1 out.
    for name in ["v.patch_embd.weight", "v.patch_embd.weight.1"] {
        let kernel = v.normals(p * p * 3 * e, 0.0, 0.03);
        add(
            &mut w,
            name,
            f32,
            &[p as u64, p as u64, 3, e as u64],
            &kernel,
        );
    }
    let norm = |w: &mut GgufWriter, v: &mut Values, name: &str| {
        vector(w, v, &format!("{name}.weight"), e, 1.0, 0.1);
        if layer_norm {
            vector(w, v, &format!("{name}.bias"), e, 0.0, 0.05);
        }
    };
    for il in 0..shape.n_layer {
        let n = |t: &str| format!("v.blk.{il}.{t}");
        norm(&mut w, v, &n("ln1"));
        for (name, std) in [("attn_q", 0.2), ("attn_k", 0.2), ("attn_v", 0.12)] {
            matrix(
                &mut w,
                v,
                &n(&format!("{name}.weight")),
                ty,
                e,
                e,
                std * g_e,
            );
            vector(&mut w, v, &n(&format!("{name}.bias")), e, 0.0, 0.05);
        }
        matrix(&mut w, v, &n("attn_out.weight"), ty, e, e, 0.1 * g_e);
        vector(&mut w, v, &n("attn_out.bias"), e, 0.0, 0.05);
        norm(&mut w, v, &n("ln2"));
        matrix(&mut w, v, &n("ffn_up.weight"), ty, e, f, 0.125 * g_e);
        vector(&mut w, v, &n("ffn_up.bias"), f, 0.0, 0.05);
        if kind == QwenVision::Qwen25Vl {
            matrix(&mut w, v, &n("ffn_gate.weight"), ty, e, f, 0.125 * g_e);
            vector(&mut w, v, &n("ffn_gate.bias"), f, 0.0, 0.05);
        }
        matrix(&mut w, v, &n("ffn_down.weight"), ty, f, e, 0.1 * g_f);
        vector(&mut w, v, &n("ffn_down.bias"), e, 0.0, 0.05);
    }
    norm(&mut w, v, "v.post_ln");
    matrix(&mut w, v, "mm.0.weight", ty, 4 * e, 4 * e, 0.06 * g_m);
    vector(&mut w, v, "mm.0.bias", 4 * e, 0.0, 0.05);
    // ~0.5 per output value: the size of the text model's token rows.
    let out = shape.projection_dim;
    matrix(&mut w, v, "mm.2.weight", ty, 4 * e, out, 0.06 * g_m);
    vector(&mut w, v, "mm.2.bias", out, 0.0, 0.05);
    w.to_bytes()
}

/// The extra Qwen-VL test images ([`QWEN_EXTRA_IMAGES`]), after [`test_images`]' patterns.
pub fn qwen_extra_images() -> Vec<TestImage> {
    QWEN_EXTRA_IMAGES
        .iter()
        .enumerate()
        .map(|(i, &(name, width, height, color_type))| TestImage {
            name,
            width,
            height,
            color_type,
            png: png_bytes(
                width,
                height,
                color_type,
                &pixels(IMAGES.len() + i, width, height, color_type),
            ),
        })
        .collect()
}

/// A tiny Qwen3-VL pair: a `qwen3vl` text model (n_embd 128, 3 layers, 4 query heads / 2 KV
/// heads of 32 with Q/K norms, n_ff 256, interleaved M-RoPE sections [6, 5, 5, 0], 2
/// deepstack layers) and its `qwen3vl_merger` projector (16-pixel patches, two temporal
/// kernels with a bias, learned positions on a 6x6 grid resized to each input, width 64, 3
/// layers of 4 heads with a fused QKV, GELU FFN 128, LayerNorms, deepstack mergers after
/// layers 0 and 1), all F32, the Qwen vocabulary and template of [`qwen2vl_text_bytes`].
pub const QWEN3_DEEPSTACK_LAYERS: [usize; 2] = [0, 1];
/// More layers than deepstack slices: llama.cpp's graph adds a slice after a layer even when
/// it is the last one, whose rows have already been cut to the outputs, and fails there.
pub const QWEN3_TEXT_N_LAYER: usize = 3;
pub const QWEN3_PATCH_SIZE: usize = 16;
/// 96 pixels: a 6x6 grid of positions, the input size of a 64x64 image.
pub const QWEN3_IMAGE_SIZE: usize = 96;
pub const QWEN3_MROPE_SECTIONS: [i32; 4] = [6, 5, 5, 0];
const QWEN3_TEXT_SEED: u64 = 0x011a_0321;
const QWEN3_MMPROJ_SEED: u64 = 0x011a_0322;

/// The `qwen3vl` text model of the Qwen3-VL pair.
pub fn qwen3vl_text_bytes() -> Vec<u8> {
    qwen_text_bytes(&QwenText {
        arch: "qwen3vl",
        n_embd: QWEN_TEXT_N_EMBD,
        n_layer: QWEN3_TEXT_N_LAYER,
        qwen3: true,
        deepstack: QWEN3_DEEPSTACK_LAYERS.len(),
        sections: QWEN3_MROPE_SECTIONS,
        rope_base: 5_000_000.0,
        eps: 1e-6,
        seed: QWEN3_TEXT_SEED,
    })
}

/// The Qwen3-VL projector (every tensor F32). Beyond [`qwen_mmproj_bytes`]'s Qwen2-VL
/// tensors (without its separate Q/K/V): `v.patch_embd.bias` [64], `v.position_embd.weight`
/// [64, 36], `v.blk.N.attn_qkv.{weight,bias}` [64, 192], [192], and for each deepstack
/// layer N `v.deepstack.N.norm.{weight,bias}` [256], `v.deepstack.N.fc1.{weight,bias}`
/// [256, 256], [256], `v.deepstack.N.fc2.{weight,bias}` [256, 128], [128].
pub fn qwen3vl_mmproj_bytes() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set("general.architecture", "clip");
    w.set("general.type", "mmproj");
    w.set("general.name", "ferrox synthetic test projector");
    w.set("general.file_type", 0u32);
    w.set("clip.has_vision_encoder", true);
    w.set("clip.projector_type", "qwen3vl_merger");
    w.set("clip.use_gelu", true);
    let (e, f, p) = (QWEN_VISION_N_EMBD, QWEN_VISION_N_FF, QWEN3_PATCH_SIZE);
    let side = QWEN3_IMAGE_SIZE / p;
    w.set("clip.vision.projection_dim", QWEN_TEXT_N_EMBD as u32);
    w.set("clip.vision.image_size", QWEN3_IMAGE_SIZE as u32);
    w.set("clip.vision.patch_size", p as u32);
    w.set("clip.vision.embedding_length", e as u32);
    w.set("clip.vision.feed_forward_length", f as u32);
    w.set("clip.vision.block_count", QWEN_VISION_N_LAYER as u32);
    w.set(
        "clip.vision.attention.head_count",
        QWEN_VISION_N_HEAD as u32,
    );
    w.set("clip.vision.attention.layer_norm_epsilon", VISION_EPS);
    w.set("clip.vision.spatial_merge_size", 2u32);
    w.set(
        "clip.vision.is_deepstack_layers",
        (0..QWEN_VISION_N_LAYER)
            .map(|il| QWEN3_DEEPSTACK_LAYERS.contains(&il))
            .collect::<Vec<bool>>(),
    );
    w.set("clip.vision.image_mean", IMAGE_MEAN.to_vec());
    w.set("clip.vision.image_std", IMAGE_STD.to_vec());

    let mut vals = Values(StdRng::seed_from_u64(QWEN3_MMPROJ_SEED));
    let v = &mut vals;
    let f32 = GgmlType::F32;
    for name in ["v.patch_embd.weight", "v.patch_embd.weight.1"] {
        let kernel = v.normals(p * p * 3 * e, 0.0, 0.026);
        add(
            &mut w,
            name,
            f32,
            &[p as u64, p as u64, 3, e as u64],
            &kernel,
        );
    }
    vector(&mut w, v, "v.patch_embd.bias", e, 0.0, 0.1);
    matrix(
        &mut w,
        v,
        "v.position_embd.weight",
        f32,
        e,
        side * side,
        0.3,
    );
    let norm = |w: &mut GgufWriter, v: &mut Values, name: &str, width: usize| {
        vector(w, v, &format!("{name}.weight"), width, 1.0, 0.1);
        vector(w, v, &format!("{name}.bias"), width, 0.0, 0.05);
    };
    for il in 0..QWEN_VISION_N_LAYER {
        let n = |t: &str| format!("v.blk.{il}.{t}");
        norm(&mut w, v, &n("ln1"), e);
        matrix(&mut w, v, &n("attn_qkv.weight"), f32, e, 3 * e, 0.18);
        vector(&mut w, v, &n("attn_qkv.bias"), 3 * e, 0.0, 0.05);
        matrix(&mut w, v, &n("attn_out.weight"), f32, e, e, 0.1);
        vector(&mut w, v, &n("attn_out.bias"), e, 0.0, 0.05);
        norm(&mut w, v, &n("ln2"), e);
        matrix(&mut w, v, &n("ffn_up.weight"), f32, e, f, 0.125);
        vector(&mut w, v, &n("ffn_up.bias"), f, 0.0, 0.05);
        matrix(&mut w, v, &n("ffn_down.weight"), f32, f, e, 0.1);
        vector(&mut w, v, &n("ffn_down.bias"), e, 0.0, 0.05);
    }
    for &il in &QWEN3_DEEPSTACK_LAYERS {
        let n = |t: &str| format!("v.deepstack.{il}.{t}");
        norm(&mut w, v, &n("norm"), 4 * e);
        matrix(&mut w, v, &n("fc1.weight"), f32, 4 * e, 4 * e, 0.06);
        vector(&mut w, v, &n("fc1.bias"), 4 * e, 0.0, 0.05);
        matrix(
            &mut w,
            v,
            &n("fc2.weight"),
            f32,
            4 * e,
            QWEN_TEXT_N_EMBD,
            0.04,
        );
        vector(&mut w, v, &n("fc2.bias"), QWEN_TEXT_N_EMBD, 0.0, 0.02);
    }
    norm(&mut w, v, "v.post_ln", e);
    matrix(&mut w, v, "mm.0.weight", f32, 4 * e, 4 * e, 0.06);
    vector(&mut w, v, "mm.0.bias", 4 * e, 0.0, 0.05);
    matrix(&mut w, v, "mm.2.weight", f32, 4 * e, QWEN_TEXT_N_EMBD, 0.06);
    vector(&mut w, v, "mm.2.bias", QWEN_TEXT_N_EMBD, 0.0, 0.05);
    w.to_bytes()
}

/// A tiny Kimi pair: a `deepseek2` text model (the `deepseek2-sweep` shapes: n_embd 128, 2
/// layers of 2 MLA heads, the first dense, then 4 experts; every matrix F32) whose vocabulary
/// holds Kimi's turn and image markers, and its two projectors (14-pixel patches with a bias,
/// width 64, 3 layers of 4 heads of 16, GELU FFN 128, LayerNorms with eps 1e-5, 2x2 merge
/// to the text width through a 256-wide MLP, all F32):
/// - `kimivl`: separate Q/K/V, learned positions on a 6x6 grid, llama.cpp's limits of 8 to
///   1024 tokens;
/// - `kimik25`: a fused QKV, learned positions on a grid 5 wide and 7 tall
///   (`[n_embd, width, height]`, resized bicubically), the file's own pixel limits (8 to
///   4096 patches, as the converter writes them from `in_patch_limit`).
pub const KIMI_CONTROL_TOKENS: [&str; 7] = [
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_middle|>",
    "<|im_end|>",
    "<|media_start|>",
    "<|media_end|>",
    "<|media_begin|>",
];
pub const KIMI_PATCH_SIZE: usize = 14;
pub const KIMI_VISION_N_EMBD: usize = 64;
pub const KIMI_VISION_N_FF: usize = 128;
pub const KIMI_VISION_N_LAYER: usize = 3;
pub const KIMI_VISION_N_HEAD: usize = 4;
pub const KIMI_VISION_EPS: f32 = 1e-5;
/// Kimi-VL's square grid of learned positions, and Kimi-K2.5's (width, height).
pub const KIMIVL_POSITION_SIDE: usize = 6;
pub const KIMIK25_POSITION_GRID: (usize, usize) = (5, 7);
/// Kimi-K2.5's pixel limits in patches (the converter's `in_patch_limit` and minimum).
pub const KIMIK25_PATCH_LIMITS: (usize, usize) = (8, 4096);
const KIMI_TEXT_SEED: u64 = 0x011a_0331;
const KIMI_MMPROJ_SEED: u64 = 0x011a_0332;

/// Which Kimi projector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KimiVision {
    KimiVl,
    KimiK25,
}

/// The `deepseek2` text model of the Kimi pair.
pub fn kimi_text_bytes() -> Vec<u8> {
    let mut s = super::spec("deepseek2-sweep");
    s.seed = KIMI_TEXT_SEED;
    s.n_vocab = TEXT_N_VOCAB;
    s.mla = s.mla.map(|m| super::MlaSpec {
        chat: Some(super::ChatVocab {
            control: &KIMI_CONTROL_TOKENS,
            template: KIMI_CHAT_TEMPLATE,
        }),
        ..m
    });
    super::spec_gguf_bytes(s)
}

/// Kimi's turn format, short.
pub const KIMI_CHAT_TEMPLATE: &str = "{% for message in messages %}\
{{ '<|im_' + message['role'] + '|>' + message['role'] + '<|im_middle|>' + message['content'] + '<|im_end|>' }}{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_assistant|>assistant<|im_middle|>' }}{% endif %}";

/// GLM-5.2-V's markers and turns: its text model (`glm-dsa`) takes Kimi-K2.5's projector.
pub const GLM_CONTROL_TOKENS: [&str; 4] = [
    "<|user|>",
    "<|assistant|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
];
pub const GLM_CHAT_TEMPLATE: &str = "{% for message in messages %}\
{{ '<|' + message['role'] + '|>' + message['content'] }}{% endfor %}\
{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}";
const GLM_TEXT_SEED: u64 = 0x011a_0341;

/// A `glm-dsa` text model (the synthetic glm-dsa's shapes: DeepSeek Sparse Attention over
/// MLA, every matrix F32) whose vocabulary holds GLM-5.2-V's turn and image markers: with
/// `kimik25.mmproj.gguf`, a GLM-5.2-V pair.
pub fn glm5v_text_bytes() -> Vec<u8> {
    let mut s = super::spec("glm-dsa");
    s.seed = GLM_TEXT_SEED;
    s.n_vocab = TEXT_N_VOCAB;
    s.mla = s.mla.map(|m| super::MlaSpec {
        chat: Some(super::ChatVocab {
            control: &GLM_CONTROL_TOKENS,
            template: GLM_CHAT_TEMPLATE,
        }),
        ..m
    });
    super::spec_gguf_bytes(s)
}

/// A Kimi projector (every tensor F32). Tensors, in ggml shape order:
///
/// | name | ne |
/// | --- | --- |
/// | `v.patch_embd.weight`, `.bias` | [14, 14, 3, 64], [64] |
/// | `v.position_embd.weight` | Kimi-VL [64, 36]; Kimi-K2.5 [64, 5, 7] |
/// | `v.blk.N.ln1`, `ln2`, `.weight` and `.bias` | [64] |
/// | `v.blk.N.attn_{q,k,v}` (Kimi-VL) or `attn_qkv` (Kimi-K2.5), `attn_out`, with biases | [64, 64] or [64, 192] |
/// | `v.blk.N.ffn_up`, `ffn_down`, with biases | [64, 128], [128, 64] |
/// | `v.post_ln.weight`, `.bias` | [64] |
/// | `mm.input_norm.weight`, `.bias` | [64] |
/// | `mm.1.{weight,bias}` | [256, 256], [256] |
/// | `mm.2.{weight,bias}` | [256, 128], [128] |
pub fn kimi_mmproj_bytes(kind: KimiVision) -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set("general.architecture", "clip");
    w.set("general.type", "mmproj");
    w.set("general.name", "ferrox synthetic test projector");
    w.set("general.file_type", 0u32);
    w.set("clip.has_vision_encoder", true);
    let (e, f, p) = (KIMI_VISION_N_EMBD, KIMI_VISION_N_FF, KIMI_PATCH_SIZE);
    let (gw, gh) = match kind {
        KimiVision::KimiVl => (KIMIVL_POSITION_SIDE, KIMIVL_POSITION_SIDE),
        KimiVision::KimiK25 => KIMIK25_POSITION_GRID,
    };
    match kind {
        KimiVision::KimiVl => {
            w.set("clip.projector_type", "kimivl");
        }
        KimiVision::KimiK25 => {
            w.set("clip.projector_type", "kimik25");
            w.set("vision.pos_emb_height", gh as u32);
            w.set("vision.pos_emb_width", gw as u32);
            w.set("vision.pos_emb_time", 4u32);
            let (lo, hi) = KIMIK25_PATCH_LIMITS;
            w.set("clip.vision.image_min_pixels", (lo * p * p) as u32);
            w.set("clip.vision.image_max_pixels", (hi * p * p) as u32);
        }
    }
    w.set("clip.use_gelu", true);
    w.set("clip.vision.projector.scale_factor", 2u32);
    w.set("clip.vision.projection_dim", QWEN_TEXT_N_EMBD as u32);
    w.set("clip.vision.image_size", (gh * p) as u32);
    w.set("clip.vision.patch_size", p as u32);
    w.set("clip.vision.embedding_length", e as u32);
    w.set("clip.vision.feed_forward_length", f as u32);
    w.set("clip.vision.block_count", KIMI_VISION_N_LAYER as u32);
    w.set(
        "clip.vision.attention.head_count",
        KIMI_VISION_N_HEAD as u32,
    );
    w.set("clip.vision.attention.layer_norm_epsilon", KIMI_VISION_EPS);
    w.set("clip.vision.image_mean", IMAGE_MEAN.to_vec());
    w.set("clip.vision.image_std", IMAGE_STD.to_vec());

    let mut vals = Values(StdRng::seed_from_u64(KIMI_MMPROJ_SEED));
    let v = &mut vals;
    let f32 = GgmlType::F32;
    let kernel = v.normals(p * p * 3 * e, 0.0, 0.03);
    add(
        &mut w,
        "v.patch_embd.weight",
        f32,
        &[p as u64, p as u64, 3, e as u64],
        &kernel,
    );
    vector(&mut w, v, "v.patch_embd.bias", e, 0.0, 0.1);
    let positions = v.normals(e * gw * gh, 0.0, 0.3);
    let shape = match kind {
        KimiVision::KimiVl => vec![e as u64, (gw * gh) as u64],
        KimiVision::KimiK25 => vec![e as u64, gw as u64, gh as u64],
    };
    add(&mut w, "v.position_embd.weight", f32, &shape, &positions);
    let norm = |w: &mut GgufWriter, v: &mut Values, name: &str| {
        vector(w, v, &format!("{name}.weight"), e, 1.0, 0.1);
        vector(w, v, &format!("{name}.bias"), e, 0.0, 0.05);
    };
    for il in 0..KIMI_VISION_N_LAYER {
        let n = |t: &str| format!("v.blk.{il}.{t}");
        norm(&mut w, v, &n("ln1"));
        match kind {
            KimiVision::KimiVl => {
                for (name, std) in [("attn_q", 0.2), ("attn_k", 0.2), ("attn_v", 0.12)] {
                    matrix(&mut w, v, &n(&format!("{name}.weight")), f32, e, e, std);
                    vector(&mut w, v, &n(&format!("{name}.bias")), e, 0.0, 0.05);
                }
            }
            KimiVision::KimiK25 => {
                matrix(&mut w, v, &n("attn_qkv.weight"), f32, e, 3 * e, 0.18);
                vector(&mut w, v, &n("attn_qkv.bias"), 3 * e, 0.0, 0.05);
            }
        }
        matrix(&mut w, v, &n("attn_out.weight"), f32, e, e, 0.1);
        vector(&mut w, v, &n("attn_out.bias"), e, 0.0, 0.05);
        norm(&mut w, v, &n("ln2"));
        matrix(&mut w, v, &n("ffn_up.weight"), f32, e, f, 0.125);
        vector(&mut w, v, &n("ffn_up.bias"), f, 0.0, 0.05);
        matrix(&mut w, v, &n("ffn_down.weight"), f32, f, e, 0.1);
        vector(&mut w, v, &n("ffn_down.bias"), e, 0.0, 0.05);
    }
    norm(&mut w, v, "v.post_ln");
    norm(&mut w, v, "mm.input_norm");
    matrix(&mut w, v, "mm.1.weight", f32, 4 * e, 4 * e, 0.06);
    vector(&mut w, v, "mm.1.bias", 4 * e, 0.0, 0.05);
    matrix(&mut w, v, "mm.2.weight", f32, 4 * e, QWEN_TEXT_N_EMBD, 0.06);
    vector(&mut w, v, "mm.2.bias", QWEN_TEXT_N_EMBD, 0.0, 0.05);
    w.to_bytes()
}
