//! The key/value cache of attention layers: one row of keys and one of values per layer and
//! position, stored as f32 or f16, with truncation and snapshot/restore for prefix reuse.

use half::f16;
use half::vec::HalfBitsVecExt;

/// How cached keys and values are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvStorage {
    F32,
    /// Half the memory; llama.cpp's default cache type.
    #[default]
    F16,
}

impl KvStorage {
    /// Bytes per stored element.
    pub fn element_bytes(self) -> usize {
        match self {
            KvStorage::F32 => 4,
            KvStorage::F16 => 2,
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) enum Rows {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

/// Element types whose all-zero bit pattern is a valid value (0.0 and 0).
trait ZeroIsValid: Copy {}
impl ZeroIsValid for f32 {}
impl ZeroIsValid for u16 {}

/// `len` zeroed elements, or `None` when the allocator refuses (where `vec![0; len]` would
/// abort the process). Zeroed allocations come from calloc: pages are touched only as
/// positions fill.
fn try_zeroed<T: ZeroIsValid>(len: usize) -> Option<Vec<T>> {
    let layout = std::alloc::Layout::array::<T>(len).ok()?;
    if layout.size() == 0 {
        return Some(Vec::new());
    }
    // SAFETY: the layout has a non-zero size. A non-null result is a block of `len` zeroed
    // `T`s from the global allocator with the layout `Vec<T>` of capacity `len` frees with,
    // and all-zero bits are a valid `T` (`ZeroIsValid`).
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout).cast::<T>();
        (!ptr.is_null()).then(|| Vec::from_raw_parts(ptr, len, len))
    }
}

impl Rows {
    pub(crate) fn try_zeroed(storage: KvStorage, len: usize) -> Option<Rows> {
        Some(match storage {
            KvStorage::F32 => Rows::F32(try_zeroed(len)?),
            // (`vec![f16::ZERO; n]` would write every element; zero u16s come from calloc.)
            KvStorage::F16 => Rows::F16(try_zeroed::<u16>(len)?.reinterpret_into()),
        })
    }

    /// Like [`Rows::try_zeroed`], for sizes the caller has already bounded.
    pub(crate) fn zeroed(storage: KvStorage, len: usize) -> Rows {
        match storage {
            KvStorage::F32 => Rows::F32(vec![0.0; len]),
            KvStorage::F16 => Rows::F16(vec![0u16; len].reinterpret_into()),
        }
    }

    pub(crate) fn write(&mut self, at: usize, values: &[f32]) {
        match self {
            Rows::F32(buf) => buf[at..at + values.len()].copy_from_slice(values),
            Rows::F16(buf) => {
                for (dst, &v) in buf[at..at + values.len()].iter_mut().zip(values) {
                    *dst = f16::from_f32(v);
                }
            }
        }
    }

    pub(crate) fn slice(&self, start: usize, end: usize) -> KvRows<'_> {
        match self {
            Rows::F32(buf) => KvRows::F32(&buf[start..end]),
            Rows::F16(buf) => KvRows::F16(&buf[start..end]),
        }
    }

    fn copy_prefix(&self, len: usize) -> Rows {
        match self {
            Rows::F32(buf) => Rows::F32(buf[..len].to_vec()),
            Rows::F16(buf) => Rows::F16(buf[..len].to_vec()),
        }
    }

    fn restore_prefix(&mut self, from: &Rows) {
        match (self, from) {
            (Rows::F32(dst), Rows::F32(src)) => dst[..src.len()].copy_from_slice(src),
            (Rows::F16(dst), Rows::F16(src)) => dst[..src.len()].copy_from_slice(src),
            _ => unreachable!("snapshot storage checked by KvCache::restore"),
        }
    }
}

/// A borrowed run of cached rows.
#[derive(Clone, Copy, Debug)]
pub enum KvRows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

#[derive(Clone, Debug)]
struct LayerCache {
    keys: Rows,
    values: Rows,
}

/// Keys and values for every layer, `capacity` positions deep. Rows are laid out
/// position-major: position `p` of a layer holds `key_width` keys (all KV heads) at
/// `p * key_width`.
#[derive(Clone, Debug)]
pub struct KvCache {
    layers: Vec<LayerCache>,
    storage: KvStorage,
    capacity: usize,
    key_width: usize,
    value_width: usize,
    len: usize,
    /// Set when the requested cache could not be allocated (the cache then has no positions).
    unavailable: Option<KvError>,
}

/// The used part of a cache, copied out.
#[derive(Clone, Debug)]
pub struct KvSnapshot {
    layers: Vec<LayerCache>,
    storage: KvStorage,
    len: usize,
}

