//! Weight matrices repacked at load for the int8 dot-product instructions (Q4_0, Q4_1,
//! Q5_0, Q5_1, Q8_0, MXFP4, NVFP4, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, TQ1_0,
//! TQ2_0, Q1_0, Q2_0): sixteen
//! rows interleaved four values at a time, so that one `vpdpbusd` multiplies four values of
//! sixteen rows by the same four activation values and leaves one integer sum per row in its
//! own lane.
//!
//! The row-major kernels ([`crate::kernels`]) follow ggml's AVX2 arithmetic: eight partial
//! sums per block and row, each converted, scaled and accumulated in float. Here each block
//! and row gives one exact integer sum, scaled once: `acc = fma(dw·dy, Σ w·x, acc)`, ggml's
//! reference (`_generic`) arithmetic with a fused multiply-add (for the K-quants, the
//! sub-block scales and minimums are applied in integers first). That is about a quarter of
//! the instructions per multiply-add, so small batches (a server's decode step) and prompt
//! chunks run several times faster, while a single token still streams the weights once.
//!
//! Every result is computed by the same operations whatever the number of tokens, the
//! split of rows across threads or the instruction set: the scalar reference and the
//! AVX2 and AVX-512 kernels give the same bits, and a row's logits do not depend on its
//! batch.
//!
//! Layout: groups of [`GROUP_ROWS`] rows, each group its blocks in order. The 256-value
//! formats, Q1_0, Q2_0 and NVFP4 are described in `layout.rs`; a block of the others is
//! `[16 f16 scales]`, for
//! Q4_1 and Q5_1 `[16 f16 minimums]`, then the codes, per format:
//! - Q8_0: eight 64-byte vectors; vector `g` holds values `4g..4g+4` of row `r` at bytes
//!   `4r..4r+4`, as unsigned `w + 128`;
//! - Q4_0: four 64-byte vectors of the original nibble bytes `4k..4k+4` per row: the low
//!   nibbles are values `4k..4k+4`, the high ones `16+4k..16+4k+4` (unsigned `w + 8`);
//! - Q5_0: a 64-byte plane of fifth bits (bit `g` of byte `4r + j`: the fifth bit of value
//!   `4g + j` of row `r`; a shift and a mask put code vector `g`'s in place), then the
//!   nibbles as for Q4_0 (unsigned `w + 16`);
//! - Q4_1 and Q5_1: as Q4_0 and Q5_0, the codes unsigned as they are (`d·code + m`);
//! - MXFP4: the scales as 16 f32 (64 bytes: powers of two beyond f16's range), then the
//!   nibbles as for Q4_0; a nibble indexes the FP4 levels, read as unsigned `level + 12`;
//! - IQ4_NL: as Q4_0; a nibble indexes the non-linear levels, read as `level + 128`.
//!
//! The group takes exactly the bytes of its sixteen rows in the file (Q3_K, Q4_K and Q5_K
//! four bytes more per row and super-block, MXFP4 three more per row and block).
//!
//! Prompts: a kernel passes over each block once per four or eight tokens, so whatever it
//! does to a block's codes before the products (unpacking nibbles, merging high bits,
//! taking magnitudes) is done again on every pass. Where that work weighs, an instruction
//! set has a [`PromptForm`]: each panel of groups is rewritten once into a buffer of the
//! thread, the codes as the products take them, and every token sweeps that (AVX2: Q8_0,
//! IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, TQ2_0 and TQ1_0; AVX-512: Q3_K, Q5_K, Q6_K).
//! The integers are the same, so are the bits.

use std::ops::Range;

use ferrox_gguf::GgmlType;
use rayon::prelude::*;

use crate::kernels::{self, Isa};
use crate::matrix::{min_claimed_run, Outputs, PARALLEL_MIN_BYTES};
use crate::quant::{self, QuantError};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_kquants;
mod int8;
mod layout;
mod scalar;

pub use int8::{Int8Path, INT8_MIN_TOKENS};
use layout::{pack_group, Activations, ACTIVATION_BLOCK_BYTES, ACT_SCALE_AT, ACT_SUM_AT, QK};
pub use layout::{PackedFormat, GROUP_ROWS};

/// Whether this machine has a fast kernel for packed matrices and may use it: AVX2 or
/// AVX-512 VNNI (capped by `FERROX_ISA`). Elsewhere the row-major kernels are faster than
/// the packed scalar reference, so nothing should be packed.
pub fn available() -> bool {
    kernel_isa().has_avx2()
}

