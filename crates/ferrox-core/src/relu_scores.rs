//! A sparse-attention indexer's scores: `Σ_h w_h · relu(q_h · k)` for one query (heads
//! `q_h`, one weight `w_h` each) against many cached keys.
//!
//! Every score is computed in one fixed order, by the scalar reference and the SIMD kernels
//! alike: each dot product sums its products in dimension order with fused multiply-adds,
//! and the heads' terms are added in head order. The SIMD kernels hold one *key* per lane
//! (a tile of 8 or 16 keys transposed so that one dimension of all of them is one register),
//! so they need no horizontal sums and give the reference's bits on every machine. The order
//! matters more than usual here: a dot product within rounding of 0 is clipped or not by the
//! ReLU, and that can decide which position enters a top-k selection.

use crate::kernels::{best_isa, Isa};
use crate::kv_cache::KvRows;

/// Widest key the kernels take.
pub const MAX_KEY_DIM: usize = crate::flash_attn::MAX_HEAD_DIM;

/// One token's indexer query: `heads` holds its heads of `head_dim` back to back, `weights`
/// one weight per head.
#[derive(Clone, Copy, Debug)]
pub struct IndexQuery<'a> {
    pub heads: &'a [f32],
    pub weights: &'a [f32],
    pub head_dim: usize,
}

impl IndexQuery<'_> {
    /// The score of one key: the reference every kernel reproduces bit for bit.
    pub fn score(&self, key: &[f32]) -> f32 {
        let mut score = 0.0f32;
        for (head, &w) in self.heads.chunks_exact(self.head_dim).zip(self.weights) {
            let mut dot = 0.0f32;
            for (&q, &k) in head.iter().zip(key) {
                dot = q.mul_add(k, dot);
            }
            score += relu(dot) * w;
        }
        score
    }
}

/// `max(x, 0)` as the SIMD `max` instruction computes it (`x > 0 ? x : 0`): NaN and −0
/// give +0.
#[inline(always)]
fn relu(x: f32) -> f32 {
    if x > 0.0 {
        x
    } else {
        0.0
    }
}

/// Scores every key of `keys` (rows of `q.head_dim`) into `out`, one per key, with the
/// fastest kernel this machine has.
pub fn scores(q: &IndexQuery<'_>, keys: KvRows<'_>, out: &mut [f32]) {
    scores_with(best_isa(), q, keys, out)
}

/// [`scores`] with the kernels of `isa` (the reference where `isa` is not available here).
pub fn scores_with(isa: Isa, q: &IndexQuery<'_>, keys: KvRows<'_>, out: &mut [f32]) {
    let d = q.head_dim;
    assert!(d <= MAX_KEY_DIM && q.heads.len() == d * q.weights.len());
    match keys {
        KvRows::F32(k) => assert_eq!(k.len(), out.len() * d),
        KvRows::F16(k) => assert_eq!(k.len(), out.len() * d),
        KvRows::Blocks(ty, k) => assert_eq!(k.len(), out.len() * ty.bytes(d)),
    }
    #[cfg(target_arch = "x86_64")]
    if isa.is_available() && isa.has_avx2() {
        let lanes = if isa == Isa::Avx512Vnni { 16 } else { 8 };
        let mut tile = [0f32; 16 * MAX_KEY_DIM];
        for (j, dst) in out.chunks_mut(lanes).enumerate() {
            let tile = &mut tile[..lanes * d];
            transpose(keys, j * lanes, dst.len(), d, lanes, tile);
            // SAFETY: the features were detected; `tile` holds `lanes` keys of `d`
            // transposed, and `dst` at most `lanes` outputs.
            unsafe {
                if lanes == 16 {
                    x86::tile_512(q, tile, dst)
                } else {
                    x86::tile_256(q, tile, dst)
                }
            }
        }
        return;
    }
    let _ = isa;
    let mut row = [0f32; MAX_KEY_DIM];
    for (j, o) in out.iter_mut().enumerate() {
        *o = match keys {
            KvRows::F32(k) => q.score(&k[j * d..(j + 1) * d]),
            // f16 and quantized keys are decoded to f32 first, as ggml's lightning indexer
            // reads them.
            KvRows::F16(_) | KvRows::Blocks(..) => {
                let key = &mut row[..d];
                key_row(keys, j, d).copy_to(key);
                q.score(key)
            }
        };
    }
}

