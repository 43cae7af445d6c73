//! Attention's inner loop over caches of llama.cpp's other types: bf16, the quantized
//! types, or keys and values of different types. It computes what ggml's CPU flash
//! attention computes for them (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`, the only
//! path ggml has for these caches), one query at a time:
//!
//! * the query is rounded once to the keys' vec-dot type (Q8_0, Q8_1, f16, ...) exactly as
//!   ggml-cpu's `from_float` rounds it, and every score is the keys' own dot-product kernel
//!   ([`crate::kernels::RowDot`]), bit-identical to ggml's;
//! * `s = score·scale` (`cap·tanh(s)` with a soft cap), then the online softmax: on a new
//!   maximum the accumulator is scaled by `exp(old − new)`, otherwise the key weighs
//!   `exp(s − max)`;
//! * each value row is decoded to f32 and added as `acc = v·w + acc` with fused
//!   multiply-adds (`ggml_vec_mad_f32`), per element, so every instruction set gives the
//!   same bits.

use crate::kernels::{best_isa, quantize_activation, Isa, RowDot};
use crate::quant::QuantError;
use crate::KvType;

/// Largest head size.
pub const MAX_HEAD_DIM: usize = crate::flash_attn::MAX_HEAD_DIM;
/// Bytes of the largest quantized query (an f32 row of `MAX_HEAD_DIM`).
const MAX_QUERY_BYTES: usize = 4 * MAX_HEAD_DIM;

/// A run of consecutive cached positions of one KV head, as bytes of its types.
#[derive(Clone, Copy, Debug)]
pub struct TypedRun<'a> {
    /// Key `j` is `head_dim_k` values of the keys' type at `keys[j * key_stride..]`.
    pub keys: &'a [u8],
    pub key_stride: usize,
    /// Value `j` is `head_dim_v` values of the values' type at `values[j * value_stride..]`.
    pub values: &'a [u8],
    pub value_stride: usize,
    pub len: usize,
}

/// One query's running softmax over a typed cache.
pub struct TypedQuery {
    dot: RowDot,
    values: KvType,
    head_dim_v: usize,
    key_bytes: usize,
    value_bytes: usize,
    scale: f32,
    softcap: Option<f32>,
    query: [u8; MAX_QUERY_BYTES],
    query_bytes: usize,
    max: f32,
    sum: f32,
    /// A decoded value row.
    row: [f32; MAX_HEAD_DIM],
    isa: Isa,
}

impl TypedQuery {
    /// Starts the softmax of query `q` (`head_dim_k` values) over keys of type `keys` and
    /// values of type `values` (`head_dim_v` each); the accumulator `acc` is zeroed. `scale`
    /// multiplies q·k; `softcap` caps the scaled score as `cap·tanh(s / cap)`.
    pub fn new(
        keys: KvType,
        values: KvType,
        q: &[f32],
        head_dim_v: usize,
        scale: f32,
        softcap: Option<f32>,
        acc: &mut [f32],
    ) -> Result<TypedQuery, QuantError> {
        TypedQuery::with_isa(best_isa(), keys, values, q, head_dim_v, scale, softcap, acc)
    }

    /// [`new`](Self::new) on a given instruction set (scalar code where it is not
    /// available), for comparing kernels.
    #[allow(clippy::too_many_arguments)]
    pub fn with_isa(
        isa: Isa,
        keys: KvType,
        values: KvType,
        q: &[f32],
        head_dim_v: usize,
        scale: f32,
        softcap: Option<f32>,
        acc: &mut [f32],
    ) -> Result<TypedQuery, QuantError> {
        assert!(q.len() <= MAX_HEAD_DIM && head_dim_v <= MAX_HEAD_DIM);
        let isa = if isa.is_available() { isa } else { Isa::Scalar };
        let dot = RowDot::with_isa(isa, keys.ggml())?;
        let query_bytes = crate::quant::row_byte_len(dot.vec_dot_type(), q.len())?;
        let mut query = [0u8; MAX_QUERY_BYTES];
        quantize_activation(dot.vec_dot_type(), q, &mut query[..query_bytes])?;
        acc[..head_dim_v].fill(0.0);
        let (scale, softcap) = match softcap {
            Some(cap) => (scale / cap, Some(cap)),
            None => (scale, None),
        };
        Ok(TypedQuery {
            dot,
            values,
            head_dim_v,
            key_bytes: keys.bytes(q.len()),
            value_bytes: values.bytes(head_dim_v),
            scale,
            softcap,
            query,
            query_bytes,
            max: f32::NEG_INFINITY,
            sum: 0.0,
            row: [0.0; MAX_HEAD_DIM],
            isa,
        })
    }

    /// Adds `run`'s positions (following everything added so far) into `acc`.
    pub fn attend_run(&mut self, run: &TypedRun<'_>, acc: &mut [f32]) {
        let dv = self.head_dim_v;
        let acc = &mut acc[..dv];
        let query = &self.query[..self.query_bytes];
        for j in 0..run.len {
            let key = &run.keys[j * run.key_stride..][..self.key_bytes];
            let mut s = self.dot.dot(key, query) * self.scale;
            if let Some(cap) = self.softcap {
                s = cap * s.tanh();
            }
            let (ms, vs) = if s > self.max {
                let ms = (self.max - s).exp();
                self.max = s;
                acc.iter_mut().for_each(|a| *a *= ms);
                (ms, 1.0)
            } else {
                (1.0, (s - self.max).exp())
            };
            let value = &run.values[j * run.value_stride..][..self.value_bytes];
            crate::quant::dequantize_row(self.values.ggml(), value, &mut self.row[..dv])
                .expect("a value row is whole blocks of its type");
            mad(self.isa, acc, &self.row[..dv], vs);
            self.sum = self.sum * ms + vs;
        }
    }

