//! The image-input fixtures in `fixtures/vision/` (text models, projectors,
//! test images) are exactly what `synthetic::vision` generates, so that the files llama.cpp's
//! reference outputs were computed from and the generator cannot drift apart. Regenerate them
//! with `cargo run -p ferrox-models --example write_synthetic -- fixtures/vision --vision`
//! (then `scripts/reference/gen-vision-refs.sh` for the reference outputs).

mod synthetic;

use std::path::PathBuf;

use ferrox_gguf::{GgmlType, Gguf};
use synthetic::vision;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/vision")
}

fn assert_same(name: &str, generated: &[u8]) {
    let path = fixture_dir().join(name);
    let stored = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        stored == generated,
        "{name}: the committed file ({} bytes) differs from the generator's output ({} bytes); \
         regenerate fixtures/vision (see fixtures/vision/README.md)",
        stored.len(),
        generated.len()
    );
}

#[test]
fn text_model_matches_generator() {
    let bytes = vision::gemma3_text_bytes();
    assert_same("gemma3.gguf", &bytes);
    let gguf = Gguf::from_bytes(bytes).expect("parses");
    let meta = gguf.metadata();
    assert_eq!(meta.architecture().unwrap(), "gemma3");
}

#[test]
fn mmproj_files_match_generator() {
    assert_same(
        "gemma3.mmproj.gguf",
        &vision::gemma3_mmproj_bytes(GgmlType::F32),
    );
    assert_same(
        "gemma3.f16.mmproj.gguf",
        &vision::gemma3_mmproj_bytes(GgmlType::F16),
    );
}

#[test]
fn qwen_files_match_generator() {
    let text = vision::qwen2vl_text_bytes();
    assert_same("qwen2vl.gguf", &text);
    let gguf = Gguf::from_bytes(text).expect("parses");
    assert_eq!(gguf.metadata().architecture().unwrap(), "qwen2vl");
    assert_same(
        "qwen25vl.mmproj.gguf",
        &vision::qwen_mmproj_bytes(vision::QwenVision::Qwen25Vl),
    );
    assert_same(
        "qwen2vl.mmproj.gguf",
        &vision::qwen_mmproj_bytes(vision::QwenVision::Qwen2Vl),
    );
    assert_same("qwen3vl.gguf", &vision::qwen3vl_text_bytes());
    assert_same("qwen3vl.mmproj.gguf", &vision::qwen3vl_mmproj_bytes());
    for image in vision::qwen_extra_images() {
        assert_same(&format!("{}.png", image.name), &image.png);
    }
}

#[test]
fn images_match_generator() {
    let images = vision::test_images();
    assert_eq!(images.len(), vision::IMAGES.len());
    for image in images {
        assert_same(&format!("{}.png", image.name), &image.png);
    }
}

/// The reference embeddings have the projector's shape: 16 rows of the text width.
#[test]
fn reference_embeddings_have_the_projector_shape() {
    let dir = fixture_dir().join("ref");
    for &(name, ..) in vision::IMAGES {
        for kind in ["f32", "f16"] {
            let path = dir.join(format!("{name}.{kind}.embd"));
            let len = std::fs::metadata(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
                .len() as usize;
            assert_eq!(
                len,
                vision::N_IMAGE_TOKENS * vision::TEXT_N_EMBD * 4,
                "{}",
                path.display()
            );
        }
    }
}

#[test]
fn kimi_files_match_generator() {
    let text = vision::kimi_text_bytes();
    assert_same("kimi.gguf", &text);
    let gguf = Gguf::from_bytes(text).expect("parses");
    assert_eq!(gguf.metadata().architecture().unwrap(), "deepseek2");
    let glm = vision::glm5v_text_bytes();
    assert_same("glm5v.gguf", &glm);
    let gguf = Gguf::from_bytes(glm).expect("parses");
    assert_eq!(gguf.metadata().architecture().unwrap(), "glm-dsa");
    assert_same(
        "kimivl.mmproj.gguf",
        &vision::kimi_mmproj_bytes(vision::KimiVision::KimiVl),
    );
    assert_same(
        "kimik25.mmproj.gguf",
        &vision::kimi_mmproj_bytes(vision::KimiVision::KimiK25),
    );
}
