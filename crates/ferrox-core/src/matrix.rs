//! A read-only view of one 2-D weight tensor in any supported storage type.

use ferrox_gguf::GgmlType;

use rayon::prelude::*;

use crate::kernels::{self, WeightKind};
use crate::quant::{self, QuantError};

/// `rows × cols` weights of type `ty`, stored row-major as ggml lays them out: each row is
/// `cols` values packed into whole blocks, rows back to back. Borrowed straight from the
/// tensor bytes (typically an mmap), so nothing is copied or aligned.
#[derive(Clone, Copy, Debug)]
pub struct WeightMatrix<'a> {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    bytes_per_row: usize,
    bytes: &'a [u8],
    kind: WeightKind,
    activation_row_bytes: usize,
}

impl<'a> WeightMatrix<'a> {
    /// Checks that `ty` can be decoded, that `cols` is a whole number of blocks and that
    /// `bytes` holds exactly `rows` rows.
    pub fn new(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &'a [u8],
    ) -> Result<Self, QuantError> {
        if !quant::can_dequantize(ty) {
            return Err(QuantError::UnsupportedDequantize(ty));
        }
        let kind = WeightKind::of(ty).ok_or(QuantError::UnsupportedDot(ty))?;
        let bytes_per_row = quant::row_byte_len(ty, cols)?;
        let expected = rows
            .checked_mul(bytes_per_row)
            .ok_or(QuantError::MatrixTooLarge { ty, rows, cols })?;
        if bytes.len() != expected {
            return Err(QuantError::ByteLength {
                ty,
                elements: rows.saturating_mul(cols),
                expected,
                actual: bytes.len(),
            });
        }
        let activation_row_bytes = quant::row_byte_len(kind.vec_dot_type(), cols)?;
        Ok(Self {
            ty,
            rows,
            cols,
            bytes_per_row,
            bytes,
            kind,
            activation_row_bytes,
        })
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The encoded bytes of row `i`.
    ///
    /// # Panics
    /// If `i >= self.rows()`, like slice indexing.
    pub fn row_bytes(&self, i: usize) -> &'a [u8] {
        assert!(i < self.rows, "row {i} out of range for {} rows", self.rows);
        &self.bytes[i * self.bytes_per_row..(i + 1) * self.bytes_per_row]
    }

    /// Decodes row `i` into `out`, which must hold exactly `cols` values.
    pub fn dequant_row(&self, i: usize, out: &mut [f32]) -> Result<(), QuantError> {
        if i >= self.rows {
            return Err(QuantError::RowOutOfRange {
                row: i,
                rows: self.rows,
            });
        }
        if out.len() != self.cols {
            return Err(QuantError::VectorLength {
                what: "row output",
                expected: self.cols,
                actual: out.len(),
            });
        }
        quant::dequantize_row(self.ty, self.row_bytes(i), out)
    }

    /// The type activations are quantized to before a product with this matrix
    /// (ggml's `vec_dot_type`).
    pub fn vec_dot_type(&self) -> GgmlType {
        self.kind.vec_dot_type()
    }

    /// Bytes of one quantized activation row (`cols` values of [`Self::vec_dot_type`]).
    pub fn activation_row_bytes(&self) -> usize {
        self.activation_row_bytes
    }

    /// Quantizes `x`, one or more rows of `cols` values back to back, to the vec-dot type
    /// (as ggml-cpu does), replacing the contents of `out`. Returns the number of rows.
    /// `out`'s capacity is reused, so a long-lived buffer makes this allocation-free.
    pub fn quantize_activation(&self, x: &[f32], out: &mut Vec<u8>) -> Result<usize, QuantError> {
        let tokens = x.len().checked_div(self.cols).unwrap_or(0);
        if tokens * self.cols != x.len() {
            return Err(QuantError::VectorLength {
                what: "activation rows",
                expected: (tokens + 1) * self.cols,
                actual: x.len(),
            });
        }
        out.clear();
        out.resize(tokens * self.activation_row_bytes, 0);
        if self.cols > 0 {
            for (src, dst) in x
                .chunks_exact(self.cols)
                .zip(out.chunks_exact_mut(self.activation_row_bytes))
            {
                kernels::quantize_activation(self.vec_dot_type(), src, dst)?;
            }
        }
        Ok(tokens)
    }

