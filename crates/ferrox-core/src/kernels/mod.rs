//! Dot products of weight rows with activation rows, the inner loop of every matrix
//! product.
//!
//! As in ggml, the activation is first quantized to the weight type's *vec-dot type*
//! ([`vec_dot_type`]: Q8_0, Q8_1, Q8_K, or the float type itself), so the products are
//! integer sums per block with one float scaling per block. Each pair has a scalar
//! reference following ggml's `_generic` C code and, on x86-64, an AVX2+FMA+F16C version
//! whose float accumulation order follows ggml's own AVX2 kernels, so that our results
//! match llama.cpp's on the same machine bit for bit where that is cheap. Where the CPU has
//! AVX-512 with VNNI, the types that dominate quantized models (Q4_0, Q5_0, Q8_0, Q4_K,
//! Q6_K) have kernels that compute the same integer lane sums with `vpdpbusd` and then the
//! AVX2 kernels' float operations in the same order, two rows per 512-bit register: the
//! same bits, faster. (Faster still, and used by the engines wherever AVX2 is, are the
//! repacked layouts of [`crate::packed`].) The i-quants (IQ1-IQ3) are the exception: every
//! kernel computes ggml's generic arithmetic from their exact integer form
//! ([`crate::quant::int8`]), so that their prompt path through int8 panels gives the
//! single-token bits.
//!
//! The best kernel set is picked once per process ([`best_isa`]) and kept in a table of
//! function pointers. Matrix products call *panels*: a run of weight rows against 1, 4 or
//! 8 activation rows at once, so that each weight block is decoded once per tile of rows
//! and tokens, while every output is computed with exactly the operations of the
//! single-row, single-token call (batch invariance).

mod activation;
mod dot_float;
mod dot_iq;
mod dot_kquants;
mod dot_legacy;
pub mod prefetch;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

use std::sync::OnceLock;

use ferrox_gguf::GgmlType;

use crate::quant::{self, QuantError};

pub use activation::{quantize_activation, quantize_activation_with};

/// The instruction sets kernels exist for, from the most portable up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust following ggml's `_generic` reference arithmetic.
    Scalar,
    /// x86-64 AVX2 with FMA and F16C, following ggml's AVX2 kernels.
    Avx2,
    /// x86-64 AVX-512 (F, BW, VL, DQ) with VNNI, on top of AVX2/FMA/F16C: several weight
    /// rows per pass, integer sums by `vpdpbusd`. Its results are bit-identical to the
    /// AVX2 kernels' (the same integer lane sums, the same float operations in the same
    /// order per output); types without a kernel of their own use the AVX2 ones.
    Avx512Vnni,
}

impl Isa {
    /// Every instruction set, from the most portable up.
    pub const ALL: [Isa; 3] = [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni];

    /// Whether this machine can run kernels for `self` (detected once).
    pub fn is_available(self) -> bool {
        static AVAILABLE: OnceLock<[bool; 3]> = OnceLock::new();
        AVAILABLE.get_or_init(|| {
            let avx2 = avx2_detected();
            [true, avx2, avx2 && avx512_vnni_detected()]
        })[self as usize]
    }

