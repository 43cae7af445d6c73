//! AVX2+FMA+F16C and AVX-512 VNNI kernels, compiled for the generic x86-64 target and
//! chosen at run time.
//!
//! Every AVX2 kernel function carries `#[target_feature(enable = "avx2,fma,f16c")]`, every
//! AVX-512 one [`AVX512`]'s features as well; the only way to reach one is through
//! [`avx2_kernel`] or [`avx512_vnni_kernel`], which hand them out only after detecting
//! those features, so the `unsafe` calls in the entry wrappers are sound.

/// Aligns the calling function's stack frame to a cache line. Without it LLVM gives the
/// vector registers a kernel spills, and its vector arrays, slots aligned only to the
/// stack's 16 bytes, so whether a 32- or 64-byte slot straddles two cache lines depends on
/// the callers' frames: then every reload waits on a split store, and a kernel's speed
/// changes with unrelated code (the AVX2 Q8_0 product against sixteen tokens ran at 0.62x
/// in one build). A 64-byte-aligned local whose address escapes makes LLVM realign the
/// frame, and with it give every slot its own alignment. Costs a few instructions per call:
/// for functions that run loops, not per-block helpers.
macro_rules! align_frame {
    () => {
        let frame_anchor = $crate::kernels::x86::FrameAnchor([0; 64]);
        ::std::hint::black_box(&frame_anchor);
    };
}
pub(crate) use align_frame;

/// See [`align_frame`].
#[repr(C, align(64))]
pub(crate) struct FrameAnchor(pub(crate) [u8; 64]);

pub(crate) mod avx2_activation;
pub(crate) mod avx2_common;
mod avx2_float;
mod avx2_float_gemm;
mod avx2_iq;
mod avx2_iq1;
mod avx2_iq2;
mod avx2_iq3;
#[cfg(test)]
mod avx2_iq_tests;
mod avx2_kquants;
mod avx2_legacy;
mod avx2_low_bit;
mod avx2_ternary;
mod avx512_common;
mod avx512_float;
mod avx512_float_gemm;
mod avx512_iq;
mod avx512_iq2_xxs;
mod avx512_iq_codes;
pub(crate) use avx512_common::prefetch_ahead;
mod avx512_kquants;
mod avx512_legacy;
mod gather;

use super::{row_kernel_entry, DotKernel, PanelRows, RowKernel, WeightKind};

/// Whether the CPU says it is Intel's (`GenuineIntel`): its streaming wants a different
/// prefetch distance (see `packed::prefetch_ahead`).
pub(crate) fn cpu_is_intel() -> bool {
    #[allow(unused_unsafe)]
    // SAFETY: CPUID leaf 0 exists on every x86-64 CPU.
    let leaf = unsafe { std::arch::x86_64::__cpuid(0) };
    let vendor = [leaf.ebx, leaf.edx, leaf.ecx]
        .map(u32::to_le_bytes)
        .concat();
    vendor == *b"GenuineIntel"
}

#[cfg(all(test, target_os = "linux"))]
mod vendor_tests {
    /// The vendor read from CPUID is the one the kernel reports.
    #[test]
    fn the_vendor_is_the_one_linux_reports() {
        let info = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo");
        let vendor = info
            .lines()
            .find_map(|line| line.strip_prefix("vendor_id"))
            .map(|rest| rest.trim_start_matches([' ', '\t', ':']).trim())
            .expect("a vendor_id line");
        assert_eq!(super::cpu_is_intel(), vendor == "GenuineIntel", "{vendor}");
    }
}

pub(super) fn avx2_detected() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

pub(super) fn avx512_vnni_detected() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512dq")
        && is_x86_feature_detected!("avx512vnni")
}

/// Whether the AVX-512 i-quant kernels ([`avx512_iq`]) may run: VNNI's set plus VBMI
/// and BITALG.
pub(super) fn avx512_iq_detected() -> bool {
    avx512_vnni_detected()
        && is_x86_feature_detected!("avx512vbmi")
        && is_x86_feature_detected!("avx512bitalg")
}

