//! `y = W x` for a batch of activation rows, on the current thread pool: the activations
//! are quantized to the weight type's dot-product type once, then integer kernels run.

use ferrox_core::WeightMatrix;
use smallvec::SmallVec;

use crate::ModelError;

/// `y[t * rows + r] = W[r] · x[t * cols ..]` for `n` tokens; `xq` is reusable scratch.
pub fn linear(
    w: &WeightMatrix<'_>,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    xq: &mut Vec<u8>,
) -> Result<(), ModelError> {
    let (rows, cols) = (w.rows(), w.cols());
    w.quantize_activation(&x[..n * cols], xq)?;
    let y = &mut y[..n * rows];
    if n == 1 {
        w.matvec(xq, y)?;
    } else {
        w.matmul(xq, n, y)?;
    }
    Ok(())
}

/// [`linear`] for several matrices applied to the same input (query, key and value; gate
/// and up): the matrices whose activations are laid out alike are one group, `x` is
/// quantized once per group and each group's products run in one pass over the thread
/// pool (a file may mix types: IQ2_XXS query and key, a packed Q4_K value). `ys[i]` holds
/// at least `n × rows` of matrix `i`.
pub fn linear_many(
    ws: &[&WeightMatrix<'_>],
    x: &[f32],
    n: usize,
    ys: &mut [&mut [f32]],
    xq: &mut Vec<u8>,
) -> Result<(), ModelError> {
    const MOST: usize = ferrox_core::packed::MAX_PARTS;
    if ws.len() > MOST {
        // More than one pass holds: each on its own.
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            linear(w, x, n, y, xq)?;
        }
        return Ok(());
    }
    let mut done = [false; MOST];
    for leader in 0..ws.len() {
        if done[leader] {
            continue;
        }
        let first = ws[leader];
        let mut parts: SmallVec<[&WeightMatrix<'_>; MOST]> = SmallVec::new();
        let mut outs: SmallVec<[&mut [f32]; MOST]> = SmallVec::new();
        for (i, (w, y)) in ws.iter().zip(ys.iter_mut()).enumerate().skip(leader) {
            if !done[i] && first.shares_activations(w) {
                done[i] = true;
                parts.push(w);
                outs.push(&mut y[..n * w.rows()]);
            }
        }
        first.quantize_activation(&x[..n * first.cols()], xq)?;
        WeightMatrix::matmul_many(&parts, xq, n, &mut outs)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrox_core::packed::PackedMatrix;
    use ferrox_core::{row_byte_len, GgmlType};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Random rows of `ty` whose f16 scales (at the start of each block) are small and
    /// finite; the other bytes are any (i-quant indices are masked).
    fn random_rows(rng: &mut StdRng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; rows * row_byte_len(ty, cols).unwrap()];
        rng.fill(&mut bytes[..]);
        let scale = half::f16::from_f32(1e-2).to_le_bytes();
        for block in bytes.chunks_exact_mut(ty.block_bytes().unwrap() as usize) {
            block[..2].copy_from_slice(&scale);
            if ty == GgmlType::Q4K {
                block[2..4].copy_from_slice(&scale);
            }
        }
        bytes
    }

    /// Matrices of mixed layouts (row-major i-quants, packed K-quants that take the same
    /// Q8_K rows, a packed Q8_0 with its own) applied together give each the bits it
    /// gives alone, for one token and for several.
    #[test]
    fn grouped_products_equal_each_matrix_alone() {
        let mut rng = StdRng::seed_from_u64(0x11EA);
        let cols = 512;
        let shapes = [
            (GgmlType::Iq2Xxs, 1024),
            (GgmlType::Q4K, 128),
            (GgmlType::Q8_0, 64),
            (GgmlType::Iq3S, 256),
        ];
        let files: Vec<Vec<u8>> = shapes
            .iter()
            .map(|&(ty, rows)| random_rows(&mut rng, ty, rows, cols))
            .collect();
        let packed: Vec<Option<PackedMatrix>> = shapes
            .iter()
            .zip(&files)
            .map(|(&(ty, rows), file)| {
                matches!(ty, GgmlType::Q4K | GgmlType::Q8_0)
                    .then(|| PackedMatrix::pack(ty, rows, cols, file, |_| {}).unwrap())
            })
            .collect();
        let ws: Vec<WeightMatrix<'_>> = shapes
            .iter()
            .zip(&files)
            .zip(&packed)
            .map(|((&(ty, rows), file), packed)| {
                let m = WeightMatrix::new(ty, rows, cols, file).unwrap();
                match packed {
                    Some(p) => m.with_packed(p).unwrap(),
                    None => m,
                }
            })
            .collect();
        let shares: Vec<bool> = ws.iter().map(|w| ws[0].shares_activations(w)).collect();
        assert_eq!(shares, [true, true, false, true]);
        let refs: Vec<&WeightMatrix<'_>> = ws.iter().collect();
        for n in [1, 3] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut xq = Vec::new();
            let mut together: Vec<Vec<f32>> =
                ws.iter().map(|w| vec![f32::NAN; n * w.rows()]).collect();
            let mut outs: Vec<&mut [f32]> = together.iter_mut().map(|v| &mut v[..]).collect();
            linear_many(&refs, &x, n, &mut outs, &mut xq).unwrap();
            for (i, (w, got)) in ws.iter().zip(&together).enumerate() {
                let mut alone = vec![f32::NAN; n * w.rows()];
                linear(w, &x, n, &mut alone, &mut xq).unwrap();
                let same = got
                    .iter()
                    .zip(&alone)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "matrix {i}, {n} tokens");
            }
        }
    }
}
