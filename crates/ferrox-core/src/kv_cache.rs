//! The element types of cached rows (keys, values, latents), as llama.cpp names them
//! (`-ctk`/`-ctv`), and borrowed runs of them, as kernels read them. `ferrox-memory` keeps
//! its paged stores in these types.

use std::sync::OnceLock;

use ferrox_gguf::GgmlType;
use half::f16;

/// The element type of one kind of cached row: llama.cpp's KV cache types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvType {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q4_0,
    Q4_1,
    Iq4Nl,
    Q5_0,
    Q5_1,
}

impl KvType {
    /// Every type, in llama.cpp's order of `-ctk`'s list.
    pub const ALL: [KvType; 9] = [
        KvType::F32,
        KvType::F16,
        KvType::Bf16,
        KvType::Q8_0,
        KvType::Q4_0,
        KvType::Q4_1,
        KvType::Iq4Nl,
        KvType::Q5_0,
        KvType::Q5_1,
    ];

    /// llama.cpp's name (`q8_0`, ...).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Bf16 => "bf16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
            KvType::Q4_1 => "q4_1",
            KvType::Iq4Nl => "iq4_nl",
            KvType::Q5_0 => "q5_0",
            KvType::Q5_1 => "q5_1",
        }
    }

    /// The type llama.cpp calls `name`.
    pub fn from_name(name: &str) -> Option<KvType> {
        KvType::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The ggml block format rows are stored in.
    pub fn ggml(self) -> GgmlType {
        match self {
            KvType::F32 => GgmlType::F32,
            KvType::F16 => GgmlType::F16,
            KvType::Bf16 => GgmlType::Bf16,
            KvType::Q8_0 => GgmlType::Q8_0,
            KvType::Q4_0 => GgmlType::Q4_0,
            KvType::Q4_1 => GgmlType::Q4_1,
            KvType::Iq4Nl => GgmlType::Iq4Nl,
            KvType::Q5_0 => GgmlType::Q5_0,
            KvType::Q5_1 => GgmlType::Q5_1,
        }
    }

    /// Whether rows are stored in blocks with a scale (llama.cpp rotates those).
    pub fn is_quantized(self) -> bool {
        !matches!(self, KvType::F32 | KvType::F16 | KvType::Bf16)
    }

    /// Values per block: a row's width must be a multiple of it.
    pub fn block_len(self) -> usize {
        if self.is_quantized() {
            32
        } else {
            1
        }
    }

    /// Bytes per block of [`block_len`](Self::block_len) values.
    pub fn block_bytes(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 | KvType::Bf16 => 2,
            KvType::Q8_0 => 34,
            KvType::Q4_0 | KvType::Iq4Nl => 18,
            KvType::Q4_1 => 20,
            KvType::Q5_0 => 22,
            KvType::Q5_1 => 24,
        }
    }

    /// Bytes of `values` values (a whole number of blocks).
    pub fn bytes(self, values: usize) -> usize {
        values / self.block_len() * self.block_bytes()
    }
}

/// How cached keys and values are stored (llama.cpp's `type_k`, `type_v`). A store without
/// values (MLA's latent rows) uses the keys' type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvStorage {
    pub keys: KvType,
    pub values: KvType,
}

impl Default for KvStorage {
    /// llama.cpp's default: f16 keys and values.
    fn default() -> Self {
        KvStorage::F16
    }
}

impl KvStorage {
    pub const F32: KvStorage = KvStorage::uniform(KvType::F32);
    /// Half the memory; llama.cpp's default cache type.
    pub const F16: KvStorage = KvStorage::uniform(KvType::F16);

    /// Keys and values of one type.
    pub const fn uniform(ty: KvType) -> KvStorage {
        KvStorage {
            keys: ty,
            values: ty,
        }
    }

    /// Whether both are f16 or both f32 (attended as floats; the other types through the
    /// typed kernels).
    pub fn is_float(self) -> bool {
        self == KvStorage::F16 || self == KvStorage::F32
    }

    /// `f16`, or `q8_0/q4_0` for keys and values of different types.
    pub fn name(self) -> String {
        if self.keys == self.values {
            self.keys.name().to_owned()
        } else {
            format!("{}/{}", self.keys.name(), self.values.name())
        }
    }

    /// Bytes of a row of `key_width` keys and `value_width` values.
    pub fn row_bytes(self, key_width: usize, value_width: usize) -> usize {
        self.keys.bytes(key_width) + self.values.bytes(value_width)
    }

