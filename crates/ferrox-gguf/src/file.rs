//! Opening GGUF checkpoints: one file, or a split checkpoint as one logical file.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::direct::{DirectBuffer, DirectFile};
use crate::error::{GgufError, Result};
use crate::metadata::Metadata;
use crate::parse::{parse, Layout, TensorInfo, DEFAULT_ALIGNMENT, MAX_DIMS};
use crate::value::OwnedValue;
use crate::{GgmlType, GgufWriter};

enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// Bytes that hold tensor data for [`Gguf::from_parts`].
pub enum TensorStorage {
    /// A memory-mapped file; its path is reported by [`Gguf::paths`].
    Mapped { path: PathBuf, map: memmap2::Mmap },
    /// Bytes in memory (tensors converted at load).
    Owned(Vec<u8>),
}

/// Where one tensor given to [`Gguf::from_parts`] lies.
#[derive(Clone, Debug)]
pub struct TensorPart {
    pub name: String,
    pub ty: GgmlType,
    /// Dimensions in ggml order: `shape[0]` is the contiguous (row) dimension.
    pub shape: Vec<u64>,
    /// Index of the [`TensorStorage`] that holds the data.
    pub storage: usize,
    /// Byte offset of the data in that storage.
    pub offset: u64,
}

/// One parsed GGUF file (one shard of a checkpoint).
pub(crate) struct Shard {
    path: Option<PathBuf>,
    storage: Storage,
    layout: Layout,
}

impl Shard {
    pub(crate) fn open(path: &Path) -> Result<Shard> {
        let io = |err| GgufError::Io {
            path: path.to_path_buf(),
            err,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; like every mmap-based loader we rely on the file not
        // being truncated underneath us while it is open.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let layout = parse(&map)?;
        Ok(Shard {
            path: Some(path.to_path_buf()),
            storage: Storage::Mapped(map),
            layout,
        })
    }

    pub(crate) fn metadata(&self) -> Metadata<'_> {
        Metadata {
            bytes: self.storage.bytes(),
            layout: &self.layout,
        }
    }

    pub(crate) fn tensor_count(&self) -> usize {
        self.layout.tensors.len()
    }
}

/// A GGUF checkpoint: a single file, or all files of a split checkpoint
/// (`NAME-00001-of-00003.gguf`, ...) presented as one. Tensor data stays memory-mapped.
pub struct Gguf {
    shards: Vec<Shard>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    /// Bytes handed to [`Gguf::release_pages`] so far: how far a load that copies the
    /// weights has got (for progress reports).
    released: AtomicU64,
    /// The shards opened for direct reads, once [`Gguf::enable_direct_io`] has been called.
    direct: std::sync::OnceLock<Vec<Option<DirectFile>>>,
}

impl Gguf {
    /// Opens a GGUF file. When its metadata says it is the first of a split checkpoint, the
    /// other files are found beside it by llama.cpp's naming scheme and opened too.
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf> {
        let path = path.as_ref();
        let first = Shard::open(path)?;
        let split_count = first.metadata().opt_u32("split.count")?.unwrap_or(1);
        if split_count <= 1 {
            return Self::from_shards(vec![first]);
        }
        crate::split::open_rest(path, first, split_count)
    }

