//! Qwen-VL image input against llama.cpp on the synthetic pair of `fixtures/vision/`
//! (`qwen2vl.gguf` with the Qwen2.5-VL and Qwen2-VL projectors): the input size each image
//! is resized to, the grid of image tokens, and the projector's embeddings against `mtmd`'s
//! with flash attention off and, with the defaults (f16 keys and values), within llama.cpp's
//! own flash-attention on/off band. References:
//! `scripts/reference/gen-vision-qwen-refs.sh`.

mod vision_common;

use ferrox_models::vision::{ProjectorKind, VisionEncoder, VisionOptions};
use vision_common::{check_default_band, encoder, image, max_diff, reference_embd};

/// Width and height, or tokens a row and rows.
type Size = (usize, usize);

/// Image, the input llama.cpp resizes it to, and the token grid (nx, ny).
const IMAGES: &[(&str, Size, Size)] = &[
    // 64x64 rounds to 56x56, under the 8-token minimum: scaled up to 84x84.
    ("rgb64", (84, 84), (3, 3)),
    // 100x60 rounds to 112x56, exactly the minimum.
    ("rgb100x60", (112, 56), (4, 2)),
    ("rgb37x51", (84, 112), (3, 4)),
    ("rgba80", (84, 84), (3, 3)),
    ("gray48", (84, 84), (3, 3)),
    // 7x5 merged tokens: windows of 4x4, 3x4, 4x1 and 3x1 in Qwen2.5-VL's windowed layers.
    ("rgb200x150", (196, 140), (7, 5)),
    ("rgb160x130", (168, 140), (6, 5)),
    // Tall: windows of 3x4, 3x4 and 3x1.
    ("rgb90x240", (84, 252), (3, 9)),
];

/// How close to llama.cpp (flash attention off) an image's token rows must be: the median
/// token's largest difference within `median`, every value within `max`. The differences are
/// summation order, except where an f16 rounding flips: ggml rounds the patch convolution's
/// inputs and its GELU tables' inputs and outputs to f16, and an intermediate value landing
/// on the other side of a rounding moves the rows it reaches by up to a few 1e-4.
/// Qwen2.5-VL (SiLU in its layers, the GELU table only in the merger) matches to about 1e-6
/// but for the tokens of a window where that happened; Qwen2-VL runs the quick GELU's table
/// in every layer, and its attention spreads each flip over every token; Qwen3-VL runs
/// GELU's table in every layer likewise (its rows hold the main projection and two deepstack
/// mergers' outputs).
struct Bar {
    median: f32,
    max: f32,
}

const PROJECTORS: &[(&str, ProjectorKind, Bar)] = &[
    (
        "qwen25vl",
        ProjectorKind::Qwen25Vl,
        Bar {
            median: 2e-6,
            max: 5e-4,
        },
    ),
    (
        "qwen2vl",
        ProjectorKind::Qwen2Vl,
        Bar {
            median: 5e-4,
            max: 1.5e-3,
        },
    ),
    (
        "qwen3vl",
        ProjectorKind::Qwen3Vl,
        Bar {
            median: 5e-4,
            max: 1.5e-3,
        },
    ),
];

#[test]
fn qwen_projectors_load_as_their_kind() {
    for &(name, kind, _) in PROJECTORS {
        let enc = encoder(&format!("{name}.mmproj.gguf"), true);
        assert_eq!(enc.config().projector, kind);
        assert_eq!(enc.markers(), ("<|vision_start|>", "<|vision_end|>"));
        assert!(enc.grid_positions() && !enc.bidirectional());
    }
}

#[test]
fn images_are_resized_as_llama_cpp_does() {
    let enc = encoder("qwen25vl.mmproj.gguf", true);
    for &(name, size, grid) in IMAGES {
        let prepared = enc.preprocess(&image(name)).unwrap();
        assert_eq!((prepared.width, prepared.height), size, "{name}");
        let ours = enc.encode_prepared(&prepared).unwrap();
        assert_eq!((ours.nx, ours.ny), grid, "{name}");
        assert_eq!(ours.n_tokens, grid.0 * grid.1);
    }
    // The limits: a huge image is scaled down under 4096 tokens, a sliver up to 8.
    let c = enc.config();
    let (w, h) = c.input_size(16_000, 9_000);
    assert!(
        w * h <= 4096 * 28 * 28 && w % 28 == 0 && h % 28 == 0,
        "{w}x{h}"
    );
    let (w, h) = c.input_size(3, 1);
    assert!(
        w * h >= 8 * 28 * 28 && w % 28 == 0 && h % 28 == 0,
        "{w}x{h}"
    );
}