    /// The size of llama.cpp's Hadamard rotation of keys stored in this cache, for heads of
    /// `head_dim` keys (every layer's the same): none for float caches or heads not a
    /// multiple of 64, else 64 doubled while it divides the head twice over. Queries are
    /// rotated alike, so q·k is unchanged but the rounded keys lose less.
    pub fn key_rotation(self, head_dim: usize) -> Option<usize> {
        if !self.keys.is_quantized() || rotation_disabled() || !head_dim.is_multiple_of(64) {
            return None;
        }
        let mut n = 64;
        while head_dim.is_multiple_of(2 * n) {
            n *= 2;
        }
        Some(n)
    }

    /// The size of llama.cpp's rotation of values stored in this cache (64, where the cache
    /// is quantized and the head a multiple of 64); the attention's output is rotated back.
    pub fn value_rotation(self, head_dim: usize) -> Option<usize> {
        (self.values.is_quantized() && !rotation_disabled() && head_dim.is_multiple_of(64))
            .then_some(64)
    }
}

/// `FERROX_ATTN_ROT_DISABLE=1` turns the rotation of quantized caches off, as
/// `LLAMA_ATTN_ROT_DISABLE` does in llama.cpp (read once).
fn rotation_disabled() -> bool {
    static DISABLED: OnceLock<bool> = OnceLock::new();
    *DISABLED.get_or_init(|| {
        std::env::var("FERROX_ATTN_ROT_DISABLE")
            .ok()
            .and_then(|v| v.trim().parse::<i64>().ok())
            .is_some_and(|v| v != 0)
    })
}

/// A borrowed run of cached rows.
#[derive(Clone, Copy, Debug)]
pub enum KvRows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    /// Whole blocks of a block type (bf16 and the quantized types).
    Blocks(KvType, &'a [u8]),
}

impl<'a> KvRows<'a> {
    /// The rows' type and bytes (little-endian values, as the kernels read them).
    pub fn as_bytes(self) -> (KvType, &'a [u8]) {
        // SAFETY: f32 and f16 are plain values with no padding; any bytes of them may be read
        // as `u8`s, which need no alignment, for as long as the borrow lasts.
        let bytes = |ptr: *const u8, len: usize| unsafe { std::slice::from_raw_parts(ptr, len) };
        match self {
            KvRows::F32(r) => (KvType::F32, bytes(r.as_ptr().cast(), size_of_val(r))),
            KvRows::F16(r) => (KvType::F16, bytes(r.as_ptr().cast(), size_of_val(r))),
            KvRows::Blocks(ty, b) => (ty, b),
        }
    }

    /// The rows as f32 into `out` (of the same length).
    pub fn copy_to(self, out: &mut [f32]) {
        match self {
            KvRows::F32(r) => out.copy_from_slice(r),
            KvRows::F16(r) => out.iter_mut().zip(r).for_each(|(o, v)| *o = v.to_f32()),
            KvRows::Blocks(ty, bytes) => crate::quant::dequantize_row(ty.ggml(), bytes, out)
                .expect("cached rows are whole blocks of a type we decode"),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_matches_ggml() {
        for ty in KvType::ALL {
            assert_eq!(KvType::from_name(ty.name()), Some(ty));
            let ggml = ty.ggml();
            let elems = ggml.block_size().unwrap() as usize;
            assert_eq!(ty.block_len(), elems, "{ty:?}");
            assert_eq!(
                ty.block_bytes(),
                ggml.block_bytes().unwrap() as usize,
                "{ty:?}"
            );
        }
        assert_eq!(KvType::Q8_0.bytes(128), 136);
        assert_eq!(KvStorage::F16.row_bytes(64, 32), 192);
    }

    #[test]
    fn rotation_sizes_follow_llama_cpp() {
        let q8 = KvStorage::uniform(KvType::Q8_0);
        assert_eq!(q8.key_rotation(128), Some(128));
        assert_eq!(q8.key_rotation(192), Some(64));
        assert_eq!(q8.key_rotation(256), Some(256));
        assert_eq!(q8.key_rotation(96), None);
        assert_eq!(q8.value_rotation(256), Some(64));
        assert_eq!(KvStorage::F16.key_rotation(128), None);
        let mixed = KvStorage {
            keys: KvType::F16,
            values: KvType::Q4_0,
        };
        assert_eq!(
            (mixed.key_rotation(128), mixed.value_rotation(128)),
            (None, Some(64))
        );
    }
}
