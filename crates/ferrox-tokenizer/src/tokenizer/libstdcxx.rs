//! Reproductions of two libstdc++ behaviours that llama.cpp's vocabulary loading depends on:
//! the order `std::sort` leaves equal elements in, and the iteration order of an
//! `std::unordered_map<std::string, int>` filled with the token texts in id order. Both are
//! deterministic for a given input, and both decide observable results (which special
//! token wins a tie, which of several candidate texts becomes the EOT or FIM token).

/// libstdc++'s `std::sort` (introsort: median-of-three quicksort down to runs of 16, heap
/// sort past the depth limit, then one insertion sort), reproduced so that elements that
/// compare equal end up in the same order as in llama.cpp.
pub(crate) fn sort<T: Copy>(v: &mut [T], less: impl Fn(&T, &T) -> bool) {
    const THRESHOLD: usize = 16;
    let n = v.len();
    if n < 2 {
        return;
    }
    let depth_limit = 2 * (usize::BITS - 1 - n.leading_zeros()) as usize;
    introsort_loop(v, depth_limit, &less);
    if n > THRESHOLD {
        insertion_sort(&mut v[..THRESHOLD], &less);
        // Unguarded insertion for the rest: the first THRESHOLD elements hold the minimum.
        for i in THRESHOLD..n {
            unguarded_linear_insert(v, i, &less);
        }
    } else {
        insertion_sort(v, &less);
    }

    fn introsort_loop<T: Copy>(mut v: &mut [T], mut depth: usize, less: &impl Fn(&T, &T) -> bool) {
        while v.len() > THRESHOLD {
            if depth == 0 {
                heap_sort(v, less);
                return;
            }
            depth -= 1;
            let cut = unguarded_partition_pivot(v, less);
            let (left, right) = std::mem::take(&mut v).split_at_mut(cut);
            introsort_loop(right, depth, less);
            v = left;
        }
    }

    fn move_median_to_first<T: Copy>(
        v: &mut [T],
        result: usize,
        a: usize,
        b: usize,
        c: usize,
        less: &impl Fn(&T, &T) -> bool,
    ) {
        let pick = if less(&v[a], &v[b]) {
            if less(&v[b], &v[c]) {
                b
            } else if less(&v[a], &v[c]) {
                c
            } else {
                a
            }
        } else if less(&v[a], &v[c]) {
            a
        } else if less(&v[b], &v[c]) {
            c
        } else {
            b
        };
        v.swap(result, pick);
    }

    fn unguarded_partition_pivot<T: Copy>(v: &mut [T], less: &impl Fn(&T, &T) -> bool) -> usize {
        let n = v.len();
        let mid = n / 2;
        move_median_to_first(v, 0, 1, mid, n - 1, less);
        // Unguarded partition of [1, n) around the pivot at 0.
        let (mut first, mut last) = (1, n);
        loop {
            while less(&v[first], &v[0]) {
                first += 1;
            }
            last -= 1;
            while less(&v[0], &v[last]) {
                last -= 1;
            }
            if first >= last {
                return first;
            }
            v.swap(first, last);
            first += 1;
        }
    }

    fn insertion_sort<T: Copy>(v: &mut [T], less: &impl Fn(&T, &T) -> bool) {
        for i in 1..v.len() {
            if less(&v[i], &v[0]) {
                let val = v[i];
                v.copy_within(0..i, 1);
                v[0] = val;
            } else {
                unguarded_linear_insert(v, i, less);
            }
        }
    }

    fn unguarded_linear_insert<T: Copy>(v: &mut [T], mut i: usize, less: &impl Fn(&T, &T) -> bool) {
        let val = v[i];
        while less(&val, &v[i - 1]) {
            v[i] = v[i - 1];
            i -= 1;
        }
        v[i] = val;
    }

    fn heap_sort<T: Copy>(v: &mut [T], less: &impl Fn(&T, &T) -> bool) {
        let n = v.len();
        // std::make_heap
        if n >= 2 {
            let mut parent = (n - 2) / 2;
            loop {
                let val = v[parent];
                adjust_heap(v, parent, n, val, less);
                if parent == 0 {
                    break;
                }
                parent -= 1;
            }
        }
        // std::sort_heap
        let mut end = n;
        while end > 1 {
            end -= 1;
            let val = v[end];
            v[end] = v[0];
            adjust_heap(v, 0, end, val, less);
        }
    }
}