    /// Whether `self` includes AVX2, FMA and F16C (so AVX2 code may run where it is
    /// available).
    pub fn has_avx2(self) -> bool {
        matches!(self, Isa::Avx2 | Isa::Avx512Vnni)
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_detected() -> bool {
    x86::avx2_detected()
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_detected() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
fn avx512_vnni_detected() -> bool {
    x86::avx512_vnni_detected()
}

#[cfg(not(target_arch = "x86_64"))]
fn avx512_vnni_detected() -> bool {
    false
}

/// The fastest instruction set available here, detected once. Setting the environment
/// variable `FERROX_ISA` to `scalar`, `avx2` or `avx512vnni` caps it (for comparing
/// kernels end to end; a level the machine lacks is ignored).
pub fn best_isa() -> Isa {
    static BEST: OnceLock<Isa> = OnceLock::new();
    *BEST.get_or_init(|| {
        let cap = std::env::var("FERROX_ISA").ok().and_then(|v| {
            Isa::ALL
                .into_iter()
                .find(|isa| format!("{isa:?}").eq_ignore_ascii_case(v.trim()))
        });
        let allowed = |isa: Isa| cap.is_none_or(|cap| isa as usize <= cap as usize);
        Isa::ALL
            .into_iter()
            .rev()
            .find(|&isa| isa.is_available() && allowed(isa))
            .unwrap_or(Isa::Scalar)
    })
}

/// The activation type ggml quantizes the input to before a product with weights of type
/// `ty` (`type_traits_cpu[ty].vec_dot_type`), or `None` when we have no kernel for `ty`.
pub fn vec_dot_type(ty: GgmlType) -> Option<GgmlType> {
    WeightKind::of(ty).map(WeightKind::vec_dot_type)
}

/// Whether a dot-product kernel for weights of type `ty` exists for `isa` (on any machine).
pub fn has_kernel(ty: GgmlType, isa: Isa) -> bool {
    WeightKind::of(ty).is_some_and(|kind| kernel_for(kind, isa).is_some())
}

/// Dot product of one weight row `w` (whole blocks of `ty`) with one activation row `x`
/// already quantized to [`vec_dot_type`]`(ty)`, using the kernel matrix products use (the
/// best instruction set's, or the next best for types it lacks).
pub fn vec_dot(ty: GgmlType, w: &[u8], x: &[u8]) -> Result<f32, QuantError> {
    let kind = WeightKind::of(ty).ok_or(QuantError::UnsupportedDot(ty))?;
    let cols = elements_in(ty, w.len())?;
    check_activation_len(kind, cols, x.len())?;
    Ok((best_kernel(kind).one)(w, [x])[0])
}

/// [`vec_dot`] with an explicit instruction set, for comparing kernels.
pub fn vec_dot_with(isa: Isa, ty: GgmlType, w: &[u8], x: &[u8]) -> Result<f32, QuantError> {
    let kind = WeightKind::of(ty).ok_or(QuantError::UnsupportedDot(ty))?;
    if !isa.is_available() {
        return Err(QuantError::IsaUnavailable(isa));
    }
    let kernel = kernel_for(kind, isa).ok_or(QuantError::UnsupportedDot(ty))?;
    let cols = elements_in(ty, w.len())?;
    check_activation_len(kind, cols, x.len())?;
    Ok((kernel.one)(w, [x])[0])
}

/// The dot-product kernel of one row type and length, looked up and checked once for many
/// rows (attention's scores against cached keys): [`vec_dot`] without the per-call work.
#[derive(Clone, Copy)]
pub struct RowDot {
    one: DotFn<1>,
    panel4: PanelFn<4>,
    panel8: PanelFn<8>,
    dot_ty: GgmlType,
    row_bytes: usize,
    activation_bytes: usize,
}

impl RowDot {
    /// The kernel matrix products use for rows of `values` values of `ty`.
    pub fn new(ty: GgmlType, values: usize) -> Result<RowDot, QuantError> {
        RowDot::with_isa(best_isa(), ty, values)
    }

    /// `isa`'s kernel (the next best where it has none) for rows of `values` values of `ty`.
    pub fn with_isa(isa: Isa, ty: GgmlType, values: usize) -> Result<RowDot, QuantError> {
        let kind = WeightKind::of(ty).ok_or(QuantError::UnsupportedDot(ty))?;
        if !isa.is_available() {
            return Err(QuantError::IsaUnavailable(isa));
        }
        let kernel = kernel_at_most(kind, isa);
        let dot_ty = kind.vec_dot_type();
        Ok(RowDot {
            one: kernel.one,
            panel4: kernel.panel4,
            panel8: kernel.panel8,
            dot_ty,
            row_bytes: quant::row_byte_len(ty, values)?,
            activation_bytes: quant::row_byte_len(dot_ty, values)?,
        })
    }

    /// The type activations are quantized to ([`vec_dot_type`]).
    pub fn vec_dot_type(&self) -> GgmlType {
        self.dot_ty
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Bytes of one activation.
    pub fn activation_bytes(&self) -> usize {
        self.activation_bytes
    }

    /// The row `w` times the activation `x`.
    ///
    /// # Panics
    /// When `w` or `x` is not of the length this kernel was made for.
    #[inline]
    pub fn dot(&self, w: &[u8], x: &[u8]) -> f32 {
        self.check(w, x);
        (self.one)(w, [x])[0]
    }

    /// `out.len() / 4` rows, row `r` at `rows[r * stride..]` (this kernel's length each),
    /// times four activations: `out[r * 4 + t]` is row `r` times `xs[t]`, exactly the bits
    /// [`dot`](Self::dot) gives (each row is decoded once for all four where the kernel can).
    ///
    /// # Panics
    /// When a length does not fit this kernel, the rows overlap or do not lie inside
    /// `rows`, or `out` does not hold four values per row.
    #[inline]
    pub fn panel4(&self, (rows, stride): (&[u8], usize), xs: [&[u8]; 4], out: &mut [f32]) {
        let layout = self.check_panel((rows, stride), &xs, out);
        (self.panel4)(rows, layout, xs, out);
    }

    /// [`panel4`](Self::panel4) with eight activations: `out[r * 8 + t]`.
    #[inline]
    pub fn panel8(&self, (rows, stride): (&[u8], usize), xs: [&[u8]; 8], out: &mut [f32]) {
        let layout = self.check_panel((rows, stride), &xs, out);
        (self.panel8)(rows, layout, xs, out);
    }

    #[inline]
    fn check_panel(&self, (rows, stride): (&[u8], usize), xs: &[&[u8]], out: &[f32]) -> PanelRows {
        let layout = PanelRows {
            count: out.len() / xs.len().max(1),
            stride,
            bytes: self.row_bytes,
        };
        assert!(
            stride >= self.row_bytes
                && rows.len() >= layout.span()
                && out.len() == layout.count * xs.len(),
            "{} rows of {} bytes at a stride of {} in {} bytes with {} outputs for {} activations",
            layout.count,
            self.row_bytes,
            stride,
            rows.len(),
            out.len(),
            xs.len()
        );
        if let Some(row) = rows.get(..self.row_bytes) {
            xs.iter().for_each(|x| self.check(row, x));
        }
        layout
    }

    #[inline]
    fn check(&self, w: &[u8], x: &[u8]) {
        assert!(
            w.len() == self.row_bytes && x.len() == self.activation_bytes,
            "a row of {} bytes against an activation of {}: this kernel pairs {} with {}",
            w.len(),
            x.len(),
            self.row_bytes,
            self.activation_bytes
        );
    }
}

/// Rows of `w` (each `row_bytes` bytes, whole blocks of `ty`) against the activation rows
/// `xs`, through `isa`'s panel kernels as matrix products use them (eight tokens per call,
/// then four, then one): `out[r * xs.len() + t]`. For comparing kernels.
pub fn panel_dot_with(
    isa: Isa,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    xs: &[&[u8]],
    out: &mut [f32],
) -> Result<(), QuantError> {
    let kind = WeightKind::of(ty).ok_or(QuantError::UnsupportedDot(ty))?;
    if !isa.is_available() {
        return Err(QuantError::IsaUnavailable(isa));
    }
    let kernel = kernel_for(kind, isa).ok_or(QuantError::UnsupportedDot(ty))?;
    let cols = elements_in(ty, row_bytes)?;
    let rows = w.len().checked_div(row_bytes).unwrap_or(0);
    if rows * row_bytes != w.len() || cols == 0 {
        return Err(QuantError::ByteLength {
            ty,
            elements: rows * cols,
            expected: rows * row_bytes,
            actual: w.len(),
        });
    }
    for x in xs {
        check_activation_len(kind, cols, x.len())?;
    }
    let n = xs.len();
    if out.len() != rows * n {
        return Err(QuantError::VectorLength {
            what: "panel output",
            expected: rows * n,
            actual: out.len(),
        });
    }
    let layout = PanelRows::dense(w, row_bytes);
    let mut tile = vec![0f32; rows * 8];
    let mut t = 0;
    while t < n {
        let width = match n - t {
            8.. => 8,
            4.. => 4,
            _ => 1,
        };
        let tile = &mut tile[..rows * width];
        match width {
            8 => (kernel.panel8)(w, layout, std::array::from_fn(|i| xs[t + i]), tile),
            4 => (kernel.panel4)(w, layout, std::array::from_fn(|i| xs[t + i]), tile),
            _ => (kernel.panel1)(w, layout, [xs[t]], tile),
        }
        for (r, values) in tile.chunks_exact(width).enumerate() {
            out[r * n + t..r * n + t + width].copy_from_slice(values);
        }
        t += width;
    }
    Ok(())
}

/// Values in `bytes` bytes of `ty`, which must be whole blocks.
pub(crate) fn elements_in(ty: GgmlType, bytes: usize) -> Result<usize, QuantError> {
    let (block_elems, block_bytes) = quant::block_geometry(ty)?;
    if !bytes.is_multiple_of(block_bytes) {
        return Err(QuantError::ByteLength {
            ty,
            elements: bytes / block_bytes * block_elems,
            expected: bytes / block_bytes * block_bytes,
            actual: bytes,
        });
    }
    Ok(bytes / block_bytes * block_elems)
}

fn check_activation_len(kind: WeightKind, cols: usize, actual: usize) -> Result<(), QuantError> {
    let dot_ty = kind.vec_dot_type();
    let expected = quant::row_byte_len(dot_ty, cols)?;
    if actual != expected {
        return Err(QuantError::ByteLength {
            ty: dot_ty,
            elements: cols,
            expected,
            actual,
        });
    }
    Ok(())
}

/// One weight row against `N` activation rows of the matching vec-dot type. Callers
/// guarantee the lengths: the weight row is whole blocks and every activation row holds
/// exactly as many values.
pub(crate) type DotFn<const N: usize> = fn(&[u8], [&[u8]; N]) -> [f32; N];

/// A panel of weight rows against `N` activation rows: `w` holds the rows where
/// [`PanelRows`] says, and `out[r * N + t]` receives row `r` times `xs[t]`. Callers
/// guarantee the lengths (`out` holds exactly `N` values per row).
pub(crate) type PanelFn<const N: usize> = fn(&[u8], PanelRows, [&[u8]; N], &mut [f32]);

/// Where a panel's rows lie in its bytes: `count` rows of `bytes` bytes (whole blocks),
/// row `r` at `r · stride` (cached keys of several heads lie interleaved, read in place).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PanelRows {
    pub(crate) count: usize,
    pub(crate) stride: usize,
    pub(crate) bytes: usize,
}

impl PanelRows {
    /// Consecutive rows of `row_bytes` filling `w`.
    pub(crate) fn dense(w: &[u8], row_bytes: usize) -> PanelRows {
        PanelRows {
            count: w.len().checked_div(row_bytes).unwrap_or(0),
            stride: row_bytes,
            bytes: row_bytes,
        }
    }

    /// Bytes from the first row's start to the last row's end.
    pub(crate) fn span(&self) -> usize {
        self.count
            .checked_sub(1)
            .map_or(0, |last| last * self.stride + self.bytes)
    }

    /// Row `r` of `w`.
    #[inline(always)]
    pub(crate) fn row<'a>(&self, w: &'a [u8], r: usize) -> &'a [u8] {
        &w[r * self.stride..][..self.bytes]
    }
}

/// The kernels for one weight type on one instruction set. Every panel output is exactly
/// the bits `one` gives for that row and activation alone, whatever the panel's size and
/// the row's place in it: that is what makes matrix products batch-invariant.
#[derive(Clone, Copy)]
pub(crate) struct DotKernel {
    pub(crate) one: DotFn<1>,
    pub(crate) panel1: PanelFn<1>,
    /// Two and three tokens: an i-quant product's leftovers (see `QuantMatrix::matmul_rows`).
    pub(crate) panel2: PanelFn<2>,
    pub(crate) panel3: PanelFn<3>,
    pub(crate) panel4: PanelFn<4>,
    pub(crate) panel8: PanelFn<8>,
}

/// A kernel computing one weight row against `N` activation rows at a time (`N` = 1, 2 and
/// 4 are used, and 8 where [`RowKernel::EIGHT_AT_ONCE`]); panels are built from it row by
/// row.
pub(crate) trait RowKernel {
    fn dot<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N];