/// The instruction set whose kernels [`PackedMatrix::matmul`] and
/// [`PackedMatrix::matmul_many`] run: the best available, capped by `FERROX_ISA`.
pub fn kernel_isa() -> Isa {
    kernels::best_isa()
}

/// A `rows × cols` matrix in the packed layout (see the module notes), owned.
pub struct PackedMatrix {
    format: PackedFormat,
    rows: usize,
    cols: usize,
    data: memmap2::MmapMut,
}

/// `len` zeroed bytes in an anonymous mapping of their own, on Linux backed by huge pages
/// where the system allows: the kernels stream these bytes, and 2 MiB pages spare them a
/// TLB miss and a prefetch stop every 4 KiB (and make the copy at load fault 512 times
/// less often).
pub(crate) fn huge_page_bytes(len: usize) -> Result<memmap2::MmapMut, QuantError> {
    let map = memmap2::MmapMut::map_anon(len).map_err(|e| QuantError::PackedAllocation {
        bytes: len,
        reason: e.to_string(),
    })?;
    #[cfg(target_os = "linux")]
    {
        // Only advice: without transparent huge pages the mapping works as it is.
        let _ = map.advise(memmap2::Advice::HugePage);
    }
    Ok(map)
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedMatrix")
            .field("format", &self.format)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish()
    }
}

/// Source rows packed (and released) per parallel task.
const PACK_CHUNK_GROUPS: usize = 128;

impl PackedMatrix {
    /// Whether a matrix of this type and shape can be packed.
    pub fn can_pack(ty: GgmlType, rows: usize, cols: usize) -> bool {
        PackedFormat::of(ty).is_some_and(|f| cols.is_multiple_of(f.values()))
            && rows.is_multiple_of(GROUP_ROWS)
            && cols > 0
    }

    /// Packs `bytes`, `rows` ggml rows of `cols` values of `ty`. `release` is called with
    /// each part of `bytes` once it has been copied (the caller may drop those pages from
    /// memory), from the rayon pool's threads.
    pub fn pack(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
        release: impl Fn(&[u8]) + Sync,
    ) -> Result<PackedMatrix, QuantError> {
        let format = PackedFormat::of(ty)
            .filter(|_| Self::can_pack(ty, rows, cols))
            .ok_or(QuantError::UnsupportedDot(ty))?;
        let len = Self::packed_bytes(ty, rows, cols).ok_or(QuantError::UnsupportedDot(ty))?;
        let mut packed = PackedMatrix {
            format,
            rows,
            cols,
            data: huge_page_bytes(len)?,
        };
        // The new mapping is zeroed already.
        packed.fill(bytes, release, false)?;
        Ok(packed)
    }

    /// Bytes a packed `rows × cols` matrix of `ty` takes, `None` if it cannot be packed.
    pub fn packed_bytes(ty: GgmlType, rows: usize, cols: usize) -> Option<usize> {
        let format = PackedFormat::of(ty).filter(|_| Self::can_pack(ty, rows, cols))?;
        let blocks = cols / format.values();
        (rows / GROUP_ROWS)
            .checked_mul(blocks)?
            .checked_mul(format.group_block_bytes())
    }

    /// Packs `bytes` into this matrix's memory in place of what it held, as
    /// [`PackedMatrix::pack`] would into new memory (`ty` and shape must be this matrix's):
    /// a cache slot takes one expert after another without reallocating.
    pub fn repack_from(
        &mut self,
        ty: GgmlType,
        bytes: &[u8],
        release: impl Fn(&[u8]) + Sync,
    ) -> Result<(), QuantError> {
        if ty != self.ty() {
            return Err(QuantError::UnsupportedDot(ty));
        }
        self.fill(bytes, release, true)
    }

