#![allow(dead_code)]
//! A small GGUF file exercising every metadata type, nested arrays and several tensor types.

use ferrox_gguf::{GgmlType, GgufWriter, OwnedArray, OwnedValue};

pub fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.set("general.architecture", "llama")
        .set("general.name", "sample ✓ 模型")
        .set("t.u8", 7u8)
        .set("t.i8", -7i8)
        .set("t.u16", 65000u16)
        .set("t.i16", -32000i16)
        .set("t.u32", 4_000_000_000u32)
        .set("t.i32", -2_000_000_000i32)
        .set("t.f32", 1.5f32)
        .set("t.bool", true)
        .set("t.u64", u64::MAX)
        .set("t.i64", i64::MIN)
        .set("t.f64", -0.25f64)
        .set("t.empty", "")
        .set("t.tokens", vec!["<s>", "</s>", "▁hello", "🙂", ""])
        .set("t.scores", vec![0.0f32, -1.0, -2.5])
        .set("t.types", vec![1i32, 3, 6])
        .set("t.flags", vec![true, false, true])
        .set("t.bytes", vec![1u8, 2, 255])
        .set(
            "t.nested",
            OwnedArray::Array(vec![
                OwnedArray::U32(vec![1, 2]),
                OwnedArray::String(vec!["a".into(), "bc".into()]),
                OwnedArray::Array(vec![OwnedArray::F64(vec![0.5])]),
                OwnedArray::I64(vec![]),
            ]),
        )
        .set(
            "t.empty_array",
            OwnedValue::Array(OwnedArray::String(vec![])),
        );
    let f32s: Vec<u8> = (0..64)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    w.add_tensor("a.weight", GgmlType::F32, &[16, 4], f32s)
        .unwrap();
    w.add_tensor("b.weight", GgmlType::Q4_0, &[64, 2], pattern(4 * 18))
        .unwrap();
    w.add_tensor("c.weight", GgmlType::Q4K, &[256], pattern(144))
        .unwrap();
    w.add_tensor("d.bias", GgmlType::F16, &[3], pattern(6))
        .unwrap();
    w.add_tensor("e.scalar", GgmlType::I32, &[], pattern(4))
        .unwrap();
    w
}

/// Deterministic non-trivial bytes.
pub fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 + 7) as u8).collect()
}