/// `std::__adjust_heap`: sifts the hole at `hole` down to a leaf, then pushes `val` up.
fn adjust_heap<T: Copy>(
    v: &mut [T],
    mut hole: usize,
    len: usize,
    val: T,
    less: &impl Fn(&T, &T) -> bool,
) {
    let top = hole;
    let mut child = hole;
    while child < (len - 1) / 2 {
        child = 2 * (child + 1);
        if less(&v[child], &v[child - 1]) {
            child -= 1;
        }
        v[hole] = v[child];
        hole = child;
    }
    if len.is_multiple_of(2) && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        v[hole] = v[child - 1];
        hole = child - 1;
    }
    push_heap(v, hole, top, val, less);
}
/// `std::__push_heap`: moves `val` up from `hole` towards `top`.
fn push_heap<T: Copy>(
    v: &mut [T],
    mut hole: usize,
    top: usize,
    val: T,
    less: &impl Fn(&T, &T) -> bool,
) {
    while hole > top {
        let parent = (hole - 1) / 2;
        if !less(&v[parent], &val) {
            break;
        }
        v[hole] = v[parent];
        hole = parent;
    }
    v[hole] = val;
}

/// `std::priority_queue` over a vector: the same heap operations as libstdc++, so entries
/// that compare equal come out in the same order as in llama.cpp.
pub(crate) struct PriorityQueue<T, F> {
    heap: Vec<T>,
    less: F,
}

impl<T: Copy, F: Fn(&T, &T) -> bool> PriorityQueue<T, F> {
    /// An empty queue whose `pop` yields the greatest element under `less`.
    pub(crate) fn new(less: F) -> Self {
        PriorityQueue {
            heap: Vec::new(),
            less,
        }
    }

    pub(crate) fn clear(&mut self) {
        self.heap.clear();
    }

    pub(crate) fn push(&mut self, item: T) {
        self.heap.push(item);
        let last = self.heap.len() - 1;
        push_heap(&mut self.heap, last, 0, item, &self.less);
    }

    pub(crate) fn pop(&mut self) -> Option<T> {
        let len = self.heap.len();
        if len > 1 {
            // std::pop_heap: the last element fills the hole left by the top.
            let val = self.heap[len - 1];
            self.heap[len - 1] = self.heap[0];
            adjust_heap(&mut self.heap[..len - 1], 0, len - 1, val, &self.less);
        }
        self.heap.pop()
    }
}