#[test]
fn qwen_embeddings_match_llama_cpp() {
    for (projector, _, bar) in PROJECTORS {
        let enc = encoder(&format!("{projector}.mmproj.gguf"), true);
        let width = enc.output_width();
        for &(name, _, _) in IMAGES {
            let ours = enc.encode(&image(name)).unwrap();
            let theirs = reference_embd(&format!("{name}.{projector}.f32.embd"));
            assert_eq!(ours.n_embd, width);
            assert_eq!(ours.n_tokens, ours.nx * ours.ny);
            assert_eq!(ours.data.len(), theirs.len(), "{name} ({projector})");
            let per_token: Vec<f32> = ours
                .data
                .chunks(width)
                .zip(theirs.chunks(width))
                .map(|(a, b)| max_diff(a, b))
                .collect();
            let worst = per_token.iter().copied().fold(0.0, f32::max);
            let mut sorted = per_token.clone();
            sorted.sort_by(f32::total_cmp);
            let median = sorted[sorted.len() / 2];
            assert!(
                worst <= bar.max && median <= bar.median,
                "{name} ({projector}): max difference {worst}, median token {median}"
            );
        }
    }
}

#[test]
fn default_attention_stays_inside_llama_cpps_band() {
    let checked: usize = PROJECTORS
        .iter()
        .map(|(projector, _, _)| check_default_band(projector, IMAGES.iter().map(|i| i.0)))
        .sum();
    assert_eq!(checked, 3 * IMAGES.len());
}

#[test]
fn qwen3_vl_rows_carry_the_deepstack_features() {
    // Two deepstack mergers: each token's row is the main projection and their outputs.
    let enc = encoder("qwen3vl.mmproj.gguf", true);
    assert_eq!(enc.deepstack_count(), 2);
    assert_eq!(enc.output_width(), 3 * 128);
    // Positions: a 6x6 grid, resized to the input unless it is 6x6 patches (64x64 images
    // become 96x96).
    let prepared = enc.preprocess(&image("rgb64")).unwrap();
    assert_eq!((prepared.width, prepared.height), (96, 96));
    let prepared = enc.preprocess(&image("rgb200x150")).unwrap();
    assert_eq!((prepared.width, prepared.height), (192, 160));
}

#[test]
fn token_limits_resize_as_llama_cpps_flags_do() {
    // --image-min-tokens 40 scales 100x60 up to 9x5 tokens, --image-max-tokens 12 scales
    // 200x150 down to 4x3 (ref/*.min40.embd, *.max12.embd).
    let limited = |min, max| {
        let options = VisionOptions {
            threads: 2,
            f32_attention: true,
            image_min_tokens: min,
            image_max_tokens: max,
        };
        VisionEncoder::open(vision_common::dir().join("qwen25vl.mmproj.gguf"), &options)
    };
    for (min, max, name, grid, reference) in [
        (
            Some(40),
            None,
            "rgb100x60",
            (9, 5),
            "rgb100x60.qwen25vl.min40.embd",
        ),
        (
            None,
            Some(12),
            "rgb200x150",
            (4, 3),
            "rgb200x150.qwen25vl.max12.embd",
        ),
    ] {
        let enc = limited(min, max).unwrap();
        let ours = enc.encode(&image(name)).unwrap();
        assert_eq!((ours.nx, ours.ny), grid, "{name}");
        let d = max_diff(&ours.data, &reference_embd(reference));
        assert!(d <= 5e-4, "{name}: {d}");
    }
    for (min, max) in [(Some(0), None), (None, Some(0)), (Some(20), Some(10))] {
        let err = limited(min, max).err().expect("refused");
        assert!(err.to_string().contains("image token limits"), "{err}");
    }
}
