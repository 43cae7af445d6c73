//! Prompt products of i-quant matrices (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
//! IQ3_S) through their int8 form: each task expands a panel of sixteen-row groups into
//! I8K groups (see `layout.rs`) in a buffer of its thread, then runs the packed I8K kernel
//! over every token. Decoding the grids once per panel rather than once per token, and the
//! int8 kernels' four-values-per-instruction products, are what make prompts fast; the
//! matrix itself stays in its file's few bits per value.
//!
//! The results are the bits of the row-major kernels ([`crate::kernels`]): both compute
//! the i-quants' exact integer sums per super-block and the same float operations
//! ([`crate::quant::int8`]).

use std::cell::RefCell;

use ferrox_gguf::GgmlType;
use rayon::prelude::*;

use super::layout::{int8_group, PlaceFn, QK_K};
use super::{kernel_isa, panel_bytes, sweep_tokens, CacheLine, GroupsFn, PackedFormat, GROUP_ROWS};
use crate::kernels::Isa;
use crate::matrix::Outputs;
use crate::quant::int8::{Int8Block, Int8Expand};
use crate::quant::iq1::{Iq1M, Iq1S};
use crate::quant::iq2::{Iq2S, Iq2Xs, Iq2Xxs};
use crate::quant::iq3::{Iq3S, Iq3Xxs};
use crate::quant::QuantError;

/// Fewest tokens for which expanding pays, with the scalar expansion (IQ1_S on AVX2, whose
/// vector expansion measured slower than this one, and every type without SIMD): from 13
/// the row kernels' second pass carries five tokens or more. `iq_kernels` (Intel Xeon,
/// `FERROX_ISA=avx2`, IQ1_S, 8960 × 1536, one thread, alternated, ms): row kernels at 12 /
/// 14 / 16 tokens 6.55 / 8.8 / 8.75, the int8 path 7.0-7.3 / 7.1-7.4 / 7.5.
const SCALAR_EXPANSION_MIN_TOKENS: usize = 13;

/// Fewest tokens for which expanding pays with AVX-512's vector expansions: more than one
/// pass of the row kernels, which decode a row once for eight tokens. `iq_kernels` (Intel
/// Xeon, 8960 × 1536, one thread): at 10 tokens the int8 path is 1.07-1.19x the row kernels
/// (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S), at 16 tokens 1.13-1.23x; at 5 and 8 tokens
/// (`decode_stack TYPE 2 4 tokens=N`, streamed from memory) level or slower for every type
/// but IQ2_XXS (1.1x).
const AVX512_EXPANSION_MIN_TOKENS: usize = 9;

/// Fewest tokens for which expanding pays with AVX2's vector expansions, and fewest for any
/// path: AVX2's row kernels take four tokens per pass and decode a row again on every pass,
/// so from five tokens a product decodes each row twice. `decode_stack TYPE 2 4 tokens=N`
/// (Intel Xeon, `FERROX_ISA=avx2`, streamed from memory, GB/s of weights, row kernels /
/// int8 path): 5 tokens IQ2_XXS 1.7 / 2.6, IQ2_XS 1.9 / 2.8, IQ2_S 2.4 / 3.0, IQ3_XXS
/// 2.5 / 3.4, IQ3_S 2.4 / 3.6, IQ1_M 1.3 / 1.7; 8 tokens 1.04-1.33x; 4 tokens the row
/// kernels ahead (IQ3_XXS 4.8 / 3.8). At 10 and 16 tokens (`iq_kernels`, one thread) the
/// int8 path is 1.10-1.91x and 1.19-1.99x.
pub const INT8_MIN_TOKENS: usize = 5;

/// Expanded bytes one task works on: a panel that stays in the L2 cache while every
/// token sweeps it.
const PANEL_BYTES: usize = 192 * 1024;

/// How one i-quant becomes I8K groups.
#[derive(Clone, Copy)]
pub struct Int8Path {
    /// A super-block's integer form, and the bytes of a super-block.
    expand: (fn(&[u8], &mut Int8Block), usize),
    /// How the integer forms go into the group blocks.
    place: PlaceFn,
    /// Fewest tokens for which this path pays.
    min_tokens: usize,
    factor: f32,
    kernel: GroupsFn,
}

impl Int8Path {
    fn of<F: Int8Expand>(isa: Isa) -> Option<Self> {
        Some(Self {
            expand: (F::expand, F::BYTES),
            place: super::int8_placement(isa),
            min_tokens: SCALAR_EXPANSION_MIN_TOKENS,
            factor: F::FACTOR,
            kernel: super::i8k_kernel(isa, F::SCALE_PER_32)?,
        })
    }

    /// The path for a `ty` matrix of `cols` columns, if `ty` is an i-quant and this
    /// machine has a packed kernel (see [`super::available`]).
    pub fn for_type(ty: GgmlType, cols: usize) -> Option<Self> {
        if !super::available() {
            return None;
        }
        Self::for_type_with(kernel_isa(), ty, cols)
    }