    /// Normalises the accumulated row.
    pub fn finish(&self, acc: &mut [f32]) {
        let inv = if self.sum == 0.0 { 0.0 } else { 1.0 / self.sum };
        acc[..self.head_dim_v].iter_mut().for_each(|a| *a *= inv);
    }
}

/// `acc[i] = x[i]·w + acc[i]`, fused, element by element.
fn mad(isa: Isa, acc: &mut [f32], x: &[f32], w: f32) {
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() {
        // SAFETY: `isa` is available (checked when the query started) and has FMA.
        unsafe { x86::mad(acc, x, w) };
        return;
    }
    let _ = isa;
    acc.iter_mut()
        .zip(x)
        .for_each(|(a, &v)| *a = v.mul_add(w, *a));
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// [`super::mad`] eight lanes at a time (the same fused operation per element).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn mad(acc: &mut [f32], x: &[f32], w: f32) {
        let n = acc.len().min(x.len());
        let vw = _mm256_set1_ps(w);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n` elements of both slices are in bounds.
            unsafe {
                let a = _mm256_loadu_ps(acc.as_ptr().add(i));
                let v = _mm256_loadu_ps(x.as_ptr().add(i));
                _mm256_storeu_ps(acc.as_mut_ptr().add(i), _mm256_fmadd_ps(v, vw, a));
            }
            i += 8;
        }
        for (a, &v) in acc[i..n].iter_mut().zip(&x[i..n]) {
            *a = v.mul_add(w, *a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::quantize_row;

    #[test]
    fn fused_accumulation_is_the_same_on_every_isa() {
        let x = values(77, 9);
        let start = values(77, 10);
        let mut reference = start.clone();
        mad(Isa::Scalar, &mut reference, &x, 0.371);
        for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
            let mut acc = start.clone();
            mad(isa, &mut acc, &x, 0.371);
            assert!(acc
                .iter()
                .zip(&reference)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32 ^ seed).wrapping_mul(2_654_435_761).rotate_left(7);
                (h % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// On each instruction set, the same run in one piece or split anywhere gives the same
    /// bits (the scores are each set's dot kernel: ggml's generic and AVX2 code round
    /// differently); and the result is a softmax-weighted mean of the decoded values, as a
    /// two-pass computation over the decoded keys finds it (up to the query's rounding).
    #[test]
    fn any_split_gives_the_same_bits() {
        let (dk, dv, n) = (64, 96, 37);
        for (keys, vals) in [
            (KvType::Q8_0, KvType::Q8_0),
            (KvType::Q4_0, KvType::Q4_1),
            (KvType::Q5_1, KvType::Iq4Nl),
            (KvType::F16, KvType::Q5_0),
            (KvType::Bf16, KvType::Bf16),
            (KvType::F32, KvType::Q8_0),
        ] {
            let (kf, vf) = (values(n * dk, 1), values(n * dv, 2));
            let mut kb = vec![0u8; keys.bytes(n * dk)];
            let mut vb = vec![0u8; vals.bytes(n * dv)];
            quantize_row(keys.ggml(), &kf, &mut kb).unwrap();
            quantize_row(vals.ggml(), &vf, &mut vb).unwrap();
            let q = values(dk, 3);
            let run = |lo: usize, hi: usize| TypedRun {
                keys: &kb[keys.bytes(lo * dk)..],
                key_stride: keys.bytes(dk),
                values: &vb[vals.bytes(lo * dv)..],
                value_stride: vals.bytes(dv),
                len: hi - lo,
            };
            let attend = |isa: Isa, split: usize| {
                let mut acc = vec![0f32; dv];
                let mut t = TypedQuery::with_isa(isa, keys, vals, &q, dv, 0.3, Some(5.0), &mut acc)
                    .unwrap();
                t.attend_run(&run(0, split), &mut acc);
                t.attend_run(&run(split, n), &mut acc);
                t.finish(&mut acc);
                acc
            };
            let mut results = Vec::new();
            for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
                let whole = attend(isa, n);
                for split in [0, 1, 16] {
                    let got = attend(isa, split);
                    let same = got
                        .iter()
                        .zip(&whole)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{keys:?}/{vals:?} {isa:?} split {split}");
                }
                results.push(whole);
            }
            // Two passes over the decoded rows.
            let mut kd = vec![0f32; n * dk];
            let mut vd = vec![0f32; n * dv];
            crate::dequantize_row(keys.ggml(), &kb, &mut kd).unwrap();
            crate::dequantize_row(vals.ggml(), &vb, &mut vd).unwrap();
            let scores: Vec<f32> = kd
                .chunks_exact(dk)
                .map(|k| {
                    5.0 * (k.iter().zip(&q).map(|(a, b)| a * b).sum::<f32>() * 0.3 / 5.0).tanh()
                })
                .collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let w: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f32 = w.iter().sum();
            for (d, r) in results.iter().flat_map(|r| r.iter().enumerate()) {
                let expect: f32 = (0..n).map(|j| w[j] * vd[j * dv + d]).sum::<f32>() / total;
                assert!(
                    (r - expect).abs() < 2e-2,
                    "{keys:?}/{vals:?} dim {d}: {r} vs {expect}"
                );
            }
        }
    }
}
