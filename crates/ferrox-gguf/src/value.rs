//! Metadata values: the borrowed view used when reading, and the owned form used when writing.

use std::borrow::Cow;
use std::fmt;

/// The GGUF metadata value type tags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    pub fn from_tag(tag: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match tag {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    pub fn tag(self) -> u32 {
        use ValueType::*;
        match self {
            U8 => 0,
            I8 => 1,
            U16 => 2,
            I16 => 3,
            U32 => 4,
            I32 => 5,
            F32 => 6,
            Bool => 7,
            String => 8,
            Array => 9,
            U64 => 10,
            I64 => 11,
            F64 => 12,
        }
    }

    /// Size of one value on disk for fixed-size types; `None` for strings and arrays.
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// The fewest bytes one value can take on disk: bounds element counts before any allocation.
    pub(crate) fn min_size(self) -> usize {
        match self {
            ValueType::String => 8,
            ValueType::Array => 12,
            t => t.fixed_size().unwrap_or(1),
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value borrowed from a parsed file.
#[derive(Clone, Copy, Debug)]
pub enum Value<'a> {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(&'a str),
    Array(ArrayRef<'a>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl<'a> Value<'a> {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer value, widened; `None` for non-integers.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// A floating-point value (f32 or f64).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&'a str> {
        match *self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<ArrayRef<'a>> {
        match *self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Describes the value's type for error messages (`array of string`, `u32`).
    pub fn type_description(&self) -> String {
        match self {
            Value::Array(a) => format!("array of {}", a.elem_type()),
            v => v.value_type().name().to_string(),
        }
    }

    /// Copies the value out of the file.
    pub fn to_owned_value(&self) -> OwnedValue {
        match *self {
            Value::U8(v) => OwnedValue::U8(v),
            Value::I8(v) => OwnedValue::I8(v),
            Value::U16(v) => OwnedValue::U16(v),
            Value::I16(v) => OwnedValue::I16(v),
            Value::U32(v) => OwnedValue::U32(v),
            Value::I32(v) => OwnedValue::I32(v),
            Value::F32(v) => OwnedValue::F32(v),
            Value::Bool(v) => OwnedValue::Bool(v),
            Value::String(v) => OwnedValue::String(v.to_string()),
            Value::Array(a) => OwnedValue::Array(a.to_owned_array()),
            Value::U64(v) => OwnedValue::U64(v),
            Value::I64(v) => OwnedValue::I64(v),
            Value::F64(v) => OwnedValue::F64(v),
        }
    }
}

/// Where an array's elements live in the file, validated at parse time.
#[derive(Debug, Clone)]
pub(crate) struct RawArray {
    pub elem: ValueType,
    pub len: usize,
    /// Offset of the first element's bytes.
    pub offset: usize,
    pub items: RawItems,
}

#[derive(Debug, Clone)]
pub(crate) enum RawItems {
    /// Fixed-size elements, `len * size` contiguous bytes at `offset`.
    Fixed,
    /// (offset, length) of each string's UTF-8 bytes.
    Strings(Vec<(usize, usize)>),
    Arrays(Vec<RawArray>),
}

/// An array value borrowed from a parsed file.
#[derive(Clone, Copy)]
pub struct ArrayRef<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) raw: &'a RawArray,
}

impl fmt::Debug for ArrayRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}; {}]", self.elem_type(), self.len())
    }
}

/// Element types an array can be viewed as a typed slice of.
pub trait ArrayElement: bytemuck::Pod {
    const TYPE: ValueType;
    fn read_le(bytes: &[u8]) -> Self;
}

macro_rules! array_element {
    ($t:ty, $vt:ident) => {
        impl ArrayElement for $t {
            const TYPE: ValueType = ValueType::$vt;
            fn read_le(bytes: &[u8]) -> Self {
                let mut b = [0u8; std::mem::size_of::<$t>()];
                b.copy_from_slice(bytes);
                <$t>::from_le_bytes(b)
            }
        }
    };
}
array_element!(u8, U8);
array_element!(i8, I8);
array_element!(u16, U16);
array_element!(i16, I16);
array_element!(u32, U32);
array_element!(i32, I32);
array_element!(f32, F32);
array_element!(u64, U64);
array_element!(i64, I64);
array_element!(f64, F64);

