//! Eight table entries into one vector, by `vpgatherdd` or by loads and inserts, whichever
//! this CPU does faster (decided once, by measuring both): the same vector either way, so
//! the kernels that use it give the same bits.
//!
//! Where the gather pays depends on the core, not the instruction set: on an Intel Xeon
//! (Emerald Rapids) under `FERROX_ISA=avx2` gathered grid points made IQ3_XXS decode 1.11x
//! and IQ3_S 1.58x faster, while microcode that guards gathers against Gather Data Sampling
//! makes them several times slower, and some cores split them into many micro-operations.
//! For eight-byte entries (the IQ2 and IQ1 grids: four per vector) the inserts won here.
//! On an AMD EPYC (Zen 3) the probe keeps the inserts, rightly: `decode_stack iq3_xxs 2 4`
//! streamed 3.1 GB/s gathered (`FERROX_GATHER=on`) against 3.9-4.4 with inserts, 3.8-4.0
//! as the probe chose (runs alternated).

use std::arch::x86_64::*;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Whether [`gathered`] beats [`inserted`] on this CPU, measured once
/// (`FERROX_GATHER=on|off` decides instead).
pub(crate) fn gathers_pay() -> bool {
    static PAY: OnceLock<bool> = OnceLock::new();
    *PAY.get_or_init(|| {
        let setting = std::env::var("FERROX_GATHER").ok();
        match setting.as_deref().map(str::trim) {
            Some("on" | "1") => true,
            Some("off" | "0") => false,
            _ => super::avx2_detected() && gather_is_faster(),
        }
    })
}

/// `table[indices[k]]` in i32 lane `k`, by one gather.
///
/// # Safety
/// The CPU has AVX2; every index is below `N`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gathered<const N: usize>(table: &[u32; N], indices: __m256i) -> __m256i {
    // SAFETY: the caller's contract: every lane's index is within the table.
    unsafe { _mm256_i32gather_epi32::<4>(table.as_ptr().cast(), indices) }
}

/// `table[indices[k]]` in i32 lane `k`, loaded one by one and inserted.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn inserted<const N: usize>(table: &[u32; N], indices: [usize; 8]) -> __m256i {
    let p = indices.map(|i| table[i] as i32);
    _mm256_setr_epi32(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7])
}

/// Vectors built per timed run, and runs per way (alternated, the best of each kept).
const PROBE_VECTORS: usize = 16 * 1024;
const PROBE_RUNS: usize = 5;

/// Times both ways over the same pseudo-random indices into a 256-entry table, each
/// vector combined into the next so neither is optimised away: the gather must take at
/// most nine tenths of the inserts' time (a tie keeps the inserts, which every x86 core
/// runs at a known pace).
fn gather_is_faster() -> bool {
    let table: [u32; 256] = std::array::from_fn(|i| (i as u32).wrapping_mul(0x9E37_79B9));
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let indices: Vec<u8> = (0..8 * 1024)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let (mut best_gather, mut best_insert) = (Duration::MAX, Duration::MAX);
    for _ in 0..PROBE_RUNS {
        // SAFETY: `gathers_pay` probes only after detecting AVX2, FMA and F16C.
        let (g, i) = unsafe {
            (
                time_gathers(&table, &indices),
                time_inserts(&table, &indices),
            )
        };
        best_gather = best_gather.min(g);
        best_insert = best_insert.min(i);
    }
    best_gather.as_secs_f64() <= 0.9 * best_insert.as_secs_f64()
}

#[target_feature(enable = "avx2,fma,f16c")]
fn time_gathers(table: &[u32; 256], indices: &[u8]) -> Duration {
    let start = Instant::now();
    let mut acc = _mm256_setzero_si256();
    for chunk in indices.chunks_exact(8).cycle().take(PROBE_VECTORS) {
        let bytes = u64::from_le_bytes(*chunk.first_chunk().expect("eight indices"));
        let lanes = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes as i64));
        // SAFETY: byte indices into a 256-entry table; AVX2 is this function's.
        acc = _mm256_xor_si256(acc, unsafe { gathered(table, lanes) });
    }
    std::hint::black_box(acc);
    start.elapsed()
}

#[target_feature(enable = "avx2,fma,f16c")]
fn time_inserts(table: &[u32; 256], indices: &[u8]) -> Duration {
    let start = Instant::now();
    let mut acc = _mm256_setzero_si256();
    for chunk in indices.chunks_exact(8).cycle().take(PROBE_VECTORS) {
        let lanes = std::array::from_fn(|k| usize::from(chunk[k]));
        acc = _mm256_xor_si256(acc, inserted(table, lanes));
    }
    std::hint::black_box(acc);
    start.elapsed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_ways_build_the_same_vector() {
        if !super::super::avx2_detected() {
            eprintln!("skipped: this machine has no AVX2");
            return;
        }
        let table: [u32; 512] = std::array::from_fn(|i| (i as u32).wrapping_mul(0x0101_0F1D));
        for start in 0..512 - 8 {
            let lanes: [usize; 8] = std::array::from_fn(|k| (start * 37 + k * 101) % 512);
            let mut got = [[0u32; 8]; 2];
            // SAFETY: AVX2 detected; every index below 512; 32 writable bytes per store.
            unsafe {
                let indices = _mm256_loadu_si256(lanes.map(|i| i as i32).as_ptr().cast());
                _mm256_storeu_si256(got[0].as_mut_ptr().cast(), gathered(&table, indices));
                _mm256_storeu_si256(got[1].as_mut_ptr().cast(), inserted(&table, lanes));
            }
            let want = lanes.map(|i| table[i]);
            assert_eq!(got, [want, want], "indices {lanes:?}");
        }
    }
}
