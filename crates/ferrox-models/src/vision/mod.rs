//! Images in: the vision encoders of llama.cpp's multimodal projector files (`mmproj`
//! GGUFs), computed as llama.cpp's `mtmd` computes them, on the shared layers and kernels.
//!
//! An image is decoded ([`RgbImage::decode`]), resized and normalized as the projector's
//! family expects ([`image`]), cut into patches, run through the vision transformer and
//! projected into the language model's embedding space: one row per image token, placed
//! into the sequence between the family's markers (see [`VisionEncoder::markers`]).
//!
//! Attention: llama.cpp's default runs the encoder's attention through flash attention
//! with keys and values rounded to f16; [`VisionOptions::f32_attention`] keeps them f32 (its
//! `--flash-attn off`).

pub mod config;
pub mod image;
mod weights;

use std::path::Path;
use std::sync::Arc;

use ferrox_gguf::Gguf;
use rayon::prelude::*;

pub use config::{ClipConfig, ProjectorKind, VisionFfnAct};
pub use image::{ImageError, ResizeFilter, RgbImage};
use weights::{Affine, Norm, ProjectorWeights, VisionWeights, VitLayer};

use crate::layers::activation::{gelu, silu};
use crate::layers::linear::{linear, linear_many};
use crate::layers::norm::{layer_norm_in_place, rms_norm_in_place};
use crate::scaffold::sized;
use crate::ModelError;
use ferrox_core::dense_attn::{DenseAttention, DenseScratch, KvPrecision};

/// How to run a vision encoder.
#[derive(Clone, Debug, Default)]
pub struct VisionOptions {
    /// Worker threads; 0 means one per available core.
    pub threads: usize,
    /// Attention with f32 keys and values (llama.cpp's `--flash-attn off`) instead of f16.
    pub f32_attention: bool,
}

