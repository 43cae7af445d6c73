//! A model that needs something we cannot run fails at load with an error naming it,
//! never later with a wrong answer.

mod synthetic;

use std::sync::Arc;

use ferrox_gguf::{GgmlType, Gguf, GgufWriter};
use ferrox_models::{Decoder, EngineOptions, ModelError};

/// The synthetic qwen2 model with one tensor re-typed (and re-sized) as `ty`, or with its
/// architecture renamed.
fn altered(tensor: &str, ty: GgmlType, arch: Option<&str>) -> Gguf {
    let original = Gguf::from_bytes(synthetic::gguf_bytes("qwen2")).unwrap();
    let mut w = GgufWriter::new();
    for (key, value) in original.metadata().iter() {
        w.set(key, value.to_owned_value());
    }
    if let Some(arch) = arch {
        w.set("general.architecture", arch);
    }
    for t in original.tensors() {
        if t.name == tensor {
            let bytes = ty.bytes_for(t.n_elements).unwrap() as usize;
            w.add_tensor(&t.name, ty, &t.shape, vec![0u8; bytes])
                .unwrap();
        } else {
            w.add_tensor(&t.name, t.ty, &t.shape, original.tensor_data(t).unwrap())
                .unwrap();
        }
    }
    Gguf::from_bytes(w.to_bytes()).unwrap()
}

fn load(gguf: Gguf) -> Result<Decoder, ModelError> {
    ferrox_models::load_as::<Decoder>(
        Arc::new(gguf),
        &EngineOptions {
            n_ctx: 64,
            threads: 1,
            ..Default::default()
        },
    )
}

#[test]
fn an_unsupported_tensor_type_is_named_with_its_tensor() {
    let err = load(altered("blk.1.ffn_down.weight", GgmlType::I32, None))
        .err()
        .expect("must fail");
    let text = err.to_string();
    assert!(
        matches!(err, ModelError::UnsupportedTensorType { .. }),
        "{text}"
    );
    assert!(
        text.contains("blk.1.ffn_down.weight") && text.contains("I32"),
        "{text}"
    );
}

#[test]
fn an_unknown_architecture_is_named() {
    let err = load(altered("", GgmlType::F32, Some("mamba9")))
        .err()
        .expect("must fail");
    assert!(err.to_string().contains("mamba9"), "{err}");
}

#[test]
fn a_missing_required_key_is_named() {
    let original = Gguf::from_bytes(synthetic::gguf_bytes("qwen2")).unwrap();
    let mut w = GgufWriter::new();
    for (key, value) in original
        .metadata()
        .iter()
        .filter(|(k, _)| *k != "qwen2.embedding_length")
    {
        w.set(key, value.to_owned_value());
    }
    for t in original.tensors() {
        w.add_tensor(&t.name, t.ty, &t.shape, original.tensor_data(t).unwrap())
            .unwrap();
    }
    let err = load(Gguf::from_bytes(w.to_bytes()).unwrap())
        .err()
        .expect("must fail");
    assert!(err.to_string().contains("qwen2.embedding_length"), "{err}");
}
