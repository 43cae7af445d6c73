//! Images in: the vision encoders of llama.cpp's multimodal projector files (`mmproj`
//! GGUFs), computed as llama.cpp's `mtmd` computes them, on the shared layers and kernels.
//!
//! An image is decoded ([`RgbImage::decode`]), resized and normalized as the projector's
//! family expects ([`image`], [`VisionEncoder::preprocess`]), cut into patches, run through
//! the vision transformer and projected into the language model's embedding space: one row
//! per image token, placed into the sequence between the family's markers (see
//! [`VisionEncoder::markers`]).
//!
//! Three families: Gemma 3 (a fixed square input, learned positions, pooling), Qwen-VL
//! (the image at about its own size, 2D RoPE over patch rows and columns, 2x2 patches
//! merged; Qwen2.5-VL attends within windows of merged tokens in most layers, Qwen3-VL adds
//! learned positions resized to the image and deepstack features beside the tokens) and
//! Kimi (MoonViT: the image at about its own size, learned positions resized to it, 2D RoPE
//! over the two halves of each head, merged patches LayerNormed and projected). The patches
//! are kept in the order llama.cpp's graph holds them (Qwen-VL: merged blocks together,
//! windows together, so that a window is a contiguous run of rows and a merged token four
//! consecutive rows; the others: raster order); the output comes back in raster order.
//!
//! Attention: llama.cpp's default runs the encoder's attention through flash attention
//! with keys and values rounded to f16; [`VisionOptions::f32_attention`] keeps them f32 (its
//! `--flash-attn off`).

pub mod config;
pub mod image;
mod positions;
mod weights;

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use ferrox_gguf::Gguf;
use rayon::prelude::*;

pub use config::{ClipConfig, DynamicSize, ProjectorKind, VisionFfnAct, VisionNorm};
pub use image::{ImageError, ResizeFilter, RgbImage};
use weights::{
    Affine, KimiProjector, MergerProjector, Norm, ProjectorWeights, VisionWeights, VitLayer, VitQkv,
};

use crate::layers::activation::{gelu, gelu_quick, silu};
use crate::layers::linear::{linear, linear_many};
use crate::layers::norm::{layer_norm_in_place, rms_norm_in_place};
use crate::scaffold::sized;
use crate::ModelError;
use ferrox_core::dense_attn::{DenseAttention, DenseScratch, KvPrecision, TILED_MIN_QUERIES};
use ferrox_core::glu::{geglu, swiglu};

/// How to run a vision encoder.
#[derive(Clone, Debug, Default)]
pub struct VisionOptions {
    /// Worker threads; 0 means one per available core.
    pub threads: usize,
    /// Attention with f32 keys and values (llama.cpp's `--flash-attn off`) instead of f16.
    pub f32_attention: bool,
    /// The fewest and the most tokens an image may become, for encoders that take images at
    /// their own size (llama.cpp's `--image-min-tokens` / `--image-max-tokens`); `None`:
    /// the family's defaults (Qwen-VL: 8 and 4096).
    pub image_min_tokens: Option<usize>,
    pub image_max_tokens: Option<usize>,
}

/// One image's embeddings: `n_tokens` rows of the language model's width, a grid of `nx`
/// tokens a row and `ny` rows (row-major).
#[derive(Clone, Debug, PartialEq)]
pub struct ImageEmbeddings {
    pub n_tokens: usize,
    pub n_embd: usize,
    pub nx: usize,
    pub ny: usize,
    pub data: Vec<f32>,
}

/// An image as the encoder takes it: `width × height` pixels (the encoder's input size for
/// it), normalized, as planar channels (`[3][height][width]`).
#[derive(Clone, Debug, PartialEq)]
pub struct PreparedImage {
    pub width: usize,
    pub height: usize,
    pub planar: Vec<f32>,
}

impl ImageEmbeddings {
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.n_embd..(i + 1) * self.n_embd]
    }
}

/// A vision encoder and projector over a memory-mapped `mmproj` file.
pub struct VisionEncoder {
    gguf: Arc<Gguf>,
    config: ClipConfig,
    weights: VisionWeights,
    pool: rayon::ThreadPool,
    f32_attention: bool,
    markers: (&'static str, &'static str),
}