    /// [`Self::for_type`] with the kernel of `isa` (which must be available).
    pub(crate) fn for_type_with(isa: Isa, ty: GgmlType, cols: usize) -> Option<Self> {
        if cols == 0 || !cols.is_multiple_of(QK_K) {
            return None;
        }
        let path = match ty {
            GgmlType::Iq1S => Self::of::<Iq1S>(isa),
            GgmlType::Iq1M => Self::of::<Iq1M>(isa),
            GgmlType::Iq2Xxs => Self::of::<Iq2Xxs>(isa),
            GgmlType::Iq2Xs => Self::of::<Iq2Xs>(isa),
            GgmlType::Iq2S => Self::of::<Iq2S>(isa),
            GgmlType::Iq3Xxs => Self::of::<Iq3Xxs>(isa),
            GgmlType::Iq3S => Self::of::<Iq3S>(isa),
            _ => None,
        }?;
        // The vector expansion of the product's instruction set (the same integers).
        #[cfg(target_arch = "x86_64")]
        if let Some(expand) = crate::kernels::x86::iq_int8_expansion(isa, ty) {
            let min_tokens = match isa {
                Isa::Avx2 => INT8_MIN_TOKENS,
                _ => AVX512_EXPANSION_MIN_TOKENS,
            };
            return Some(Self {
                expand: (expand, path.expand.1),
                min_tokens,
                ..path
            });
        }
        Some(path)
    }

    /// Fewest tokens for which this path pays (at least [`INT8_MIN_TOKENS`]).
    pub fn min_tokens(&self) -> usize {
        self.min_tokens
    }

    /// `Y = W·X` for the first `groups · 16` rows of `bytes` (`row_bytes` each, `cols`
    /// values) against `n_tokens` Q8_K activation rows `xq`, into `y[t * rows + r]` (`rows`
    /// the whole matrix's). Lengths are the caller's to check.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matmul(
        &self,
        groups: usize,
        rows: usize,
        cols: usize,
        row_bytes: usize,
        bytes: &[u8],
        xq: &[u8],
        n_tokens: usize,
        y: &mut [f32],
    ) -> Result<(), QuantError> {
        let blocks = cols / QK_K;
        let act = blocks * PackedFormat::I8K.activation_block_bytes();
        let group_bytes = blocks * PackedFormat::I8K.group_block_bytes();
        if groups * GROUP_ROWS > rows
            || bytes.len() < groups * GROUP_ROWS * row_bytes
            || xq.len() != n_tokens * act
            || y.len() != n_tokens * rows
        {
            return Err(QuantError::VectorLength {
                what: "int8 prompt product",
                expected: n_tokens * rows,
                actual: y.len(),
            });
        }
        let per_task = (PANEL_BYTES / group_bytes).clamp(1, groups.max(1));
        let out = Outputs {
            ptr: y.as_mut_ptr(),
            len: y.len(),
        };
        let run = |task: usize| {
            let first = task * per_task;
            let count = per_task.min(groups - first);
            PANEL.with_borrow_mut(|(panel, expanded)| {
                let panel = panel_bytes(panel, count * group_bytes);
                for (g, dst) in panel.chunks_exact_mut(group_bytes).enumerate() {
                    let src =
                        &bytes[(first + g) * GROUP_ROWS * row_bytes..][..GROUP_ROWS * row_bytes];
                    int8_group(
                        self.expand,
                        self.place,
                        blocks,
                        row_bytes,
                        src,
                        dst,
                        expanded,
                    );
                }
                // SAFETY: the panel holds `count` whole groups of `blocks` blocks, every
                // activation row `blocks` Q8_K blocks (checked above); this task's outputs
                // (rows of groups `first..first + count`, every token) are inside `y` and
                // touched by no other task.
                unsafe {
                    sweep_tokens(
                        self.kernel,
                        panel.as_ptr(),
                        count,
                        blocks,
                        xq,
                        act,
                        n_tokens,
                        out.ptr.add(first * GROUP_ROWS),
                        rows,
                    )
                };
                if self.factor != 1.0 {
                    for t in 0..n_tokens {
                        // SAFETY: as above.
                        let y =
                            unsafe { out.rows(t * rows + first * GROUP_ROWS, count * GROUP_ROWS) };
                        for y in y {
                            *y *= self.factor;
                        }
                    }
                }
            });
        };
        let tasks = groups.div_ceil(per_task);
        match tasks {
            0 => {}
            1 => run(0),
            _ => (0..tasks).into_par_iter().for_each(run),
        }
        Ok(())
    }
}

thread_local! {
    /// Each thread's expanded panel, reused from task to task; whole cache lines, so that
    /// the kernels' code vectors (at whole lines in every I8K group block) never straddle
    /// two.
    /// Beside it, room for one group's integer forms.
    static PANEL: RefCell<(Vec<CacheLine>, Vec<Int8Block>)> =
        const { RefCell::new((Vec::new(), Vec::new())) };
}