    /// Whether [`Self::dot`] takes eight activation rows at once as well as it takes four
    /// (the row is decoded once for all eight); otherwise panels of eight run as two of four.
    const EIGHT_AT_ONCE: bool = false;
}

/// The panels of a [`RowKernel`]: each row against the activations eight at a time where
/// the kernel takes eight, two or three at a time in a panel of that many, else four at a
/// time, then one at a time.
pub(crate) fn row_kernel_entry<K: RowKernel>() -> DotKernel {
    fn one<K: RowKernel>(w: &[u8], xs: [&[u8]; 1]) -> [f32; 1] {
        K::dot(w, xs)
    }
    fn panel<K: RowKernel, const N: usize>(
        w: &[u8],
        rows: PanelRows,
        xs: [&[u8]; N],
        out: &mut [f32],
    ) {
        let rows = (0..rows.count).map(|r| rows.row(w, r));
        for (row, out) in rows.zip(out.chunks_exact_mut(N)) {
            if N == 2 || N == 3 || (N == 8 && K::EIGHT_AT_ONCE) {
                out.copy_from_slice(&K::dot(row, xs));
                continue;
            }
            let mut quads = xs.chunks_exact(4);
            let mut at = 0;
            for quad in &mut quads {
                let quad: [&[u8]; 4] = std::array::from_fn(|i| quad[i]);
                out[at..at + 4].copy_from_slice(&K::dot(row, quad));
                at += 4;
            }
            for x in quads.remainder() {
                out[at] = K::dot(row, [*x])[0];
                at += 1;
            }
        }
    }
    DotKernel {
        one: one::<K>,
        panel1: panel::<K, 1>,
        panel2: panel::<K, 2>,
        panel3: panel::<K, 3>,
        panel4: panel::<K, 4>,
        panel8: panel::<K, 8>,
    }
}