/// How a 2D RoPE encoder pairs a head's values and which patch coordinate turns which part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum VisionRope {
    /// ggml's vision mode (Qwen-VL): pairs `(i, i + head/2)`, the first quarter of the
    /// pairs by the patch's row, the second by its column.
    Halves,
    /// `build_rope_2d` (Kimi): adjacent pairs, the first half of the head by the patch's
    /// column, the second by its row.
    Adjacent,
}

/// The encoder's activations for one image.
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    dense: DenseScratch,
    attn: Vec<f32>,
    proj: Vec<f32>,
    up: Vec<f32>,
    gate: Vec<f32>,
    xq: Vec<u8>,
}

/// Where an input's patches sit in the encoder's rows, and how its attention is cut.
struct PatchLayout {
    /// Patches a row and rows of patches.
    pw: usize,
    ph: usize,
    /// Each encoder row's patch (row, column).
    order: Vec<(usize, usize)>,
    /// The runs of rows that attend to each other in windowed layers (one run covering
    /// every row when the encoder has no windows).
    windows: Vec<Range<usize>>,
    /// For each output token in raster order, its merged block's index in encoder order
    /// (merging encoders).
    merged_rows: Vec<usize>,
}

impl PatchLayout {
    /// Raster order, one window.
    fn raster(pw: usize, ph: usize) -> PatchLayout {
        PatchLayout {
            pw,
            ph,
            order: (0..ph).flat_map(|y| (0..pw).map(move |x| (y, x))).collect(),
            windows: std::iter::once(0..pw * ph).collect(),
            merged_rows: Vec::new(),
        }
    }

    /// Qwen-VL's order: 2x2 blocks of patches (block rows, then blocks, then the block's
    /// rows and columns), blocks grouped into windows of `window` blocks a side (row-major
    /// windows, row-major inside; `None`: one window of every block).
    fn merged(pw: usize, ph: usize, window: Option<usize>) -> PatchLayout {
        let (mw, mh) = (pw / 2, ph / 2);
        let g = window.unwrap_or(mw.max(mh)).max(1);
        let mut order = Vec::with_capacity(pw * ph);
        let mut windows = Vec::new();
        let mut merged_rows = vec![0; mw * mh];
        for wy in (0..mh).step_by(g) {
            for wx in (0..mw).step_by(g) {
                let first = order.len();
                for uy in wy..(wy + g).min(mh) {
                    for ux in wx..(wx + g).min(mw) {
                        merged_rows[uy * mw + ux] = order.len() / 4;
                        for dy in 0..2 {
                            for dx in 0..2 {
                                order.push((2 * uy + dy, 2 * ux + dx));
                            }
                        }
                    }
                }
                windows.push(first..order.len());
            }
        }
        PatchLayout {
            pw,
            ph,
            order,
            windows,
            merged_rows,
        }
    }

    fn len(&self) -> usize {
        self.order.len()
    }
}

impl VisionEncoder {
    pub fn open(
        path: impl AsRef<Path>,
        options: &VisionOptions,
    ) -> Result<VisionEncoder, ModelError> {
        let gguf = Gguf::open(path.as_ref())?;
        VisionEncoder::load(Arc::new(gguf), options)
    }