    /// Parses a GGUF file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Gguf> {
        let layout = parse(&bytes)?;
        Self::from_shards(vec![Shard {
            path: None,
            storage: Storage::Owned(bytes),
            layout,
        }])
    }

    /// A checkpoint assembled from parts rather than read from a GGUF file: metadata
    /// key/values, and tensors that point into memory maps or owned buffers (a checkpoint
    /// in another format, translated at load). Each tensor's range is checked against its
    /// storage, as the parser checks a file's.
    pub fn from_parts(
        metadata: Vec<(String, OwnedValue)>,
        storages: Vec<TensorStorage>,
        tensors: Vec<TensorPart>,
    ) -> Result<Gguf> {
        let mut writer = GgufWriter::new();
        for (key, value) in metadata {
            writer.set(key, value);
        }
        // The metadata goes through the writer and the parser, so that it is held and
        // validated exactly as a file's would be.
        let header = writer.to_bytes();
        let layout = parse(&header)?;
        let mut shards = vec![Shard {
            path: None,
            storage: Storage::Owned(header),
            layout,
        }];
        for storage in storages {
            let (path, storage) = match storage {
                TensorStorage::Mapped { path, map } => (Some(path), Storage::Mapped(map)),
                TensorStorage::Owned(bytes) => (None, Storage::Owned(bytes)),
            };
            let layout = Layout {
                version: 3,
                kvs: Vec::new(),
                key_index: HashMap::new(),
                tensors: Vec::new(),
                alignment: DEFAULT_ALIGNMENT,
                data_offset: 0,
            };
            shards.push(Shard {
                path,
                storage,
                layout,
            });
        }
        for part in tensors {
            let (shard, info) = part_info(&part, &shards)?;
            shards[shard].layout.tensors.push(info);
        }
        Self::from_shards(shards)
    }

    pub(crate) fn from_shards(mut shards: Vec<Shard>) -> Result<Gguf> {
        let mut tensors = Vec::new();
        let mut tensor_index = HashMap::new();
        for (i, shard) in shards.iter_mut().enumerate() {
            for mut t in std::mem::take(&mut shard.layout.tensors) {
                t.shard = i;
                if tensor_index.insert(t.name.clone(), tensors.len()).is_some() {
                    return Err(GgufError::Split {
                        path: shard.path.clone().unwrap_or_default(),
                        reason: format!("tensor `{}` appears in more than one file", t.name),
                    });
                }
                tensors.push(t);
            }
        }
        Ok(Gguf {
            shards,
            tensors,
            tensor_index,
            released: AtomicU64::new(0),
            direct: std::sync::OnceLock::new(),
        })
    }

    /// The checkpoint's metadata (the first file's, for a split checkpoint).
    pub fn metadata(&self) -> Metadata<'_> {
        self.shards[0].metadata()
    }

    /// The GGUF format version of the (first) file.
    pub fn version(&self) -> u32 {
        self.shards[0].layout.version
    }

    pub fn alignment(&self) -> u64 {
        self.shards[0].layout.alignment
    }

    /// Absolute offset of the (first) file's data section.
    pub fn data_offset(&self) -> u64 {
        self.shards[0].layout.data_offset
    }

    /// Number of files the checkpoint spans (1 for one held in memory; for one built
    /// [`Gguf::from_parts`], the mapped files).
    pub fn shard_count(&self) -> usize {
        let files = self.shards.iter().filter(|s| s.path.is_some()).count();
        files.max(1)
    }

    /// Paths of the files the checkpoint was read from (empty for an in-memory file).
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().filter_map(|s| s.path.as_deref())
    }

    /// Total size in bytes of the files.
    pub fn file_size(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.storage.bytes().len() as u64)
            .sum()
    }

    /// All tensors, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's info, or an error naming it.
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()))
    }

    /// The bytes of a tensor, borrowed from the mapped file.
    /// Tells the system that `bytes`, part of this checkpoint's mapped tensor data, will
    /// not be read again soon: its pages leave this process's resident memory (they
    /// stay in the page cache and are read back transparently if touched). For data copied
    /// elsewhere at load, so that the copy does not count twice. Anything else is ignored.
    pub fn release_pages(&self, bytes: &[u8]) {
        self.released
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        self.advise(bytes, false);
    }

    /// Tells the system that `bytes`, part of this checkpoint's mapped tensor data, will be
    /// read soon, so that reading them from disk starts now (and several such reads
    /// overlap). Anything else is ignored, and so is everything with direct reads on.
    pub fn prefetch_pages(&self, bytes: &[u8]) {
        // Direct reads bypass the page cache: reading ahead into it would read twice.
        if self.direct_io() {
            return;
        }
        self.advise(bytes, true);
    }

    /// Asks for the part of a shard's mapping that `bytes` is to be read in (`will_need`)
    /// or dropped.
    fn advise(&self, bytes: &[u8], will_need: bool) {
        for shard in &self.shards {
            let Storage::Mapped(map) = &shard.storage else {
                continue;
            };
            let base = map.as_ptr() as usize;
            let start = bytes.as_ptr() as usize;
            if start < base || start + bytes.len() > base + map.len() {
                continue;
            }
            let (offset, len) = (start - base, bytes.len());
            let _ = if will_need {
                map.advise_range(memmap2::Advice::WillNeed, offset, len)
            } else {
                // SAFETY: the map is a read-only file mapping: dropping its pages (including
                // the partly covered first and last, which the call rounds out to) loses
                // nothing, later reads fault them back in from the file.
                unsafe {
                    map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len)
                }
            };
            return;
        }
    }

    /// Reads tensor data past the page cache from now on where [`Gguf::read_direct`] is
    /// asked to (`--direct-io`): opens every mapped shard with `O_DIRECT`. An error where
    /// the system or filesystem does not allow it; the mapping keeps working either way.
    pub fn enable_direct_io(&self) -> std::io::Result<()> {
        let files = self
            .shards
            .iter()
            .map(|shard| match (&shard.storage, &shard.path) {
                (Storage::Mapped(_), Some(path)) => DirectFile::open(path).map(Some),
                _ => Ok(None),
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let _ = self.direct.set(files);
        Ok(())
    }

    /// Whether [`Gguf::enable_direct_io`] succeeded.
    pub fn direct_io(&self) -> bool {
        self.direct.get().is_some()
    }

    /// `bytes`, part of a shard's mapped tensor data, read from the file past the page
    /// cache into `buf` when direct reads are on; `None` when they are off or `bytes` is
    /// not mapped data (read it in place then).
    pub fn read_direct<'b>(
        &self,
        bytes: &[u8],
        buf: &'b mut DirectBuffer,
    ) -> Option<std::io::Result<&'b [u8]>> {
        let span = self.read_direct_span(bytes, buf)?;
        Some(span.map(|span| buf.bytes(span)))
    }

    /// As [`Gguf::read_direct`], with the place of the bytes in `buf` given back instead of
    /// a borrow of it (for a read made on another thread, which then hands `buf` back).
    pub fn read_direct_span(
        &self,
        bytes: &[u8],
        buf: &mut DirectBuffer,
    ) -> Option<std::io::Result<std::ops::Range<usize>>> {
        let files = self.direct.get()?;
        for (shard, file) in self.shards.iter().zip(files) {
            let (Storage::Mapped(map), Some(file)) = (&shard.storage, file) else {
                continue;
            };
            let base = map.as_ptr() as usize;
            let start = bytes.as_ptr() as usize;
            if start < base || start + bytes.len() > base + map.len() {
                continue;
            }
            return Some(file.read((start - base) as u64, bytes.len(), buf));
        }
        None
    }

    /// Bytes of tensor data released so far (see [`Gguf::release_pages`]): during a load that
    /// repacks the weights, how much of them is done.
    pub fn released_bytes(&self) -> u64 {
        self.released.load(Ordering::Relaxed)
    }

    /// Bytes of all tensor data.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().filter_map(|t| t.n_bytes).sum()
    }

    pub fn tensor_data(&self, tensor: &TensorInfo) -> Result<&[u8]> {
        let n_bytes = tensor.n_bytes.ok_or_else(|| GgufError::UnknownTensorType {
            name: tensor.name.clone(),
            ty: tensor.ty.name().into_owned(),
        })?;
        let bytes = self
            .shards
            .get(tensor.shard)
            .map(|s| s.storage.bytes())
            .unwrap_or_default();
        // Ranges were validated at parse time; `get` keeps a forged TensorInfo harmless.
        let start = tensor.file_offset as usize;
        bytes
            .get(start..start.saturating_add(n_bytes as usize))
            .ok_or_else(|| GgufError::Invalid {
                field: format!("tensor `{}` data", tensor.name),
                offset: tensor.file_offset,
                reason: "range lies outside its file".into(),
            })
    }

    /// Raw metadata of shard `i` of a split checkpoint.
    pub fn shard_metadata(&self, i: usize) -> Option<Metadata<'_>> {
        self.shards.get(i).map(Shard::metadata)
    }
}

