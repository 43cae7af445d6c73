#![allow(dead_code)]
//! Shared helpers for the image-input tests over `fixtures/vision/`.

use std::path::PathBuf;

use ferrox_models::vision::{RgbImage, VisionEncoder, VisionOptions};

pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/vision")
}

/// The test image `<name>.png`.
pub fn image(name: &str) -> RgbImage {
    let bytes = std::fs::read(dir().join(format!("{name}.png"))).unwrap();
    RgbImage::decode(&bytes).unwrap()
}

/// A reference embedding file of `ref/` (raw little-endian f32).
pub fn reference_embd(name: &str) -> Vec<f32> {
    let bytes = std::fs::read(dir().join("ref").join(name)).unwrap();
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// The projector file `mmproj`, two threads.
pub fn encoder(mmproj: &str, f32_attention: bool) -> VisionEncoder {
    let options = VisionOptions {
        threads: 2,
        f32_attention,
        ..VisionOptions::default()
    };
    VisionEncoder::open(dir().join(mmproj), &options).unwrap()
}

pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Each image's embeddings through `projector` with the default (f16) attention lie within
/// llama.cpp's own flash-attention on/off band (`<image>.<projector>.default.embd` against
/// `.f32.embd`); returns how many were checked.
pub fn check_default_band(
    projector: &str,
    images: impl IntoIterator<Item = &'static str>,
) -> usize {
    let enc = encoder(&format!("{projector}.mmproj.gguf"), false);
    let mut checked = 0;
    for name in images {
        // Under 64 patches llama.cpp's one-query kernel runs (queries rounded, outputs
        // accumulated in f16), from there its tiled one: both are followed.
        let ours = enc.encode(&image(name)).unwrap();
        let default = reference_embd(&format!("{name}.{projector}.default.embd"));
        let off = reference_embd(&format!("{name}.{projector}.f32.embd"));
        let band = max_diff(&default, &off);
        let d = max_diff(&ours.data, &default);
        assert!(
            d <= band,
            "{name} ({projector}): {d} from llama.cpp's defaults, its own band {band}"
        );
        checked += 1;
    }
    checked
}
