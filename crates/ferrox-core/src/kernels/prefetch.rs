//! How far ahead of the block they read the kernels ask for weights: each kernel family's
//! built-in distance, or one distance set for every kernel at run time, so that benchmarks
//! can alternate distances within one process (`examples/decode_stack.rs ... prefetch=`).
//! Products give the same bits whatever the setting.

use std::sync::atomic::{AtomicUsize, Ordering};

const BUILT_IN: usize = usize::MAX;
const NO_PREFETCH: usize = usize::MAX - 1;
static PREFETCH_BYTES: AtomicUsize = AtomicUsize::new(BUILT_IN);

/// How far ahead the kernels prefetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefetch {
    /// Each kernel family's built-in choice.
    BuiltIn,
    /// No software prefetch.
    Off,
    /// This many bytes ahead of the current block, in every kernel.
    Ahead(usize),
}

/// Makes every later product prefetch as `prefetch` says.
pub fn set_prefetch(prefetch: Prefetch) {
    let value = match prefetch {
        Prefetch::BuiltIn => BUILT_IN,
        Prefetch::Off => NO_PREFETCH,
        Prefetch::Ahead(bytes) => bytes.min(NO_PREFETCH - 1),
    };
    PREFETCH_BYTES.store(value, Ordering::Relaxed);
}

/// The setting in force.
pub(crate) fn setting() -> Prefetch {
    match PREFETCH_BYTES.load(Ordering::Relaxed) {
        BUILT_IN => Prefetch::BuiltIn,
        NO_PREFETCH => Prefetch::Off,
        bytes => Prefetch::Ahead(bytes),
    }
}

/// How far ahead the kernels ask for weights on Intel CPUs, whose hardware prefetchers fall
/// short of a decode step's streams where Zen 4's keep up by themselves. Measured with
/// `examples/decode_stack.rs ... prefetch=none,...,4096` (sweeps alternated; Intel Xeon,
/// Emerald Rapids, 2 threads, one token), 4 KiB ahead against just before reading: packed
/// Q8_0 1.21x, Q5_0 1.29x, Q4_K 1.05x, Q6_K 1.27x with AVX-512; 1.39x, 1.55x, 1.12x,
/// 1.31x with AVX2 (1 KiB and 2 KiB slower, 8 KiB the same); eight tokens with AVX2 1.15x.
/// Row-major i-quants against none: IQ2_XXS at DeepSeek-V3's expert shapes 1.19x
/// (2048 x 7168) and 1.27x (7168 x 2048), 1.14x at Qwen2.5-1.5B's, 1.08x with AVX2;
/// IQ3_XXS 1.06x (1 KiB 1.06x, 2 KiB 1.12x against none).
pub(crate) const FAR_PREFETCH_BYTES: usize = 4096;

/// Whether the built-in prefetch asks [`FAR_PREFETCH_BYTES`] ahead: on Intel CPUs.
pub(crate) fn far_prefetch() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static FAR: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *FAR.get_or_init(super::x86::cpu_is_intel)
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Bytes ahead of the current super-block at which the row-major kernels ask for each
/// row's weights (0: none, the hardware prefetchers alone): [`FAR_PREFETCH_BYTES`] on
/// Intel CPUs by default.
#[inline]
pub(crate) fn row_major_ahead() -> usize {
    match setting() {
        Prefetch::BuiltIn if far_prefetch() => FAR_PREFETCH_BYTES,
        Prefetch::BuiltIn | Prefetch::Off => 0,
        Prefetch::Ahead(bytes) => bytes,
    }
}
