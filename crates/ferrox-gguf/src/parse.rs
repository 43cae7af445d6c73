//! The GGUF parser. Works on a byte slice and records offsets, never copies of the data,
//! so the same code serves memory-mapped files and in-memory buffers.
//!
//! Every count, length and offset read from the file is checked against the bytes that are
//! actually there before it is used, and no allocation is sized from a count that has not
//! been bounded by the remaining file size first.

use std::collections::HashMap;

use crate::error::{GgufError, Result};
use crate::value::{read_fixed, RawArray, RawItems, Value, ValueType};
use crate::GgmlType;

pub const MAGIC: &[u8; 4] = b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
pub const MAX_DIMS: u32 = 4;
/// Arrays of arrays are legal; deeper than this is an attack on the stack, not a model.
const MAX_NESTING: usize = 8;
/// Smallest possible metadata entry: empty key (8) + type tag (4) + a one-byte value.
const MIN_KV_BYTES: u64 = 13;
/// Smallest possible tensor info: empty name (8) + n_dims (4) + type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 24;

/// A metadata value located in the file.
#[derive(Debug, Clone)]
pub(crate) enum RawValue {
    Fixed(ValueType, usize),
    String(usize, usize),
    Array(RawArray),
}

impl RawValue {
    pub fn view<'a>(&'a self, bytes: &'a [u8]) -> Value<'a> {
        match self {
            RawValue::Fixed(ty, off) => {
                let size = ty.fixed_size().unwrap_or(1);
                read_fixed(*ty, &bytes[*off..*off + size])
            }
            RawValue::String(off, len) => {
                Value::String(std::str::from_utf8(&bytes[*off..*off + *len]).unwrap_or_default())
            }
            RawValue::Array(raw) => Value::Array(crate::value::ArrayRef { bytes, raw }),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct RawKv {
    pub key: String,
    pub value: RawValue,
}

/// One tensor as described by the file's tensor info table, with its byte range validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// Dimensions in ggml order: `shape[0]` is the contiguous (row) dimension.
    pub shape: Vec<u64>,
    /// Offset of the data relative to the start of the file's data section.
    pub offset: u64,
    /// Absolute offset of the data in its file.
    pub file_offset: u64,
    pub n_elements: u64,
    /// Size of the data; `None` when the type's layout is unknown.
    pub n_bytes: Option<u64>,
    /// Which file of a split checkpoint holds the data (0 for a single file).
    pub shard: usize,
}

/// The parsed structure of one GGUF file.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub version: u32,
    pub kvs: Vec<RawKv>,
    pub key_index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_offset: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, field: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                field: field(),
                offset: self.pos as u64,
                needed: n,
                available: self.remaining(),
            });
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn u32(&mut self, field: &dyn Fn() -> String) -> Result<u32> {
        let b = self.take(4, field)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, field: &dyn Fn() -> String) -> Result<u64> {
        let b = self.take(8, field)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn invalid(&self, offset: usize, field: String, reason: impl Into<String>) -> GgufError {
        GgufError::Invalid {
            field,
            offset: offset as u64,
            reason: reason.into(),
        }
    }

    /// A length-prefixed UTF-8 string; returns the (offset, length) of its bytes.
    fn string(&mut self, field: &dyn Fn() -> String) -> Result<(usize, usize)> {
        let len_at = self.pos;
        let len = self.u64(&|| format!("{} (string length)", field()))?;
        let start = self.pos;
        let bytes = self.take(len, &|| format!("{} (string of {len} bytes)", field()))?;
        if let Err(e) = std::str::from_utf8(bytes) {
            return Err(self.invalid(
                start + e.valid_up_to(),
                field(),
                format!("string is not valid UTF-8 (length field at offset {len_at})"),
            ));
        }
        Ok((start, bytes.len()))
    }

    fn str_at(&self, (off, len): (usize, usize)) -> &'a str {
        std::str::from_utf8(&self.buf[off..off + len]).unwrap_or_default()
    }

    /// Checks that `count` elements of at least `min_size` bytes each can fit in what is left.
    fn check_count(&self, count: u64, min_size: u64, field: &dyn Fn() -> String) -> Result<usize> {
        let fits = count
            .checked_mul(min_size)
            .is_some_and(|need| need <= self.remaining());
        if !fits {
            return Err(GgufError::Invalid {
                field: field(),
                offset: self.pos as u64,
                reason: format!(
                    "count {count} cannot fit in the {} bytes left in the file",
                    self.remaining()
                ),
            });
        }
        Ok(count as usize)
    }

    fn value_type(&mut self, field: &dyn Fn() -> String) -> Result<ValueType> {
        let at = self.pos;
        let tag = self.u32(field)?;
        ValueType::from_tag(tag)
            .ok_or_else(|| self.invalid(at, field(), format!("unknown value type {tag}")))
    }

    fn value(
        &mut self,
        ty: ValueType,
        depth: usize,
        field: &dyn Fn() -> String,
    ) -> Result<RawValue> {
        match ty {
            ValueType::String => {
                let (off, len) = self.string(field)?;
                Ok(RawValue::String(off, len))
            }
            ValueType::Array => Ok(RawValue::Array(self.array(depth, field)?)),
            fixed => {
                let at = self.pos;
                let size = fixed.fixed_size().unwrap_or(1) as u64;
                let bytes = self.take(size, field)?;
                if fixed == ValueType::Bool && bytes[0] > 1 {
                    return Err(self.invalid(at, field(), format!("bool value {}", bytes[0])));
                }
                Ok(RawValue::Fixed(fixed, at))
            }
        }
    }

    fn array(&mut self, depth: usize, field: &dyn Fn() -> String) -> Result<RawArray> {
        if depth >= MAX_NESTING {
            return Err(self.invalid(
                self.pos,
                field(),
                format!("arrays nested deeper than {MAX_NESTING}"),
            ));
        }
        let elem = self.value_type(&|| format!("{} (array element type)", field()))?;
        let count = self.u64(&|| format!("{} (array length)", field()))?;
        let len = self.check_count(count, elem.min_size() as u64, &|| {
            format!("{} (array length)", field())
        })?;
        let offset = self.pos;
        let items = match elem {
            ValueType::String => {
                let mut spans = Vec::with_capacity(len);
                for i in 0..len {
                    spans.push(self.string(&|| format!("{}[{i}]", field()))?);
                }
                RawItems::Strings(spans)
            }
            ValueType::Array => {
                let mut arrays = Vec::with_capacity(len);
                for i in 0..len {
                    arrays.push(self.array(depth + 1, &|| format!("{}[{i}]", field()))?);
                }
                RawItems::Arrays(arrays)
            }
            fixed => {
                let size = fixed.fixed_size().unwrap_or(1) as u64;
                let bytes = self.take(len as u64 * size, field)?;
                if fixed == ValueType::Bool {
                    if let Some(i) = bytes.iter().position(|&b| b > 1) {
                        return Err(self.invalid(
                            offset + i,
                            format!("{}[{i}]", field()),
                            format!("bool value {}", bytes[i]),
                        ));
                    }
                }
                RawItems::Fixed
            }
        };
        Ok(RawArray {
            elem,
            len,
            offset,
            items,
        })
    }
}