/// Most weight rows per tile of [`FloatGemm::tile`].
pub(crate) const TILE_ROWS: usize = 4;
/// Most activation rows per tile of [`FloatGemm::tile`].
pub(crate) const TILE_TOKENS: usize = 3;
/// One tile's outputs, `[row][token]`.
pub(crate) type FloatTile = [[f32; TILE_TOKENS]; TILE_ROWS];

/// Matrix products of float weights (F32, F16, BF16) through widened operands: rows of
/// the type (weights and activations alike) widened to f32 once, then products by tiles
/// of `tile_rows` weight rows and `tile_tokens` activation rows (at most [`TILE_ROWS`]
/// and [`TILE_TOKENS`]). Every output has exactly the bits the row kernel gives for that
/// row and activation.
#[derive(Clone, Copy)]
pub(crate) struct FloatGemm {
    /// Widens a row of the type's values to f32.
    pub(crate) widen: fn(&[u8], &mut [f32]),
    /// `(w, rows, x, tokens, cols, out)`: `out[r][t]` = widened weight row `r` · widened
    /// activation row `t`, rows of `cols` values back to back.
    /// `rows` must be `tile_rows` but for the last tile of a panel (fewer), `tokens`
    /// likewise.
    pub(crate) tile: fn(&[f32], usize, &[f32], usize, usize, &mut FloatTile),
    pub(crate) tile_rows: usize,
    pub(crate) tile_tokens: usize,
}