    /// Packs `bytes` into this matrix's memory; `zero_first` when it holds an earlier
    /// matrix: [`pack_group`] ors several formats' codes into zeroed bytes.
    fn fill(
        &mut self,
        bytes: &[u8],
        release: impl Fn(&[u8]) + Sync,
        zero_first: bool,
    ) -> Result<(), QuantError> {
        let (ty, rows, cols) = (self.ty(), self.rows, self.cols);
        let row_bytes = quant::row_byte_len(ty, cols)?;
        if bytes.len() != rows * row_bytes {
            return Err(QuantError::ByteLength {
                ty,
                elements: rows * cols,
                expected: rows * row_bytes,
                actual: bytes.len(),
            });
        }
        let format = self.format;
        let blocks = cols / format.values();
        let group_bytes = blocks * format.group_block_bytes();
        self.data
            .par_chunks_mut(PACK_CHUNK_GROUPS * group_bytes)
            .zip(bytes.par_chunks(PACK_CHUNK_GROUPS * GROUP_ROWS * row_bytes))
            .for_each(|(dst, src)| {
                if zero_first {
                    dst.fill(0);
                }
                for (dst, src) in dst
                    .chunks_exact_mut(group_bytes)
                    .zip(src.chunks_exact(GROUP_ROWS * row_bytes))
                {
                    pack_group(format, blocks, row_bytes, src, dst);
                }
                release(src);
            });
        Ok(())
    }

    /// Bytes of memory this matrix holds.
    pub fn n_bytes(&self) -> usize {
        self.data.len()
    }