/// One image's embeddings: `n_tokens` rows of the language model's width.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageEmbeddings {
    pub n_tokens: usize,
    pub n_embd: usize,
    pub data: Vec<f32>,
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
    xq: Vec<u8>,
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
        let config = ClipConfig::read(&gguf.metadata())?;
        if config.ffn_act == VisionFfnAct::GeluQuick {
            return Err(ModelError::Config(
                "the vision feed-forward uses the quick GELU, which is not built".into(),
            ));
        }
        let weights = VisionWeights::load(&gguf, &config)?;
        let threads = match options.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("vision-{i}"))
            .build()
            .map_err(|e| ModelError::Config(format!("vision thread pool: {e}")))?;
        Ok(VisionEncoder {
            gguf,
            config,
            weights,
            pool,
            f32_attention: options.f32_attention,
        })
    }

    pub fn config(&self) -> &ClipConfig {
        &self.config
    }

    /// The language model's width the embeddings have.
    pub fn output_width(&self) -> usize {
        self.config.projection_dim
    }

    /// Tokens each image becomes.
    pub fn tokens_per_image(&self) -> usize {
        self.config.tokens_per_image()
    }

    /// The text around an image's embeddings in the prompt (tokenized with the model's
    /// vocabulary, special tokens parsed).
    pub fn markers(&self) -> (&'static str, &'static str) {
        match self.config.projector {
            ProjectorKind::Gemma3 => ("<start_of_image>", "<end_of_image>"),
        }
    }

    /// Whether the image's tokens attend to each other both ways in the language model
    /// (Gemma 3), rather than causally.
    pub fn bidirectional(&self) -> bool {
        match self.config.projector {
            ProjectorKind::Gemma3 => true,
        }
    }

    /// The encoder's input: the image fitted into the square input (aspect kept, black
    /// padding), normalized, as planar channels.
    pub fn preprocess(&self, img: &RgbImage) -> Result<Vec<f32>, ModelError> {
        img.check()?;
        let c = &self.config;
        let s = c.image_size;
        let fitted = image::resize_padded(img, s, s, c.resize, [0, 0, 0]);
        Ok(image::normalize_planar(&fitted, c.image_mean, c.image_std))
    }

    /// The image's embeddings.
    pub fn encode(&self, img: &RgbImage) -> Result<ImageEmbeddings, ModelError> {
        let planar = self.preprocess(img)?;
        self.encode_planar(&planar)
    }

    /// The embeddings of an already preprocessed input ([`preprocess`](Self::preprocess)).
    pub fn encode_planar(&self, planar: &[f32]) -> Result<ImageEmbeddings, ModelError> {
        let c = &self.config;
        if planar.len() != 3 * c.image_size * c.image_size {
            return Err(ModelError::Config(format!(
                "{} input values for a {}x{} RGB input",
                planar.len(),
                c.image_size,
                c.image_size
            )));
        }
        self.pool.install(|| {
            let mut s = Scratch::default();
            self.embed_patches(planar, &mut s)?;
            let n = c.patches_per_side() * c.patches_per_side();
            let e = c.n_embd;
            if let Some(norm) = &self.weights.pre_ln {
                norm_rows(&mut s.x[..n * e], norm, c.eps);
            }
            for layer in &self.weights.layers {
                self.layer(layer, n, &mut s)?;
            }
            if let Some(norm) = &self.weights.post_ln {
                norm_rows(&mut s.x[..n * e], norm, c.eps);
            }
            match &self.weights.projector {
                ProjectorWeights::Gemma3(p) => self.gemma3_projector(p, &mut s),
            }
        })
    }

    /// The patch convolution (stride = kernel = patch size) as one product, plus its bias,
    /// plus the position rows.
    fn embed_patches(&self, planar: &[f32], s: &mut Scratch) -> Result<(), ModelError> {
        let c = &self.config;
        let (side, p, e) = (c.patches_per_side(), c.patch_size, c.n_embd);
        let plane = c.image_size * c.image_size;
        let cols = 3 * p * p;
        let n = side * side;
        // Each patch's values in the kernel's order: channel, kernel row, column.
        let mut patches = vec![0.0f32; n * cols];
        patches
            .par_chunks_mut(cols)
            .enumerate()
            .for_each(|(i, out)| {
                let (py, px) = (i / side, i % side);
                for ch in 0..3 {
                    for ky in 0..p {
                        let y = py * p + ky;
                        let src = &planar[ch * plane + y * c.image_size + px * p..][..p];
                        out[(ch * p + ky) * p..][..p].copy_from_slice(src);
                    }
                }
            });
        let x = sized(&mut s.x, n * e);
        linear(&self.weights.patch_embd.view()?, &patches, n, x, &mut s.xq)?;
        let bias = self.weights.patch_bias.as_deref();
        x.par_chunks_mut(e)
            .zip(self.weights.position_embd.par_chunks(e))
            .for_each(|(row, pos)| {
                if let Some(b) = bias {
                    row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
                }
                row.iter_mut().zip(pos).for_each(|(v, p)| *v += p);
            });
        Ok(())
    }

    /// One pre-norm transformer layer over the `n` patch rows.
    fn layer(&self, lw: &VitLayer, n: usize, s: &mut Scratch) -> Result<(), ModelError> {
        let c = &self.config;
        let (e, hd) = (c.n_embd, c.head_dim);
        let gguf = &*self.gguf;
        let xn = sized(&mut s.xn, n * e);
        xn.copy_from_slice(&s.x[..n * e]);
        norm_rows(xn, &lw.ln1, c.eps);
        let q = sized(&mut s.q, n * e);
        let k = sized(&mut s.k, n * e);
        let v = sized(&mut s.v, n * e);
        let (wq, wk, wv) = (lw.q.w.view(gguf)?, lw.k.w.view(gguf)?, lw.v.w.view(gguf)?);
        linear_many(
            &[&wq, &wk, &wv],
            xn,
            n,
            &mut [&mut *q, &mut *k, &mut *v],
            &mut s.xq,
        )?;
        add_bias(q, &lw.q);
        add_bias(k, &lw.k);
        add_bias(v, &lw.v);
        let attention = DenseAttention {
            n_head: c.n_head,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            kv: if self.f32_attention {
                KvPrecision::F32
            } else {
                KvPrecision::F16
            },
        };
        let attn = sized(&mut s.attn, n * e);
        attention.run(q, k, v, n, attn, &mut s.dense);
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
        let act: fn(f32) -> f32 = match c.ffn_act {
            VisionFfnAct::Gelu => gelu,
            VisionFfnAct::Silu => silu,
            VisionFfnAct::GeluQuick => unreachable!("refused at load"),
        };
        up.par_iter_mut().for_each(|v| *v = act(*v));
        let proj = sized(&mut s.proj, n * e);
        linear(&lw.down.w.view(gguf)?, up, n, proj, &mut s.xq)?;
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
            data,
        })
    }
}

fn norm_rows(x: &mut [f32], norm: &Norm, eps: f32) {
    let e = norm.weight.len();
    x.par_chunks_mut(e)
        .for_each(|row| layer_norm_in_place(row, &norm.weight, Some(&norm.bias), eps));
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