    /// `y = W·x` for one activation row `xq` quantized by [`Self::quantize_activation`].
    ///
    /// Rows are split across the current rayon pool; every output is computed by the same
    /// kernel call whatever the split, so results do not depend on the number of threads.
    /// Allocates nothing.
    pub fn matvec(&self, xq: &[u8], y: &mut [f32]) -> Result<(), QuantError> {
        self.check_product(xq, 1, y)?;
        if self.rows == 0 {
            return Ok(());
        }
        if self.cols == 0 {
            y.fill(0.0);
            return Ok(());
        }
        let kernel = kernels::best_kernel(self.kind);
        let chunk = self.rows_per_task();
        let run = |(weights, out): (&[u8], &mut [f32])| {
            for (row, y) in weights.chunks_exact(self.bytes_per_row).zip(out) {
                *y = (kernel.one)(row, [xq])[0];
            }
        };
        if self.bytes.len() < PARALLEL_MIN_BYTES {
            run((self.bytes, y));
        } else {
            self.bytes
                .par_chunks(chunk * self.bytes_per_row)
                .zip(y.par_chunks_mut(chunk))
                .for_each(run);
        }
        Ok(())
    }

    /// `Y = W·X` for `n_tokens` activation rows `xq` (back to back, each quantized by
    /// [`Self::quantize_activation`]), with `y` token-major: `y[t * rows + r]`.
    ///
    /// Each output is bit-identical to what [`Self::matvec`] gives for that token alone: the
    /// batched kernels decode a weight block once for four tokens but apply exactly the
    /// single-token operations to each. Work is split by rows across the rayon pool, and
    /// within a task the rows are swept once per block of tokens whose activations fit in
    /// L1/L2, so each weight row is reused across the whole block.
    pub fn matmul(&self, xq: &[u8], n_tokens: usize, y: &mut [f32]) -> Result<(), QuantError> {
        self.check_product(xq, n_tokens, y)?;
        if self.rows == 0 || n_tokens == 0 {
            return Ok(());
        }
        if self.cols == 0 {
            y.fill(0.0);
            return Ok(());
        }
        let chunk = self.rows_per_task();
        // Gather the outputs chunk by chunk: task `c` owns rows `c·chunk..` of every token.
        let mut per_token: Vec<_> = y
            .chunks_mut(self.rows)
            .map(|t| t.chunks_mut(chunk))
            .collect();
        let chunks = self.rows.div_ceil(chunk);
        let mut outputs: Vec<&mut [f32]> = Vec::with_capacity(chunks * n_tokens);
        for _ in 0..chunks {
            outputs.extend(per_token.iter_mut().filter_map(Iterator::next));
        }
        let run = |(c, outs): (usize, &mut [&mut [f32]])| {
            let weights = &self.bytes[c * chunk * self.bytes_per_row..];
            self.matmul_rows(weights, xq, outs);
        };
        if self.bytes.len() * n_tokens < PARALLEL_MIN_BYTES {
            outputs.chunks_mut(n_tokens).enumerate().for_each(run);
        } else {
            outputs.par_chunks_mut(n_tokens).enumerate().for_each(run);
        }
        Ok(())
    }

