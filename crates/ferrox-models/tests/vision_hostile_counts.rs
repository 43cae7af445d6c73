//! Opening a vision projector whose metadata holds an edge-case count fails cleanly or
//! works: every integer `clip.*` key of every projector fixture (the first elements of an
//! integer array too), set to 0, small values and 2^29, 2^31-1 and 2^32-1, is loaded and,
//! if it loads, two images are encoded. No case may panic, abort on a huge allocation or take
//! long; the layer count of 2^29, which once sized an allocation of 600 GB, is refused by name.

// Only the count rewriting of the shared helpers is used here.
#[allow(dead_code)]
#[path = "synthetic/hostile.rs"]
mod hostile;
mod vision_common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrox_gguf::Gguf;
use ferrox_models::vision::{VisionEncoder, VisionOptions};

const PROJECTORS: [&str; 6] = [
    "gemma3", "qwen25vl", "qwen2vl", "qwen3vl", "kimivl", "kimik25",
];
/// Small values; then [`hostile::HOSTILE_VALUES`].
const SMALL: [u64; 7] = [0, 1, 2, 3, 7, 9, 100];

/// Loads `bytes` as a projector and encodes `images` with it: whether it loaded.
fn open_and_encode(bytes: Vec<u8>, images: &[ferrox_models::vision::RgbImage]) -> bool {
    let Ok(gguf) = Gguf::from_bytes(bytes) else {
        return false;
    };
    let options = VisionOptions {
        threads: 2,
        ..VisionOptions::default()
    };
    let Ok(encoder) = VisionEncoder::load(Arc::new(gguf), &options) else {
        return false;
    };
    for image in images {
        // An error is a fine answer; a panic is not.
        let _ = encoder.encode(image);
    }
    true
}

#[test]
fn hostile_projector_counts_fail_cleanly() {
    let images = [
        vision_common::image("rgb64"),
        vision_common::image("rgb90x240"),
    ];
    let (mut cases, mut loaded) = (0, 0);
    for projector in PROJECTORS {
        let path = vision_common::dir().join(format!("{projector}.mmproj.gguf"));
        let gguf = Gguf::open(&path).unwrap();
        let keys = hostile::count_keys(&gguf);
        assert!(
            keys.iter().any(|k| k.key == "clip.vision.block_count"),
            "{projector}: no clip.* counts found"
        );
        for key in keys {
            let indices: Vec<Option<usize>> = match key.array_len {
                Some(n) => (0..n.min(3)).map(Some).collect(),
                None => vec![None],
            };
            for index in indices {
                for &value in SMALL.iter().chain(hostile::HOSTILE_VALUES) {
                    let Some(bytes) = hostile::try_with_count(&gguf, &key.key, index, value) else {
                        continue;
                    };
                    let what = format!("{projector}: {} {index:?} = {value}", key.key);
                    let start = Instant::now();
                    let ok = catch_unwind(AssertUnwindSafe(|| open_and_encode(bytes, &images)))
                        .unwrap_or_else(|_| panic!("{what}: panicked"));
                    assert!(
                        start.elapsed() < Duration::from_secs(20),
                        "{what}: took {:?}",
                        start.elapsed()
                    );
                    cases += 1;
                    loaded += usize::from(ok);
                }
            }
        }
        let huge = hostile::with_count(&gguf, "clip.vision.block_count", None, 1 << 29);
        let err = VisionEncoder::load(
            Arc::new(Gguf::from_bytes(huge).unwrap()),
            &VisionOptions::default(),
        )
        .err()
        .expect("refused");
        assert!(
            err.to_string().contains("block_count"),
            "{projector}: {err}"
        );
    }
    eprintln!("{cases} hostile projector files: {loaded} loaded and encoded, the rest refused");
    assert!(loaded > 0 && loaded < cases);
}