    pub fn load(gguf: Arc<Gguf>, options: &VisionOptions) -> Result<VisionEncoder, ModelError> {
        let mut config = ClipConfig::read(&gguf.metadata())?;
        config.limit_image_tokens(options.image_min_tokens, options.image_max_tokens)?;
        let weights = VisionWeights::load(&gguf, &config)?;
        if config.ffn_act == VisionFfnAct::GeluQuick
            && weights.layers.iter().any(|l| l.gate.is_some())
        {
            return Err(ModelError::Config(
                "a gated vision feed-forward with the quick GELU is not built".into(),
            ));
        }
        let threads = match options.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("vision-{i}"))
            .build()
            .map_err(|e| ModelError::Config(format!("vision thread pool: {e}")))?;
        let markers = match config.projector {
            ProjectorKind::Gemma3 => ("<start_of_image>", "<end_of_image>"),
            ProjectorKind::Qwen2Vl | ProjectorKind::Qwen25Vl | ProjectorKind::Qwen3Vl => {
                ("<|vision_start|>", "<|vision_end|>")
            }
            ProjectorKind::KimiVl => ("<|media_start|>", "<|media_end|>"),
            ProjectorKind::KimiK25 => ("<|media_begin|>", "<|media_end|>"),
        };
        Ok(VisionEncoder {
            gguf,
            config,
            weights,
            pool,
            f32_attention: options.f32_attention,
            markers,
        })
    }

    /// Picks the markers the language model's vocabulary has where the family's differ by
    /// model (llama.cpp decides the same way): GLM-5.2-V reuses Kimi-K2.5's projector but
    /// marks images with `<|begin_of_image|>` / `<|end_of_image|>`.
    pub fn fit_markers_to(&mut self, text_model: &Gguf) {
        if self.config.projector != ProjectorKind::KimiK25 {
            return;
        }
        let has_glm_marker = text_model
            .metadata()
            .get_array("tokenizer.ggml.tokens")
            .ok()
            .is_some_and(|tokens| {
                tokens
                    .iter()
                    .any(|t| t.as_str() == Some("<|begin_of_image|>"))
            });
        if has_glm_marker {
            self.markers = ("<|begin_of_image|>", "<|end_of_image|>");
        }
    }

    pub fn config(&self) -> &ClipConfig {
        &self.config
    }

    /// The width of an image token's row: the language model's (Qwen3-VL: times one plus
    /// the number of deepstack mergers, whose outputs follow the main projection).
    pub fn output_width(&self) -> usize {
        self.config.projection_dim * (1 + self.deepstack_count())
    }

    /// Qwen3-VL's deepstack mergers: the language model adds their features after its
    /// first layers, one each.
    pub fn deepstack_count(&self) -> usize {
        match &self.weights.projector {
            ProjectorWeights::Merger(p) => p.deepstack.len(),
            ProjectorWeights::Gemma3(_) | ProjectorWeights::Kimi(_) => 0,
        }
    }

    /// Tokens each image becomes.
    pub fn tokens_per_image(&self) -> usize {
        self.config.tokens_per_image()
    }

    /// The text around an image's embeddings in the prompt (tokenized with the model's
    /// vocabulary, special tokens parsed).
    pub fn markers(&self) -> (&'static str, &'static str) {
        self.markers
    }

    /// Whether the image's tokens attend to each other both ways in the language model
    /// (Gemma 3), rather than causally.
    pub fn bidirectional(&self) -> bool {
        self.config.projector == ProjectorKind::Gemma3
    }

    /// The grid the language model places `emb`'s tokens by, for projectors whose tokens
    /// take M-RoPE grid positions ([`Self::grid_positions`]).
    pub fn image_grid(&self, emb: &ImageEmbeddings) -> Option<crate::engine::ImageGrid> {
        self.grid_positions().then_some(crate::engine::ImageGrid {
            nx: emb.nx,
            ny: emb.ny,
        })
    }

    /// Whether the language model places the image's tokens by M-RoPE grid positions
    /// (time, row, column), the image taking `max(nx, ny)` positions (Qwen-VL), rather than
    /// one position per token.
    pub fn grid_positions(&self) -> bool {
        self.config.projector.qwen()
    }

    /// The encoder's input: the image resized to the input size the family takes for it
    /// ([`ClipConfig::input_size`]; aspect kept, black padding), normalized, as planar
    /// channels.
    pub fn preprocess(&self, img: &RgbImage) -> Result<PreparedImage, ModelError> {
        img.check()?;
        let c = &self.config;
        let (width, height) = c.input_size(img.width, img.height);
        let fitted = image::resize_padded(img, width, height, c.resize, [0, 0, 0]);
        Ok(PreparedImage {
            width,
            height,
            planar: image::normalize_planar(&fitted, c.image_mean, c.image_std),
        })
    }

    /// The image's embeddings.
    pub fn encode(&self, img: &RgbImage) -> Result<ImageEmbeddings, ModelError> {
        let prepared = self.preprocess(img)?;
        self.encode_prepared(&prepared)
    }

    /// The embeddings of an already preprocessed input ([`preprocess`](Self::preprocess)).
    pub fn encode_prepared(&self, input: &PreparedImage) -> Result<ImageEmbeddings, ModelError> {
        let c = &self.config;
        let (w, h) = (input.width, input.height);
        let (unit, most) = match c.dynamic {
            Some(d) => (d.align, d.max_pixels.max(d.min_pixels)),
            None => (c.image_size, c.image_size * c.image_size),
        };
        if w == 0 || h == 0 || !w.is_multiple_of(unit) || !h.is_multiple_of(unit) || w * h > most {
            return Err(ModelError::Config(format!(
                "a {w}x{h} input: this encoder takes {}",
                match c.dynamic {
                    Some(d) => format!(
                        "sides that are multiples of {} and at most {most} pixels",
                        d.align
                    ),
                    None => format!("{0}x{0}", c.image_size),
                }
            )));
        }
        if input.planar.len() != 3 * w * h {
            return Err(ModelError::Config(format!(
                "{} input values for a {w}x{h} RGB input",
                input.planar.len()
            )));
        }
        let (pw, ph) = (w / c.patch_size, h / c.patch_size);
        let (layout, rope_kind) = match c.projector {
            ProjectorKind::Gemma3 => (PatchLayout::raster(pw, ph), None),
            ProjectorKind::Qwen2Vl | ProjectorKind::Qwen25Vl | ProjectorKind::Qwen3Vl => (
                PatchLayout::merged(pw, ph, (c.n_wa_pattern > 0).then_some(c.window_tokens)),
                Some(VisionRope::Halves),
            ),
            ProjectorKind::KimiVl | ProjectorKind::KimiK25 => {
                (PatchLayout::raster(pw, ph), Some(VisionRope::Adjacent))
            }
        };
        let rope = rope_kind.map(|kind| (kind, vision_rope(&layout, c.head_dim, kind)));
        self.pool.install(|| {
            let mut s = Scratch::default();
            self.embed_patches(&input.planar, w, &layout, &mut s)?;
            let n = layout.len();
            let e = c.n_embd;
            if let Some(norm) = &self.weights.pre_ln {
                norm_rows(&mut s.x[..n * e], norm, c.eps);
            }
            let all_rows = 0..n;
            let everything = std::slice::from_ref(&all_rows);
            let mut deepstack = Vec::new();
            for (il, layer) in self.weights.layers.iter().enumerate() {
                let windowed = c.n_wa_pattern > 0 && (il + 1) % c.n_wa_pattern != 0;
                let spans = match windowed {
                    true => layout.windows.as_slice(),
                    false => everything,
                };
                let rope = rope.as_ref().map(|(kind, angles)| (*kind, &angles[..]));
                self.layer(layer, n, rope, spans, &mut s)?;
                if let ProjectorWeights::Merger(p) = &self.weights.projector {
                    for ds in p.deepstack.iter().filter(|d| d.layer == il) {
                        deepstack.push(self.deepstack_features(ds, n, &mut s)?);
                    }
                }
            }
            if let Some(norm) = &self.weights.post_ln {
                norm_rows(&mut s.x[..n * e], norm, c.eps);
            }
            match &self.weights.projector {
                ProjectorWeights::Gemma3(p) => self.gemma3_projector(p, &mut s),
                ProjectorWeights::Merger(p) => {
                    self.merger_projector(p, &layout, &deepstack, &mut s)
                }
                ProjectorWeights::Kimi(p) => self.kimi_projector(p, &layout, &mut s),
            }
        })
    }

    /// The patch convolution (stride = kernel = patch size) as one product per kernel (a
    /// second temporal kernel's added), plus its bias, plus the position rows; the patches in
    /// the layout's order.
    fn embed_patches(
        &self,
        planar: &[f32],
        width: usize,
        layout: &PatchLayout,
        s: &mut Scratch,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let (p, e) = (c.patch_size, c.n_embd);
        let plane = planar.len() / 3;
        let cols = 3 * p * p;
        let n = layout.len();
        // Each patch's values in the kernel's order: channel, kernel row, column.
        let mut patches = vec![0.0f32; n * cols];
        patches
            .par_chunks_mut(cols)
            .zip(layout.order.par_iter())
            .for_each(|(out, &(py, px))| {
                for ch in 0..3 {
                    for ky in 0..p {
                        let y = py * p + ky;
                        let src = &planar[ch * plane + y * width + px * p..][..p];
                        out[(ch * p + ky) * p..][..p].copy_from_slice(src);
                    }
                }
            });
        let x = sized(&mut s.x, n * e);
        linear(&self.weights.patch_embd.view()?, &patches, n, x, &mut s.xq)?;
        if let Some(second) = &self.weights.patch_embd_1 {
            let y = sized(&mut s.proj, n * e);
            linear(&second.view()?, &patches, n, y, &mut s.xq)?;
            residual(&mut s.x[..n * e], y);
        }
        let bias = self.weights.patch_bias.as_deref();
        let resized;
        let positions = match self.weights.position_embd.as_deref() {
            Some(table) if self.weights.position_grid != (layout.pw, layout.ph) => {
                let from = self.weights.position_grid;
                let to = (layout.pw, layout.ph);
                resized = match c.projector {
                    ProjectorKind::KimiVl => positions::bilinear_antialiased(table, from, to),
                    ProjectorKind::KimiK25 => positions::bicubic_columns_inner(table, from, to),
                    _ => positions::bilinear_aligned(table, from, to),
                };
                Some(&resized[..])
            }
            other => other,
        };
        s.x[..n * e]
            .par_chunks_mut(e)
            .zip(layout.order.par_iter())
            .for_each(|(row, &(py, px))| {
                if let Some(b) = bias {
                    row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
                }
                if let Some(pos) = positions {
                    let at = (py * layout.pw + px) * e;
                    row.iter_mut()
                        .zip(&pos[at..at + e])
                        .for_each(|(v, p)| *v += p);
                }
            });
        Ok(())
    }

    /// One pre-norm transformer layer over the `n` patch rows: `rope` the rows' rotations
    /// (2D RoPE encoders), `spans` the runs of rows that attend to each other.
    fn layer(
        &self,
        lw: &VitLayer,
        n: usize,
        rope: Option<(VisionRope, &[(f32, f32)])>,
        spans: &[Range<usize>],
        s: &mut Scratch,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let (e, hd) = (c.n_embd, c.head_dim);
        let gguf = &*self.gguf;
        let xn = sized(&mut s.xn, n * e);
        xn.copy_from_slice(&s.x[..n * e]);
        norm_rows(xn, &lw.ln1, c.eps);
        let q = sized(&mut s.q, n * e);
        let k = sized(&mut s.k, n * e);
        let v = sized(&mut s.v, n * e);
        match &lw.qkv {
            VitQkv::Separate {
                q: aq,
                k: ak,
                v: av,
            } => {
                let (wq, wk, wv) = (aq.w.view(gguf)?, ak.w.view(gguf)?, av.w.view(gguf)?);
                linear_many(
                    &[&wq, &wk, &wv],
                    xn,
                    n,
                    &mut [&mut *q, &mut *k, &mut *v],
                    &mut s.xq,
                )?;
                add_bias(q, aq);
                add_bias(k, ak);
                add_bias(v, av);
            }
            VitQkv::Fused(a) => {
                let fused = sized(&mut s.up, n * 3 * e);
                linear(&a.w.view(gguf)?, xn, n, fused, &mut s.xq)?;
                add_bias(fused, a);
                for (t, row) in fused.chunks_exact(3 * e).enumerate() {
                    q[t * e..(t + 1) * e].copy_from_slice(&row[..e]);
                    k[t * e..(t + 1) * e].copy_from_slice(&row[e..2 * e]);
                    v[t * e..(t + 1) * e].copy_from_slice(&row[2 * e..]);
                }
            }
        }
        if let Some((kind, angles)) = rope {
            let pairs = hd / 2;
            let rotate = match kind {
                VisionRope::Halves => rotate_halves,
                VisionRope::Adjacent => rotate_adjacent,
            };
            for buf in [&mut *q, &mut *k] {
                buf.par_chunks_mut(e)
                    .zip(angles.par_chunks(pairs))
                    .for_each(|(row, angles)| {
                        for head in row.chunks_exact_mut(hd) {
                            rotate(head, angles);
                        }
                    });
            }
        }
        let attention = DenseAttention {
            n_head: c.n_head,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            // llama.cpp's kernel depends on the queries of the whole image (its windows
            // are a mask over every row).
            kv: match (self.f32_attention, n < TILED_MIN_QUERIES) {
                (true, _) => KvPrecision::F32,
                (false, true) => KvPrecision::F16Accumulated,
                (false, false) => KvPrecision::F16,
            },
        };
        let attn = sized(&mut s.attn, n * e);
        for span in spans {
            let rows = span.start * e..span.end * e;
            attention.run(
                &q[rows.clone()],
                &k[rows.clone()],
                &v[rows.clone()],
                span.len(),
                &mut attn[rows],
                &mut s.dense,
            );
        }
        let proj = sized(&mut s.proj, n * e);
        linear(&lw.o.w.view(gguf)?, attn, n, proj, &mut s.xq)?;
        add_bias(proj, &lw.o);
        residual(&mut s.x[..n * e], proj);

        let xn = &mut s.xn[..n * e];
        xn.copy_from_slice(&s.x[..n * e]);
        norm_rows(xn, &lw.ln2, c.eps);
        let up = sized(&mut s.up, n * c.n_ff);
        linear(&lw.up.w.view(gguf)?, xn, n, up, &mut s.xq)?;
        add_bias(up, &lw.up);
        let hidden: &[f32] = match &lw.gate {
            Some(gate_w) => {
                // ggml's gated units, row by row: act(gate) * up.
                let gate = sized(&mut s.gate, n * c.n_ff);
                linear(&gate_w.w.view(gguf)?, xn, n, gate, &mut s.xq)?;
                add_bias(gate, gate_w);
                let glu: fn(&mut [f32], &[f32]) = match c.ffn_act {
                    VisionFfnAct::Silu => swiglu,
                    VisionFfnAct::Gelu => geglu,
                    VisionFfnAct::GeluQuick => unreachable!("refused at load"),
                };
                gate.par_chunks_mut(c.n_ff)
                    .zip(up.par_chunks(c.n_ff))
                    .for_each(|(g, u)| glu(g, u));
                gate
            }
            None => {
                let act: fn(f32) -> f32 = match c.ffn_act {
                    VisionFfnAct::Gelu => gelu,
                    VisionFfnAct::Silu => silu,
                    VisionFfnAct::GeluQuick => gelu_quick,
                };
                up.par_iter_mut().for_each(|v| *v = act(*v));
                up
            }
        };
        let proj = sized(&mut s.proj, n * e);
        linear(&lw.down.w.view(gguf)?, hidden, n, proj, &mut s.xq)?;
        add_bias(proj, &lw.down);
        residual(&mut s.x[..n * e], proj);
        Ok(())
    }

    /// Gemma 3: the patch grid average-pooled `n_merge × n_merge`, each pooled row RMS-normed
    /// and projected to the language model's width.
    fn gemma3_projector(
        &self,
        p: &weights::Gemma3Projector,
        s: &mut Scratch,
    ) -> Result<ImageEmbeddings, ModelError> {
        let c = &self.config;
        let (side, k, e) = (c.patches_per_side(), c.n_merge, c.n_embd);
        let out_side = side / k;
        let n_out = out_side * out_side;
        let x = &s.x[..side * side * e];
        let pooled = sized(&mut s.xn, n_out * e);
        let area = (k * k) as f32;
        pooled.par_chunks_mut(e).enumerate().for_each(|(i, out)| {
            let (oy, ox) = (i / out_side, i % out_side);
            for (ch, o) in out.iter_mut().enumerate() {
                // ggml's pool: an f32 sum, kernel rows outer, then one division.
                let mut sum = 0.0f32;
                for ky in 0..k {
                    for kx in 0..k {
                        sum += x[((oy * k + ky) * side + ox * k + kx) * e + ch];
                    }
                }
                *o = sum / area;
            }
        });
        pooled
            .par_chunks_mut(e)
            .for_each(|row| rms_norm_in_place(row, &p.soft_emb_norm, c.eps));
        let width = c.projection_dim;
        let mut data = vec![0.0f32; n_out * width];
        linear(
            &p.input_projection.view()?,
            pooled,
            n_out,
            &mut data,
            &mut s.xq,
        )?;
        Ok(ImageEmbeddings {
            n_tokens: n_out,
            n_embd: width,
            nx: out_side,
            ny: out_side,
            data,
        })
    }

    /// Qwen3-VL's deepstack merger after its layer: the rows merged 2x2, LayerNorm,
    /// `fc1`, GELU, `fc2`, one row of the language model's width per merged block (encoder
    /// order).
    fn deepstack_features(
        &self,
        ds: &weights::Deepstack,
        n: usize,
        s: &mut Scratch,
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.config;
        let gguf = &*self.gguf;
        let (n_out, wide) = (n / 4, 4 * c.n_embd);
        let merged = sized(&mut s.xn, n_out * wide);
        merged.copy_from_slice(&s.x[..n_out * wide]);
        norm_rows(merged, &ds.norm, c.eps);
        let hidden = sized(&mut s.up, n_out * wide);
        linear(&ds.fc1.w.view(gguf)?, merged, n_out, hidden, &mut s.xq)?;
        add_bias(hidden, &ds.fc1);
        hidden.par_iter_mut().for_each(|v| *v = gelu(*v));
        let mut out = vec![0.0f32; n_out * c.projection_dim];
        linear(&ds.fc2.w.view(gguf)?, hidden, n_out, &mut out, &mut s.xq)?;
        add_bias(&mut out, &ds.fc2);
        Ok(out)
    }

    /// Qwen-VL: each 2x2 block of patches (four consecutive rows) as one row through
    /// `mm.0`, GELU and `mm.2`, Qwen3-VL's `deepstack` features beside it (a token's row is
    /// the main projection, then each deepstack merger's, in layer order); the tokens put back
    /// in raster order.
    fn merger_projector(
        &self,
        p: &MergerProjector,
        layout: &PatchLayout,
        deepstack: &[Vec<f32>],
        s: &mut Scratch,
    ) -> Result<ImageEmbeddings, ModelError> {
        let c = &self.config;
        let gguf = &*self.gguf;
        let (n_out, wide) = (layout.len() / 4, 4 * c.n_embd);
        let merged = &s.x[..n_out * wide];
        let hidden = sized(&mut s.up, n_out * wide);
        linear(&p.mm0.w.view(gguf)?, merged, n_out, hidden, &mut s.xq)?;
        add_bias(hidden, &p.mm0);
        hidden.par_iter_mut().for_each(|v| *v = gelu(*v));
        let dim = c.projection_dim;
        let out = sized(&mut s.proj, n_out * dim);
        linear(&p.mm2.w.view(gguf)?, hidden, n_out, out, &mut s.xq)?;
        add_bias(out, &p.mm2);
        let width = dim * (1 + deepstack.len());
        let mut data = vec![0.0f32; n_out * width];
        let out = &*out;
        data.par_chunks_mut(width)
            .zip(layout.merged_rows.par_iter())
            .for_each(|(dst, &r)| {
                let parts = std::iter::once(out).chain(deepstack.iter().map(|d| &d[..]));
                for (slot, part) in dst.chunks_exact_mut(dim).zip(parts) {
                    slot.copy_from_slice(&part[r * dim..(r + 1) * dim]);
                }
            });
        Ok(ImageEmbeddings {
            n_tokens: n_out,
            n_embd: width,
            nx: layout.pw / 2,
            ny: layout.ph / 2,
            data,
        })
    }
}