/// The tiled float products for `kind` on the best instruction set, if it has them.
pub(crate) fn best_float_gemm(kind: WeightKind) -> Option<FloatGemm> {
    float_gemm_for(kind, best_isa())
}

/// `isa`'s tiled float products for `kind`, if it has them.
pub(crate) fn float_gemm_for(kind: WeightKind, isa: Isa) -> Option<FloatGemm> {
    if !isa.is_available() {
        return None;
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => x86::avx512_float_gemm(kind),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::avx2_float_gemm(kind),
        _ => None,
    }
}

/// The weight types we have kernels for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WeightKind {
    F32,
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Iq4Nl,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Iq4Xs,
    Mxfp4,
    Tq2_0,
    Tq1_0,
    Nvfp4,
    Q1_0,
    Q2_0,
    Iq3Xxs,
    Iq3S,
    Iq1S,
    Iq1M,
    Iq2Xxs,
    Iq2Xs,
    Iq2S,
}

impl WeightKind {
    const ALL: [WeightKind; 28] = [
        WeightKind::F32,
        WeightKind::F16,
        WeightKind::Bf16,
        WeightKind::Q4_0,
        WeightKind::Q4_1,
        WeightKind::Q5_0,
        WeightKind::Q5_1,
        WeightKind::Q8_0,
        WeightKind::Iq4Nl,
        WeightKind::Q2K,
        WeightKind::Q3K,
        WeightKind::Q4K,
        WeightKind::Q5K,
        WeightKind::Q6K,
        WeightKind::Iq4Xs,
        WeightKind::Mxfp4,
        WeightKind::Tq2_0,
        WeightKind::Tq1_0,
        WeightKind::Nvfp4,
        WeightKind::Q1_0,
        WeightKind::Q2_0,
        WeightKind::Iq3Xxs,
        WeightKind::Iq3S,
        WeightKind::Iq1S,
        WeightKind::Iq1M,
        WeightKind::Iq2Xxs,
        WeightKind::Iq2Xs,
        WeightKind::Iq2S,
    ];