    /// Keeps this matrix's memory resident (`mlock`): it is never paged out.
    pub fn lock(&self) -> std::io::Result<()> {
        self.data.lock()
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn ty(&self) -> GgmlType {
        self.format.ty()
    }

    fn blocks(&self) -> usize {
        self.cols / self.format.values()
    }

    /// Bytes of one quantized activation row.
    pub fn activation_row_bytes(&self) -> usize {
        self.blocks() * self.format.activation_block_bytes()
    }

    /// The row-major vec-dot type whose activation rows this matrix takes as they are
    /// (Q8_K for the 256-value formats), so that one quantized row serves it and row-major
    /// matrices alike; `None` where the layout is its own (the 32-value formats').
    pub fn row_major_activations(&self) -> Option<GgmlType> {
        self.format.is_k().then_some(GgmlType::Q8K)
    }

    /// Rows `rows` of one token's product `out = W·x` (`out` holds every row), with the
    /// fastest available kernel, on this thread.
    ///
    /// # Safety
    /// `rows` are whole groups of this matrix ([`GROUP_ROWS`]), `xq` is one activation
    /// row for it, `out` has `rows()` elements and no other thread touches those rows.
    pub(crate) unsafe fn matvec_rows(&self, rows: Range<usize>, xq: &[u8], out: &Outputs) {
        debug_assert!(rows.start.is_multiple_of(GROUP_ROWS) && rows.end.is_multiple_of(GROUP_ROWS));
        let kernel = kernel_for(kernel_isa(), self.format).expect("the chosen ISA's kernel");
        let groups = self.rows / GROUP_ROWS;
        let group_bytes = self.data.len() / groups;
        // SAFETY: per this function's contract.
        unsafe {
            self.run_groups(
                kernel,
                None,
                rows.start / GROUP_ROWS,
                rows.len() / GROUP_ROWS,
                group_bytes,
                xq,
                1,
                out,
            )
        };
    }

    /// Quantizes one activation row of `cols` values into `out` (its
    /// [`activation_row_bytes`](Self::activation_row_bytes)) exactly as ggml-cpu does for
    /// the format: Q8_K for the 256-value formats; Q8_0 for the others, laid out per block
    /// as codes, f32 scale, sum of codes (NVFP4: the sums of the two halves).
    pub fn quantize_activation(&self, x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
        if x.len() != self.cols {
            return Err(QuantError::VectorLength {
                what: "activation row",
                expected: self.cols,
                actual: x.len(),
            });
        }
        if out.len() != self.activation_row_bytes() {
            return Err(QuantError::ByteLength {
                ty: GgmlType::Q8_0,
                elements: self.cols,
                expected: self.activation_row_bytes(),
                actual: out.len(),
            });
        }
        let half_sums = match self.format.activations() {
            Activations::Q8K => return kernels::quantize_activation(GgmlType::Q8K, x, out),
            Activations::Sum => false,
            Activations::HalfSums => true,
        };
        // ggml's Q8_0 blocks for up to `CHUNK` blocks at a time, then laid out afresh.
        const CHUNK: usize = 64;
        let mut q8 = [0u8; CHUNK * 34];
        for (src, dst) in x
            .chunks(CHUNK * QK)
            .zip(out.chunks_mut(CHUNK * ACTIVATION_BLOCK_BYTES))
        {
            let q8 = &mut q8[..src.len() / QK * 34];
            kernels::quantize_activation(GgmlType::Q8_0, src, q8)?;
            for (q8, dst) in q8
                .chunks_exact(34)
                .zip(dst.chunks_exact_mut(ACTIVATION_BLOCK_BYTES))
            {
                dst[..QK].copy_from_slice(&q8[2..]);
                let scale = half::f16::from_bits(u16::from_le_bytes([q8[0], q8[1]])).to_f32();
                let sum = |codes: &[u8]| codes.iter().map(|&c| i32::from(c as i8)).sum::<i32>();
                let sum = if half_sums {
                    // Each half's sum is at most 16 · 128 in magnitude: an i16.
                    let [low, high] = [&q8[2..18], &q8[18..]].map(|h| sum(h) as i16 as u16);
                    (u32::from(low) | u32::from(high) << 16) as i32
                } else {
                    sum(&q8[2..])
                };
                dst[ACT_SCALE_AT..ACT_SUM_AT].copy_from_slice(&scale.to_le_bytes());
                dst[ACT_SUM_AT..].copy_from_slice(&sum.to_le_bytes());
            }
        }
        Ok(())
    }

    /// `Y = W·X` for `n_tokens` activation rows (each made by
    /// [`quantize_activation`](Self::quantize_activation)), `y[t * rows + r]`, with the
    /// fastest available kernel, across the current rayon pool. Allocates nothing.
    pub fn matmul(&self, xq: &[u8], n_tokens: usize, y: &mut [f32]) -> Result<(), QuantError> {
        self.matmul_with(kernel_isa(), xq, n_tokens, y)
    }

    /// [`matmul`](Self::matmul) with the kernel of `isa`, for comparing them.
    pub fn matmul_with(
        &self,
        isa: Isa,
        xq: &[u8],
        n_tokens: usize,
        y: &mut [f32],
    ) -> Result<(), QuantError> {
        Self::matmul_many_with(isa, &[self], xq, n_tokens, &mut [y])
    }

    /// Whether activation rows quantized for `self` serve `other` too: the same columns
    /// and activation layout.
    pub fn shares_activations(&self, other: &PackedMatrix) -> bool {
        self.cols == other.cols && self.format.activations() == other.format.activations()
    }

    /// `outs[i] = parts[i]·X` for matrices that share activations (see
    /// [`shares_activations`](Self::shares_activations); at most [`MAX_PARTS`]), in one
    /// pass over the rayon pool: their tasks run together, so that the pool is entered
    /// once, not once per matrix. Each result is the one [`matmul`](Self::matmul) gives.
    pub fn matmul_many(
        parts: &[&PackedMatrix],
        xq: &[u8],
        n_tokens: usize,
        outs: &mut [&mut [f32]],
    ) -> Result<(), QuantError> {
        Self::matmul_many_with(kernel_isa(), parts, xq, n_tokens, outs)
    }

    fn matmul_many_with(
        isa: Isa,
        parts: &[&PackedMatrix],
        xq: &[u8],
        n_tokens: usize,
        outs: &mut [&mut [f32]],
    ) -> Result<(), QuantError> {
        let Some(first) = parts.first() else {
            return Ok(());
        };
        if parts.len() > MAX_PARTS
            || outs.len() != parts.len()
            || !parts.iter().all(|p| first.shares_activations(p))
        {
            return Err(QuantError::VectorLength {
                what: "packed products sharing activations",
                expected: parts.len().min(MAX_PARTS),
                actual: outs.len(),
            });
        }
        let mut products: smallvec::SmallVec<[Product<'_>; MAX_PARTS]> = parts
            .iter()
            .zip(outs.iter_mut())
            .map(|(&matrix, out)| Product {
                matrix,
                xq,
                n_tokens,
                out,
            })
            .collect();
        Self::products_with(isa, &mut products)
    }

    /// Several independent products, each with its own activations (`xq`, quantized for
    /// its matrix) and token count, in one pass over the rayon pool: all their tasks run
    /// together, so that the pool is entered once, not once per product (a token's routed
    /// experts, say). At most [`MAX_PRODUCTS`]. Each result is the one
    /// [`matmul`](Self::matmul) gives; nothing is allocated.
    pub fn matmul_products(products: &mut [Product<'_>]) -> Result<(), QuantError> {
        Self::products_with(kernel_isa(), products)
    }

    fn products_with(isa: Isa, products: &mut [Product<'_>]) -> Result<(), QuantError> {
        if !isa.is_available() {
            return Err(QuantError::IsaUnavailable(isa));
        }
        if products.len() > MAX_PRODUCTS {
            return Err(QuantError::VectorLength {
                what: "products in one pass",
                expected: MAX_PRODUCTS,
                actual: products.len(),
            });
        }
        let mut plans: smallvec::SmallVec<[Plan<'_>; MAX_PRODUCTS]> = smallvec::SmallVec::new();
        let mut total = 0;
        for product in products.iter_mut() {
            let part = product.matrix;
            let n_tokens = product.n_tokens;
            let act = part.activation_row_bytes();
            if product.xq.len() != n_tokens * act {
                return Err(QuantError::ByteLength {
                    ty: GgmlType::Q8_0,
                    elements: n_tokens * part.cols,
                    expected: n_tokens * act,
                    actual: product.xq.len(),
                });
            }
            if product.out.len() != n_tokens * part.rows {
                return Err(QuantError::VectorLength {
                    what: "output",
                    expected: n_tokens * part.rows,
                    actual: product.out.len(),
                });
            }
            let kernel = kernel_for(isa, part.format).ok_or(QuantError::IsaUnavailable(isa))?;
            let prompt = prompt_form_for(isa, part.format);
            let groups = part.rows / GROUP_ROWS;
            if n_tokens == 0 || groups == 0 {
                continue;
            }
            let group_bytes = part.data.len() / groups;
            let per_task = groups_per_task(groups, group_bytes, n_tokens);
            let tasks = groups.div_ceil(per_task);
            plans.push(Plan {
                part,
                xq: product.xq,
                n_tokens,
                kernel,
                prompt,
                groups,
                group_bytes,
                per_task,
                first_task: total,
                out: Outputs {
                    ptr: product.out.as_mut_ptr(),
                    len: product.out.len(),
                },
            });
            total += tasks;
        }
        if plans.iter().all(|p| p.n_tokens <= MAX_TOKENS_PER_SWEEP) {
            // A decode step (one token per sequence, a few with several sequences or
            // speculation): the weights are swept once, and the products' groups claimed
            // in shrinking runs.
            let sizes: smallvec::SmallVec<[usize; MAX_PRODUCTS]> =
                plans.iter().map(|p| p.groups).collect();
            let work: usize = plans
                .iter()
                .map(|p| p.groups * p.group_bytes * p.n_tokens)
                .sum();
            let widest = plans
                .iter()
                .map(|p| p.group_bytes * p.n_tokens)
                .max()
                .unwrap_or(1);
            let min_groups = min_claimed_run(work, widest);
            crate::work_split::for_each_run(&sizes, 1, min_groups, |i, groups| {
                // SAFETY: runs are disjoint groups of one product, hence disjoint output
                // rows (the products' outputs are distinct `&mut` slices); every pointer
                // stays inside the product's matrix, activations and output (checked
                // above).
                unsafe { plans[i].run(groups) };
            });
            return Ok(());
        }
        let run = |task: usize| {
            // The plan whose tasks include `task`: the last one starting at or before it.
            let plan = plans
                .iter()
                .take_while(|p| p.first_task <= task)
                .last()
                .expect("a task belongs to a plan");
            let first = (task - plan.first_task) * plan.per_task;
            let count = plan.per_task.min(plan.groups - first);
            // SAFETY: tasks own disjoint groups of one product, hence disjoint output rows
            // (the products' outputs are distinct `&mut` slices); every pointer stays
            // inside the product's matrix, activations and output (checked above).
            unsafe { plan.run(first..first + count) };
        };
        match total {
            0 => {}
            1 => run(0),
            _ => (0..total).into_par_iter().for_each(run),
        }
        Ok(())
    }

    /// Groups `first..first + count` against every token: panels of groups small enough
    /// to stay cached, each swept against up to eight tokens at a time.
    ///
    /// # Safety
    /// The groups exist, `xq` holds `n_tokens` activation rows, and no other thread
    /// touches these groups' outputs.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_groups(
        &self,
        kernel: GroupsFn,
        prompt: Option<PromptForm>,
        first: usize,
        count: usize,
        group_bytes: usize,
        xq: &[u8],
        n_tokens: usize,
        out: &Outputs,
    ) {
        let act = self.activation_row_bytes();
        // One sweep of the tokens streams the weights once: no panels needed (and the
        // kernels' prefetching runs on across the whole range).
        let single_sweep = n_tokens <= MAX_TOKENS_PER_SWEEP;
        let panel = if single_sweep {
            count
        } else {
            (PANEL_BYTES / group_bytes).max(1)
        };
        let blocks = self.blocks();
        let prompt = prompt.filter(|form| !single_sweep && n_tokens >= form.min_tokens);
        let mut g = first;
        while g < first + count {
            let n = panel.min(first + count - g);
            let w = self.data[g * group_bytes..].as_ptr();
            let out = out.ptr.wrapping_add(g * GROUP_ROWS);
            match prompt {
                // SAFETY (both arms): per this function's contract; outputs of rows of
                // groups `g..g+n`. The rewritten panel holds the same `n` groups, whole; the
                // form is the one of the instruction set the product checked for.
                None => unsafe {
                    sweep_tokens(kernel, w, n, blocks, xq, act, n_tokens, out, self.rows)
                },
                Some(form) => PROMPT_PANEL.with_borrow_mut(|panel| {
                    let panel =
                        panel_bytes(panel, n * blocks * form.group_block_bytes).as_mut_ptr();
                    unsafe {
                        (form.rewrite)(w, n, blocks, panel);
                        sweep_tokens(
                            form.kernel,
                            panel,
                            n,
                            blocks,
                            xq,
                            act,
                            n_tokens,
                            out,
                            self.rows,
                        )
                    }
                }),
            }
            g += n;
        }
    }
}

/// `groups` groups at `w` against all `n_tokens` activation rows of `xq` (`act` bytes each),
/// [`MAX_TOKENS_PER_SWEEP`] tokens per kernel call; token `t`'s outputs at
/// `out + t · out_stride`.
///
/// # Safety
/// As for [`GroupsFn`], for every token.
#[allow(clippy::too_many_arguments)]
unsafe fn sweep_tokens(
    kernel: GroupsFn,
    w: *const u8,
    groups: usize,
    blocks: usize,
    xq: &[u8],
    act: usize,
    n_tokens: usize,
    out: *mut f32,
    out_stride: usize,
) {
    let mut t = 0;
    while t < n_tokens {
        let width = (n_tokens - t).min(MAX_TOKENS_PER_SWEEP);
        let mut xs = [std::ptr::null::<u8>(); MAX_TOKENS_PER_SWEEP];
        for (i, x) in xs.iter_mut().take(width).enumerate() {
            *x = xq[(t + i) * act..].as_ptr();
        }
        // SAFETY: the caller's contract, for tokens `t..t + width`.
        unsafe {
            kernel(
                w,
                groups,
                blocks,
                &xs[..width],
                out.add(t * out_stride),
                out_stride,
            )
        };
        t += width;
    }
}

/// Bytes ahead of the current block at which the kernels ask for a group block's cache
/// lines (`None`: no software prefetch). Zero: each block's lines are all asked for just
/// before the block is read, so the memory system has the whole block in flight at once
/// rather than the loads one by one, and the hardware prefetchers keep the streams ahead.
/// Measured with `examples/decode_stack.rs ... prefetch=0,none,256,512,2048` (sweeps
/// alternated; AMD EPYC Zen 4, 1 and 2 threads), zero against 2 KiB ahead: Q5_K 1.75-2.45x,
/// Q6_K 1.0-1.23x, Q8_0 1.03-1.5x, Q4_0 1.02-1.19x (AVX-512 and AVX2). Q4_K streams best
/// with no software prefetch at all (1.03-1.12x over zero, 1.2-1.29x over 2 KiB); without
/// it Q5_K loses 10-20%, Q8_0 30-60%, Q4_0 a few percent, and Q6_K (since its blocks are
/// read front to back) nothing measurable. The AVX2 kernels, which read a group block in
/// two halves one after the other, stream Q6_K 3-7% faster with no software prefetch
/// (2 threads, three alternated runs).
///
/// Intel's cores want the lines well ahead instead
/// ([`crate::kernels::prefetch::FAR_PREFETCH_BYTES`]), and AMD's without AVX-512 (Zen 3)
/// the 32-value formats', Q2_K's, Q3_K's and the ternary formats' 2 KiB ahead
/// ([`crate::kernels::prefetch::MID_PREFETCH_BYTES`]).
#[cfg(target_arch = "x86_64")]
fn prefetch_ahead(format: PackedFormat, isa: Isa) -> Option<usize> {
    use crate::kernels::prefetch::{
        far_prefetch, mid_prefetch, setting, Prefetch, FAR_PREFETCH_BYTES, MID_PREFETCH_BYTES,
    };
    let avx2_q6k = format == PackedFormat::Q6K && isa == Isa::Avx2;
    // I8K groups are made just before their product and are still in the cache.
    let cached = format == PackedFormat::I8K;
    // The formats that stream faster from further ahead on cores such as Zen 3 (the
    // kernels name their layout: TQ1_0's is TQ2_0's).
    let mid = matches!(
        format,
        PackedFormat::Q4_0
            | PackedFormat::Q4_1
            | PackedFormat::Q5_0
            | PackedFormat::Q5_1
            | PackedFormat::Q8_0
            | PackedFormat::Mxfp4
            | PackedFormat::Nvfp4
            | PackedFormat::Iq4Nl
            | PackedFormat::Q2K
            | PackedFormat::Q3K
            | PackedFormat::Tq2_0
    );
    match setting() {
        Prefetch::Off => None,
        Prefetch::BuiltIn if cached => None,
        Prefetch::BuiltIn if far_prefetch() => Some(FAR_PREFETCH_BYTES),
        Prefetch::BuiltIn if format == PackedFormat::Q4K || avx2_q6k => None,
        Prefetch::BuiltIn if mid && mid_prefetch() => Some(MID_PREFETCH_BYTES),
        Prefetch::BuiltIn => Some(0),
        Prefetch::Ahead(bytes) => Some(bytes),
    }
}

/// Asks for the cache lines of `[p, p + len)` that lie before `end` (a kernel's first
/// bytes at its start, so that a small matrix does not begin at memory latency; then each
/// block [`prefetch_ahead`] bytes on).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_lines(p: *const u8, len: usize, end: *const u8) {
    for line in (0..len).step_by(64) {
        if p.wrapping_add(line) < end {
            crate::kernels::x86::prefetch_ahead(p, line);
        }
    }
}

/// Run-time overrides of the kernels' streaming choices, for measuring alternatives side
/// by side in one process (`examples/decode_stack.rs`); products give the same bits
/// whatever they are set to.
#[doc(hidden)]
pub mod tuning {
    pub use crate::kernels::prefetch::{set_prefetch, Prefetch};
}

/// Most tokens one sweep of the weights serves (their accumulators stay in registers).
const MAX_TOKENS_PER_SWEEP: usize = 8;

/// Weight bytes of a panel swept against all tokens while it stays in the L2 cache.
const PANEL_BYTES: usize = 96 * 1024;
fn groups_per_task(groups: usize, group_bytes: usize, n_tokens: usize) -> usize {
    let threads = rayon::current_num_threads();
    let work = group_bytes * n_tokens;
    if threads <= 1 || work * groups < PARALLEL_MIN_BYTES {
        return groups;
    }
    // A matrix product keeps a task's panel whole so that it is read from memory once.
    groups
        .div_ceil(4 * threads)
        .max((PANEL_BYTES / group_bytes).max(1))
        .min(groups)
}

/// Most matrices one [`PackedMatrix::matmul_many`] takes.
pub const MAX_PARTS: usize = 4;

/// Most products one [`PackedMatrix::matmul_products`] takes.
pub const MAX_PRODUCTS: usize = 32;

/// One product of [`PackedMatrix::matmul_products`]: `out = matrix · X` for `n_tokens`
/// activation rows `xq` quantized for `matrix`, `out` token-major.
pub struct Product<'a> {
    pub matrix: &'a PackedMatrix,
    pub xq: &'a [u8],
    pub n_tokens: usize,
    pub out: &'a mut [f32],
}

/// How one product is split into tasks.
struct Plan<'a> {
    part: &'a PackedMatrix,
    xq: &'a [u8],
    n_tokens: usize,
    kernel: GroupsFn,
    prompt: Option<PromptForm>,
    groups: usize,
    group_bytes: usize,
    per_task: usize,
    /// The part's first task among all the parts' tasks.
    first_task: usize,
    out: Outputs,
}

impl Plan<'_> {
    /// Groups `groups` of the product against all of its tokens.
    ///
    /// # Safety
    /// As [`PackedMatrix::run_groups`]: the groups exist and no other thread touches their
    /// outputs.
    unsafe fn run(&self, groups: Range<usize>) {
        // SAFETY: forwarded contract; the plan's activations and outputs were checked.
        unsafe {
            self.part.run_groups(
                self.kernel,
                self.prompt,
                groups.start,
                groups.len(),
                self.group_bytes,
                self.xq,
                self.n_tokens,
                &self.out,
            )
        };
    }
}

