//! Loops over f32 slices for the KDA recurrence. The element-wise ones are plain loops the
//! compiler vectorizes; sums of products ([`Sums`]) are not, since a float sum kept in one
//! accumulator is a serial chain of additions the compiler may not reorder: they run in
//! independent accumulators, with AVX2 and FMA instructions where the CPU has them. Always
//! inlined, so that they take the instruction set of the function they are inlined into
//! (see [`super::delta_rule`]'s dispatch).

/// Independent accumulators of a sum: one 512-bit or two 256-bit registers.
pub const LANES: usize = 16;

/// The sums of products the recurrence needs, portable or with explicit vector instructions
/// (a float sum in lanes is a reordering the compiler does not make on its own).
pub trait Sums: Copy {
    /// `Σ a[i]·b[i]`.
    fn dot(self, a: &[f32], b: &[f32]) -> f32;

    /// Scales `row` by `scale` channel by channel and returns the scaled row's dot product
    /// with `k`, in one pass.
    fn scale_then_dot(self, row: &mut [f32], scale: &[f32], k: &[f32]) -> f32;

    /// Adds `a·x` to `row` and returns the updated row's dot product with `q`, in one pass.
    fn add_scaled_then_dot(self, row: &mut [f32], a: f32, x: &[f32], q: &[f32]) -> f32;
}

/// Plain loops in [`LANES`] accumulators.
#[derive(Clone, Copy)]
pub struct Portable;

#[inline(always)]
fn fold(acc: [f32; LANES]) -> f32 {
    let mut half = [0f32; LANES / 2];
    for (l, h) in half.iter_mut().enumerate() {
        *h = acc[l] + acc[l + LANES / 2];
    }
    let mut quarter = [0f32; LANES / 4];
    for (l, q) in quarter.iter_mut().enumerate() {
        *q = half[l] + half[l + LANES / 4];
    }
    (quarter[0] + quarter[2]) + (quarter[1] + quarter[3])
}

impl Sums for Portable {
    #[inline(always)]
    fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        debug_assert_eq!(a.len(), b.len());
        let mut acc = [0f32; LANES];
        let (a_lanes, b_lanes) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
        let tail: f32 = (a_lanes.remainder().iter())
            .zip(b_lanes.remainder())
            .map(|(x, y)| x * y)
            .sum();
        for (x, y) in a_lanes.zip(b_lanes) {
            for l in 0..LANES {
                acc[l] += x[l] * y[l];
            }
        }
        fold(acc) + tail
    }

    #[inline(always)]
    fn scale_then_dot(self, row: &mut [f32], scale: &[f32], k: &[f32]) -> f32 {
        debug_assert!(row.len() == scale.len() && row.len() == k.len());
        row.iter_mut().zip(scale).for_each(|(r, s)| *r *= s);
        self.dot(row, k)
    }

    #[inline(always)]
    fn add_scaled_then_dot(self, row: &mut [f32], a: f32, x: &[f32], q: &[f32]) -> f32 {
        add_scaled(row, a, x);
        self.dot(row, q)
    }
}

/// AVX2 and FMA instructions; a value exists only where the CPU has them.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub struct Avx2(());

#[cfg(target_arch = "x86_64")]
impl Avx2 {
    pub fn detect() -> Option<Avx2> {
        let avx2 = std::arch::is_x86_feature_detected!("avx2");
        (avx2 && std::arch::is_x86_feature_detected!("fma")).then_some(Avx2(()))
    }
}

#[cfg(target_arch = "x86_64")]
impl Sums for Avx2 {
    #[inline(always)]
    fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: an `Avx2` exists only where the CPU has AVX2 and FMA.
        unsafe { avx2::dot(a, b) }
    }

    #[inline(always)]
    fn scale_then_dot(self, row: &mut [f32], scale: &[f32], k: &[f32]) -> f32 {
        // SAFETY: as in `dot`.
        unsafe { avx2::scale_then_dot(row, scale, k) }
    }

    #[inline(always)]
    fn add_scaled_then_dot(self, row: &mut [f32], a: f32, x: &[f32], q: &[f32]) -> f32 {
        // SAFETY: as in `dot`.
        unsafe { avx2::add_scaled_then_dot(row, a, x, q) }
    }
}

