//! Kimi image input against llama.cpp on the synthetic pair of `fixtures/vision/`
//! (`kimi.gguf`, a deepseek2 text model, with the Kimi-VL and Kimi-K2.5 projectors): the
//! input size each image is resized to, the grid of image tokens, and the projector's
//! embeddings against `mtmd`'s with flash attention off and, with the defaults (f16 keys and
//! values), within llama.cpp's own flash-attention on/off band. References:
//! `scripts/reference/gen-vision-kimi-refs.sh`.

mod vision_common;

use ferrox_models::vision::{ProjectorKind, VisionEncoder, VisionOptions};
use vision_common::{check_default_band, encoder, image, max_diff, reference_embd};

/// Width and height, or tokens a row and rows.
type Size = (usize, usize);

/// Image, then for Kimi-VL (at least 8 tokens of 28x28 pixels) and Kimi-K2.5 (the file's
/// limits: at least 8 patches, so 2 tokens) the input llama.cpp resizes it to and the token
/// grid (nx, ny).
const IMAGES: &[(&str, [(Size, Size); 2])] = &[
    // 64x64 rounds to 56x56: under Kimi-VL's minimum, scaled up to 84x84.
    ("rgb64", [((84, 84), (3, 3)), ((56, 56), (2, 2))]),
    ("rgb100x60", [((112, 56), (4, 2)), ((112, 56), (4, 2))]),
    ("rgb37x51", [((84, 112), (3, 4)), ((28, 56), (1, 2))]),
    ("rgba80", [((84, 84), (3, 3)), ((84, 84), (3, 3))]),
    ("gray48", [((84, 84), (3, 3)), ((56, 56), (2, 2))]),
    ("rgb200x150", [((196, 140), (7, 5)), ((196, 140), (7, 5))]),
    ("rgb160x130", [((168, 140), (6, 5)), ((168, 140), (6, 5))]),
    ("rgb90x240", [((84, 252), (3, 9)), ((84, 252), (3, 9))]),
];

const PROJECTORS: [(&str, ProjectorKind); 2] = [
    ("kimivl", ProjectorKind::KimiVl),
    ("kimik25", ProjectorKind::KimiK25),
];

#[test]
fn kimi_projectors_load_as_their_kind() {
    for (name, kind) in PROJECTORS {
        let enc = encoder(&format!("{name}.mmproj.gguf"), true);
        assert_eq!(enc.config().projector, kind);
        // Plain positions, causal: no M-RoPE grid, no bidirectional span.
        assert!(!enc.grid_positions() && !enc.bidirectional());
        assert_eq!(enc.output_width(), 128);
    }
    let markers = |name: &str| encoder(&format!("{name}.mmproj.gguf"), true).markers();
    assert_eq!(markers("kimivl"), ("<|media_start|>", "<|media_end|>"));
    assert_eq!(markers("kimik25"), ("<|media_begin|>", "<|media_end|>"));
}

#[test]
fn kimi_k25_takes_glm_markers_when_the_vocabulary_has_them() {
    // GLM-5.2-V reuses Kimi-K2.5's projector with its own image markers; llama.cpp picks
    // them when the text model's vocabulary has `<|begin_of_image|>`. The Kimi text model
    // has not; a vocabulary with it is made here.
    let dir = vision_common::dir();
    let mut enc = encoder("kimik25.mmproj.gguf", true);
    enc.fit_markers_to(&ferrox_gguf::Gguf::open(dir.join("kimi.gguf")).unwrap());
    assert_eq!(enc.markers(), ("<|media_begin|>", "<|media_end|>"));
    let mut w = ferrox_gguf::GgufWriter::new();
    w.set("general.architecture", "glm-dsa");
    w.set(
        "tokenizer.ggml.tokens",
        ferrox_gguf::OwnedValue::Array(ferrox_gguf::OwnedArray::String(vec![
            "<|begin_of_image|>".into(),
            "<|end_of_image|>".into(),
        ])),
    );
    let file = std::env::temp_dir().join(format!("ferrox-glm-vocab-{}.gguf", std::process::id()));
    std::fs::write(&file, w.to_bytes()).unwrap();
    let glm = ferrox_gguf::Gguf::open(&file).unwrap();
    enc.fit_markers_to(&glm);
    std::fs::remove_file(&file).unwrap();
    assert_eq!(enc.markers(), ("<|begin_of_image|>", "<|end_of_image|>"));
    // Kimi-VL's markers do not depend on the model.
    let mut vl = encoder("kimivl.mmproj.gguf", true);
    vl.fit_markers_to(&glm);
    assert_eq!(vl.markers(), ("<|media_start|>", "<|media_end|>"));
}

