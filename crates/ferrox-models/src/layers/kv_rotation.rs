//! llama.cpp's Hadamard rotation of quantized caches: with a quantized K cache, queries and
//! keys are rotated (q·k is unchanged, but the rounded keys lose less); with a quantized V
//! cache, values are rotated before they are stored and the attention's output is rotated
//! back (the rotation is its own inverse). Sizes as llama.cpp picks them
//! ([`KvStorage::key_rotation`]), only where every layer has the same head sizes.

use ferrox_core::hadamard::rotate_fast;
use ferrox_core::KvStorage;
use ferrox_engine::ModelError;

/// The rotations one engine applies around its cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvRotation {
    /// Size of the blocks queries and keys are rotated in.
    pub keys: Option<usize>,
    /// Size of the blocks values and the attention's output are rotated in.
    pub values: Option<usize>,
}

impl KvRotation {
    /// The rotations for a cache of `storage` under layers with heads of `(head_dim_k,
    /// head_dim_v)`; an error where a head is not a whole number of the cache's blocks.
    pub fn new(
        storage: KvStorage,
        head_dims: impl IntoIterator<Item = (usize, usize)>,
    ) -> Result<KvRotation, ModelError> {
        let dims: Vec<(usize, usize)> = head_dims.into_iter().collect();
        for &(dk, dv) in &dims {
            for (what, ty, d) in [("K", storage.keys, dk), ("V", storage.values, dv)] {
                if !d.is_multiple_of(ty.block_len()) {
                    return Err(ModelError::Config(format!(
                        "a {} {what} cache stores blocks of {} values, and this model's heads \
                         have {d}: not whole blocks (choose f16, f32 or bf16)",
                        ty.name(),
                        ty.block_len()
                    )));
                }
            }
        }
        let uniform = |pick: fn(&(usize, usize)) -> usize| {
            let first = dims.first().map(pick)?;
            dims.iter().all(|d| pick(d) == first).then_some(first)
        };
        Ok(KvRotation {
            keys: uniform(|d| d.0).and_then(|d| storage.key_rotation(d)),
            values: uniform(|d| d.1).and_then(|d| storage.value_rotation(d)),
        })
    }

    /// Rotates rows of queries and of keys (whole heads) before the keys are stored.
    pub fn queries_and_keys(&self, q: &mut [f32], k: &mut [f32]) {
        if let Some(n) = self.keys {
            rotate_fast(q, n);
            rotate_fast(k, n);
        }
    }

    /// Rotates rows of values before they are stored, and the attention's output rows
    /// after (back to the values' own basis).
    pub fn values(&self, v: &mut [f32]) {
        if let Some(n) = self.values {
            rotate_fast(v, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrox_core::KvType;

    #[test]
    fn sizes_and_refusals() {
        let q8 = KvStorage::uniform(KvType::Q8_0);
        let r = KvRotation::new(q8, [(128, 128); 3]).unwrap();
        assert_eq!(
            r,
            KvRotation {
                keys: Some(128),
                values: Some(64)
            }
        );
        // Different heads per layer: llama.cpp rotates nothing.
        let r = KvRotation::new(q8, [(128, 128), (256, 256)]).unwrap();
        assert_eq!(r, KvRotation::default());
        assert_eq!(
            KvRotation::new(KvStorage::F16, [(80, 80)]).unwrap(),
            KvRotation::default()
        );
        let err = KvRotation::new(q8, [(80, 80)]).unwrap_err().to_string();
        assert!(err.contains("q8_0 K cache") && err.contains("80"), "{err}");
    }

    #[test]
    fn rotating_twice_gives_the_row_back() {
        let r = KvRotation {
            keys: None,
            values: Some(64),
        };
        let row: Vec<f32> = (0..128).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut v = row.clone();
        r.values(&mut v);
        assert!(v.iter().zip(&row).any(|(a, b)| (a - b).abs() > 1e-3));
        r.values(&mut v);
        assert!(v.iter().zip(&row).all(|(a, b)| (a - b).abs() < 1e-5));
    }
}