/// `groups` consecutive groups at `w` (`blocks` blocks each) against the activation rows
/// `xs` (1 to [`MAX_TOKENS_PER_SWEEP`] of them); token `t`'s result for row `r` of the first group goes to
/// `out[t * out_stride + r]`.
///
/// # Safety
/// All pointers address whole groups, activation rows and outputs.
type GroupsFn = unsafe fn(
    w: *const u8,
    groups: usize,
    blocks: usize,
    xs: &[*const u8],
    out: *mut f32,
    out_stride: usize,
);

fn kernel_for(isa: Isa, format: PackedFormat) -> Option<GroupsFn> {
    let format = format.layout();
    match isa {
        Isa::Scalar => Some(scalar::kernel(format)),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => Some(avx2::kernel(format)),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => Some(avx512::kernel(format)),
        #[cfg(not(target_arch = "x86_64"))]
        _ => None,
    }
}

/// The I8K kernel of `isa` for i-quants whose scales cover 32 values when `paired_scales`
/// (AVX-512 then applies one scale per 32; the others' kernels serve both).
fn i8k_kernel(isa: Isa, paired_scales: bool) -> Option<GroupsFn> {
    #[cfg(target_arch = "x86_64")]
    if paired_scales && isa == Isa::Avx512Vnni {
        return Some(avx512::paired_i8k_kernel());
    }
    kernel_for(isa, PackedFormat::I8K)
}