#[test]
fn images_are_resized_as_llama_cpp_does() {
    for (p, (projector, _)) in PROJECTORS.iter().enumerate() {
        let enc = encoder(&format!("{projector}.mmproj.gguf"), true);
        for &(name, sizes) in IMAGES {
            let (size, grid) = sizes[p];
            let prepared = enc.preprocess(&image(name)).unwrap();
            assert_eq!(
                (prepared.width, prepared.height),
                size,
                "{name} ({projector})"
            );
            let ours = enc.encode_prepared(&prepared).unwrap();
            assert_eq!((ours.nx, ours.ny), grid, "{name} ({projector})");
            // llama.cpp's token count (its embeddings' length).
            let theirs = reference_embd(&format!("{name}.{projector}.f32.embd"));
            assert_eq!(theirs.len(), grid.0 * grid.1 * 128, "{name} ({projector})");
        }
    }
    // Kimi-VL's limits: a huge image is scaled down under 1024 tokens.
    let enc = encoder("kimivl.mmproj.gguf", true);
    let (w, h) = enc.config().input_size(16_000, 9_000);
    assert!(
        w * h <= 1024 * 28 * 28 && w % 28 == 0 && h % 28 == 0,
        "{w}x{h}"
    );
    // Kimi-K2.5's are the file's: at most 4096 patches of 14x14.
    let enc = encoder("kimik25.mmproj.gguf", true);
    let (w, h) = enc.config().input_size(16_000, 9_000);
    assert!(w * h <= 4096 * 14 * 14 && w * h > 3000 * 14 * 14, "{w}x{h}");
}

/// How close to llama.cpp (flash attention off) every value of an image's rows must be.
/// The differences are summation order but where an f16 rounding of ggml's GELU table (in
/// every layer and in the projector) flips; attention spreads a flip over every token. The
/// table is what llama.cpp computes: with it, the median token lies 1.5e-4 to 3.4e-4 from
/// llama.cpp's and the largest value 6.9e-4 (rgb200x150, Kimi-VL); with an exact GELU
/// instead, the median moves to 6.9e-4 to 7.7e-4 and the largest to 1.1e-3.
const F32_BAR: f32 = 1e-3;

#[test]
fn kimi_embeddings_match_llama_cpp() {
    let mut worst = 0.0f32;
    for (projector, _) in PROJECTORS {
        let enc = encoder(&format!("{projector}.mmproj.gguf"), true);
        for &(name, _) in IMAGES {
            let ours = enc.encode(&image(name)).unwrap();
            let theirs = reference_embd(&format!("{name}.{projector}.f32.embd"));
            assert_eq!(ours.data.len(), theirs.len(), "{name} ({projector})");
            let d = max_diff(&ours.data, &theirs);
            assert!(d <= F32_BAR, "{name} ({projector}): {d}");
            worst = worst.max(d);
        }
    }
    eprintln!("largest difference from llama.cpp: {worst}");
}

#[test]
fn default_attention_stays_inside_llama_cpps_band() {
    let checked: usize = PROJECTORS
        .iter()
        .map(|(projector, _)| check_default_band(projector, IMAGES.iter().map(|i| i.0)))
        .sum();
    assert_eq!(checked, 2 * IMAGES.len());
}

#[test]
fn token_limits_apply_as_llama_cpp_applies_them() {
    // --image-max-tokens 12: Kimi-VL scales 200x150 down to 4x3 tokens; a Kimi-K2.5 file
    // that states its own pixel limits keeps them (llama.cpp ignores the flag there).
    let limited = |projector: &str| {
        let options = VisionOptions {
            threads: 2,
            f32_attention: true,
            image_min_tokens: None,
            image_max_tokens: Some(12),
        };
        let path = vision_common::dir().join(format!("{projector}.mmproj.gguf"));
        VisionEncoder::open(path, &options).unwrap()
    };
    for (projector, grid) in [("kimivl", (4, 3)), ("kimik25", (7, 5))] {
        let ours = limited(projector).encode(&image("rgb200x150")).unwrap();
        assert_eq!((ours.nx, ours.ny), grid, "{projector}");
        let theirs = reference_embd(&format!("rgb200x150.{projector}.max12.embd"));
        let d = max_diff(&ours.data, &theirs);
        assert!(d <= F32_BAR, "{projector}: {d}");
    }
}
