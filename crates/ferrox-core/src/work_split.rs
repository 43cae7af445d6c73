//! Splitting products' rows across the thread pool by claiming: each thread takes the
//! next run of rows from a shared cursor, the runs shrinking as the rows left shrink
//! (guided self-scheduling). Threads end within one small run of each other whether they
//! start together or not (a worker that joins late, a core another process takes), where
//! fixed tasks leave one thread idle for up to a whole task at the end of every product:
//! a decode step is hundreds of short products, so those ends add up.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Runs `f(part, rows)` on runs of rows that together cover `0..sizes[part]` of every
/// part once, across the current pool. A run lies within one part, starts at a multiple
/// of `granule` there and is at least `min_run` rows long, but where it meets a part's
/// start or end.
pub fn for_each_run(
    sizes: &[usize],
    granule: usize,
    min_run: usize,
    f: impl Fn(usize, Range<usize>) + Sync,
) {
    let granule = granule.max(1);
    let min_run = min_run.max(granule).next_multiple_of(granule);
    // Each part starts at a multiple of `granule` of one index space (no table of the
    // starts: a pass of a decode step must not allocate, whatever its number of parts).
    let total: usize = sizes.iter().map(|s| s.next_multiple_of(granule)).sum();
    let threads = rayon::current_num_threads();
    if threads <= 1 || total <= min_run {
        for (part, &size) in sizes.iter().enumerate() {
            if size > 0 {
                f(part, 0..size);
            }
        }
        return;
    }
    let cursor = AtomicUsize::new(0);
    let claim = || loop {
        let start = cursor.load(Ordering::Relaxed);
        if start >= total {
            return None;
        }
        let left = total - start;
        let run = left
            .div_ceil(2 * threads)
            .next_multiple_of(granule)
            .max(min_run)
            .min(left);
        if cursor
            .compare_exchange_weak(start, start + run, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            return Some(start..start + run);
        }
    };
    let work = || {
        while let Some(run) = claim() {
            // The run's piece of each part it overlaps (parts' padding is skipped).
            let mut start = 0;
            for (part, &size) in sizes.iter().enumerate() {
                if start >= run.end {
                    break;
                }
                let end = start + size.next_multiple_of(granule);
                if end > run.start {
                    let rows = run.start.max(start) - start..(run.end - start).min(size);
                    if !rows.is_empty() {
                        f(part, rows);
                    }
                }
                start = end;
            }
        }
    };
    // No more threads than there are runs of the minimum length to share.
    spread(threads.min(total.div_ceil(min_run)), &work);
}

/// `work` on `threads` threads of the pool (fewer if they are busy: each call returns once
/// the cursor is spent, so the calling thread alone finishes the work if need be).
fn spread(threads: usize, work: &(impl Fn() + Sync)) {
    if threads <= 1 {
        work();
    } else {
        let half = threads / 2;
        rayon::join(|| spread(threads - half, work), || spread(half, work));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Every row of every part is run exactly once, runs start on the granule and are
    /// at least the minimum but at a part's end, on one thread and on several.
    #[test]
    fn runs_cover_every_row_once() {
        for threads in [1, 2, 3, 5] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for (sizes, granule, min_run) in [
                (vec![1536], 4, 44),
                (vec![1536, 256, 7], 4, 8),
                (vec![0, 5, 0, 9], 4, 1),
                (vec![3], 4, 100),
                (vec![100_000, 1], 16, 3),
            ] {
                let seen = Mutex::new(sizes.iter().map(|&s| vec![0u32; s]).collect::<Vec<_>>());
                pool.install(|| {
                    for_each_run(&sizes, granule, min_run, |part, rows| {
                        assert_eq!(rows.start % granule, 0, "{sizes:?}: run {rows:?}");
                        let min = min_run.next_multiple_of(granule);
                        assert!(
                            rows.start == 0 || rows.len() >= min.min(sizes[part] - rows.start),
                            "{sizes:?}: run {rows:?} of part {part}"
                        );
                        let mut seen = seen.lock().unwrap();
                        for r in rows {
                            seen[part][r] += 1;
                        }
                    })
                });
                for (part, counts) in seen.into_inner().unwrap().iter().enumerate() {
                    assert!(
                        counts.iter().all(|&c| c == 1),
                        "{threads} threads, {sizes:?}: part {part} not covered once"
                    );
                }
            }
        }
    }
}
