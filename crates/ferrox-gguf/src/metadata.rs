//! Typed access to a file's metadata.

use crate::error::{GgufError, Result};
use crate::parse::Layout;
use crate::value::{ArrayRef, Value};

/// A borrowed view of one file's metadata, in file order.
#[derive(Clone, Copy)]
pub struct Metadata<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) layout: &'a Layout,
}

impl<'a> Metadata<'a> {
    pub fn len(&self) -> usize {
        self.layout.kvs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layout.kvs.is_empty()
    }

    /// Every key and value, in the order they appear in the file.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&'a str, Value<'a>)> + 'a {
        let bytes = self.bytes;
        self.layout
            .kvs
            .iter()
            .map(move |kv| (kv.key.as_str(), kv.value.view(bytes)))
    }

    pub fn get(&self, key: &str) -> Option<Value<'a>> {
        let i = *self.layout.key_index.get(key)?;
        Some(self.layout.kvs[i].value.view(self.bytes))
    }

    pub fn contains(&self, key: &str) -> bool {
        self.layout.key_index.contains_key(key)
    }

    fn typed<T>(
        &self,
        key: &str,
        expected: &'static str,
        convert: impl Fn(&Value<'a>) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => convert(&v).map(Some).ok_or_else(|| GgufError::WrongType {
                key: key.to_string(),
                expected,
                found: describe(&v),
            }),
        }
    }

    fn required<T>(&self, key: &str, value: Result<Option<T>>) -> Result<T> {
        value?.ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    /// An integer value of any stored width that fits in `T` (files disagree on widths:
    /// `context_length` is u32 in some writers and u64 in others).
    pub fn opt_int<T: TryFrom<i128>>(&self, key: &str) -> Result<Option<T>> {
        self.typed(key, "an integer in range", |v| {
            v.as_i128().and_then(|i| T::try_from(i).ok())
        })
    }

    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        self.opt_int(key)
    }

    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.required(key, self.opt_u32(key))
    }

    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        self.opt_int(key)
    }

    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.required(key, self.opt_u64(key))
    }

    pub fn opt_i32(&self, key: &str) -> Result<Option<i32>> {
        self.opt_int(key)
    }

    pub fn get_i32(&self, key: &str) -> Result<i32> {
        self.required(key, self.opt_i32(key))
    }

    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        self.opt_int(key)
    }

    pub fn get_usize(&self, key: &str) -> Result<usize> {
        self.required(key, self.opt_usize(key))
    }

    /// A floating-point value stored as f32 or f64.
    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        self.typed(key, "a float", |v| v.as_f64().map(|f| f as f32))
    }

    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.required(key, self.opt_f32(key))
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "a bool", |v| match v {
            Value::Bool(b) => Some(*b),
            _ => None,
        })
    }

    pub fn get_bool(&self, key: &str) -> Result<bool> {
        self.required(key, self.opt_bool(key))
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        self.typed(key, "a string", |v| v.as_str())
    }

    pub fn get_str(&self, key: &str) -> Result<&'a str> {
        self.required(key, self.opt_str(key))
    }

    pub fn opt_array(&self, key: &str) -> Result<Option<ArrayRef<'a>>> {
        self.typed(key, "an array", |v| v.as_array())
    }

    pub fn get_array(&self, key: &str) -> Result<ArrayRef<'a>> {
        self.required(key, self.opt_array(key))
    }

    /// `general.architecture`, the key every model-loading path starts from.
    pub fn architecture(&self) -> Result<&'a str> {
        self.get_str("general.architecture")
    }
}

fn describe(v: &Value<'_>) -> String {
    match v {
        Value::Array(_) | Value::String(_) => v.type_description(),
        other => format!("{} ({other:?})", other.value_type()),
    }
}