/// An i-quant's int8 expansion with `isa`'s kernel (the scalar expansion's bits,
/// [`crate::quant::int8::Int8Expand::expand`]), where this CPU can run it: AVX-512's from
/// the kernels' per-super-block preparation, AVX2's from its kernels' sub-block values.
pub(crate) fn iq_int8_expansion(
    isa: super::Isa,
    ty: ferrox_gguf::GgmlType,
) -> Option<fn(&[u8], &mut crate::quant::int8::Int8Block)> {
    iq_int8_expansion_gathering(isa, ty, gather::gathers_pay())
}

/// [`iq_int8_expansion`], the AVX2 expansions gathering grid points where `gather` (see
/// [`gather`]).
fn iq_int8_expansion_gathering(
    isa: super::Isa,
    ty: ferrox_gguf::GgmlType,
    gather: bool,
) -> Option<fn(&[u8], &mut crate::quant::int8::Int8Block)> {
    use crate::quant::int8::Int8Block;
    use ferrox_gguf::GgmlType as T;
    macro_rules! expansion {
        ($expand:path, $format:ty) => {{
            fn expand(block: &[u8], out: &mut Int8Block) {
                assert_eq!(
                    block.len(),
                    <$format as avx2_iq::IqAvx2>::BYTES,
                    "one whole block"
                );
                // SAFETY: handed out only where the features were detected (below); one
                // whole block (asserted).
                unsafe { $expand(block, out) }
            }
            expand as fn(&[u8], &mut Int8Block)
        }};
    }
    // `module: F` is `module::expand_int8::<F>`, the expansion shared by most formats.
    macro_rules! shared {
        ($module:ident: $format:ty) => {
            expansion!($module::expand_int8::<$format>, $format)
        };
    }
    match isa {
        super::Isa::Avx512Vnni if avx2_detected() && avx512_iq_detected() => Some(match ty {
            T::Iq2Xxs => expansion!(avx512_iq2_xxs::expand_int8, avx2_iq2::Iq2XxsAvx2),
            T::Iq2Xs => shared!(avx512_iq: avx2_iq2::Iq2XsAvx2),
            T::Iq2S => shared!(avx512_iq: avx2_iq2::Iq2SAvx2),
            T::Iq3Xxs => shared!(avx512_iq: avx2_iq3::Xxs),
            T::Iq3S => shared!(avx512_iq: avx2_iq3::S),
            T::Iq1S => shared!(avx512_iq: avx2_iq1::S),
            T::Iq1M => shared!(avx512_iq: avx2_iq1::M),
            _ => return None,
        }),
        super::Isa::Avx2 if avx2_detected() => Some(match ty {
            T::Iq2Xxs => expansion!(avx2_iq2::expand_int8_xxs, avx2_iq2::Iq2XxsAvx2),
            T::Iq2Xs => shared!(avx2_iq: avx2_iq2::Iq2XsAvx2),
            T::Iq2S => shared!(avx2_iq: avx2_iq2::Iq2SAvx2),
            T::Iq3Xxs if gather => shared!(avx2_iq: avx2_iq3::Xxs<true>),
            T::Iq3Xxs => shared!(avx2_iq: avx2_iq3::Xxs),
            T::Iq3S if gather => expansion!(avx2_iq3::expand_int8_s_gathered, avx2_iq3::S<true>),
            T::Iq3S => expansion!(avx2_iq3::expand_int8_s, avx2_iq3::S),
            T::Iq1M => shared!(avx2_iq: avx2_iq1::M),
            // IQ1_S's AVX2 values (index bits gathered per group) measured slower than the
            // scalar expansion (`iq_kernels`, 128 tokens: 0.98-1.01x; 24 tokens with the
            // vector placing, 8.8-9.4 against 8.5-8.8 ms); the other types 1.05-1.17x at
            // 128 tokens and 1.1-2x at 10 and 16.
            _ => return None,
        }),
        _ => None,
    }
}

/// Safe `DotKernel` entries for an AVX2 driver `$run::<N>(w, xs)`.
macro_rules! avx2_entry {
    ($run:expr) => {{
        struct Rows;
        impl RowKernel for Rows {
            fn dot<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
                // SAFETY: these entries are only handed out by `avx2_kernel`, after
                // `avx2_detected()` confirmed AVX2, FMA and F16C.
                unsafe { $run(w, xs) }
            }
        }
        row_kernel_entry::<Rows>()
    }};
}