/// Key `j` (of `d` values) of `keys`.
fn key_row(keys: KvRows<'_>, j: usize, d: usize) -> KvRows<'_> {
    match keys {
        KvRows::F32(k) => KvRows::F32(&k[j * d..(j + 1) * d]),
        KvRows::F16(k) => KvRows::F16(&k[j * d..(j + 1) * d]),
        KvRows::Blocks(ty, k) => {
            let n = ty.bytes(d);
            KvRows::Blocks(ty, &k[j * n..(j + 1) * n])
        }
    }
}

/// Writes keys `first..first + n` of `keys` into `tile` dimension-major
/// (`tile[i * lanes + j]` = dimension `i` of key `first + j`); the lanes past `n` are zero.
#[cfg(target_arch = "x86_64")]
fn transpose(keys: KvRows<'_>, first: usize, n: usize, d: usize, lanes: usize, tile: &mut [f32]) {
    if n < lanes {
        tile.fill(0.0);
    }
    match keys {
        KvRows::F32(k) => put(tile, lanes, &k[first * d..(first + n) * d], d, |v| *v),
        KvRows::F16(k) => put(tile, lanes, &k[first * d..(first + n) * d], d, |v| {
            v.to_f32()
        }),
        // A quantized key is decoded to f32 first, as ggml's lightning indexer reads one.
        KvRows::Blocks(..) => {
            let mut row = [0f32; MAX_KEY_DIM];
            for j in 0..n {
                let key = &mut row[..d];
                key_row(keys, first + j, d).copy_to(key);
                put(&mut tile[j..], lanes, key, d, |v| *v);
            }
        }
    }

    fn put<T>(tile: &mut [f32], lanes: usize, rows: &[T], d: usize, f: impl Fn(&T) -> f32) {
        for (j, row) in rows.chunks_exact(d).enumerate() {
            for (i, v) in row.iter().enumerate() {
                tile[i * lanes + j] = f(v);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::IndexQuery;

    /// Heads whose dot products run side by side (independent chains of multiply-adds).
    const HEADS_PER_PASS: usize = 4;

    macro_rules! tile_kernel {
        ($name:ident, $feat:literal, $lanes:expr, $vec:ty, $zero:ident, $load:ident,
         $set1:ident, $fmadd:ident, $max:ident, $mul:ident, $add:ident, $store:ident) => {
            /// Scores the `dst.len()` keys of `tile` (dimension-major, one key per lane).
            ///
            /// SAFETY: needs the features named; `tile` holds `q.head_dim` rows of
            /// `$lanes` values and `dst.len() <= $lanes`.
            #[target_feature(enable = $feat)]
            pub unsafe fn $name(q: &IndexQuery<'_>, tile: &[f32], dst: &mut [f32]) {
                let d = q.head_dim;
                debug_assert!(tile.len() >= d * $lanes && dst.len() <= $lanes);
                let zero = $zero();
                let mut score = zero;
                let n_heads = q.weights.len();
                let mut h = 0;
                while h < n_heads {
                    let group = HEADS_PER_PASS.min(n_heads - h);
                    let mut acc: [$vec; HEADS_PER_PASS] = [zero; HEADS_PER_PASS];
                    let heads = q.heads.as_ptr().add(h * d);
                    for i in 0..d {
                        let k = $load(tile.as_ptr().add(i * $lanes));
                        for (g, acc) in acc.iter_mut().enumerate().take(group) {
                            *acc = $fmadd($set1(*heads.add(g * d + i)), k, *acc);
                        }
                    }
                    for (g, acc) in acc.iter().enumerate().take(group) {
                        let w = $set1(q.weights[h + g]);
                        score = $add(score, $mul($max(*acc, zero), w));
                    }
                    h += group;
                }
                let mut out = [0f32; $lanes];
                $store(out.as_mut_ptr(), score);
                dst.copy_from_slice(&out[..dst.len()]);
            }
        };
    }

    tile_kernel!(
        tile_512,
        "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c",
        16,
        __m512,
        _mm512_setzero_ps,
        _mm512_loadu_ps,
        _mm512_set1_ps,
        _mm512_fmadd_ps,
        _mm512_max_ps,
        _mm512_mul_ps,
        _mm512_add_ps,
        _mm512_storeu_ps
    );
    tile_kernel!(
        tile_256,
        "avx2,fma,f16c",
        8,
        __m256,
        _mm256_setzero_ps,
        _mm256_loadu_ps,
        _mm256_set1_ps,
        _mm256_fmadd_ps,
        _mm256_max_ps,
        _mm256_mul_ps,
        _mm256_add_ps,
        _mm256_storeu_ps
    );
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect()
    }

    #[test]
    fn every_isa_gives_the_reference_bits() {
        for (heads, d, n) in [
            (64, 128, 53),
            (3, 16, 7),
            (5, 40, 33),
            (1, 1, 1),
            (8, 64, 16),
        ] {
            let q = values(heads * d, 1);
            let w = values(heads, 2);
            let keys = values(n * d, 3);
            let keys16: Vec<f16> = keys.iter().map(|&v| f16::from_f32(v)).collect();
            let query = IndexQuery {
                heads: &q,
                weights: &w,
                head_dim: d,
            };
            let reference: Vec<f32> = keys.chunks(d).map(|k| query.score(k)).collect();
            let reference16: Vec<f32> = keys16
                .chunks(d)
                .map(|k| query.score(&k.iter().map(|v| v.to_f32()).collect::<Vec<_>>()))
                .collect();
            // Some scores must be clipped to 0 and some not, or the ReLU is untested.
            assert!(reference.iter().any(|&s| s != 0.0));
            for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
                let mut out = vec![f32::NAN; n];
                scores_with(isa, &query, KvRows::F32(&keys), &mut out);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&out), bits(&reference), "{isa:?} f32 {heads}x{d}");
                scores_with(isa, &query, KvRows::F16(&keys16), &mut out);
                assert_eq!(bits(&out), bits(&reference16), "{isa:?} f16 {heads}x{d}");
            }
        }
    }

    #[test]
    fn quantized_keys_score_as_their_decoded_values() {
        use crate::KvType;
        let (heads, d, n) = (4, 64, 37);
        let q = values(heads * d, 4);
        let w = values(heads, 5);
        let keys = values(n * d, 6);
        let query = IndexQuery {
            heads: &q,
            weights: &w,
            head_dim: d,
        };
        for ty in [KvType::Q8_0, KvType::Q4_0, KvType::Bf16] {
            let mut bytes = vec![0u8; n * ty.bytes(d)];
            crate::quant::quantize_row(ty.ggml(), &keys, &mut bytes).unwrap();
            let mut decoded = vec![0f32; n * d];
            crate::quant::dequantize_row(ty.ggml(), &bytes, &mut decoded).unwrap();
            assert_ne!(decoded, keys, "{ty:?} rounds");
            let reference: Vec<f32> = decoded.chunks(d).map(|k| query.score(k)).collect();
            assert!(reference.iter().any(|&s| s != 0.0));
            for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
                let mut out = vec![f32::NAN; n];
                scores_with(isa, &query, KvRows::Blocks(ty, &bytes), &mut out);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&out), bits(&reference), "{isa:?} {ty:?}");
            }
        }
    }

    #[test]
    fn negative_dot_products_contribute_nothing() {
        let q = [1.0, 0.0, -1.0, 0.0];
        let query = IndexQuery {
            heads: &q,
            weights: &[2.0, 3.0],
            head_dim: 2,
        };
        // Head 0: 0.5·2 = 1; head 1: −0.5 clipped.
        assert_eq!(query.score(&[0.5, 7.0]), 1.0);
        let mut out = [0.0; 2];
        scores(&query, KvRows::F32(&[0.5, 7.0, -0.5, 1.0]), &mut out);
        assert_eq!(out, [1.0, 1.5]);
    }
}