impl KvSnapshot {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Errors from cache operations.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvError {
    #[error("the context is full ({capacity} positions)")]
    Full { capacity: usize },
    #[error("snapshot does not fit this cache (storage or size differs)")]
    SnapshotMismatch,
    #[error("a KV cache of {capacity} positions is too large to address")]
    TooLarge { capacity: usize },
    #[error(
        "a KV cache of {capacity} positions needs {bytes} bytes, more than the {available} \
         bytes of memory available (use a smaller context)"
    )]
    ExceedsMemory {
        capacity: usize,
        bytes: usize,
        available: usize,
    },
    #[error("cannot allocate {bytes} bytes for a KV cache of {capacity} positions")]
    AllocationFailed { capacity: usize, bytes: usize },
}

/// The memory the system can give without swapping (`MemAvailable` of `/proc/meminfo`), when
/// it says.
pub fn available_memory() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line
        .trim_start_matches("MemAvailable:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

impl KvCache {
    /// Bytes a cache of this shape holds, or [`KvError::TooLarge`] when that overflows.
    pub fn bytes_needed(
        n_layers: usize,
        capacity: usize,
        key_width: usize,
        value_width: usize,
        storage: KvStorage,
    ) -> Result<usize, KvError> {
        key_width
            .checked_add(value_width)
            .and_then(|w| w.checked_mul(storage.element_bytes()))
            .and_then(|b| b.checked_mul(capacity))
            .and_then(|b| b.checked_mul(n_layers))
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or(KvError::TooLarge { capacity })
    }

    /// Checks that a cache of this shape can be had: its size computes without overflow and
    /// is not more than the memory available (see [`available_memory`]). Returns its bytes.
    pub fn check_size(
        n_layers: usize,
        capacity: usize,
        key_width: usize,
        value_width: usize,
        storage: KvStorage,
    ) -> Result<usize, KvError> {
        let bytes = Self::bytes_needed(n_layers, capacity, key_width, value_width, storage)?;
        match available_memory() {
            Some(available) if bytes > available => Err(KvError::ExceedsMemory {
                capacity,
                bytes,
                available,
            }),
            _ => Ok(bytes),
        }
    }

    /// A cache of `capacity` positions, or an error when its size overflows, exceeds the
    /// memory available or the allocator refuses it.
    pub fn try_new(
        n_layers: usize,
        capacity: usize,
        key_width: usize,
        value_width: usize,
        storage: KvStorage,
    ) -> Result<KvCache, KvError> {
        let bytes = Self::check_size(n_layers, capacity, key_width, value_width, storage)?;
        let failed = KvError::AllocationFailed { capacity, bytes };
        let mut layers = Vec::new();
        layers
            .try_reserve_exact(n_layers)
            .map_err(|_| failed.clone())?;
        for _ in 0..n_layers {
            // The products cannot overflow: `bytes_needed` bounded their sum.
            let keys = Rows::try_zeroed(storage, capacity * key_width);
            let values = Rows::try_zeroed(storage, capacity * value_width);
            match (keys, values) {
                (Some(keys), Some(values)) => layers.push(LayerCache { keys, values }),
                _ => return Err(failed),
            }
        }
        Ok(KvCache {
            layers,
            storage,
            capacity,
            key_width,
            value_width,
            len: 0,
            unavailable: None,
        })
    }

    /// [`KvCache::try_new`]; when the cache cannot be had, one that holds no position, so
    /// that the first step fails as a full context (and [`KvCache::reserve`] and
    /// [`KvCache::unavailable`] give the reason) instead of the process aborting.
    pub fn new(
        n_layers: usize,
        capacity: usize,
        key_width: usize,
        value_width: usize,
        storage: KvStorage,
    ) -> KvCache {
        Self::try_new(n_layers, capacity, key_width, value_width, storage).unwrap_or_else(|e| {
            KvCache {
                layers: Vec::new(),
                storage,
                capacity: 0,
                key_width,
                value_width,
                len: 0,
                unavailable: Some(e),
            }
        })
    }

    /// Why [`KvCache::new`] made a cache without positions, if it did.
    pub fn unavailable(&self) -> Option<&KvError> {
        self.unavailable.as_ref()
    }

    /// Positions filled so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn storage(&self) -> KvStorage {
        self.storage
    }

    /// Bytes held per position across all layers.
    pub fn bytes_per_position(&self) -> usize {
        self.layers.len() * (self.key_width + self.value_width) * self.storage.element_bytes()
    }

    /// Forgets every position from `len` on.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Checks that `n` more positions fit.
    pub fn reserve(&self, n: usize) -> Result<(), KvError> {
        if let Some(e) = &self.unavailable {
            return Err(e.clone());
        }
        if self.len.saturating_add(n) > self.capacity {
            return Err(KvError::Full {
                capacity: self.capacity,
            });
        }
        Ok(())
    }

    /// Stores the key and value rows of `layer` at position `pos` (which must lie below
    /// `capacity`; positions become visible through `len` once `advance` is called).
    pub fn write(&mut self, layer: usize, pos: usize, keys: &[f32], values: &[f32]) {
        debug_assert!(pos < self.capacity);
        let l = &mut self.layers[layer];
        l.keys.write(pos * self.key_width, keys);
        l.values.write(pos * self.value_width, values);
    }

    /// Marks positions up to `len` (exclusive) as filled.
    pub fn advance(&mut self, len: usize) {
        debug_assert!(len <= self.capacity);
        self.len = len.max(self.len);
    }

    /// The keys of positions `start..end` of `layer`, position-major.
    pub fn keys(&self, layer: usize, start: usize, end: usize) -> KvRows<'_> {
        self.layers[layer]
            .keys
            .slice(start * self.key_width, end * self.key_width)
    }

    /// The values of positions `start..end` of `layer`, position-major.
    pub fn values(&self, layer: usize, start: usize, end: usize) -> KvRows<'_> {
        self.layers[layer]
            .values
            .slice(start * self.value_width, end * self.value_width)
    }

    pub fn key_width(&self) -> usize {
        self.key_width
    }

    pub fn value_width(&self) -> usize {
        self.value_width
    }

    /// Copies out the filled positions.
    pub fn snapshot(&self) -> KvSnapshot {
        KvSnapshot {
            layers: self
                .layers
                .iter()
                .map(|l| LayerCache {
                    keys: l.keys.copy_prefix(self.len * self.key_width),
                    values: l.values.copy_prefix(self.len * self.value_width),
                })
                .collect(),
            storage: self.storage,
            len: self.len,
        }
    }

    /// Returns the cache to a snapshot taken from a cache of the same shape.
    pub fn restore(&mut self, snapshot: &KvSnapshot) -> Result<(), KvError> {
        if snapshot.storage != self.storage
            || snapshot.layers.len() != self.layers.len()
            || snapshot.len > self.capacity
        {
            return Err(KvError::SnapshotMismatch);
        }
        for (dst, src) in self.layers.iter_mut().zip(&snapshot.layers) {
            dst.keys.restore_prefix(&src.keys);
            dst.values.restore_prefix(&src.values);
        }
        self.len = snapshot.len;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(v: f32, n: usize) -> Vec<f32> {
        vec![v; n]
    }

    #[test]
    fn write_truncate_snapshot_restore() {
        for storage in [KvStorage::F32, KvStorage::F16] {
            let mut kv = KvCache::new(2, 8, 4, 2, storage);
            for pos in 0..5 {
                for layer in 0..2 {
                    kv.write(layer, pos, &row(pos as f32, 4), &row(-(pos as f32), 2));
                }
                kv.advance(pos + 1);
            }
            assert_eq!(kv.len(), 5);
            let snap = kv.snapshot();
            kv.truncate(2);
            assert_eq!(kv.len(), 2);
            kv.write(1, 2, &row(9.0, 4), &row(9.0, 2));
            kv.advance(3);
            kv.restore(&snap).unwrap();
            assert_eq!(kv.len(), 5);
            match kv.keys(1, 2, 3) {
                KvRows::F32(k) => assert_eq!(k, &[2.0; 4]),
                KvRows::F16(k) => assert!(k.iter().all(|x| x.to_f32() == 2.0)),
            }
            match kv.values(0, 4, 5) {
                KvRows::F32(v) => assert_eq!(v, &[-4.0; 2]),
                KvRows::F16(v) => assert!(v.iter().all(|x| x.to_f32() == -4.0)),
            }
            assert_eq!(kv.reserve(3), Ok(()));
            assert_eq!(kv.reserve(4), Err(KvError::Full { capacity: 8 }));
        }
    }

    #[test]
    fn impossible_sizes_are_errors() {
        assert_eq!(
            KvCache::bytes_needed(2, usize::MAX / 2, 4, 4, KvStorage::F16),
            Err(KvError::TooLarge {
                capacity: usize::MAX / 2
            })
        );
        // 2^40 positions of 2 KiB: far beyond any machine's memory, yet addressable.
        let capacity = 1usize << 40;
        let err = KvCache::try_new(4, capacity, 256, 256, KvStorage::F32).unwrap_err();
        assert!(matches!(
            err,
            KvError::ExceedsMemory { .. } | KvError::AllocationFailed { .. }
        ));
        let kv = KvCache::new(4, capacity, 256, 256, KvStorage::F32);
        assert_eq!(kv.capacity(), 0);
        assert_eq!(kv.unavailable(), Some(&err));
        assert_eq!(kv.reserve(1), Err(err));
    }

    #[test]
    fn snapshots_only_fit_matching_caches() {
        let a = KvCache::new(2, 8, 4, 2, KvStorage::F32);
        let mut b = KvCache::new(2, 8, 4, 2, KvStorage::F16);
        assert_eq!(b.restore(&a.snapshot()), Err(KvError::SnapshotMismatch));
    }
}
