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