impl<'a> ArrayRef<'a> {
    pub fn elem_type(&self) -> ValueType {
        self.raw.elem
    }

    pub fn len(&self) -> usize {
        self.raw.len
    }

    pub fn is_empty(&self) -> bool {
        self.raw.len == 0
    }

    /// The elements as a typed slice: borrowed straight from the file when the bytes are
    /// suitably aligned (and the host is little-endian), copied otherwise.
    /// `None` when the element type is not `T`.
    pub fn as_slice<T: ArrayElement>(&self) -> Option<Cow<'a, [T]>> {
        if self.raw.elem != T::TYPE {
            return None;
        }
        let size = std::mem::size_of::<T>();
        let bytes = &self.bytes[self.raw.offset..self.raw.offset + self.raw.len * size];
        if cfg!(target_endian = "little") {
            if let Ok(slice) = bytemuck::try_cast_slice::<u8, T>(bytes) {
                return Some(Cow::Borrowed(slice));
            }
        }
        Some(Cow::Owned(
            bytes.chunks_exact(size).map(T::read_le).collect(),
        ))
    }

    /// The elements of a bool array.
    pub fn as_bools(&self) -> Option<Vec<bool>> {
        if self.raw.elem != ValueType::Bool {
            return None;
        }
        let bytes = &self.bytes[self.raw.offset..self.raw.offset + self.raw.len];
        Some(bytes.iter().map(|&b| b != 0).collect())
    }

    /// The element at `index`, or `None` past the end.
    pub fn get(&self, index: usize) -> Option<Value<'a>> {
        if index >= self.raw.len {
            return None;
        }
        Some(match &self.raw.items {
            RawItems::Fixed => {
                let size = self.raw.elem.fixed_size().unwrap_or(1);
                let at = self.raw.offset + index * size;
                read_fixed(self.raw.elem, &self.bytes[at..at + size])
            }
            RawItems::Strings(spans) => {
                let (off, len) = spans[index];
                Value::String(str_at(self.bytes, off, len))
            }
            RawItems::Arrays(arrays) => Value::Array(ArrayRef {
                bytes: self.bytes,
                raw: &arrays[index],
            }),
        })
    }

    /// Iterates over the strings of a string array (`None` for other element types).
    pub fn strings(&self) -> Option<impl ExactSizeIterator<Item = &'a str> + 'a> {
        match &self.raw.items {
            RawItems::Strings(spans) => {
                let bytes = self.bytes;
                Some(spans.iter().map(move |&(off, len)| str_at(bytes, off, len)))
            }
            _ => None,
        }
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = Value<'a>> + '_ {
        (0..self.len()).map(move |i| self.get(i).expect("index below len"))
    }

    pub fn to_owned_array(&self) -> OwnedArray {
        fn vec<T: ArrayElement>(a: &ArrayRef<'_>) -> Vec<T> {
            a.as_slice::<T>().map(Cow::into_owned).unwrap_or_default()
        }
        match self.raw.elem {
            ValueType::U8 => OwnedArray::U8(vec(self)),
            ValueType::I8 => OwnedArray::I8(vec(self)),
            ValueType::U16 => OwnedArray::U16(vec(self)),
            ValueType::I16 => OwnedArray::I16(vec(self)),
            ValueType::U32 => OwnedArray::U32(vec(self)),
            ValueType::I32 => OwnedArray::I32(vec(self)),
            ValueType::F32 => OwnedArray::F32(vec(self)),
            ValueType::U64 => OwnedArray::U64(vec(self)),
            ValueType::I64 => OwnedArray::I64(vec(self)),
            ValueType::F64 => OwnedArray::F64(vec(self)),
            ValueType::Bool => OwnedArray::Bool(self.as_bools().unwrap_or_default()),
            ValueType::String => OwnedArray::String(
                self.strings()
                    .map(|it| it.map(str::to_string).collect())
                    .unwrap_or_default(),
            ),
            ValueType::Array => OwnedArray::Array(
                self.iter()
                    .filter_map(|v| v.as_array().map(|a| a.to_owned_array()))
                    .collect(),
            ),
        }
    }
}

/// Strings were validated as UTF-8 when the file was parsed.
fn str_at(bytes: &[u8], off: usize, len: usize) -> &str {
    std::str::from_utf8(&bytes[off..off + len]).unwrap_or_default()
}

