//! Files our writer produces load in llama.cpp's reference reader (the PyPI `gguf` package)
//! with the same metadata, tensor infos and bytes. Needs `python3` with `gguf` installed
//! (`pip install gguf`; `scripts/test.sh` does it).

mod common;

use std::process::Command;

use ferrox_gguf::{Gguf, OwnedArray, OwnedValue};
use serde_json::{json, Value as Json};

fn owned_json(v: &OwnedValue) -> Json {
    match v {
        OwnedValue::U8(x) => json!(x),
        OwnedValue::I8(x) => json!(x),
        OwnedValue::U16(x) => json!(x),
        OwnedValue::I16(x) => json!(x),
        OwnedValue::U32(x) => json!(x),
        OwnedValue::I32(x) => json!(x),
        OwnedValue::F32(x) => json!(*x as f64),
        OwnedValue::Bool(x) => json!(x),
        OwnedValue::String(x) => json!(x),
        OwnedValue::Array(a) => array_json(a),
        OwnedValue::U64(x) => json!(x),
        OwnedValue::I64(x) => json!(x),
        OwnedValue::F64(x) => json!(x),
    }
}

fn array_json(a: &OwnedArray) -> Json {
    match a {
        OwnedArray::U8(v) => json!(v),
        OwnedArray::I8(v) => json!(v),
        OwnedArray::U16(v) => json!(v),
        OwnedArray::I16(v) => json!(v),
        OwnedArray::U32(v) => json!(v),
        OwnedArray::I32(v) => json!(v),
        OwnedArray::F32(v) => json!(v.iter().map(|&x| x as f64).collect::<Vec<_>>()),
        OwnedArray::Bool(v) => json!(v),
        OwnedArray::String(v) => json!(v),
        OwnedArray::Array(v) => Json::Array(v.iter().map(array_json).collect()),
        OwnedArray::U64(v) => json!(v),
        OwnedArray::I64(v) => json!(v),
        OwnedArray::F64(v) => json!(v),
    }
}

/// gguf-py's `contents()` flattens arrays of arrays into their leaves, with strings as their
/// bytes; compare nested arrays in that form.
fn flattened(a: &OwnedArray, out: &mut Vec<Json>) {
    match a {
        OwnedArray::Array(v) => v.iter().for_each(|inner| flattened(inner, out)),
        OwnedArray::String(v) => out.extend(v.iter().flat_map(|s| s.bytes().map(|b| json!(b)))),
        leaf => out.extend(array_json(leaf).as_array().cloned().unwrap_or_default()),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn gguf_py_reads_what_we_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sample.gguf");
    common::sample_writer().write_file(&path).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/gguf-py-dump.py");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .arg(script)
        .arg(&path)
        .arg("--data")
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {python}: {e}; install python3 and `pip install gguf`")
        });
    assert!(
        out.status.success(),
        "gguf-py could not read the file (is the `gguf` package installed? `pip install gguf`):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: Json = serde_json::from_slice(&out.stdout).unwrap();

    let ours = Gguf::open(&path).unwrap();
    let meta = &theirs["metadata"];
    assert_eq!(meta.as_object().unwrap().len(), ours.metadata().len());
    for (key, value) in ours.metadata().iter() {
        let expected = match value.to_owned_value() {
            OwnedValue::Array(a @ OwnedArray::Array(_)) => {
                let mut leaves = Vec::new();
                flattened(&a, &mut leaves);
                Json::Array(leaves)
            }
            v => owned_json(&v),
        };
        assert_eq!(meta[key], expected, "metadata `{key}`");
    }
    let tensors = theirs["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), ours.tensors().len());
    for (t, py) in ours.tensors().iter().zip(tensors) {
        assert_eq!(py["name"], json!(t.name));
        assert_eq!(py["type"], json!(t.ty.name()));
        assert_eq!(py["shape"], json!(t.shape));
        assert_eq!(py["offset"], json!(t.offset));
        assert_eq!(
            py["data_hex"],
            json!(hex(ours.tensor_data(t).unwrap())),
            "{}",
            t.name
        );
    }
}
