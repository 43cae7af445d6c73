//! A read-only view of one 2-D weight tensor in any supported storage type.

use ferrox_gguf::GgmlType;

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
        Ok(Self {
            ty,
            rows,
            cols,
            bytes_per_row,
            bytes,
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

    /// Matrix-vector product `y = W·x` (`x` has `cols` values, `y` has `rows`).
    ///
    /// The plain scalar reference: each row is decoded into a scratch buffer and dotted
    /// with `x` in order, accumulating in f32.
    pub fn apply(&self, x: &[f32], y: &mut [f32]) -> Result<(), QuantError> {
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
        let mut row = vec![0f32; self.cols];
        for (i, out) in y.iter_mut().enumerate() {
            self.dequant_row(i, &mut row)?;
            *out = row.iter().zip(x).fold(0.0f32, |acc, (w, v)| acc + w * v);
        }
        Ok(())
    }
}
