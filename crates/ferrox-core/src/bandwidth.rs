//! Measuring how fast this machine streams memory: the bound on decode speed, since every
//! decoded token reads every weight once.

use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;

/// Bytes each pass reads: far beyond any cache.
const BUFFER_BYTES: usize = 512 << 20;

/// Sustained read bandwidth in bytes per second with `threads` threads: the best of
/// `passes` sweeps over a buffer much larger than the last-level cache.
pub fn read_bandwidth(threads: usize, passes: usize) -> f64 {
    let pool = match rayon::ThreadPoolBuilder::new().num_threads(threads).build() {
        Ok(pool) => pool,
        Err(_) => return 0.0,
    };
    // Written (not just allocated) so every page is resident before timing.
    let buffer: Vec<u64> = (0..BUFFER_BYTES / 8).map(|i| i as u64).collect();
    let chunk = buffer.len().div_ceil(threads.max(1) * 4);
    let mut best = 0.0f64;
    pool.install(|| {
        for _ in 0..passes.max(1) {
            let start = Instant::now();
            let total: u64 = buffer
                .par_chunks(chunk)
                .map(sum_words)
                .reduce(|| 0, u64::wrapping_add);
            black_box(total);
            let secs = start.elapsed().as_secs_f64();
            best = best.max(BUFFER_BYTES as f64 / secs);
        }
    });
    best
}

/// Sums with the widest vector loads the CPU has (chosen at run time).
fn sum_words(words: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was just detected.
        return unsafe { sum_lanes_avx2(words) };
    }
    sum_lanes(words)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_lanes_avx2(words: &[u64]) -> u64 {
    sum_lanes(words)
}

/// Sums with independent accumulators so the loop is bound by loads, not by one add chain
/// (the compiler turns the lanes into vector registers).
#[inline(always)]
fn sum_lanes(words: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut blocks = words.chunks_exact(8);
    for block in &mut blocks {
        for (a, &w) in acc.iter_mut().zip(block) {
            *a = a.wrapping_add(w);
        }
    }
    let tail: u64 = blocks.remainder().iter().fold(0, |s, &w| s.wrapping_add(w));
    acc.iter().fold(tail, |s, &a| s.wrapping_add(a))
}

#[cfg(test)]
mod tests {
    #[test]
    fn sums_all_words() {
        let words: Vec<u64> = (1..=21).collect();
        assert_eq!(super::sum_lanes(&words), 231);
        assert_eq!(super::sum_words(&words), 231);
    }
}