    pub(crate) fn of(ty: GgmlType) -> Option<Self> {
        use GgmlType as T;
        Some(match ty {
            T::F32 => Self::F32,
            T::F16 => Self::F16,
            T::Bf16 => Self::Bf16,
            T::Q4_0 => Self::Q4_0,
            T::Q4_1 => Self::Q4_1,
            T::Q5_0 => Self::Q5_0,
            T::Q5_1 => Self::Q5_1,
            T::Q8_0 => Self::Q8_0,
            T::Iq4Nl => Self::Iq4Nl,
            T::Q2K => Self::Q2K,
            T::Q3K => Self::Q3K,
            T::Q4K => Self::Q4K,
            T::Q5K => Self::Q5K,
            T::Q6K => Self::Q6K,
            T::Iq4Xs => Self::Iq4Xs,
            T::Mxfp4 => Self::Mxfp4,
            T::Tq2_0 => Self::Tq2_0,
            T::Tq1_0 => Self::Tq1_0,
            T::Nvfp4 => Self::Nvfp4,
            T::Q1_0 => Self::Q1_0,
            T::Q2_0 => Self::Q2_0,
            T::Iq3Xxs => Self::Iq3Xxs,
            T::Iq3S => Self::Iq3S,
            T::Iq1S => Self::Iq1S,
            T::Iq1M => Self::Iq1M,
            T::Iq2Xxs => Self::Iq2Xxs,
            T::Iq2Xs => Self::Iq2Xs,
            T::Iq2S => Self::Iq2S,
            _ => return None,
        })
    }

