//! The orthonormal Walsh-Hadamard rotation llama.cpp applies to cached keys (and the queries
//! that meet them) before they are rounded to the cache's type: `x ← H·x / sqrt(n)` with
//! `H` the Sylvester Hadamard matrix of a power-of-two size `n`
//! (`H[i][j] = (-1)^popcount(i & j)`). It changes no dot product between two rotated vectors
//! (up to rounding) but spreads outliers over every element, so a rounded copy loses less.
//!
//! llama.cpp computes it two ways, and which one decides the rounding of every element:
//! * [`rotate_fast`], ggml's transform (the rotations it marks as Hadamard: the
//!   quantized caches' and DeepSeek-V4's indexer): scaled first, then `log2 n` butterfly passes.
//! * [`Hadamard::rotate_as_product`], an f32 product with the matrix (the DeepSeek-V3.2 and
//!   GLM-DSA indexers): each output the sum of eight lanes of fused multiply-adds, then the
//!   lanes added pairwise, as llama.cpp's AVX2 build multiplies f32 matrices.
//!
//! Rounding matters here because the rotated keys feed a top-k selection: a different last
//! bit can swap two positions that score within rounding of each other.

use crate::kernels::{best_isa, Isa};

/// Lanes of the product's partial sums.
const LANES: usize = 8;

/// The largest rotation built: a row is copied to the stack while it is multiplied, so that
/// rotating allocates nothing.
pub const MAX_LEN: usize = 1024;

/// The rotation of one size: its matrix, row by row, as llama.cpp fills it.
#[derive(Clone, Debug, PartialEq)]
pub struct Hadamard {
    n: usize,
    matrix: Vec<f32>,
}

impl Hadamard {
    /// The rotation of `n` values; `None` unless `n` is a power of two (the only sizes it
    /// exists in) of at most [`MAX_LEN`].
    pub fn new(n: usize) -> Option<Self> {
        if !n.is_power_of_two() || n > MAX_LEN {
            return None;
        }
        // llama.cpp divides in double precision, then stores the f32.
        let h = (1.0f64 / ((n as f32).sqrt() as f64)) as f32;
        let matrix = (0..n * n)
            .map(|ij| {
                let (i, j) = (ij / n, ij % n);
                if (i & j).count_ones() % 2 == 0 {
                    h
                } else {
                    -h
                }
            })
            .collect();
        Some(Hadamard { n, matrix })
    }

    /// Rotates every row of `n` values of `x` as llama.cpp's f32 matrix product does, with
    /// the fastest kernel this machine has (every kernel gives the reference's bits).
    pub fn rotate_as_product(&self, x: &mut [f32]) {
        self.rotate_as_product_with(best_isa(), x)
    }

    /// [`Self::rotate_as_product`] with the kernels of `isa` (the reference where `isa` is
    /// not available here).
    pub fn rotate_as_product_with(&self, isa: Isa, x: &mut [f32]) {
        let n = self.n;
        assert_eq!(x.len() % n, 0, "rows of {n} values");
        let mut copy = [0f32; MAX_LEN];
        let src = &mut copy[..n];
        for row in x.chunks_exact_mut(n) {
            src.copy_from_slice(row);
            #[cfg(target_arch = "x86_64")]
            if n >= LANES && isa.is_available() && isa.has_avx2() {
                // SAFETY: AVX2 and FMA were detected; `src` and `row` hold `n` values, a
                // multiple of the 8 lanes, and the matrix `n * n`.
                unsafe { x86::product_avx2(&self.matrix, src, row) };
                continue;
            }
            let _ = isa;
            product_reference(&self.matrix, src, row);
        }
    }
}

/// Rotates every row of `n` values of `x` (`n` a power of two) as ggml's transform does:
/// each value scaled by `1/sqrt(n)` (an f32 quotient), then butterflies of width 1, 2, 4, …
/// `n/2`. Needs no matrix.
pub fn rotate_fast(x: &mut [f32], n: usize) {
    assert!(n.is_power_of_two(), "a Hadamard rotation of {n} values");
    assert_eq!(x.len() % n, 0, "rows of {n} values");
    let scale = 1.0f32 / (n as f32).sqrt();
    for row in x.chunks_exact_mut(n) {
        row.iter_mut().for_each(|v| *v *= scale);
        let mut half = 1;
        while half < n {
            for block in row.chunks_exact_mut(2 * half) {
                let (lo, hi) = block.split_at_mut(half);
                for (a, b) in lo.iter_mut().zip(hi.iter_mut()) {
                    let (u, v) = (*a, *b);
                    *a = u + v;
                    *b = u - v;
                }
            }
            half *= 2;
        }
    }
}

