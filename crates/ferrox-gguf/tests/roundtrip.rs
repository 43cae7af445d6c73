mod common;

use ferrox_gguf::{
    GgmlType, Gguf, GgufError, GgufWriter, OwnedArray, OwnedValue, Value, ValueType,
};
use std::borrow::Cow;

#[test]
fn write_then_read_gives_identical_metadata_and_bytes() {
    let w = common::sample_writer();
    let gguf = Gguf::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(gguf.version(), 3);
    let meta = gguf.metadata();
    assert_eq!(meta.len(), 21);
    assert_eq!(meta.architecture().unwrap(), "llama");
    assert_eq!(meta.get_str("general.name").unwrap(), "sample ✓ 模型");
    assert_eq!(meta.get_u32("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(meta.get_u64("t.u64").unwrap(), u64::MAX);
    assert_eq!(meta.get_i32("t.i32").unwrap(), -2_000_000_000);
    assert_eq!(meta.get_f32("t.f32").unwrap(), 1.5);
    assert_eq!(meta.get_f32("t.f64").unwrap(), -0.25);
    assert!(meta.get_bool("t.bool").unwrap());
    assert_eq!(meta.get_u32("t.u8").unwrap(), 7);

    // Every value read back equals what was written, in order.
    let written = [
        ("general.architecture", OwnedValue::from("llama")),
        ("t.i64", OwnedValue::I64(i64::MIN)),
        (
            "t.nested",
            OwnedValue::Array(OwnedArray::Array(vec![
                OwnedArray::U32(vec![1, 2]),
                OwnedArray::String(vec!["a".into(), "bc".into()]),
                OwnedArray::Array(vec![OwnedArray::F64(vec![0.5])]),
                OwnedArray::I64(vec![]),
            ])),
        ),
        ("t.flags", OwnedValue::from(vec![true, false, true])),
        (
            "t.empty_array",
            OwnedValue::Array(OwnedArray::String(vec![])),
        ),
    ];
    for (key, value) in written {
        assert_eq!(meta.get(key).unwrap().to_owned_value(), value, "{key}");
    }
    let keys: Vec<&str> = meta.iter().map(|(k, _)| k).collect();
    assert_eq!(keys[0], "general.architecture");
    assert_eq!(keys[20], "t.empty_array");

    let tokens = meta.get_array("t.tokens").unwrap();
    assert_eq!(tokens.elem_type(), ValueType::String);
    let strings: Vec<&str> = tokens.strings().unwrap().collect();
    assert_eq!(strings, ["<s>", "</s>", "▁hello", "🙂", ""]);
    let scores = meta.get_array("t.scores").unwrap();
    assert_eq!(&*scores.as_slice::<f32>().unwrap(), &[0.0, -1.0, -2.5]);
    assert!(scores.as_slice::<u32>().is_none());

    // Tensors: same names, types, shapes and bytes, in order, aligned.
    let expected = common::sample_writer();
    let reread = Gguf::from_bytes(expected.to_bytes()).unwrap();
    let names: Vec<&str> = gguf.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        ["a.weight", "b.weight", "c.weight", "d.bias", "e.scalar"]
    );
    let b = gguf.require_tensor("b.weight").unwrap();
    assert_eq!(
        (b.ty, b.shape.as_slice(), b.n_elements),
        (GgmlType::Q4_0, &[64u64, 2][..], 128)
    );
    assert_eq!(gguf.tensor_data(b).unwrap(), common::pattern(72));
    let a = gguf.require_tensor("a.weight").unwrap();
    let a_bytes = gguf.tensor_data(a).unwrap();
    assert_eq!(f32::from_le_bytes(a_bytes[4..8].try_into().unwrap()), 0.5);
    for t in gguf.tensors() {
        assert_eq!(t.file_offset % gguf.alignment(), 0);
        assert_eq!(gguf.tensor_data(t).unwrap(), reread.tensor_data(t).unwrap());
    }
    assert_eq!(gguf.require_tensor("e.scalar").unwrap().n_elements, 1);
}

#[test]
fn rewriting_what_was_read_reproduces_the_file() {
    let original = common::sample_writer().to_bytes();
    let gguf = Gguf::from_bytes(original.clone()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in gguf.metadata().iter() {
        w.set(k, v.to_owned_value());
    }
    for t in gguf.tensors() {
        w.add_tensor(&t.name, t.ty, &t.shape, gguf.tensor_data(t).unwrap())
            .unwrap();
    }
    assert_eq!(w.to_bytes(), original);
}

#[test]
fn custom_alignment_is_honoured() {
    let mut w = common::sample_writer();
    w.set_alignment(64).unwrap();
    let gguf = Gguf::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(gguf.alignment(), 64);
    assert_eq!(gguf.data_offset() % 64, 0);
    for t in gguf.tensors() {
        assert_eq!(t.file_offset % 64, 0);
    }
    assert!(GgufWriter::new().set_alignment(48).is_err());
}

#[test]
fn typed_accessors_report_missing_and_mistyped_keys() {
    let gguf = Gguf::from_bytes(common::sample_writer().to_bytes()).unwrap();
    let meta = gguf.metadata();
    assert!(matches!(meta.get_u32("nope"), Err(GgufError::MissingKey(k)) if k == "nope"));
    assert!(matches!(meta.opt_u32("nope"), Ok(None)));
    let err = meta.get_u32("general.name").unwrap_err();
    assert!(matches!(err, GgufError::WrongType { .. }));
    assert!(err.to_string().contains("general.name"));
    // u64::MAX does not fit in a u32: an error, not a wrapped value.
    assert!(meta.get_u32("t.u64").is_err());
    assert!(meta.get_u32("t.i8").is_err());
    assert!(matches!(meta.get("t.i16"), Some(Value::I16(-32000))));
    assert!(matches!(
        gguf.require_tensor("zz"),
        Err(GgufError::MissingTensor(_))
    ));
}

#[test]
fn typed_slices_borrow_when_aligned() {
    // A u32 array placed at a 4-aligned offset is borrowed, not copied.
    let mut w = GgufWriter::new();
    w.set("k", vec![1u32, 2, 3]);
    let bytes = w.to_bytes();
    let gguf = Gguf::from_bytes(bytes).unwrap();
    let arr = gguf.metadata().get_array("k").unwrap();
    let slice = arr.as_slice::<u32>().unwrap();
    assert_eq!(&*slice, &[1, 2, 3]);
    // header 24 + key (8+1) + type 4 + elem type 4 + len 8 = offset 49: unaligned -> copied.
    assert!(matches!(slice, Cow::Owned(_)));
    let mut w = GgufWriter::new();
    w.set("kkkk", vec![1u32, 2, 3]);
    let gguf = Gguf::from_bytes(w.to_bytes()).unwrap();
    let arr = gguf.metadata().get_array("kkkk").unwrap();
    let slice = arr.as_slice::<u32>().unwrap();
    assert_eq!(&*slice, &[1, 2, 3]);
    if cfg!(target_endian = "little") {
        assert!(matches!(slice, Cow::Borrowed(_)));
    }
}

#[test]
fn writer_rejects_inconsistent_tensors() {
    let mut w = GgufWriter::new();
    assert!(w
        .add_tensor("x", GgmlType::Q4_0, &[33], vec![0; 18])
        .is_err());
    assert!(w
        .add_tensor("x", GgmlType::Q4_0, &[32], vec![0; 17])
        .is_err());
    assert!(w
        .add_tensor("x", GgmlType::Other(4), &[32], vec![0; 18])
        .is_err());
    assert!(w
        .add_tensor("x", GgmlType::F32, &[1, 1, 1, 1, 1], vec![0; 4])
        .is_err());
    w.add_tensor("x", GgmlType::Q4_0, &[32], vec![0; 18])
        .unwrap();
    assert!(w
        .add_tensor("x", GgmlType::Q4_0, &[32], vec![0; 18])
        .is_err());
}