/// Two 8-lane accumulators over 16 values a step, the rest one by one.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    const STEP: usize = 16;

    /// SAFETY: needs AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sum(a: __m256, b: __m256) -> f32 {
        let v = _mm256_add_ps(a, b);
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// SAFETY: needs AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let whole = n / STEP * STEP;
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i < whole {
            // SAFETY: i + 16 <= n, inside both slices.
            unsafe {
                s0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), s0);
                let (x, y) = (pa.add(i + 8), pb.add(i + 8));
                s1 = _mm256_fmadd_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(y), s1);
            }
            i += STEP;
        }
        let tail: f32 = a[whole..n]
            .iter()
            .zip(&b[whole..n])
            .map(|(x, y)| x * y)
            .sum();
        // SAFETY: the features this function has.
        unsafe { sum(s0, s1) + tail }
    }

    /// SAFETY: needs AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scale_then_dot(row: &mut [f32], scale: &[f32], k: &[f32]) -> f32 {
        let n = row.len().min(scale.len()).min(k.len());
        let whole = n / STEP * STEP;
        let (pr, ps, pk) = (row.as_mut_ptr(), scale.as_ptr(), k.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut i = 0;
        while i < whole {
            for (h, a) in acc.iter_mut().enumerate() {
                let at = i + 8 * h;
                // SAFETY: at + 8 <= n, inside the three slices.
                unsafe {
                    let r = _mm256_mul_ps(_mm256_loadu_ps(pr.add(at)), _mm256_loadu_ps(ps.add(at)));
                    _mm256_storeu_ps(pr.add(at), r);
                    *a = _mm256_fmadd_ps(r, _mm256_loadu_ps(pk.add(at)), *a);
                }
            }
            i += STEP;
        }
        let mut tail = 0f32;
        for j in whole..n {
            row[j] *= scale[j];
            tail += row[j] * k[j];
        }
        // SAFETY: the features this function has.
        unsafe { sum(acc[0], acc[1]) + tail }
    }

    /// SAFETY: needs AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn add_scaled_then_dot(row: &mut [f32], a: f32, x: &[f32], q: &[f32]) -> f32 {
        let n = row.len().min(x.len()).min(q.len());
        let whole = n / STEP * STEP;
        let (pr, px, pq) = (row.as_mut_ptr(), x.as_ptr(), q.as_ptr());
        let av = _mm256_set1_ps(a);
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut i = 0;
        while i < whole {
            for (h, s) in acc.iter_mut().enumerate() {
                let at = i + 8 * h;
                // SAFETY: at + 8 <= n, inside the three slices.
                unsafe {
                    let r = _mm256_loadu_ps(pr.add(at));
                    // a·x + r, rounded as the portable `r + a·x` would be without FMA: a
                    // product then a sum.
                    let r = _mm256_add_ps(r, _mm256_mul_ps(av, _mm256_loadu_ps(px.add(at))));
                    _mm256_storeu_ps(pr.add(at), r);
                    *s = _mm256_fmadd_ps(r, _mm256_loadu_ps(pq.add(at)), *s);
                }
            }
            i += STEP;
        }
        let mut tail = 0f32;
        for j in whole..n {
            row[j] += a * x[j];
            tail += row[j] * q[j];
        }
        // SAFETY: the features this function has.
        unsafe { sum(acc[0], acc[1]) + tail }
    }
}

/// `y += a·x`.
#[inline(always)]
pub fn add_scaled(y: &mut [f32], a: f32, x: &[f32]) {
    debug_assert_eq!(y.len(), x.len());
    y.iter_mut().zip(x).for_each(|(y, &x)| *y += a * x);
}

/// `y = a ⊙ b`.
#[inline(always)]
pub fn product(y: &mut [f32], a: &[f32], b: &[f32]) {
    debug_assert!(y.len() == a.len() && y.len() == b.len());
    y.iter_mut()
        .zip(a.iter().zip(b))
        .for_each(|(y, (&a, &b))| *y = a * b);
}

/// `y ⊙= a`.
#[inline(always)]
pub fn scale(y: &mut [f32], a: &[f32]) {
    debug_assert_eq!(y.len(), a.len());
    y.iter_mut().zip(a).for_each(|(y, &a)| *y *= a);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000)
            .map(|x| x as f32 / 500.0 - 1.0)
            .collect()
    }

    fn plain_dot(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
    }

    #[test]
    fn the_fused_passes_equal_plain_loops() {
        // Lengths with and without a remainder past the lanes.
        for n in [1, 15, 16, 37, 128] {
            let (a, b, c) = (values(n, 1), values(n, 2), values(n, 3));
            check(Portable, &a, &b, &c);
            #[cfg(target_arch = "x86_64")]
            if let Some(avx2) = Avx2::detect() {
                check(avx2, &a, &b, &c);
            }
        }
    }

    fn check(l: impl Sums, a: &[f32], b: &[f32], c: &[f32]) {
        assert!((l.dot(a, b) as f64 - plain_dot(a, b)).abs() < 1e-4);

        let mut row = a.to_vec();
        let got = l.scale_then_dot(&mut row, b, c);
        let want: Vec<f32> = a.iter().zip(b).map(|(x, y)| x * y).collect();
        assert_eq!(row, want);
        assert!((got as f64 - plain_dot(&want, c)).abs() < 1e-4);

        let mut row = a.to_vec();
        let got = l.add_scaled_then_dot(&mut row, 0.5, b, c);
        let want: Vec<f32> = a.iter().zip(b).map(|(x, y)| x + 0.5 * y).collect();
        assert_eq!(row, want);
        assert!((got as f64 - plain_dot(&want, c)).abs() < 1e-4);
    }
}