/// One row through the matrix: output `i` is `Σ_k H[i][k]·src[k]`, with `k` in lane
/// `k % 8`'s fused multiply-adds (in increasing `k`), then lanes `(l, l+4)`, then `(0, 2)`
/// and `(1, 3)` of those, then the two added. Rows shorter than the lanes sum in order.
fn product_reference(matrix: &[f32], src: &[f32], out: &mut [f32]) {
    let n = src.len();
    for (i, o) in out.iter_mut().enumerate() {
        let row = &matrix[i * n..(i + 1) * n];
        if n < LANES {
            *o = row
                .iter()
                .zip(src)
                .fold(0.0, |acc, (&h, &x)| h.mul_add(x, acc));
            continue;
        }
        let mut lanes = [0f32; LANES];
        for (hs, xs) in row.chunks_exact(LANES).zip(src.chunks_exact(LANES)) {
            for ((acc, &h), &x) in lanes.iter_mut().zip(hs).zip(xs) {
                *acc = h.mul_add(x, *acc);
            }
        }
        let s: [f32; 4] = std::array::from_fn(|j| lanes[j + 4] + lanes[j]);
        *o = (s[0] + s[2]) + (s[1] + s[3]);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::LANES;

    /// [`super::product_reference`] with one register of lanes per output.
    ///
    /// SAFETY: needs AVX2 and FMA; `src.len() == out.len()`, a multiple of 8, and
    /// `matrix.len() == src.len()²`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn product_avx2(matrix: &[f32], src: &[f32], out: &mut [f32]) {
        let n = src.len();
        debug_assert!(n.is_multiple_of(LANES) && matrix.len() == n * n && out.len() == n);
        for (i, o) in out.iter_mut().enumerate() {
            let row = matrix.as_ptr().add(i * n);
            let mut acc = _mm256_setzero_ps();
            for k in (0..n).step_by(LANES) {
                acc = _mm256_fmadd_ps(
                    _mm256_loadu_ps(row.add(k)),
                    _mm256_loadu_ps(src.as_ptr().add(k)),
                    acc,
                );
            }
            let s = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
            let t = _mm_add_ps(s, _mm_movehl_ps(s, s));
            *o = _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).max(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32 - 0.5) * 8.0
            })
            .collect()
    }

    #[test]
    fn only_powers_of_two() {
        assert!(Hadamard::new(64).is_some());
        assert!(Hadamard::new(1).is_some());
        assert!(Hadamard::new(96).is_none());
        assert!(Hadamard::new(0).is_none());
        assert!(Hadamard::new(2 * MAX_LEN).is_none());
    }

    #[test]
    fn is_orthonormal_and_its_own_inverse() {
        for n in [8, 64, 128] {
            let h = Hadamard::new(n).unwrap();
            let x = noise(n, n as u32);
            let fast = |y: &mut [f32]| rotate_fast(y, n);
            let product = |y: &mut [f32]| h.rotate_as_product(y);
            for rotate in [&fast as &dyn Fn(&mut [f32]), &product] {
                let mut y = x.clone();
                rotate(&mut y);
                let norm = |v: &[f32]| v.iter().map(|a| (a * a) as f64).sum::<f64>();
                assert!((norm(&y) / norm(&x) - 1.0).abs() < 1e-5);
                assert!(y.iter().zip(&x).any(|(a, b)| (a - b).abs() > 1e-3));
                rotate(&mut y);
                for (a, b) in y.iter().zip(&x) {
                    assert!((a - b).abs() < 1e-4, "{a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn both_forms_agree_up_to_rounding() {
        let h = Hadamard::new(128).unwrap();
        let x = noise(128 * 3, 7);
        let (mut a, mut b) = (x.clone(), x);
        rotate_fast(&mut a, 128);
        h.rotate_as_product(&mut b);
        for (a, b) in a.iter().zip(&b) {
            assert!((a - b).abs() < 1e-5 * (1.0 + a.abs()));
        }
    }

    /// The transform's first output is the scaled sum; the product's is its lanes' sum in
    /// llama.cpp's order, which a plain in-order sum does not always reproduce.
    #[test]
    fn product_sums_in_lane_order() {
        let n = 64;
        let h = Hadamard::new(n).unwrap();
        let x = noise(n, 3);
        let mut y = x.clone();
        h.rotate_as_product_with(Isa::Scalar, &mut y);
        let mut lanes = [0f32; 8];
        for (k, &v) in x.iter().enumerate() {
            lanes[k % 8] = (0.125f32).mul_add(v, lanes[k % 8]);
        }
        let expect = ((lanes[4] + lanes[0]) + (lanes[6] + lanes[2]))
            + ((lanes[5] + lanes[1]) + (lanes[7] + lanes[3]));
        assert_eq!(y[0].to_bits(), expect.to_bits());
    }

    #[test]
    fn kernels_match_the_reference_bit_for_bit() {
        for n in [8, 16, 64, 128, 256] {
            let h = Hadamard::new(n).unwrap();
            let x = noise(n * 5, n as u32 + 1);
            let mut reference = x.clone();
            h.rotate_as_product_with(Isa::Scalar, &mut reference);
            for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
                let mut y = x.clone();
                h.rotate_as_product_with(isa, &mut y);
                let same = y
                    .iter()
                    .zip(&reference)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{isa:?} at n = {n}");
            }
        }
    }
}