/// The iteration order of llama.cpp's `token_to_id` map (libstdc++ `unordered_map`, default
/// hash and load factor) after inserting `texts` in order: a permutation of their indices.
pub(crate) fn unordered_map_order<S: AsRef<str>>(texts: &[S]) -> Vec<u32> {
    const NIL: u32 = u32::MAX;
    let n = texts.len();
    let hashes: Vec<u64> = texts
        .iter()
        .map(|t| hash_bytes(t.as_ref().as_bytes()))
        .collect();
    // The node list is singly linked; `first` plays `_M_before_begin._M_nxt`. A bucket holds
    // the node *before* its first node, with `BEFORE_BEGIN` for the list head.
    const BEFORE_BEGIN: u32 = u32::MAX - 1;
    const EMPTY: u32 = u32::MAX;
    let mut next = vec![NIL; n];
    let mut first = NIL;
    let mut bucket_count: u64 = 1;
    let mut buckets: Vec<u32> = vec![EMPTY; 1];
    let mut policy = RehashPolicy { next_resize: 0 };

    for i in 0..n as u32 {
        if let Some(new_count) = policy.need_rehash(bucket_count, i as u64, 1) {
            bucket_count = new_count;
            buckets = vec![EMPTY; new_count as usize];
            // `_M_rehash_aux` for unique keys.
            let mut p = first;
            first = NIL;
            let mut bbegin_bkt = 0usize;
            while p != NIL {
                let p_next = next[p as usize];
                let bkt = (hashes[p as usize] % bucket_count) as usize;
                if buckets[bkt] == EMPTY {
                    next[p as usize] = first;
                    first = p;
                    buckets[bkt] = BEFORE_BEGIN;
                    if next[p as usize] != NIL {
                        buckets[bbegin_bkt] = p;
                    }
                    bbegin_bkt = bkt;
                } else if buckets[bkt] == BEFORE_BEGIN {
                    next[p as usize] = first;
                    first = p;
                } else {
                    let before = buckets[bkt];
                    next[p as usize] = next[before as usize];
                    next[before as usize] = p;
                }
                p = p_next;
            }
        }
        // `_M_insert_bucket_begin`.
        let bkt = (hashes[i as usize] % bucket_count) as usize;
        match buckets[bkt] {
            EMPTY => {
                next[i as usize] = first;
                first = i;
                if next[i as usize] != NIL {
                    let moved = next[i as usize];
                    buckets[(hashes[moved as usize] % bucket_count) as usize] = i;
                }
                buckets[bkt] = BEFORE_BEGIN;
            }
            BEFORE_BEGIN => {
                next[i as usize] = first;
                first = i;
            }
            before => {
                next[i as usize] = next[before as usize];
                next[before as usize] = i;
            }
        }
    }

    let mut order = Vec::with_capacity(n);
    let mut p = first;
    while p != NIL {
        order.push(p);
        p = next[p as usize];
    }
    order
}

/// `std::__detail::_Prime_rehash_policy` with the default maximum load factor of 1.
struct RehashPolicy {
    next_resize: u64,
}

impl RehashPolicy {
    fn need_rehash(&mut self, n_bkt: u64, n_elt: u64, n_ins: u64) -> Option<u64> {
        if n_elt + n_ins <= self.next_resize {
            return None;
        }
        let floor = if self.next_resize == 0 { 11 } else { 0 };
        let min_bkts = (n_elt + n_ins).max(floor);
        if min_bkts >= n_bkt {
            return Some(self.next_bkt((min_bkts + 1).max(n_bkt * 2)));
        }
        self.next_resize = n_bkt;
        None
    }

    fn next_bkt(&mut self, n: u64) -> u64 {
        const FAST_BKT: [u64; 14] = [2, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13];
        if n < FAST_BKT.len() as u64 {
            if n == 0 {
                return 1;
            }
            self.next_resize = FAST_BKT[n as usize];
            return FAST_BKT[n as usize];
        }
        let candidates = &PRIMES[6..];
        let at = candidates.partition_point(|&p| p < n);
        let bkt = candidates.get(at).copied().unwrap_or(u64::MAX);
        self.next_resize = bkt;
        bkt
    }
}

/// libstdc++'s `std::_Hash_bytes` (64-bit), seeded as `std::hash<std::string>` seeds it.
fn hash_bytes(bytes: &[u8]) -> u64 {
    const MUL: u64 = (0xc6a4a793u64 << 32) + 0x5bd1e995;
    const SEED: u64 = 0xc70f6907;
    let shift_mix = |v: u64| v ^ (v >> 47);
    let mut hash = SEED ^ (bytes.len() as u64).wrapping_mul(MUL);
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let data = shift_mix(u64::from_le_bytes(word).wrapping_mul(MUL)).wrapping_mul(MUL);
        hash ^= data;
        hash = hash.wrapping_mul(MUL);
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        let data = tail
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) + u64::from(b));
        hash ^= data;
        hash = hash.wrapping_mul(MUL);
    }
    hash = shift_mix(hash).wrapping_mul(MUL);
    shift_mix(hash)
}

