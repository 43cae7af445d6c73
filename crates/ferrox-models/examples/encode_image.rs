//! Times a vision encoder on one image (`scripts/bench-vision.sh`).
//!
//! ```sh
//! cargo run --release -p ferrox-models --example encode_image -- MMPROJ IMAGE \
//!     [--threads N] [--runs N] [--f32-attention] [--out FILE]
//! ```
//!
//! Opens the projector, decodes and preprocesses the image (resize, normalize), encodes it
//! once to warm up, then `--runs` times (default 5), and prints one JSON line: the settings,
//! the projector's shapes, `preprocess_ms`, `warmup_ms`, `runs_ms` and their `median_ms`.
//! The timed part is the encoder and projector on the preprocessed input, what llama.cpp's
//! `mtmd_encode_chunk` times (its preprocessing happens when the prompt is tokenized).
//! `--out` writes the embeddings as raw little-endian f32, row-major `[n_tokens][n_embd]`,
//! as `mtmd-ref embed` does.

use std::time::Instant;

use ferrox_models::vision::{RgbImage, VisionEncoder, VisionOptions};

fn usage() -> ! {
    eprintln!(
        "usage: encode_image MMPROJ IMAGE [--threads N] [--runs N] [--f32-attention] [--out FILE]"
    );
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [mmproj, image, flags @ ..] = args.as_slice() else {
        usage()
    };
    let (mut threads, mut runs, mut f32_attention, mut out) = (0usize, 5usize, false, None);
    let mut flags = flags.iter();
    let number =
        |v: Option<&String>| -> usize { v.and_then(|v| v.parse().ok()).unwrap_or_else(|| usage()) };
    while let Some(flag) = flags.next() {
        match flag.as_str() {
            "--threads" => threads = number(flags.next()),
            "--runs" => runs = number(flags.next()).max(1),
            "--f32-attention" => f32_attention = true,
            "--out" => out = Some(flags.next().unwrap_or_else(|| usage()).clone()),
            _ => usage(),
        }
    }
    let fail = |what: &str, e: &dyn std::fmt::Display| -> ! {
        eprintln!("encode_image: {what}: {e}");
        std::process::exit(1)
    };

    let options = VisionOptions {
        threads,
        f32_attention,
        ..VisionOptions::default()
    };
    let encoder = VisionEncoder::open(mmproj, &options).unwrap_or_else(|e| fail(mmproj, &e));
    let bytes = std::fs::read(image).unwrap_or_else(|e| fail(image, &e));
    let start = Instant::now();
    let img = RgbImage::decode(&bytes).unwrap_or_else(|e| fail(image, &e));
    let planar = encoder
        .preprocess(&img)
        .unwrap_or_else(|e| fail("preprocess", &e));
    let preprocess_ms = ms(start);

    let start = Instant::now();
    let embeddings = encoder
        .encode_prepared(&planar)
        .unwrap_or_else(|e| fail("encode", &e));
    let warmup_ms = ms(start);
    let mut runs_ms: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            let again = encoder
                .encode_prepared(&planar)
                .unwrap_or_else(|e| fail("encode", &e));
            let t = ms(start);
            assert_eq!(again, embeddings, "encodes of one input differ");
            t
        })
        .collect();
    if let Some(path) = &out {
        let raw: Vec<u8> = embeddings
            .data
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        std::fs::write(path, raw).unwrap_or_else(|e| fail(path, &e));
    }

    let c = encoder.config();
    let report = serde_json::json!({
        "mmproj": mmproj,
        "image": image,
        "image_width": img.width,
        "image_height": img.height,
        "threads": threads,
        "f32_attention": f32_attention,
        "input_width": planar.width,
        "input_height": planar.height,
        "patch_size": c.patch_size,
        "n_embd": c.n_embd,
        "n_ff": c.n_ff,
        "n_layer": c.n_layer,
        "n_head": c.n_head,
        "n_tokens": embeddings.n_tokens,
        "n_embd_out": embeddings.n_embd,
        "preprocess_ms": preprocess_ms,
        "warmup_ms": warmup_ms,
        "runs_ms": runs_ms.clone(),
        "median_ms": median(&mut runs_ms),
    });
    println!("{report}");
}

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
