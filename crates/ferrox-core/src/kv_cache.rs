//! How cached rows (keys, values, latents) are stored: f32 or f16 arrays allocated without
//! aborting on failure, and borrowed runs of them. The sequence memory ([`crate::memory`])
//! keeps its paged stores in these.

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
}

/// A borrowed run of cached rows.
#[derive(Clone, Copy, Debug)]
pub enum KvRows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl KvRows<'_> {
    /// The rows as f32 into `out` (of the same length).
    pub fn copy_to(self, out: &mut [f32]) {
        match self {
            KvRows::F32(r) => out.copy_from_slice(r),
            KvRows::F16(r) => out.iter_mut().zip(r).for_each(|(o, v)| *o = v.to_f32()),
        }
    }
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