    /// Rows `0..outs[0].len()` of `weights` against every token; `outs[t]` receives token
    /// `t`'s outputs.
    fn matmul_rows(&self, weights: &[u8], xq: &[u8], outs: &mut [&mut [f32]]) {
        let kernel = kernels::best_kernel(self.kind);
        let act = self.activation_row_bytes;
        let rows = outs.first().map_or(0, |o| o.len());
        let block = self.tokens_per_block();
        for (outs, xq) in outs.chunks_mut(block).zip(xq.chunks(block * act)) {
            let weight_rows = weights.chunks_exact(self.bytes_per_row).take(rows);
            for (r, w) in weight_rows.enumerate() {
                let mut out_quads = outs.chunks_exact_mut(4);
                let mut token_quads = xq.chunks_exact(4 * act);
                for (out, x) in (&mut out_quads).zip(&mut token_quads) {
                    let tokens = [
                        &x[..act],
                        &x[act..2 * act],
                        &x[2 * act..3 * act],
                        &x[3 * act..],
                    ];
                    for (out, y) in out.iter_mut().zip((kernel.four)(w, tokens)) {
                        out[r] = y;
                    }
                }
                let rest = token_quads.remainder().chunks_exact(act);
                for (out, x) in out_quads.into_remainder().iter_mut().zip(rest) {
                    out[r] = (kernel.one)(w, [x])[0];
                }
            }
        }
    }

    /// Rows per parallel task: about four tasks per thread, so uneven progress balances.
    fn rows_per_task(&self) -> usize {
        let tasks = 4 * rayon::current_num_threads();
        self.rows.div_ceil(tasks).max(MIN_ROWS_PER_TASK)
    }

    /// Tokens whose activations stay cached while a task sweeps its rows (a multiple of 4).
    fn tokens_per_block(&self) -> usize {
        (TOKEN_BLOCK_BYTES / self.activation_row_bytes.max(1) / 4 * 4).max(4)
    }

    fn check_product(&self, xq: &[u8], n_tokens: usize, y: &[f32]) -> Result<(), QuantError> {
        let expected = n_tokens.saturating_mul(self.activation_row_bytes);
        if xq.len() != expected {
            return Err(QuantError::ByteLength {
                ty: self.vec_dot_type(),
                elements: n_tokens.saturating_mul(self.cols),
                expected,
                actual: xq.len(),
            });
        }
        let outputs = n_tokens.saturating_mul(self.rows);
        if y.len() != outputs {
            return Err(QuantError::VectorLength {
                what: "output",
                expected: outputs,
                actual: y.len(),
            });
        }
        Ok(())
    }

    /// Matrix-vector product `y = W·x` (`x` has `cols` values, `y` has `rows`) through the
    /// fast path: `x` is quantized to the vec-dot type and [`Self::matvec`] runs. Allocates
    /// the quantized activation; hot loops should call the two steps with a reused buffer.
    pub fn apply(&self, x: &[f32], y: &mut [f32]) -> Result<(), QuantError> {
        self.check_input(x, y)?;
        let mut xq = Vec::new();
        self.quantize_activation(x, &mut xq)?;
        self.matvec(&xq, y)
    }

    /// `y = W·x` by the plain scalar route: each row decoded to f32 and dotted with `x` in
    /// order, accumulating in f32. Slow; for tests and debugging.
    pub fn apply_dequantized(&self, x: &[f32], y: &mut [f32]) -> Result<(), QuantError> {
        self.check_input(x, y)?;
        let mut row = vec![0f32; self.cols];
        for (i, out) in y.iter_mut().enumerate() {
            self.dequant_row(i, &mut row)?;
            *out = row.iter().zip(x).fold(0.0f32, |acc, (w, v)| acc + w * v);
        }
        Ok(())
    }

    fn check_input(&self, x: &[f32], y: &[f32]) -> Result<(), QuantError> {
        if x.len() != self.cols {
            return Err(QuantError::VectorLength {
                what: "input vector",
                expected: self.cols,
                actual: x.len(),
            });
        }
        if y.len() != self.rows {
            return Err(QuantError::VectorLength {
                what: "output vector",
                expected: self.rows,
                actual: y.len(),
            });
        }
        Ok(())
    }
}

/// Below this many weight bytes (times tokens) a product runs on the calling thread:
/// handing it to the pool would cost more than it saves.
const PARALLEL_MIN_BYTES: usize = 64 * 1024;
/// Never split finer than this, so each task amortizes its scheduling.
const MIN_ROWS_PER_TASK: usize = 16;
/// Activation bytes per token block in `matmul`: a good part of L1 plus L2.
const TOKEN_BLOCK_BYTES: usize = 64 * 1024;
