//! Writing GGUF files (version 3), for synthetic test models and tools.

use std::io::{self, Write};
use std::path::Path;

use crate::error::{GgufError, Result};
use crate::parse::{align_up, DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS};
use crate::value::{OwnedArray, OwnedValue, ValueType};
use crate::GgmlType;

struct PendingTensor {
    name: String,
    ty: GgmlType,
    shape: Vec<u64>,
    data: TensorData,
}

/// A tensor's bytes: held, or written by a function when the file is (for files larger
/// than memory).
enum TensorData {
    Bytes(Vec<u8>),
    Streamed { len: u64, write: Box<WriteTensor> },
}

/// Writes a streamed tensor's bytes.
type WriteTensor = dyn Fn(&mut dyn Write) -> io::Result<()>;

impl TensorData {
    fn len(&self) -> u64 {
        match self {
            TensorData::Bytes(b) => b.len() as u64,
            TensorData::Streamed { len, .. } => *len,
        }
    }
}

/// Collects metadata and tensors, then writes them as one GGUF file.
///
/// ```
/// use ferrox_gguf::{GgufWriter, GgmlType, Gguf};
/// let mut w = GgufWriter::new();
/// w.set("general.architecture", "llama");
/// w.add_tensor("x", GgmlType::F32, &[2], 1.5f32.to_le_bytes().repeat(2))?;
/// let gguf = Gguf::from_bytes(w.to_bytes())?;
/// assert_eq!(gguf.metadata().architecture()?, "llama");
/// # Ok::<(), ferrox_gguf::GgufError>(())
/// ```
#[derive(Default)]
pub struct GgufWriter {
    kvs: Vec<(String, OwnedValue)>,
    tensors: Vec<PendingTensor>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets a metadata key, replacing an earlier value for the same key.
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<OwnedValue>) -> &mut Self {
        let (key, value) = (key.into(), value.into());
        match self.kvs.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.kvs.push((key, value)),
        }
        self
    }

    /// Sets `general.alignment` (a power of two); tensors are padded to it.
    pub fn set_alignment(&mut self, alignment: u32) -> Result<&mut Self> {
        if !alignment.is_power_of_two() {
            return Err(GgufError::Write(format!(
                "alignment {alignment} is not a power of two"
            )));
        }
        Ok(self.set("general.alignment", alignment))
    }

    fn alignment(&self) -> u64 {
        self.kvs
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| match v {
                OwnedValue::U32(a) if a.is_power_of_two() => Some(u64::from(*a)),
                _ => None,
            })
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Adds a tensor. `shape` is in ggml order (`shape[0]` is the row length) and `data`
    /// must hold exactly the bytes that type and shape call for.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        shape: &[u64],
        data: impl Into<Vec<u8>>,
    ) -> Result<&mut Self> {
        let data = data.into();
        let len = data.len() as u64;
        self.push_tensor(name.into(), ty, shape, len, TensorData::Bytes(data))
    }

    /// Adds a tensor whose `len` bytes `write` writes when the file is written (it must
    /// write exactly that many): for files larger than memory.
    pub fn add_streamed_tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        shape: &[u64],
        len: u64,
        write: impl Fn(&mut dyn Write) -> io::Result<()> + 'static,
    ) -> Result<&mut Self> {
        let data = TensorData::Streamed {
            len,
            write: Box::new(write),
        };
        self.push_tensor(name.into(), ty, shape, len, data)
    }

    fn push_tensor(
        &mut self,
        name: String,
        ty: GgmlType,
        shape: &[u64],
        len: u64,
        data: TensorData,
    ) -> Result<&mut Self> {
        if shape.len() > MAX_DIMS as usize {
            return Err(GgufError::Write(format!(
                "tensor `{name}` has more than {MAX_DIMS} dimensions"
            )));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::Write(format!("tensor `{name}` added twice")));
        }
        let n: Option<u64> = shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        let row_ok = match (shape.first(), ty.block_size()) {
            (Some(&row), Some(bs)) => row % bs == 0,
            (None, Some(_)) => true,
            (_, None) => false,
        };
        let expected = n.and_then(|n| ty.bytes_for(n));
        if !row_ok || expected != Some(len) {
            return Err(GgufError::Write(format!(
                "tensor `{name}`: {len} bytes given, type {ty} and shape {shape:?} need {expected:?}"
            )));
        }
        self.tensors.push(PendingTensor {
            name,
            ty,
            shape: shape.to_vec(),
            data,
        });
        Ok(self)
    }

    /// Writes the file to any sink.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let alignment = self.alignment();
        let mut header = Vec::new();
        header.extend_from_slice(MAGIC);
        put_u32(&mut header, 3);
        put_u64(&mut header, self.tensors.len() as u64);
        put_u64(&mut header, self.kvs.len() as u64);
        for (key, value) in &self.kvs {
            put_str(&mut header, key);
            put_value(&mut header, value);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            put_str(&mut header, &t.name);
            put_u32(&mut header, t.shape.len() as u32);
            for &d in &t.shape {
                put_u64(&mut header, d);
            }
            put_u32(&mut header, t.ty.id());
            put_u64(&mut header, offset);
            offsets.push(offset);
            offset = align_up(offset + t.data.len(), alignment);
        }
        let data_start = align_up(header.len() as u64, alignment);
        header.resize(data_start as usize, 0);
        w.write_all(&header)?;
        let mut written = 0u64;
        for (t, &off) in self.tensors.iter().zip(&offsets) {
            w.write_all(&vec![0u8; (off - written) as usize])?;
            match &t.data {
                TensorData::Bytes(b) => w.write_all(b)?,
                TensorData::Streamed { len, write } => {
                    let mut counted = CountingWriter {
                        inner: &mut *w,
                        n: 0,
                    };
                    write(&mut counted)?;
                    if counted.n != *len {
                        return Err(io::Error::other(format!(
                            "tensor `{}`: {} bytes written, {len} announced",
                            t.name, counted.n
                        )));
                    }
                }
            }
            written = off + t.data.len();
        }
        w.write_all(&vec![0u8; (offset - written) as usize])?;
        w.flush()
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_to(&mut out)
            .expect("writing to a Vec cannot fail");
        out
    }

    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let io = |err| GgufError::Io {
            path: path.to_path_buf(),
            err,
        };
        let mut file = io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
        self.write_to(&mut file).map_err(io)
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn value_type(v: &OwnedValue) -> ValueType {
    match v {
        OwnedValue::U8(_) => ValueType::U8,
        OwnedValue::I8(_) => ValueType::I8,
        OwnedValue::U16(_) => ValueType::U16,
        OwnedValue::I16(_) => ValueType::I16,
        OwnedValue::U32(_) => ValueType::U32,
        OwnedValue::I32(_) => ValueType::I32,
        OwnedValue::F32(_) => ValueType::F32,
        OwnedValue::Bool(_) => ValueType::Bool,
        OwnedValue::String(_) => ValueType::String,
        OwnedValue::Array(_) => ValueType::Array,
        OwnedValue::U64(_) => ValueType::U64,
        OwnedValue::I64(_) => ValueType::I64,
        OwnedValue::F64(_) => ValueType::F64,
    }
}