/// Safe `DotKernel` entries for a 32-value format of scaled blocks (`$format`: Q4_0, Q5_0,
/// Q8_0), whose panels of four and eight tokens take eight sums at a time
/// (`avx2_legacy::scaled_panel`, the same bits).
macro_rules! avx2_scaled_entry {
    ($format:ty) => {{
        fn panel4(w: &[u8], rows: PanelRows, xs: [&[u8]; 4], out: &mut [f32]) {
            // SAFETY: as `avx2_entry`'s.
            unsafe { avx2_legacy::scaled_panel::<$format, 4>(w, rows, xs, out) }
        }
        fn panel8(w: &[u8], rows: PanelRows, xs: [&[u8]; 8], out: &mut [f32]) {
            // SAFETY: as `avx2_entry`'s.
            unsafe { avx2_legacy::scaled_panel::<$format, 8>(w, rows, xs, out) }
        }
        DotKernel {
            panel4,
            panel8,
            ..avx2_entry!(avx2_legacy::legacy_dot::<$format, N>)
        }
    }};
}

/// A single-token panel: its rows four at a time through `four`, the rest one at a time
/// through `one` (the same bits).
#[inline]
fn four_rows_at_a_time(
    (w, rows, out): (&[u8], PanelRows, &mut [f32]),
    four: impl Fn([&[u8]; 4]) -> [f32; 4],
    one: impl Fn(&[u8]) -> f32,
) {
    let quads = rows.count / 4;
    for (q, out) in out.chunks_exact_mut(4).take(quads).enumerate() {
        out.copy_from_slice(&four(std::array::from_fn(|i| rows.row(w, 4 * q + i))));
    }
    for (r, out) in out.iter_mut().enumerate().skip(4 * quads) {
        *out = one(rows.row(w, r));
    }
}

/// Safe `DotKernel` entries for an AVX2 i-quant `$run::<N>(w, xs)` of format `$format`
/// (`avx2_iq::iq_dot::<$format, N>`), whose single-token panels take rows four at a time
/// (the same bits).
macro_rules! avx2_iq_entry {
    ($run:expr, $format:ty) => {{
        fn panel1(w: &[u8], rows: PanelRows, [x]: [&[u8]; 1], out: &mut [f32]) {
            four_rows_at_a_time(
                (w, rows, out),
                // SAFETY: as `avx2_entry`'s.
                |quad| unsafe { avx2_iq::iq_rows4_avx2::<$format>(quad, x) },
                // SAFETY: as `avx2_entry`'s.
                |row| unsafe { avx2_iq::iq_dot::<$format, 1>(row, [x]) }[0],
            );
        }
        DotKernel {
            panel1,
            ..avx2_entry!($run)
        }
    }};
}