    pub(crate) fn vec_dot_type(self) -> GgmlType {
        use WeightKind as K;
        match self {
            K::F32 => GgmlType::F32,
            K::F16 => GgmlType::F16,
            K::Bf16 => GgmlType::Bf16,
            K::Q4_0 | K::Q5_0 | K::Q8_0 | K::Iq4Nl | K::Mxfp4 | K::Nvfp4 | K::Q1_0 | K::Q2_0 => {
                GgmlType::Q8_0
            }
            K::Q4_1 | K::Q5_1 => GgmlType::Q8_1,
            K::Q2K | K::Q3K | K::Q4K | K::Q5K | K::Q6K | K::Iq4Xs | K::Tq2_0 | K::Tq1_0 => {
                GgmlType::Q8K
            }
            K::Iq1S | K::Iq1M | K::Iq2Xxs | K::Iq2Xs | K::Iq2S | K::Iq3Xxs | K::Iq3S => {
                GgmlType::Q8K
            }
        }
    }
}

fn kernel_for(kind: WeightKind, isa: Isa) -> Option<DotKernel> {
    match isa {
        Isa::Scalar => Some(scalar_kernel(kind)),
        Isa::Avx2 => avx2_kernel(kind),
        Isa::Avx512Vnni => avx512_vnni_kernel(kind),
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_kernel(kind: WeightKind) -> Option<DotKernel> {
    x86::avx2_kernel(kind)
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_kernel(_kind: WeightKind) -> Option<DotKernel> {
    None
}

#[cfg(target_arch = "x86_64")]
fn avx512_vnni_kernel(kind: WeightKind) -> Option<DotKernel> {
    x86::avx512_vnni_kernel(kind)
}

#[cfg(not(target_arch = "x86_64"))]
fn avx512_vnni_kernel(_kind: WeightKind) -> Option<DotKernel> {
    None
}

fn scalar_kernel(kind: WeightKind) -> DotKernel {
    use WeightKind as K;
    match kind {
        K::F32 => scalar_entry::<dot_float::F32Dot>(),
        K::F16 => scalar_entry::<dot_float::F16Dot>(),
        K::Bf16 => scalar_entry::<dot_float::Bf16Dot>(),
        K::Q4_0 => scalar_entry::<quant::legacy::Q4_0>(),
        K::Q4_1 => scalar_entry::<quant::legacy::Q4_1>(),
        K::Q5_0 => scalar_entry::<quant::legacy::Q5_0>(),
        K::Q5_1 => scalar_entry::<quant::legacy::Q5_1>(),
        K::Q8_0 => scalar_entry::<quant::legacy::Q8_0>(),
        K::Iq4Nl => scalar_entry::<quant::iq4::Iq4Nl>(),
        K::Q2K => scalar_entry::<quant::kquants::Q2K>(),
        K::Q3K => scalar_entry::<quant::kquants::Q3K>(),
        K::Q4K => scalar_entry::<quant::kquants::Q4K>(),
        K::Q5K => scalar_entry::<quant::kquants::Q5K>(),
        K::Q6K => scalar_entry::<quant::kquants::Q6K>(),
        K::Iq4Xs => scalar_entry::<quant::iq4::Iq4Xs>(),
        K::Mxfp4 => scalar_entry::<quant::fp4::Mxfp4>(),
        K::Tq2_0 => scalar_entry::<quant::ternary::Tq2_0>(),
        K::Tq1_0 => scalar_entry::<quant::ternary::Tq1_0>(),
        K::Nvfp4 => scalar_entry::<quant::fp4::Nvfp4>(),
        K::Q1_0 => scalar_entry::<quant::low_bit::Q1_0>(),
        K::Q2_0 => scalar_entry::<quant::low_bit::Q2_0>(),
        K::Iq3Xxs => scalar_entry::<quant::iq3::Iq3Xxs>(),
        K::Iq3S => scalar_entry::<quant::iq3::Iq3S>(),
        K::Iq1S => scalar_entry::<quant::iq1::Iq1S>(),
        K::Iq1M => scalar_entry::<quant::iq1::Iq1M>(),
        K::Iq2Xxs => scalar_entry::<quant::iq2::Iq2Xxs>(),
        K::Iq2Xs => scalar_entry::<quant::iq2::Iq2Xs>(),
        K::Iq2S => scalar_entry::<quant::iq2::Iq2S>(),
    }
}

/// A scalar reference dot product: one weight row with one activation row.
pub(crate) trait ScalarDot {
    fn dot(w: &[u8], x: &[u8]) -> f32;
}

struct ScalarRows<S>(std::marker::PhantomData<S>);

impl<S: ScalarDot> RowKernel for ScalarRows<S> {
    fn dot<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
        xs.map(|x| S::dot(w, x))
    }
}

fn scalar_entry<S: ScalarDot>() -> DotKernel {
    row_kernel_entry::<ScalarRows<S>>()
}

/// The kernels matrix products use: the best instruction set's, falling back to the next
/// best for types it lacks, down to scalar. Built once.
pub(crate) fn best_kernel(kind: WeightKind) -> DotKernel {
    static TABLE: OnceLock<Vec<DotKernel>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let best = best_isa();
        WeightKind::ALL
            .iter()
            .map(|&k| kernel_at_most(k, best))
            .collect()
    });
    table[kind as usize]
}