fn put_value(out: &mut Vec<u8>, v: &OwnedValue) {
    put_u32(out, value_type(v).tag());
    match v {
        OwnedValue::U8(x) => out.push(*x),
        OwnedValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        OwnedValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        OwnedValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        OwnedValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        OwnedValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        OwnedValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        OwnedValue::Bool(x) => out.push(u8::from(*x)),
        OwnedValue::String(s) => put_str(out, s),
        OwnedValue::Array(a) => put_array(out, a),
        OwnedValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        OwnedValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        OwnedValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, a: &OwnedArray) {
    put_u32(out, a.elem_type().tag());
    put_u64(out, a.len() as u64);
    macro_rules! le {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        OwnedArray::U8(v) => out.extend_from_slice(v),
        OwnedArray::I8(v) => le!(v),
        OwnedArray::U16(v) => le!(v),
        OwnedArray::I16(v) => le!(v),
        OwnedArray::U32(v) => le!(v),
        OwnedArray::I32(v) => le!(v),
        OwnedArray::F32(v) => le!(v),
        OwnedArray::U64(v) => le!(v),
        OwnedArray::I64(v) => le!(v),
        OwnedArray::F64(v) => le!(v),
        OwnedArray::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        OwnedArray::String(v) => v.iter().for_each(|s| put_str(out, s)),
        OwnedArray::Array(v) => v.iter().for_each(|inner| put_array(out, inner)),
    }
}

/// Counts the bytes written through it.
struct CountingWriter<'w, W: Write + ?Sized> {
    inner: &'w mut W,
    n: u64,
}

impl<W: Write + ?Sized> Write for CountingWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