/// The AVX2 kernels for `kind`, or `None` if this machine lacks the features.
pub(super) fn avx2_kernel(kind: WeightKind) -> Option<DotKernel> {
    use avx2_float::{float_dot, Bf16Lanes, F16Lanes, F32Lanes};
    use avx2_kquants::{super_block_dot, Iq4XsAvx2, Q2KAvx2, Q3KAvx2, Q4KAvx2, Q5KAvx2, Q6KAvx2};
    use avx2_legacy::{
        legacy_dot, Iq4NlAvx2, Mxfp4Avx2, Q4_0Avx2, Q4_1Avx2, Q5_0Avx2, Q5_1Avx2, Q8_0Avx2,
    };
    use WeightKind as K;

    if !avx2_detected() {
        return None;
    }
    Some(match kind {
        K::F32 => avx2_entry!(float_dot::<F32Lanes, N>),
        K::F16 => avx2_entry!(float_dot::<F16Lanes, N>),
        K::Bf16 => avx2_entry!(float_dot::<Bf16Lanes, N>),
        K::Q4_0 => avx2_scaled_entry!(Q4_0Avx2),
        K::Q4_1 => avx2_entry!(legacy_dot::<Q4_1Avx2, N>),
        K::Q5_0 => avx2_scaled_entry!(Q5_0Avx2),
        K::Q5_1 => avx2_entry!(legacy_dot::<Q5_1Avx2, N>),
        K::Q8_0 => avx2_scaled_entry!(Q8_0Avx2),
        K::Iq4Nl => avx2_entry!(legacy_dot::<Iq4NlAvx2, N>),
        K::Q2K => avx2_entry!(super_block_dot::<Q2KAvx2, N>),
        K::Q3K => avx2_entry!(super_block_dot::<Q3KAvx2, N>),
        K::Q4K => avx2_entry!(super_block_dot::<Q4KAvx2, N>),
        K::Q5K => avx2_entry!(super_block_dot::<Q5KAvx2, N>),
        K::Q6K => avx2_entry!(super_block_dot::<Q6KAvx2, N>),
        K::Iq4Xs => avx2_entry!(super_block_dot::<Iq4XsAvx2, N>),
        K::Mxfp4 => avx2_entry!(legacy_dot::<Mxfp4Avx2, N>),
        K::Tq2_0 => avx2_entry!(avx2_ternary::tq2_0_dot::<N>),
        K::Tq1_0 => avx2_entry!(avx2_ternary::tq1_0_dot::<N>),
        K::Nvfp4 => avx2_entry!(avx2_low_bit::nvfp4_dot::<N>),
        K::Q1_0 => avx2_entry!(avx2_low_bit::q1_0_dot::<N>),
        K::Q2_0 => avx2_entry!(avx2_low_bit::q2_0_dot::<N>),
        K::Iq3Xxs if gather::gathers_pay() => {
            avx2_iq_entry!(avx2_iq3::iq3_xxs_dot::<true, N>, avx2_iq3::Xxs<true>)
        }
        K::Iq3Xxs => avx2_iq_entry!(avx2_iq3::iq3_xxs_dot::<false, N>, avx2_iq3::Xxs),
        // IQ3_S and IQ1_M: four rows at a time measured slower or level on AVX2.
        K::Iq3S if gather::gathers_pay() => {
            avx2_iq_entry!(avx2_iq3::iq3_s_dot::<true, N>, avx2_iq3::S<true>)
        }
        K::Iq3S => avx2_entry!(avx2_iq3::iq3_s_dot::<false, N>),
        K::Iq1S => avx2_iq_entry!(avx2_iq1::iq1_s_dot::<N>, avx2_iq1::S),
        K::Iq1M => avx2_entry!(avx2_iq1::iq1_m_dot::<N>),
        K::Iq2Xxs => avx2_iq_entry!(
            avx2_iq2::iq2_dot::<avx2_iq2::Iq2XxsAvx2, N>,
            avx2_iq2::Iq2XxsAvx2
        ),
        K::Iq2Xs => avx2_iq_entry!(
            avx2_iq2::iq2_dot::<avx2_iq2::Iq2XsAvx2, N>,
            avx2_iq2::Iq2XsAvx2
        ),
        K::Iq2S => avx2_iq_entry!(
            avx2_iq2::iq2_dot::<avx2_iq2::Iq2SAvx2, N>,
            avx2_iq2::Iq2SAvx2
        ),
    })
}

/// The AVX-512 VNNI kernels for `kind`, or `None` if this machine lacks the features or
/// the type has no such kernel (it then uses the AVX2 one).
pub(super) fn avx512_vnni_kernel(kind: WeightKind) -> Option<DotKernel> {
    use avx2_float::{Bf16Lanes, F16Lanes, F32Lanes};
    use avx512_kquants::{Q4KZmm, Q6KZmm};
    use avx512_legacy::{Q4_0Zmm, Q5_0Zmm, Q8_0Zmm};
    use WeightKind as K;

    if !(avx2_detected() && avx512_vnni_detected()) {
        return None;
    }
    if let Some(kernel) = avx512_iq_kernel(kind) {
        return Some(kernel);
    }
    Some(match kind {
        K::F32 => avx512_float::entry::<F32Lanes>(),
        K::F16 => avx512_float::entry::<F16Lanes>(),
        K::Bf16 => avx512_float::entry::<Bf16Lanes>(),
        K::Q4_0 => avx512_legacy::entry::<Q4_0Zmm>(),
        K::Q5_0 => avx512_legacy::entry::<Q5_0Zmm>(),
        K::Q8_0 => avx512_legacy::entry::<Q8_0Zmm>(),
        K::Q4K => avx512_kquants::entry::<Q4KZmm>(),
        K::Q6K => avx512_kquants::entry::<Q6KZmm>(),
        _ => return None,
    })
}