/// The start of libstdc++'s `__prime_list` (bucket counts), as far as any u32-indexed
/// vocabulary can reach.
const PRIMES: &[u64] = &[
    2,
    3,
    5,
    7,
    11,
    13,
    17,
    19,
    23,
    29,
    31,
    37,
    41,
    43,
    47,
    53,
    59,
    61,
    67,
    71,
    73,
    79,
    83,
    89,
    97,
    103,
    109,
    113,
    127,
    137,
    139,
    149,
    157,
    167,
    179,
    193,
    199,
    211,
    227,
    241,
    257,
    277,
    293,
    313,
    337,
    359,
    383,
    409,
    439,
    467,
    503,
    541,
    577,
    619,
    661,
    709,
    761,
    823,
    887,
    953,
    1031,
    1109,
    1193,
    1289,
    1381,
    1493,
    1613,
    1741,
    1879,
    2029,
    2179,
    2357,
    2549,
    2753,
    2971,
    3209,
    3469,
    3739,
    4027,
    4349,
    4703,
    5087,
    5503,
    5953,
    6427,
    6949,
    7517,
    8123,
    8783,
    9497,
    10273,
    11113,
    12011,
    12983,
    14033,
    15173,
    16411,
    17749,
    19183,
    20753,
    22447,
    24281,
    26267,
    28411,
    30727,
    33223,
    35933,
    38873,
    42043,
    45481,
    49201,
    53201,
    57557,
    62233,
    67307,
    72817,
    78779,
    85229,
    92203,
    99733,
    107897,
    116731,
    126271,
    136607,
    147793,
    159871,
    172933,
    187091,
    202409,
    218971,
    236897,
    256279,
    277261,
    299951,
    324503,
    351061,
    379787,
    410857,
    444487,
    480881,
    520241,
    562841,
    608903,
    658753,
    712697,
    771049,
    834181,
    902483,
    976369,
    1056323,
    1142821,
    1236397,
    1337629,
    1447153,
    1565659,
    1693859,
    1832561,
    1982627,
    2144977,
    2320627,
    2510653,
    2716249,
    2938679,
    3179303,
    3439651,
    3721303,
    4026031,
    4355707,
    4712381,
    5098259,
    5515729,
    5967347,
    6456007,
    6984629,
    7556579,
    8175383,
    8844859,
    9569143,
    10352717,
    11200489,
    12117689,
    13109983,
    14183539,
    15345007,
    16601593,
    17961079,
    19431899,
    21023161,
    22744717,
    24607243,
    26622317,
    28802401,
    31160981,
    33712729,
    36473443,
    39460231,
    42691603,
    46187573,
    49969847,
    54061849,
    58488943,
    63278561,
    68460391,
    74066549,
    80131819,
    86693767,
    93793069,
    101473717,
    109783337,
    118773397,
    128499677,
    139022417,
    150406843,
    162723577,
    176048909,
    190465427,
    206062531,
    222936881,
    241193053,
    260944219,
    282312799,
    305431229,
    330442829,
    357502601,
    386778277,
    418451333,
    452718089,
    489790921,
    529899637,
    573292817,
    620239453,
    671030513,
    725980837,
    785430967,
    849749479,
    919334987,
    994618837,
    1076067617,
    1164186217,
    1259520799,
    1362662261,
    1474249943,
    1594975441,
    1725587117,
    1866894511,
    2019773507,
    2185171673,
    2364114217,
    2557710269,
    2767159799,
    2993761039,
    3238918481,
    3504151727,
    3791104843,
    4101556399,
    4294967291,
    6442450933,
    8589934583,
    12884901857,
    17179869143,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libstdcxx_sort_sorts() {
        let mut state = 12345u64;
        for n in [0usize, 1, 2, 5, 16, 17, 40, 100, 1000] {
            let mut v: Vec<(u32, u32)> = (0..n)
                .map(|i| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (((state >> 33) % 7) as u32, i as u32)
                })
                .collect();
            sort(&mut v, |a, b| a.0 > b.0);
            assert!(v.windows(2).all(|w| w[0].0 >= w[1].0), "n = {n}");
            let mut seen: Vec<u32> = v.iter().map(|p| p.1).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..n as u32).collect::<Vec<_>>());
        }
    }
}