/// Decodes a fixed-size value; `bytes` has exactly the type's size.
pub(crate) fn read_fixed(ty: ValueType, bytes: &[u8]) -> Value<'static> {
    match ty {
        ValueType::U8 => Value::U8(bytes[0]),
        ValueType::I8 => Value::I8(bytes[0] as i8),
        ValueType::Bool => Value::Bool(bytes[0] != 0),
        ValueType::U16 => Value::U16(u16::read_le(bytes)),
        ValueType::I16 => Value::I16(i16::read_le(bytes)),
        ValueType::U32 => Value::U32(u32::read_le(bytes)),
        ValueType::I32 => Value::I32(i32::read_le(bytes)),
        ValueType::F32 => Value::F32(f32::read_le(bytes)),
        ValueType::U64 => Value::U64(u64::read_le(bytes)),
        ValueType::I64 => Value::I64(i64::read_le(bytes)),
        ValueType::F64 => Value::F64(f64::read_le(bytes)),
        ValueType::String | ValueType::Array => unreachable!("not a fixed-size type"),
    }
}

/// A metadata value owned by the caller: what the writer takes and what a read value copies to.
#[derive(Clone, Debug, PartialEq)]
pub enum OwnedValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(OwnedArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A typed array; arrays of arrays may mix element types.
#[derive(Clone, Debug, PartialEq)]
pub enum OwnedArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<OwnedArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl OwnedArray {
    pub fn elem_type(&self) -> ValueType {
        match self {
            OwnedArray::U8(_) => ValueType::U8,
            OwnedArray::I8(_) => ValueType::I8,
            OwnedArray::U16(_) => ValueType::U16,
            OwnedArray::I16(_) => ValueType::I16,
            OwnedArray::U32(_) => ValueType::U32,
            OwnedArray::I32(_) => ValueType::I32,
            OwnedArray::F32(_) => ValueType::F32,
            OwnedArray::Bool(_) => ValueType::Bool,
            OwnedArray::String(_) => ValueType::String,
            OwnedArray::Array(_) => ValueType::Array,
            OwnedArray::U64(_) => ValueType::U64,
            OwnedArray::I64(_) => ValueType::I64,
            OwnedArray::F64(_) => ValueType::F64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            OwnedArray::U8(v) => v.len(),
            OwnedArray::I8(v) => v.len(),
            OwnedArray::U16(v) => v.len(),
            OwnedArray::I16(v) => v.len(),
            OwnedArray::U32(v) => v.len(),
            OwnedArray::I32(v) => v.len(),
            OwnedArray::F32(v) => v.len(),
            OwnedArray::Bool(v) => v.len(),
            OwnedArray::String(v) => v.len(),
            OwnedArray::Array(v) => v.len(),
            OwnedArray::U64(v) => v.len(),
            OwnedArray::I64(v) => v.len(),
            OwnedArray::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

macro_rules! owned_from {
    ($t:ty, $v:ident) => {
        impl From<$t> for OwnedValue {
            fn from(v: $t) -> Self {
                OwnedValue::$v(v)
            }
        }
        impl From<Vec<$t>> for OwnedValue {
            fn from(v: Vec<$t>) -> Self {
                OwnedValue::Array(OwnedArray::$v(v))
            }
        }
    };
}
owned_from!(u8, U8);
owned_from!(i8, I8);
owned_from!(u16, U16);
owned_from!(i16, I16);
owned_from!(u32, U32);
owned_from!(i32, I32);
owned_from!(f32, F32);
owned_from!(bool, Bool);
owned_from!(String, String);
owned_from!(u64, U64);
owned_from!(i64, I64);
owned_from!(f64, F64);

impl From<&str> for OwnedValue {
    fn from(v: &str) -> Self {
        OwnedValue::String(v.to_string())
    }
}

impl From<Vec<&str>> for OwnedValue {
    fn from(v: Vec<&str>) -> Self {
        OwnedValue::Array(OwnedArray::String(
            v.into_iter().map(str::to_string).collect(),
        ))
    }
}

impl From<OwnedArray> for OwnedValue {
    fn from(v: OwnedArray) -> Self {
        OwnedValue::Array(v)
    }
}