/// `isa`'s kernels for `kind`, or the next best instruction set's where it has none.
fn kernel_at_most(kind: WeightKind, isa: Isa) -> DotKernel {
    Isa::ALL
        .into_iter()
        .rev()
        .filter(|&i| i as usize <= isa as usize)
        .find_map(|i| kernel_for(kind, i))
        .unwrap_or_else(|| scalar_kernel(kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_listed_in_discriminant_order() {
        for (i, kind) in WeightKind::ALL.iter().enumerate() {
            assert_eq!(*kind as usize, i);
        }
    }

    #[test]
    fn vec_dot_types_follow_ggml() {
        assert_eq!(vec_dot_type(GgmlType::Q4_0), Some(GgmlType::Q8_0));
        assert_eq!(vec_dot_type(GgmlType::Q5_1), Some(GgmlType::Q8_1));
        assert_eq!(vec_dot_type(GgmlType::Iq4Nl), Some(GgmlType::Q8_0));
        assert_eq!(vec_dot_type(GgmlType::Iq4Xs), Some(GgmlType::Q8K));
        assert_eq!(vec_dot_type(GgmlType::Bf16), Some(GgmlType::Bf16));
        assert_eq!(vec_dot_type(GgmlType::Q8K), None);
        assert_eq!(vec_dot_type(GgmlType::Tq1_0), Some(GgmlType::Q8K));
        assert_eq!(vec_dot_type(GgmlType::Nvfp4), Some(GgmlType::Q8_0));
        assert_eq!(vec_dot_type(GgmlType::Q1_0), Some(GgmlType::Q8_0));
        assert_eq!(vec_dot_type(GgmlType::Q2_0), Some(GgmlType::Q8_0));
        assert_eq!(vec_dot_type(GgmlType::Iq2Xxs), Some(GgmlType::Q8K));
        assert_eq!(vec_dot_type(GgmlType::I8), None);
    }

    #[test]
    fn vec_dot_rejects_bad_lengths() {
        let w = [0u8; 34];
        let x = [0u8; 34];
        assert_eq!(vec_dot(GgmlType::Q8_0, &w, &x), Ok(0.0));
        assert!(matches!(
            vec_dot(GgmlType::Q8_0, &w[..33], &x),
            Err(QuantError::ByteLength { .. })
        ));
        assert!(matches!(
            vec_dot(GgmlType::Q8_0, &w, &x[..33]),
            Err(QuantError::ByteLength { .. })
        ));
        assert!(matches!(
            vec_dot(GgmlType::Q4_1, &w[..20], &x),
            Err(QuantError::ByteLength { .. })
        ));
        assert_eq!(
            vec_dot(GgmlType::Q8K, &[0u8; 292], &[0u8; 292]),
            Err(QuantError::UnsupportedDot(GgmlType::Q8K))
        );
    }
}
