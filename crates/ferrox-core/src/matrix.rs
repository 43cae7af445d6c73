//! A read-only view of one 2-D weight tensor in any supported storage type.

use ferrox_gguf::GgmlType;

use rayon::prelude::*;

use crate::kernels::{self, PanelRows, WeightKind, TILE_ROWS};
use crate::packed::{Int8Path, PackedMatrix, Product, GROUP_ROWS, INT8_MIN_TOKENS, MAX_PRODUCTS};
use crate::quant::{self, QuantError};
use crate::work_split;
use smallvec::SmallVec;

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
    /// The same weights repacked at load: products go through it when present.
    packed: Option<&'a PackedMatrix>,
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
            packed: None,
        })
    }

    /// This matrix with its products computed from `packed`, a packed copy of the same
    /// weights (rows and [`Self::dequant_row`] still read the original bytes). Activations
    /// must then be quantized by this view's [`Self::quantize_activation`].
    pub fn with_packed(self, packed: &'a PackedMatrix) -> Result<Self, QuantError> {
        if (packed.ty(), packed.rows(), packed.cols()) != (self.ty, self.rows, self.cols) {
            return Err(QuantError::VectorLength {
                what: "packed matrix rows",
                expected: self.rows,
                actual: packed.rows(),
            });
        }
        Ok(Self {
            activation_row_bytes: packed.activation_row_bytes(),
            packed: Some(packed),
            ..self
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
        if self.cols == 0 {
            return Ok(tokens);
        }
        let quantize = |(src, dst): (&[f32], &mut [u8])| match self.packed {
            Some(packed) => packed.quantize_activation(src, dst),
            None => kernels::quantize_activation(self.vec_dot_type(), src, dst),
        };
        // A prompt's rows are many: quantize them across the pool (a single token's row
        // stays on this thread).
        if tokens >= PARALLEL_QUANTIZE_ROWS {
            x.par_chunks_exact(self.cols)
                .zip(out.par_chunks_exact_mut(self.activation_row_bytes))
                .try_for_each(quantize)?;
        } else {
            x.chunks_exact(self.cols)
                .zip(out.chunks_exact_mut(self.activation_row_bytes))
                .try_for_each(quantize)?;
        }
        Ok(tokens)
    }

    /// `y = W·x` for one activation row `xq` quantized by [`Self::quantize_activation`].
    ///
    /// Rows are split into runs of whole four-row tiles across the current rayon pool;
    /// every output is computed by the same operations whatever the split (and whatever
    /// the row's place in a kernel tile), so results do not depend on the number of
    /// threads. Allocates nothing.
    pub fn matvec(&self, xq: &[u8], y: &mut [f32]) -> Result<(), QuantError> {
        if let Some(packed) = self.packed {
            return packed.matmul(xq, 1, y);
        }
        self.check_product(xq, 1, y)?;
        if self.rows == 0 {
            return Ok(());
        }
        if self.cols == 0 {
            y.fill(0.0);
            return Ok(());
        }
        Self::matvec_one_pass(&[self], xq, &mut [y]);
        Ok(())
    }

    /// One token's products of `parts` sharing `xq` (lengths checked), `outs[i]` each
    /// part's output: every part's rows in one pass over the pool, claimed in runs
    /// ([`work_split`]) of whole groups where a part is packed, of whole four-row tiles
    /// where it is row-major.
    fn matvec_one_pass(parts: &[&WeightMatrix<'_>], xq: &[u8], outs: &mut [&mut [f32]]) {
        let mut sizes: SmallVec<[usize; crate::packed::MAX_PARTS]> = SmallVec::new();
        let mut outputs: SmallVec<[Outputs; crate::packed::MAX_PARTS]> = SmallVec::new();
        let mut work = 0;
        for (part, out) in parts.iter().zip(outs.iter_mut()) {
            // A product with no columns is zero.
            sizes.push(if part.cols == 0 { 0 } else { part.rows });
            if part.cols == 0 {
                out.fill(0.0);
            }
            outputs.push(Outputs {
                ptr: out.as_mut_ptr(),
                len: out.len(),
            });
            work += part.bytes_per_row * part.rows;
        }
        let any_packed = parts.iter().any(|p| p.packed.is_some());
        let granule = if any_packed { GROUP_ROWS } else { TILE_ROWS };
        let widest = parts.iter().map(|p| p.bytes_per_row).max().unwrap_or(1);
        let min_rows = min_claimed_run(work, widest);
        work_split::for_each_run(&sizes, granule, min_rows, |i, rows| {
            let part = parts[i];
            if let Some(packed) = part.packed {
                // SAFETY: runs are disjoint whole groups (packed rows are whole groups), so
                // no output is written twice, and the outputs are not otherwise touched
                // until every run has finished; `xq` and the output were checked.
                unsafe { packed.matvec_rows(rows, xq, &outputs[i]) };
                return;
            }
            let row_bytes = part.bytes_per_row;
            let weights = &part.bytes[rows.start * row_bytes..rows.end * row_bytes];
            let kernel = kernels::best_kernel(part.kind);
            // SAFETY: as above.
            let out = unsafe { outputs[i].rows(rows.start, rows.len()) };
            (kernel.panel1)(weights, PanelRows::dense(weights, row_bytes), [xq], out);
        });
    }

    /// Whether activation rows quantized by `self` serve `other` too: the same columns and
    /// activation layout (both packed alike, or both row-major with one vec-dot type).
    pub fn shares_activations(&self, other: &WeightMatrix<'_>) -> bool {
        self.cols == other.cols
            && match (self.packed, other.packed) {
                (Some(a), Some(b)) => a.shares_activations(b),
                (None, None) => self.vec_dot_type() == other.vec_dot_type(),
                (Some(p), None) => p.row_major_activations() == Some(other.vec_dot_type()),
                (None, Some(p)) => p.row_major_activations() == Some(self.vec_dot_type()),
            }
    }

    /// `outs[i] = parts[i]·X` for matrices that share activations (see
    /// [`Self::shares_activations`]), `xq` quantized by any of them, in one pass over the
    /// pool: one token's products whatever their layouts, several tokens' where all are
    /// packed ([`PackedMatrix::matmul_many`]), others one after the other. Each result is
    /// the one [`Self::matvec`] (one token) or [`Self::matmul`] gives.
    pub fn matmul_many(
        parts: &[&WeightMatrix<'_>],
        xq: &[u8],
        n_tokens: usize,
        outs: &mut [&mut [f32]],
    ) -> Result<(), QuantError> {
        let max = crate::packed::MAX_PARTS;
        let fits = parts.len() <= max && parts.len() == outs.len();
        let shared = parts.iter().all(|p| parts[0].shares_activations(p));
        if n_tokens == 1 && fits && shared {
            for (part, out) in parts.iter().zip(outs.iter()) {
                part.check_product(xq, 1, out)?;
            }
            Self::matvec_one_pass(parts, xq, outs);
            return Ok(());
        }
        if let Some(first) = parts.first().and_then(|p| p.packed) {
            if parts.len() <= max && parts.iter().all(|p| p.packed.is_some()) {
                let mut packed = [first; crate::packed::MAX_PARTS];
                for (slot, p) in packed.iter_mut().zip(parts) {
                    *slot = p.packed.expect("checked above");
                }
                return PackedMatrix::matmul_many(&packed[..parts.len()], xq, n_tokens, outs);
            }
        }
        for (part, out) in parts.iter().zip(outs.iter_mut()) {
            if n_tokens == 1 {
                part.matvec(xq, out)?;
            } else {
                part.matmul(xq, n_tokens, out)?;
            }
        }
        Ok(())
    }

    /// Independent products, each `out = matrix · X` for its own activation rows (quantized
    /// by its matrix): packed matrices in one pass over the pool per [`MAX_PRODUCTS`]
    /// products ([`PackedMatrix::matmul_products`]), so that many small products (a token's
    /// routed experts) enter the pool once, not once each; others one after the other. Each
    /// result is the one [`Self::matmul`] gives. Allocates nothing.
    pub fn matmul_products(products: &mut [MatrixProduct<'_, '_>]) -> Result<(), QuantError> {
        if products.iter().all(|p| p.matrix.packed.is_some()) {
            for chunk in products.chunks_mut(MAX_PRODUCTS) {
                let mut packed: SmallVec<[Product<'_>; MAX_PRODUCTS]> = chunk
                    .iter_mut()
                    .map(|p| Product {
                        matrix: p.matrix.packed.expect("checked above"),
                        xq: p.xq,
                        n_tokens: p.n_tokens,
                        out: &mut *p.out,
                    })
                    .collect();
                PackedMatrix::matmul_products(&mut packed)?;
            }
            return Ok(());
        }
        for p in products.iter_mut() {
            p.matrix.matmul(p.xq, p.n_tokens, p.out)?;
        }
        Ok(())
    }

    /// `Y = W·X` for `n_tokens` activation rows `xq` (back to back, each quantized by
    /// [`Self::quantize_activation`]), with `y` token-major: `y[t * rows + r]`.
    ///
    /// Each output is bit-identical to what [`Self::matvec`] gives for that token alone:
    /// the kernels decode each weight block once for a tile of rows and tokens but apply
    /// exactly the single-token operations to every row and token. Work is split into
    /// contiguous row runs across the rayon pool; within a run, panels of rows small enough
    /// to stay cached are swept against every token, eight tokens per kernel call.
    /// Allocates nothing.
    pub fn matmul(&self, xq: &[u8], n_tokens: usize, y: &mut [f32]) -> Result<(), QuantError> {
        if let Some(packed) = self.packed {
            return packed.matmul(xq, n_tokens, y);
        }
        if n_tokens == 1 {
            return self.matvec(xq, y);
        }
        self.check_product(xq, n_tokens, y)?;
        if self.rows == 0 || n_tokens == 0 {
            return Ok(());
        }
        if self.cols == 0 {
            y.fill(0.0);
            return Ok(());
        }
        if n_tokens >= FLOAT_GEMM_MIN_TOKENS {
            if let Some(gemm) = kernels::best_float_gemm(self.kind) {
                self.matmul_float(gemm, xq, n_tokens, y);
                return Ok(());
            }
        }
        let kernel = kernels::best_kernel(self.kind);
        // A prompt's i-quant rows go through their int8 form by whole groups of rows (the
        // same bits); rows past the last whole group, if any, run here.
        let mut done = 0;
        if n_tokens >= INT8_MIN_TOKENS {
            if let Some(path) =
                Int8Path::for_type(self.ty, self.cols).filter(|path| n_tokens >= path.min_tokens())
            {
                let groups = self.rows / GROUP_ROWS;
                path.matmul(
                    groups,
                    self.rows,
                    self.cols,
                    self.bytes_per_row,
                    self.bytes,
                    xq,
                    n_tokens,
                    y,
                )?;
                done = groups * GROUP_ROWS;
            }
        }
        if done == self.rows {
            return Ok(());
        }
        let chunk = self.rows_per_task(n_tokens);
        let out = Outputs {
            ptr: y.as_mut_ptr(),
            len: y.len(),
        };
        let run = |first: usize| {
            let rows = first..(first + chunk).min(self.rows);
            // SAFETY: tasks get disjoint row ranges, so no output is written twice, and
            // `y` is not otherwise touched until every task has finished.
            unsafe { self.matmul_rows(&kernel, rows, xq, n_tokens, &out) };
        };
        if done > 0 {
            // SAFETY: the int8 path has finished with `y`; these rows are its rest.
            unsafe { self.matmul_rows(&kernel, done..self.rows, xq, n_tokens, &out) };
        } else if chunk >= self.rows {
            run(0);
        } else {
            (0..self.rows.div_ceil(chunk))
                .into_par_iter()
                .for_each(|task| run(task * chunk));
        }
        Ok(())
    }

    /// [`Self::matmul`] for float weights through `gemm`: the activations widened to f32
    /// once, then each task widens a panel of its rows at a time (sized to stay cached)
    /// and sweeps it, tile by tile, against every group of the tile's tokens. The
    /// bits are the row kernel's (see [`kernels::FloatGemm`]). The widened operands live in
    /// per-thread buffers kept between products: nothing is allocated once they have grown.
    fn matmul_float(&self, gemm: kernels::FloatGemm, xq: &[u8], n_tokens: usize, y: &mut [f32]) {
        WIDENED_TOKENS.with(|x| {
            let mut x = x.borrow_mut();
            let len = n_tokens * self.cols;
            if x.len() < len {
                x.resize(len, 0.0);
            }
            self.matmul_float_with(gemm, xq, n_tokens, &mut x[..len], y);
        });
    }

    /// [`Self::matmul_float`] with `x` to hold the widened activations.
    fn matmul_float_with(
        &self,
        gemm: kernels::FloatGemm,
        xq: &[u8],
        n_tokens: usize,
        x: &mut [f32],
        y: &mut [f32],
    ) {
        let cols = self.cols;
        let act = self.activation_row_bytes;
        let widen_tokens = |(t, out): (usize, &mut [f32])| {
            (gemm.widen)(&xq[t * act..(t + 1) * act], out);
        };
        if n_tokens * act >= PARALLEL_MIN_BYTES {
            x.par_chunks_mut(cols).enumerate().for_each(widen_tokens);
        } else {
            x.chunks_mut(cols).enumerate().for_each(widen_tokens);
        }
        let panel_rows = (FLOAT_PANEL_BYTES / (cols * 4)).clamp(TILE_ROWS, MAX_PANEL_ROWS)
            / TILE_ROWS
            * TILE_ROWS;
        let out = Outputs {
            ptr: y.as_mut_ptr(),
            len: y.len(),
        };
        let x = &*x;
        let run = |rows: std::ops::Range<usize>| {
            WIDENED_PANEL.with(|panel| {
                let mut panel = panel.borrow_mut();
                let len = panel_rows.min(rows.len()) * cols;
                if panel.len() < len {
                    panel.resize(len, 0.0);
                }
                self.sweep_panels(gemm, rows, panel_rows, &mut panel[..len], x, n_tokens, &out);
            });
        };
        let chunk = self.rows_per_task(n_tokens);
        if chunk >= self.rows {
            run(0..self.rows);
        } else {
            (0..self.rows.div_ceil(chunk))
                .into_par_iter()
                .for_each(|task| run(task * chunk..((task + 1) * chunk).min(self.rows)));
        }
    }

    /// The rows `rows` of [`Self::matmul_float`], `panel_rows` at a time widened into
    /// `panel`, each swept against every group of tokens of the widened activations `x`.
    #[allow(clippy::too_many_arguments)]
    fn sweep_panels(
        &self,
        gemm: kernels::FloatGemm,
        rows: std::ops::Range<usize>,
        panel_rows: usize,
        panel: &mut [f32],
        x: &[f32],
        n_tokens: usize,
        out: &Outputs,
    ) {
        let cols = self.cols;
        let (tile_rows, tile_tokens) = (gemm.tile_rows, gemm.tile_tokens);
        for first in rows.clone().step_by(panel_rows) {
            let n = panel_rows.min(rows.end - first);
            for (r, widened) in panel.chunks_mut(cols).take(n).enumerate() {
                (gemm.widen)(self.row_bytes(first + r), widened);
            }
            let mut tile: kernels::FloatTile = Default::default();
            for t0 in (0..n_tokens).step_by(tile_tokens) {
                let tokens = tile_tokens.min(n_tokens - t0);
                let xs = &x[t0 * cols..(t0 + tokens) * cols];
                for r0 in (0..n).step_by(tile_rows) {
                    let rows = tile_rows.min(n - r0);
                    let w = &panel[r0 * cols..(r0 + rows) * cols];
                    (gemm.tile)(w, rows, xs, tokens, cols, &mut tile);
                    for (t, values) in (t0..t0 + tokens).zip(0..) {
                        // SAFETY: this task's rows of token `t`, which no other task
                        // touches.
                        let y = unsafe { out.rows(t * self.rows + first + r0, rows) };
                        for (y, row) in y.iter_mut().zip(&tile) {
                            *y = row[values];
                        }
                    }
                }
            }
        }
    }

    /// Rows `rows` against every token, written to `out[t * self.rows + r]`.
    ///
    /// # Safety
    /// No other thread may access those outputs meanwhile.
    unsafe fn matmul_rows(
        &self,
        kernel: &kernels::DotKernel,
        rows: std::ops::Range<usize>,
        xq: &[u8],
        n_tokens: usize,
        out: &Outputs,
    ) {
        let act = self.activation_row_bytes;
        let row_bytes = self.bytes_per_row;
        let panel_rows = (PANEL_BYTES / row_bytes).clamp(4, MAX_PANEL_ROWS) / 4 * 4;
        let mut tile = [0f32; MAX_PANEL_ROWS * 8];
        let token = |t: usize| &xq[t * act..(t + 1) * act];
        // The i-quants' rows cost far more to decode than to multiply: tokens left over take
        // one panel of two (2 left), three (3), four or eight (5-7; the AVX-512 kernels decode
        // a row once for all eight), the last token repeated and its extra outputs dropped,
        // rather than a pass each. An MoE prompt hands most experts that few.
        let pad_remainder = Int8Path::for_type(self.ty, self.cols).is_some();
        for first in rows.clone().step_by(panel_rows) {
            let n = panel_rows.min(rows.end - first);
            let weights = &self.bytes[first * row_bytes..(first + n) * row_bytes];
            let rows = PanelRows::dense(weights, row_bytes);
            // Tokens `t0..t0 + count` of a tile of `width` tokens per row.
            let scatter = |t0: usize, (count, width): (usize, usize), tile: &[f32]| {
                for k in 0..count {
                    // SAFETY: this task's rows of token `t0 + k` (bounds checked by
                    // `rows`), which no other task touches.
                    let y = unsafe { out.rows((t0 + k) * self.rows + first, n) };
                    for (y, values) in y.iter_mut().zip(tile.chunks_exact(width)) {
                        *y = values[k];
                    }
                }
            };
            // Tokens `t..t + count` through a panel of `W` tokens (the last one repeated
            // to fill it), scattered to their outputs.
            fn pass<'x, const W: usize>(
                panel: kernels::PanelFn<W>,
                (weights, rows): (&[u8], PanelRows),
                (t, count): (usize, usize),
                token: impl Fn(usize) -> &'x [u8],
                tile: &mut [f32],
                scatter: impl Fn(usize, (usize, usize), &[f32]),
            ) {
                let tile = &mut tile[..W * rows.count];
                panel(
                    weights,
                    rows,
                    std::array::from_fn(|i| token(t + i.min(count - 1))),
                    tile,
                );
                scatter(t, (count, W), tile);
            }
            let mut t = 0;
            while t < n_tokens {
                let left = n_tokens - t;
                let at = (weights, rows);
                let count = if left >= 8 || (pad_remainder && left >= 5) {
                    let count = left.min(8);
                    pass(kernel.panel8, at, (t, count), token, &mut tile, scatter);
                    count
                } else if left >= 4 {
                    pass(kernel.panel4, at, (t, 4), token, &mut tile, scatter);
                    4
                } else if pad_remainder && left == 3 {
                    pass(kernel.panel3, at, (t, 3), token, &mut tile, scatter);
                    3
                } else if pad_remainder && left == 2 {
                    pass(kernel.panel2, at, (t, 2), token, &mut tile, scatter);
                    2
                } else {
                    pass(kernel.panel1, at, (t, 1), token, &mut tile, scatter);
                    1
                };
                t += count;
            }
        }
    }

    /// Rows per parallel task of a product of several tokens (one token's are claimed, see
    /// [`Self::matvec`]): contiguous runs of equal bytes, a multiple of the kernels'
    /// four-row tiles, at least four tasks per thread so that uneven progress (other
    /// processes taking a core) balances by work stealing, no finer than
    /// [`MIN_TASK_WORK`] bytes of weights times tokens and at least [`MIN_MATMUL_ROWS`]
    /// rows, so that each sweeps its activations against a panel of rows, not a single
    /// tile.
    fn rows_per_task(&self, n_tokens: usize) -> usize {
        let threads = rayon::current_num_threads();
        if threads <= 1 {
            return self.rows;
        }
        let work_per_row = (self.bytes_per_row * n_tokens).max(1);
        let total = work_per_row * self.rows;
        if total < PARALLEL_MIN_BYTES {
            return self.rows;
        }
        let by_threads = self.rows.div_ceil(4 * threads);
        let floor = MIN_TASK_WORK.div_ceil(work_per_row);
        by_threads
            .max(floor)
            .max(MIN_MATMUL_ROWS)
            .next_multiple_of(4)
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

/// Activation rows from which quantizing them is spread across the pool.
const PARALLEL_QUANTIZE_ROWS: usize = 4;
/// Below this many weight bytes (times tokens) a product runs on the calling thread:
/// handing it to the pool would cost more than it saves.
pub(crate) const PARALLEL_MIN_BYTES: usize = 64 * 1024;
/// Never split finer than this many weight bytes (times tokens) per task.
const MIN_TASK_WORK: usize = 16 * 1024;

/// The shortest run, in units of `unit_bytes` weight bytes (times tokens), in which a
/// product of `work` such bytes is claimed ([`work_split`]): all of it below
/// [`PARALLEL_MIN_BYTES`] (one thread does it: the pool would cost more), else
/// [`MIN_TASK_WORK`] worth.
pub(crate) fn min_claimed_run(work: usize, unit_bytes: usize) -> usize {
    if work < PARALLEL_MIN_BYTES {
        usize::MAX / 2
    } else {
        MIN_TASK_WORK.div_ceil(unit_bytes.max(1))
    }
}
/// Rows per task of a matrix product, at least.
const MIN_MATMUL_ROWS: usize = 32;
/// Weight bytes of a panel of rows in `matmul`, swept against every token while cached.
const PANEL_BYTES: usize = 128 * 1024;
thread_local! {
    /// The widened activations of [`WeightMatrix::matmul_float`] on the calling thread,
    /// kept for the next product (decoding allocates nothing once warm).
    static WIDENED_TOKENS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// A task's panel of widened weight rows, kept likewise.
    static WIDENED_PANEL: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// From this many tokens a float-weight product goes through widened operands
/// ([`kernels::FloatGemm`]) where the instruction set has them.
const FLOAT_GEMM_MIN_TOKENS: usize = 4;
/// Bytes of a panel of widened float rows, swept against every token while cached.
const FLOAT_PANEL_BYTES: usize = 384 * 1024;
/// At most this many rows per panel (the stack tile holds eight tokens of each).
const MAX_PANEL_ROWS: usize = 256;

/// One product of [`WeightMatrix::matmul_products`]: `out = matrix · X` for `n_tokens`
/// activation rows `xq` quantized by `matrix`, `out` token-major.
pub struct MatrixProduct<'m, 'a> {
    pub matrix: &'m WeightMatrix<'a>,
    pub xq: &'m [u8],
    pub n_tokens: usize,
    pub out: &'m mut [f32],
}

/// `y` as the tasks of one product write it, each to its own rows (also the packed
/// products', `crate::packed`).
pub(crate) struct Outputs {
    pub(crate) ptr: *mut f32,
    pub(crate) len: usize,
}

// SAFETY: tasks write disjoint elements (see `matmul`).
unsafe impl Sync for Outputs {}

impl Outputs {
    /// Elements `start..start + len`.
    ///
    /// # Safety
    /// No other thread accesses them while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn rows(&self, start: usize, len: usize) -> &mut [f32] {
        assert!(start + len <= self.len, "outputs {start}.. out of range");
        // SAFETY: in bounds; exclusive per the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}