/// How `isa` writes the i-quants' integer forms into I8K group blocks.
fn int8_placement(isa: Isa) -> layout::PlaceFn {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Vnni && isa.is_available() {
        return avx512::place_int8;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() && isa.is_available() {
        return avx2::place_int8;
    }
    let _ = isa;
    layout::place_int8
}

/// A panel's form for prompts under some instruction sets: rewritten once into a buffer of
/// the task's thread, then swept by every token (as i-quant panels are expanded to int8),
/// where work a kernel would otherwise redo on every pass over a block is worth doing once.
#[derive(Clone, Copy)]
struct PromptForm {
    /// Bytes of one rewritten group block.
    group_block_bytes: usize,
    /// Rewrites `groups` groups of `blocks` blocks at `w` into the
    /// `groups · blocks · group_block_bytes` bytes at `dst`.
    ///
    /// # Safety
    /// Whole groups at `w`, room at `dst`; the CPU has the form's instruction set.
    rewrite: unsafe fn(w: *const u8, groups: usize, blocks: usize, dst: *mut u8),
    /// The kernel over rewritten groups (a [`GroupsFn`] on them).
    kernel: GroupsFn,
    /// Fewest tokens for which the rewriting pays (it costs about one pass of the kernel;
    /// panels are only made for more than [`MAX_TOKENS_PER_SWEEP`] tokens).
    min_tokens: usize,
}

thread_local! {
    /// Each thread's panel in its prompt form, reused from task to task; whole cache lines,
    /// so that the forms' 32- and 64-byte vectors (at multiples of their size in every
    /// block) never straddle two (the allocator's large blocks start 16 bytes into a page).
    static PROMPT_PANEL: std::cell::RefCell<Vec<CacheLine>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// 64 bytes at a 64-byte boundary: the unit of the panels that kernels sweep.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct CacheLine([u8; 64]);

/// The first `bytes` bytes of a panel of at least as many lines, grown (never shrunk: what
/// fills it writes every byte it uses, so a smaller panel must not make the next one zero
/// it again).
pub(super) fn panel_bytes(panel: &mut Vec<CacheLine>, bytes: usize) -> &mut [u8] {
    let lines = bytes.div_ceil(64);
    if panel.len() < lines {
        panel.resize(lines, CacheLine([0; 64]));
    }
    // SAFETY: `CacheLine` is 64 initialized bytes with no padding, and the panel holds at
    // least `bytes` of them, borrowed mutably for the slice's life.
    unsafe { std::slice::from_raw_parts_mut(panel.as_mut_ptr().cast::<u8>(), bytes) }
}

fn prompt_form_for(isa: Isa, format: PackedFormat) -> Option<PromptForm> {
    // The prompt form's sizes are those of the layout's (TQ1_0's groups are TQ2_0's).
    let format = format.layout();
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2::prompt_form(format),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => avx512::prompt_form(format),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
