//! `y = W x` for a batch of activation rows, on the current thread pool: the activations
//! are quantized to the weight type's dot-product type once, then integer kernels run.

use ferrox_core::WeightMatrix;

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
/// and up): when their activations are laid out alike, `x` is quantized once and packed
/// products run in one pass over the thread pool. `ys[i]` holds at least `n × rows` of
/// matrix `i`.
pub fn linear_many(
    ws: &[&WeightMatrix<'_>],
    x: &[f32],
    n: usize,
    ys: &mut [&mut [f32]],
    xq: &mut Vec<u8>,
) -> Result<(), ModelError> {
    let Some(first) = ws.first() else {
        return Ok(());
    };
    if !ws.iter().all(|w| first.shares_activations(w)) {
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            linear(w, x, n, y, xq)?;
        }
        return Ok(());
    }
    first.quantize_activation(&x[..n * first.cols()], xq)?;
    for (w, y) in ws.iter().zip(ys.iter_mut()) {
        let all = std::mem::take(y);
        *y = &mut all[..n * w.rows()];
    }
    WeightMatrix::matmul_many(ws, xq, n, ys)?;
    Ok(())
}