impl VisionEncoder {
    /// Kimi: each patch row LayerNormed, the `n_merge x n_merge` patches of each output
    /// token (its rows of patches in turn, each left to right) as one row through `mm.1`,
    /// GELU and `mm.2`; the tokens in raster order.
    fn kimi_projector(
        &self,
        p: &KimiProjector,
        layout: &PatchLayout,
        s: &mut Scratch,
    ) -> Result<ImageEmbeddings, ModelError> {
        let c = &self.config;
        let gguf = &*self.gguf;
        let (m, e) = (c.n_merge, c.n_embd);
        let (nx, ny) = (layout.pw / m, layout.ph / m);
        let (n_out, wide) = (nx * ny, m * m * e);
        let x = &s.x[..layout.len() * e];
        let merged = sized(&mut s.xn, n_out * wide);
        merged
            .par_chunks_mut(wide)
            .enumerate()
            .for_each(|(t, row)| {
                let (ty, tx) = (t / nx, t % nx);
                for (j, out) in row.chunks_exact_mut(e).enumerate() {
                    let patch = (ty * m + j / m) * layout.pw + tx * m + j % m;
                    out.copy_from_slice(&x[patch * e..(patch + 1) * e]);
                    layer_norm_in_place(
                        out,
                        &p.input_norm.weight,
                        p.input_norm.bias.as_deref(),
                        c.merge_norm_eps,
                    );
                }
            });
        let hidden = sized(&mut s.up, n_out * wide);
        linear(&p.mm1.w.view(gguf)?, merged, n_out, hidden, &mut s.xq)?;
        add_bias(hidden, &p.mm1);
        hidden.par_iter_mut().for_each(|v| *v = gelu(*v));
        let dim = c.projection_dim;
        let mut data = vec![0.0f32; n_out * dim];
        linear(&p.mm2.w.view(gguf)?, hidden, n_out, &mut data, &mut s.xq)?;
        add_bias(&mut data, &p.mm2);
        Ok(ImageEmbeddings {
            n_tokens: n_out,
            n_embd: dim,
            nx,
            ny,
            data,
        })
    }
}

