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
