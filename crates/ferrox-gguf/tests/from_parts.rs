//! A checkpoint assembled from parts: metadata, and tensors pointing into owned buffers
//! (memory maps work the same way), each range checked.

use ferrox_gguf::{GgmlType, Gguf, GgufError, TensorPart, TensorStorage};

fn part(name: &str, shape: &[u64], storage: usize, offset: u64) -> TensorPart {
    TensorPart {
        name: name.into(),
        ty: GgmlType::F32,
        shape: shape.to_vec(),
        storage,
        offset,
    }
}

fn floats(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn tensors_read_from_their_storages() {
    let metadata = vec![
        ("general.architecture".to_string(), "llama".into()),
        ("llama.block_count".to_string(), 2u32.into()),
    ];
    let storages = vec![
        TensorStorage::Owned(floats(&[1.0, 2.0, 3.0])),
        TensorStorage::Owned(floats(&[4.0, 5.0])),
    ];
    let tensors = vec![
        part("a", &[2], 0, 4),
        part("b", &[2], 1, 0),
        // Two tensors may share bytes (a tied output head).
        part("c", &[2], 1, 0),
    ];
    let g = Gguf::from_parts(metadata, storages, tensors).unwrap();
    assert_eq!(g.metadata().architecture().unwrap(), "llama");
    assert_eq!(g.metadata().get_u32("llama.block_count").unwrap(), 2);
    let data = |n: &str| {
        g.tensor_data(g.require_tensor(n).unwrap())
            .unwrap()
            .to_vec()
    };
    assert_eq!(data("a"), floats(&[2.0, 3.0]));
    assert_eq!(data("b"), floats(&[4.0, 5.0]));
    assert_eq!(data("c"), data("b"));
    assert_eq!(g.shard_count(), 1, "no mapped files");
    assert_eq!(g.tensor_bytes(), 24);
}

#[test]
fn bad_parts_are_errors() {
    let try_parts = |tensors: Vec<TensorPart>| {
        let storages = vec![TensorStorage::Owned(floats(&[1.0, 2.0]))];
        Gguf::from_parts(Vec::new(), storages, tensors)
    };
    let past_end = try_parts(vec![part("x", &[2], 0, 4)]);
    assert!(matches!(past_end, Err(GgufError::Invalid { .. })));
    let no_storage = try_parts(vec![part("x", &[1], 1, 0)]);
    assert!(no_storage.is_err());
    let forged = try_parts(vec![part("x", &[1], usize::MAX, 0)]);
    assert!(forged.is_err());
    let overflow = try_parts(vec![part("x", &[u64::MAX, 2], 0, 0)]);
    assert!(overflow.is_err());
    let too_many_dims = try_parts(vec![part("x", &[1, 1, 1, 1, 1], 0, 0)]);
    assert!(too_many_dims.is_err());
    let twice = try_parts(vec![part("x", &[1], 0, 0), part("x", &[1], 0, 4)]);
    assert!(twice.is_err());
}
