//! Hostile variants of a GGUF file: the same keys and tensors with one integer count replaced
//! (for the load-hardening tests and the model-loading fuzzer).

use ferrox_gguf::{Gguf, GgufWriter, OwnedArray, OwnedValue, Value};

/// The counts under test: every value of 2^29 and above would size gigabytes if trusted.
pub const HOSTILE_VALUES: &[u64] = &[1 << 29, (1 << 31) - 1, (1 << 32) - 1];

/// An integer metadata key and, for an integer array, its length.
#[derive(Clone, Debug)]
pub struct CountKey {
    pub key: String,
    pub array_len: Option<usize>,
}

/// The file's integer keys (and integer arrays) under `{arch}.`.
pub fn count_keys(gguf: &Gguf) -> Vec<CountKey> {
    let meta = gguf.metadata();
    let Ok(arch) = meta.architecture() else {
        return Vec::new();
    };
    let prefix = format!("{arch}.");
    meta.iter()
        .filter(|(key, _)| key.starts_with(&prefix))
        .filter_map(|(key, value)| {
            let array_len = match value {
                Value::Array(a) => {
                    if !a.iter().all(|v| v.as_i128().is_some()) {
                        return None;
                    }
                    Some(a.len())
                }
                v => {
                    v.as_i128()?;
                    None
                }
            };
            Some(CountKey {
                key: key.to_string(),
                array_len,
            })
        })
        .collect()
}

/// `value` stored in an integer type wide enough for it, signed if `like` is signed.
fn int_value(like: &Value<'_>, value: u64) -> OwnedValue {
    match like {
        Value::I8(_) | Value::I16(_) | Value::I32(_) | Value::I64(_) => {
            OwnedValue::I64(value as i64)
        }
        Value::U64(_) => OwnedValue::U64(value),
        _ => match u32::try_from(value) {
            Ok(v) => OwnedValue::U32(v),
            Err(_) => OwnedValue::U64(value),
        },
    }
}

/// An integer array with element `index` replaced by `value` (widened to 64 bits).
fn array_with(array: &ferrox_gguf::ArrayRef<'_>, index: usize, value: u64) -> OwnedValue {
    let signed = matches!(
        array.get(0),
        Some(Value::I8(_) | Value::I16(_) | Value::I32(_) | Value::I64(_))
    );
    let ints = array.iter().map(|v| v.as_i128().unwrap_or(0));
    if signed {
        let mut v: Vec<i64> = ints.map(|i| i as i64).collect();
        v[index] = value as i64;
        OwnedValue::Array(OwnedArray::I64(v))
    } else {
        let mut v: Vec<u64> = ints.map(|i| i as u64).collect();
        v[index] = value;
        OwnedValue::Array(OwnedArray::U64(v))
    }
}

/// The file rewritten with `key` set to `value` and every other key and tensor unchanged
/// (a new key is appended).
pub fn with_value(gguf: &Gguf, key: &str, value: OwnedValue) -> Vec<u8> {
    try_with_value(gguf, key, value).expect("a parsed file's tensors can be written again")
}

/// [`with_value`], or `None` when a tensor cannot be written again (its type's layout is
/// unknown).
pub fn try_with_value(gguf: &Gguf, key: &str, value: OwnedValue) -> Option<Vec<u8>> {
    let mut w = GgufWriter::new();
    let mut replaced = false;
    for (k, v) in gguf.metadata().iter() {
        if k == key {
            w.set(k, value.clone());
            replaced = true;
        } else {
            w.set(k, v.to_owned_value());
        }
    }
    if !replaced {
        w.set(key, value);
    }
    for t in gguf.tensors() {
        let data = gguf.tensor_data(t).ok()?;
        w.add_tensor(t.name.clone(), t.ty, &t.shape, data.to_vec())
            .ok()?;
    }
    Some(w.to_bytes())
}

/// The file with the integer `key` set to `value`, or element `index` of it when it is an
/// array.
pub fn with_count(gguf: &Gguf, key: &str, index: Option<usize>, value: u64) -> Vec<u8> {
    try_with_count(gguf, key, index, value).expect("an integer key of a writable file")
}

/// [`with_count`], or `None` when the key is missing, the index is out of range or a
/// tensor cannot be written again.
pub fn try_with_count(gguf: &Gguf, key: &str, index: Option<usize>, value: u64) -> Option<Vec<u8>> {
    let old = gguf.metadata().get(key)?;
    let new = match (&old, index) {
        (Value::Array(a), Some(i)) if i < a.len() => array_with(a, i, value),
        (Value::Array(_), _) => return None,
        _ => int_value(&old, value),
    };
    try_with_value(gguf, key, new)
}

/// The file with the scalar integer `key` stored as an array of `n` copies (one per layer).
pub fn as_per_layer_array(gguf: &Gguf, key: &str, n: usize) -> Option<Vec<u8>> {
    let v = gguf.metadata().get(key)?;
    let n_value = u32::try_from(v.as_i128()?).ok()?;
    Some(with_value(
        gguf,
        key,
        OwnedValue::Array(OwnedArray::U32(vec![n_value; n])),
    ))
}
