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

/// How far ahead the packed kernels of the formats that gain ask for weights on AMD cores
/// without AVX-512 (Zen 3 and earlier), whose hardware prefetchers keep up with a decode
/// step's streams only in part, where Zen 4's keep up by themselves. Measured with
/// `examples/decode_stack.rs TYPE 2 4 prefetch=0,2048,4096` (sweeps alternated; AMD EPYC,
/// Zen 3, 2 threads, one token), 2 KiB ahead against just before reading: Q8_0 1.11x (4 KiB
/// 1.02x), Q5_0 1.23x, Q4_0 1.14x, IQ4_NL 1.25x, Q2_K 1.16x, Q3_K 1.08x, TQ2_0 1.15x; eight
/// tokens Q8_0 1.12x and Q5_0 1.10x. Q4_K (0.94x), Q5_K (0.86x), IQ4_XS (0.96x) and Q6_K
/// (level) keep their own choice, and the row-major i-quants (level or slower) none.
pub(crate) const MID_PREFETCH_BYTES: usize = 2048;

/// Whether the packed kernels of the formats that gain ask [`MID_PREFETCH_BYTES`] ahead: on
/// x86 CPUs that are not Intel's and have no AVX-512 (the core, not `FERROX_ISA`, decides).
pub(crate) fn mid_prefetch() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static MID: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *MID.get_or_init(|| {
            !super::x86::cpu_is_intel() && !std::arch::is_x86_feature_detected!("avx512f")
        })
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

#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
mod tests {
    /// The streaming choice follows the core the kernel reports: far on Intel's, 2 KiB for
    /// some formats on the others without AVX-512, never both.
    #[test]
    fn the_prefetch_distance_follows_the_core() {
        let info = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo");
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name))
                .map(|rest| rest.trim_start_matches([' ', '\t', ':']).trim().to_string())
                .unwrap_or_else(|| panic!("a {name} line"))
        };
        let intel = field("vendor_id") == "GenuineIntel";
        let avx512 = field("flags").split_whitespace().any(|f| f == "avx512f");
        assert_eq!(super::far_prefetch(), intel);
        assert_eq!(super::mid_prefetch(), !intel && !avx512);
    }
}