/// The rotations of a 2D RoPE encoder (base 10000) for each row of the layout,
/// `head_dim / 2` pairs a row: the first half of the pairs turned by one coordinate of the
/// patch (the row for [`VisionRope::Halves`], the column for [`VisionRope::Adjacent`]), the
/// second half by the other, each half's angle starting at the coordinate and advanced by
/// repeated multiplication as ggml's rotation cache does.
fn vision_rope(layout: &PatchLayout, head_dim: usize, kind: VisionRope) -> Vec<(f32, f32)> {
    let pairs = head_dim / 2;
    let quarter = head_dim / 4;
    let theta_scale = 10000.0f32.powf(-2.0 / pairs as f32);
    let mut out = Vec::with_capacity(layout.len() * pairs);
    for &(py, px) in &layout.order {
        let (first, second) = match kind {
            VisionRope::Halves => (py as f32, px as f32),
            VisionRope::Adjacent => (px as f32, py as f32),
        };
        let mut theta = first;
        for k in 0..pairs {
            if k == quarter {
                theta = second;
            }
            out.push((theta.cos(), theta.sin()));
            theta *= theta_scale;
        }
    }
    out
}

/// Rotates pairs `(i, i + half)` of one head by the given angles.
fn rotate_halves(head: &mut [f32], angles: &[(f32, f32)]) {
    let half = head.len() / 2;
    for (i, &(cos, sin)) in angles.iter().enumerate() {
        let (x0, x1) = (head[i], head[i + half]);
        head[i] = x0 * cos - x1 * sin;
        head[i + half] = x0 * sin + x1 * cos;
    }
}

/// Rotates pairs `(2i, 2i + 1)` of one head by the given angles.
fn rotate_adjacent(head: &mut [f32], angles: &[(f32, f32)]) {
    for (pair, &(cos, sin)) in head.chunks_exact_mut(2).zip(angles) {
        let (x0, x1) = (pair[0], pair[1]);
        pair[0] = x0 * cos - x1 * sin;
        pair[1] = x0 * sin + x1 * cos;
    }
}

fn norm_rows(x: &mut [f32], norm: &Norm, eps: f32) {
    let e = norm.weight.len();
    x.par_chunks_mut(e).for_each(|row| match &norm.bias {
        Some(b) => layer_norm_in_place(row, &norm.weight, Some(b), eps),
        None => rms_norm_in_place(row, &norm.weight, eps),
    });
}

fn add_bias(y: &mut [f32], a: &Affine) {
    if let Some(b) = &a.b {
        y.par_chunks_mut(b.len())
            .for_each(|row| row.iter_mut().zip(b).for_each(|(v, b)| *v += b));
    }
}

fn residual(x: &mut [f32], y: &[f32]) {
    x.par_iter_mut()
        .zip(y.par_iter())
        .for_each(|(x, y)| *x += y);
}
