//! `y = W x` for a batch of activation rows, on the current thread pool.

use ferrox_core::WeightMatrix;
use rayon::prelude::*;

use crate::ModelError;

/// Rows of `W` handed to one task.
const ROWS_PER_TASK: usize = 64;

/// `y[t * rows + r] = W[r] · x[t * cols ..]` for `n` tokens.
pub fn linear(w: &WeightMatrix<'_>, x: &[f32], n: usize, y: &mut [f32]) -> Result<(), ModelError> {
    let (rows, cols) = (w.rows(), w.cols());
    debug_assert!(x.len() >= n * cols && y.len() >= n * rows);
    for t in 0..n {
        let xt = &x[t * cols..(t + 1) * cols];
        let yt = &mut y[t * rows..(t + 1) * rows];
        yt.par_chunks_mut(ROWS_PER_TASK)
            .enumerate()
            .try_for_each_init(
                || vec![0.0f32; cols],
                |row, (chunk, out)| -> Result<(), ModelError> {
                    for (j, o) in out.iter_mut().enumerate() {
                        w.dequant_row(chunk * ROWS_PER_TASK + j, row)?;
                        *o = row.iter().zip(xt).map(|(a, b)| a * b).sum();
                    }
                    Ok(())
                },
            )?;
    }
    Ok(())
}