/// Parses the header, metadata and tensor table of a GGUF file held in `buf`, and checks
/// every tensor's byte range against the file.
pub(crate) fn parse(buf: &[u8]) -> Result<Layout> {
    let mut c = Cursor { buf, pos: 0 };
    let magic = c
        .take(4, &|| "magic".into())
        .map_err(|_| GgufError::BadMagic {
            found: buf[..buf.len().min(4)].to_vec(),
        })?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic {
            found: magic.to_vec(),
        });
    }
    let version = c.u32(&|| "version".into())?;
    if version & 0xffff == 0 && version != 0 {
        // A byte-swapped small number: the file was written big-endian.
        return Err(GgufError::BigEndian);
    }
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let n_tensors = c.u64(&|| "tensor count".into())?;
    let n_kv = c.u64(&|| "metadata count".into())?;
    let n_kv = c.check_count(n_kv, MIN_KV_BYTES, &|| "metadata count".into())?;

    let mut kvs = Vec::with_capacity(n_kv);
    let mut key_index = HashMap::with_capacity(n_kv);
    for i in 0..n_kv {
        let key_at = c.pos;
        let key_span = c.string(&|| format!("metadata entry {i} key"))?;
        let key = c.str_at(key_span);
        if key_index.contains_key(key) {
            return Err(c.invalid(key_at, format!("metadata key `{key}`"), "duplicate key"));
        }
        let field = || format!("metadata `{key}`");
        let ty = c.value_type(&field)?;
        let value = c.value(ty, 0, &field)?;
        key_index.insert(key.to_string(), kvs.len());
        kvs.push(RawKv {
            key: key.to_string(),
            value,
        });
    }

    let alignment = match key_index.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(&i) => {
            let kv = &kvs[i];
            let value = kv.value.view(buf);
            match value.as_i128() {
                Some(a) if a > 0 && a <= 1 << 30 && (a as u64).is_power_of_two() => a as u64,
                _ => {
                    let at = match kv.value {
                        RawValue::Fixed(_, off) => off,
                        _ => 0,
                    };
                    return Err(c.invalid(
                        at,
                        "metadata `general.alignment`".into(),
                        format!("{value:?} is not a power of two"),
                    ));
                }
            }
        }
    };

    let n_tensors = c.check_count(n_tensors, MIN_TENSOR_INFO_BYTES, &|| "tensor count".into())?;
    let mut tensors = Vec::with_capacity(n_tensors);
    let mut names: HashMap<&str, ()> = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name_at = c.pos;
        let span = c.string(&|| format!("tensor info {i} name"))?;
        let name = c.str_at(span);
        if names.insert(name, ()).is_some() {
            return Err(c.invalid(name_at, format!("tensor `{name}`"), "duplicate tensor name"));
        }
        tensors.push(tensor_info(&mut c, name, alignment)?);
    }

    let data_offset = align_up(c.pos as u64, alignment);
    let file_len = buf.len() as u64;
    for t in &mut tensors {
        t.file_offset = data_offset.saturating_add(t.offset);
        let end = t.file_offset.checked_add(t.n_bytes.unwrap_or(0));
        if end.is_none_or(|end| end > file_len) {
            return Err(GgufError::Invalid {
                field: format!("tensor `{}` data", t.name),
                offset: t.file_offset,
                reason: format!(
                    "{} bytes at data offset {} run past the end of the file ({file_len} bytes)",
                    t.n_bytes.unwrap_or(0),
                    t.offset
                ),
            });
        }
    }

    Ok(Layout {
        version,
        kvs,
        key_index,
        tensors,
        alignment,
        data_offset,
    })
}

