//! Selecting the largest scores: [`argmax`] (greedy decoding, drafts) and [`top_k`] for sparse
//! attention's indexers, which chooses among tied scores exactly as llama.cpp's CPU `top_k`
//! does.
//!
//! Ties are common: a position whose every indexer head scores it negatively scores exactly 0
//! after the ReLU, so which of several 0-scored positions fill the last places decides what
//! attention sees. ggml takes the `k` first indices into a binary heap ordered by score (the
//! lowest at the top), then walks the remaining indices in order, replacing the top
//! whenever an index scores strictly higher: a classic heap selection, with the sift-down
//! that moves the hole to a leaf and then sifts the value back up. Reproducing those steps
//! reproduces its choice among ties; the order of the result does not matter (the selected
//! set is what the attention mask keeps).

/// `order[a]` ranks below `order[b]` in the heap: ggml's comparison `score[a] > score[b]`.
fn before(scores: &[f32], a: u32, b: u32) -> bool {
    scores[a as usize] > scores[b as usize]
}

/// Moves the hole at `hole` down to a leaf (always along the child that ranks first), then
/// sifts `value` up from there, no higher than `top`.
fn adjust(scores: &[f32], heap: &mut [u32], mut hole: usize, value: u32) {
    let (len, top) = (heap.len(), hole);
    let mut child = hole;
    while child < (len - 1) / 2 {
        child = 2 * (child + 1);
        if before(scores, heap[child], heap[child - 1]) {
            child -= 1;
        }
        heap[hole] = heap[child];
        hole = child;
    }
    if len.is_multiple_of(2) && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        heap[hole] = heap[child - 1];
        hole = child - 1;
    }
    while hole > top {
        let parent = (hole - 1) / 2;
        if !before(scores, heap[parent], value) {
            break;
        }
        heap[hole] = heap[parent];
        hole = parent;
    }
    heap[hole] = value;
}

/// The indices of `k` highest `scores` into `out` (in no particular order), ties broken as
/// ggml breaks them. With `k >= scores.len()`, every index.
pub fn top_k(scores: &[f32], k: usize, out: &mut Vec<u32>) {
    out.clear();
    let k = k.min(scores.len());
    out.extend(0..k as u32);
    if k == 0 {
        return;
    }
    // Build the heap: sift down every parent, the last first.
    if k >= 2 {
        let mut parent = (k - 2) / 2;
        loop {
            let value = out[parent];
            adjust(scores, out, parent, value);
            if parent == 0 {
                break;
            }
            parent -= 1;
        }
    }
    for i in k..scores.len() {
        let i = i as u32;
        if before(scores, i, out[0]) {
            adjust(scores, out, 0, i);
        }
    }
}

/// The first index of the largest logit (0 for an empty or all-NaN row).
pub fn argmax(logits: &[f32]) -> u32 {
    // The maximum lane by lane (a vector max), then its first position.
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = logits.chunks_exact(16);
    for chunk in &mut chunks {
        for (m, &l) in lanes.iter_mut().zip(chunk) {
            *m = if l > *m { l } else { *m };
        }
    }
    let max = chunks
        .remainder()
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m });
    logits.iter().position(|&l| l == max).unwrap_or(0) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_is_the_first_largest() {
        let reference = |l: &[f32]| {
            let mut best = 0;
            for (i, &x) in l.iter().enumerate() {
                if x > l[best] {
                    best = i;
                }
            }
            best as u32
        };
        for n in [1usize, 5, 16, 17, 100, 1000] {
            // Coarse values: many ties, the first must win.
            let l: Vec<f32> = (0..n).map(|i| ((i * 7919) % 13) as f32).collect();
            assert_eq!(argmax(&l), reference(&l), "n = {n}");
        }
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
        assert_eq!(argmax(&[f32::NAN, 1.0, 2.0, f32::NAN]), 2);
    }

    fn sorted(mut v: Vec<u32>) -> Vec<u32> {
        v.sort_unstable();
        v
    }

    #[test]
    fn picks_the_highest_scores() {
        let scores = [0.5, 3.0, -1.0, 2.0, 7.0, 0.25, 6.0];
        let mut out = Vec::new();
        top_k(&scores, 3, &mut out);
        assert_eq!(sorted(out.clone()), [1, 4, 6]);
        top_k(&scores, 10, &mut out);
        assert_eq!(sorted(out.clone()), (0..7).collect::<Vec<_>>());
        top_k(&scores, 0, &mut out);
        assert!(out.is_empty());
    }

    /// Choices among ties as libstdc++'s `std::partial_sort` (what ggml's CPU `top_k` calls)
    /// makes them: all equal keeps the first `k`; a later, higher score evicts whichever
    /// tied index the heap holds at its top.
    #[test]
    fn ties_are_broken_as_ggml_does() {
        let mut out = Vec::new();
        top_k(&[0.0; 8], 4, &mut out);
        assert_eq!(sorted(out.clone()), [0, 1, 2, 3]);
        let mut scores = [0.0f32; 8];
        scores[6] = 1.0;
        top_k(&scores, 4, &mut out);
        assert_eq!(sorted(out.clone()), [0, 1, 3, 6]);
        top_k(&[1.0, 0.0, 0.0, 0.0, 2.0, 0.0], 3, &mut out);
        assert_eq!(sorted(out.clone()), [0, 1, 4]);
        // Signed zeros compare equal.
        let scores = [
            0.0, 1.0, 0.0, 0.0, 3.0, 4.0, 4.0, 2.0, 0.0, 1.0, -0.0, 0.0, -0.0, 4.0, -0.0, -0.0,
            -0.0, 4.0, 0.0, 0.0, 4.0, -0.0, 0.0, 1.0,
        ];
        top_k(&scores, 12, &mut out);
        assert_eq!(
            sorted(out.clone()),
            [1, 3, 4, 5, 6, 7, 8, 9, 13, 17, 20, 23]
        );
    }
}