/// The shard (storage plus the metadata shard before them) and tensor info of a part, its
/// shape, type and range checked.
fn part_info(part: &TensorPart, shards: &[Shard]) -> Result<(usize, TensorInfo)> {
    let invalid = |reason: String| GgufError::Invalid {
        field: format!("tensor `{}`", part.name),
        offset: part.offset,
        reason,
    };
    if part.shape.len() > MAX_DIMS as usize {
        return Err(invalid(format!("more than {MAX_DIMS} dimensions")));
    }
    let n_elements = part
        .shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| invalid("element count overflows".into()))?;
    let row = part.shape.first().copied().unwrap_or(1);
    let n_bytes = match part.ty.block_size() {
        Some(block) if row % block == 0 => part.ty.bytes_for(n_elements),
        _ => None,
    }
    .ok_or_else(|| {
        invalid(format!(
            "type {} does not fit shape {:?}",
            part.ty, part.shape
        ))
    })?;
    let shard = part.storage.checked_add(1).filter(|&i| i < shards.len());
    let shard = shard.ok_or_else(|| invalid(format!("storage {} does not exist", part.storage)))?;
    let len = shards[shard].storage.bytes().len() as u64;
    if part.offset.checked_add(n_bytes).is_none_or(|end| end > len) {
        return Err(invalid(format!(
            "{n_bytes} bytes at offset {} run past the end of its storage ({len} bytes)",
            part.offset
        )));
    }
    let info = TensorInfo {
        name: part.name.clone(),
        ty: part.ty,
        shape: part.shape.clone(),
        offset: part.offset,
        file_offset: part.offset,
        n_elements,
        n_bytes: Some(n_bytes),
        shard,
    };
    Ok((shard, info))
}