/// The AVX-512 i-quant kernels for `kind`, or `None` if this machine lacks their features
/// or `kind` is not an i-quant.
fn avx512_iq_kernel(kind: WeightKind) -> Option<DotKernel> {
    use avx512_iq::{iq_dot_zmm, iq_rows4_zmm};
    use WeightKind as K;

    /// Safe entries for `$kernel::<$format, N>`; with `$rows4`, single-token panels take
    /// rows four at a time through `$rows4(rows, x)` (the same bits).
    macro_rules! zmm_entry {
        ($kernel:ident, $format:ty) => {{
            struct Rows;
            impl RowKernel for Rows {
                fn dot<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
                    // SAFETY: these entries are only handed out below, after
                    // `avx512_iq_detected()` (which implies AVX2, FMA and F16C here).
                    unsafe { $kernel::<$format, N>(w, xs) }
                }

                const EIGHT_AT_ONCE: bool = true;
            }
            row_kernel_entry::<Rows>()
        }};
        ($kernel:ident, $format:ty, $rows4:expr) => {{
            fn panel1(w: &[u8], rows: PanelRows, [x]: [&[u8]; 1], out: &mut [f32]) {
                four_rows_at_a_time(
                    (w, rows, out),
                    // SAFETY: as above.
                    |quad| unsafe { $rows4(quad, x) },
                    // SAFETY: as above.
                    |row| unsafe { $kernel::<$format, 1>(row, [x]) }[0],
                );
            }
            DotKernel {
                panel1,
                ..zmm_entry!($kernel, $format)
            }
        }};
    }
    use avx512_iq2_xxs::{iq2_xxs_dot_zmm, iq2_xxs_rows4_zmm};
    use avx512_iq_codes::{iq_dot_codes, iq_rows4_codes};

    if !(avx2_detected() && avx512_iq_detected()) {
        return None;
    }
    Some(match kind {
        K::Iq2Xxs => zmm_entry!(
            iq2_xxs_dot_zmm,
            avx2_iq2::Iq2XxsAvx2,
            iq2_xxs_rows4_zmm::<avx2_iq2::Iq2XxsAvx2>
        ),
        // On Intel cores the 256-bit kernel (one thread, 8960 x 1536, 1/4/8 tokens: 940,
        // 1522, 2207 us against the code kernel's 1039, 1812, 2626); elsewhere (Zen 4) the
        // code kernel, chosen where it was measured faster.
        K::Iq2Xs if cpu_is_intel() => zmm_entry!(
            iq_dot_zmm,
            avx2_iq2::Iq2XsAvx2,
            iq_rows4_zmm::<avx2_iq2::Iq2XsAvx2>
        ),
        K::Iq2Xs => zmm_entry!(
            iq_dot_codes,
            avx2_iq2::Iq2XsAvx2,
            iq_rows4_codes::<avx2_iq2::Iq2XsAvx2>
        ),
        K::Iq2S => zmm_entry!(
            iq_dot_zmm,
            avx2_iq2::Iq2SAvx2,
            iq_rows4_zmm::<avx2_iq2::Iq2SAvx2>
        ),
        K::Iq3Xxs => zmm_entry!(iq_dot_codes, avx2_iq3::Xxs, iq_rows4_codes::<avx2_iq3::Xxs>),
        K::Iq3S => zmm_entry!(iq_dot_codes, avx2_iq3::S, iq_rows4_codes::<avx2_iq3::S>),
        K::Iq1S => zmm_entry!(iq_dot_zmm, avx2_iq1::S, iq_rows4_zmm::<avx2_iq1::S>),
        K::Iq1M => zmm_entry!(iq_dot_zmm, avx2_iq1::M, iq_rows4_zmm::<avx2_iq1::M>),
        _ => return None,
    })
}

/// The AVX-512 tiled products of float weights for `kind`, or `None` if this machine lacks
/// the features or `kind` is not a float type.
pub(super) fn avx512_float_gemm(kind: WeightKind) -> Option<super::FloatGemm> {
    if !(avx2_detected() && avx512_vnni_detected()) {
        return None;
    }
    avx512_float_gemm::kernel(kind)
}

/// The AVX2 tiled products of float weights for `kind`, or `None` if this machine lacks
/// the features or `kind` is not a float type.
pub(super) fn avx2_float_gemm(kind: WeightKind) -> Option<super::FloatGemm> {
    if !avx2_detected() {
        return None;
    }
    avx2_float_gemm::kernel(kind)
}
