//! The element types of cached rows (keys, values, latents): f32 or f16, and borrowed runs
//! of them, as kernels read them. `ferrox-memory` keeps its paged stores in these types.

use half::f16;

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