fn tensor_info(c: &mut Cursor<'_>, name: &str, alignment: u64) -> Result<TensorInfo> {
    let field = |what: &str| format!("tensor `{name}` {what}");
    let dims_at = c.pos;
    let n_dims = c.u32(&|| field("dimension count"))?;
    if n_dims > MAX_DIMS {
        return Err(c.invalid(
            dims_at,
            field("dimension count"),
            format!("{n_dims} > {MAX_DIMS}"),
        ));
    }
    let mut shape = Vec::with_capacity(n_dims as usize);
    let mut n_elements: u64 = 1;
    for d in 0..n_dims {
        let at = c.pos;
        let dim = c.u64(&|| field(&format!("dimension {d}")))?;
        n_elements = match n_elements.checked_mul(dim) {
            Some(n) if dim <= i64::MAX as u64 && n <= i64::MAX as u64 => n,
            _ => {
                return Err(c.invalid(at, field("shape"), "element count overflows"));
            }
        };
        shape.push(dim);
    }
    let type_at = c.pos;
    let ty = GgmlType::from_id(c.u32(&|| field("type"))?);
    let n_bytes = match (ty.block_size(), shape.first()) {
        (None, _) => None,
        (Some(block), Some(&row)) if row % block != 0 => {
            return Err(c.invalid(
                type_at,
                field("shape"),
                format!("row length {row} is not a multiple of the {ty} block size {block}"),
            ));
        }
        _ => match ty.bytes_for(n_elements) {
            Some(bytes) => Some(bytes),
            None => return Err(c.invalid(type_at, field("shape"), "byte size overflows")),
        },
    };
    let offset_at = c.pos;
    let offset = c.u64(&|| field("data offset"))?;
    if offset % alignment != 0 {
        return Err(c.invalid(
            offset_at,
            field("data offset"),
            format!("{offset} is not a multiple of the alignment {alignment}"),
        ));
    }
    Ok(TensorInfo {
        name: name.to_string(),
        ty,
        shape,
        offset,
        file_offset: 0,
        n_elements,
        n_bytes,
        shard: 0,
    })
}

pub(crate) fn align_up(x: u64, alignment: u64) -> u64 {
    x.div_ceil(alignment).saturating_mul(alignment)
}
