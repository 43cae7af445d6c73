//! Measuring how fast this machine streams memory: the bound on decode speed, since every
//! decoded token reads every weight once.

use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;

/// Bytes each sweep reads: far beyond any cache.
const BUFFER_BYTES: usize = 512 << 20;

/// A buffer much larger than the last-level cache and a pool to read it with. On a
/// machine whose bandwidth drifts (shared hosts), measure it right beside what is compared
/// with it, as often as that is run.
pub struct ReadSweep {
    pool: rayon::ThreadPool,
    map: memmap2::MmapMut,
    threads: usize,
}

impl ReadSweep {
    /// The buffer, resident, and `threads` threads; `None` where either cannot be had.
    pub fn new(threads: usize) -> Option<ReadSweep> {
        let threads = threads.max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .ok()?;
        // Backed as the packed weights are (huge pages where the system gives them), and
        // written so that every page is resident before timing.
        let mut map = crate::packed::huge_page_bytes(BUFFER_BYTES).ok()?;
        for (i, word) in map.chunks_exact_mut(8).enumerate() {
            word.copy_from_slice(&(i as u64).to_ne_bytes());
        }
        Some(ReadSweep { pool, map, threads })
    }

    /// Bytes per second of one sweep made as plain loads and one with every 2 KiB piece's
    /// cache lines asked for before it is read (as the packed kernels stream; on some
    /// machines that is the faster of the two, and the bound must not be lower than what
    /// a kernel reaches): the better of the two.
    pub fn measure(&self) -> f64 {
        let len = self.map.len() / 8;
        // SAFETY: the mapping is page-aligned (so aligned for u64), `len` words fit in it,
        // and any bit pattern is a valid u64.
        let buffer: &[u64] = unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast(), len) };
        let chunk = buffer.len().div_ceil(self.threads * 4);
        let plain = |words: &[u64]| sum_words(words);
        let asked_first = |words: &[u64]| {
            words
                .chunks(PIECE_WORDS)
                .map(|piece| {
                    ask_for_lines(piece);
                    sum_words(piece)
                })
                .fold(0, u64::wrapping_add)
        };
        let mut best = 0.0f64;
        self.pool.install(|| {
            for sweep in [&plain as &(dyn Fn(&[u64]) -> u64 + Sync), &asked_first] {
                let start = Instant::now();
                let total: u64 = buffer
                    .par_chunks(chunk)
                    .map(sweep)
                    .reduce(|| 0, u64::wrapping_add);
                black_box(total);
                best = best.max(BUFFER_BYTES as f64 / start.elapsed().as_secs_f64());
            }
        });
        best
    }
}

/// Words per piece whose lines are asked for at once (2 KiB).
const PIECE_WORDS: usize = 256;

/// Asks the memory system for every cache line of `words`.
#[inline(always)]
fn ask_for_lines(words: &[u64]) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..std::mem::size_of_val(words)).step_by(64) {
        crate::kernels::x86::prefetch_ahead(words.as_ptr().cast(), line);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = words;
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
