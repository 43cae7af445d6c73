//! What a vision projector file (llama.cpp's `mmproj` GGUF, `general.architecture = clip`)
//! says about its encoder: the `clip.vision.*` keys and the projector type.

use ferrox_gguf::Metadata;

use super::image::ResizeFilter;
use crate::ModelError;

/// The projectors built. Files of another projector type are refused by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProjectorKind {
    /// Gemma 3: SigLIP, the patch grid average-pooled, RMS-normed and projected.
    Gemma3,
    /// Qwen2-VL: a ViT over the image at its own size (two temporal patch kernels, 2D RoPE,
    /// LayerNorm), 2x2 patches merged and projected by a two-layer MLP.
    Qwen2Vl,
    /// Qwen2.5-VL: Qwen2-VL's encoder with RMS norms, a gated SiLU feed-forward and window
    /// attention in every layer but each `n_wa_pattern`-th.
    Qwen25Vl,
    /// Qwen3-VL: Qwen2-VL's encoder with a patch bias, learned positions resized to the
    /// image, a fused QKV and "deepstack" mergers after some layers whose outputs go
    /// beside the main projection (the language model adds them after its first layers).
    Qwen3Vl,
    /// Kimi-VL (MoonViT): a ViT over the image at its own size (learned positions resized
    /// to it, 2D RoPE over the halves of each head, LayerNorm), `n_merge x n_merge` patches
    /// LayerNormed, merged and projected by a two-layer MLP; tokens in plain positions.
    KimiVl,
    /// Kimi-K2.5 (MoonViT3d, also GLM-5.2-V's): Kimi-VL's encoder with a fused QKV and the
    /// positions resized bicubically from a grid of their own width and height.
    KimiK25,
}

impl ProjectorKind {
    const ALL: [ProjectorKind; 6] = [
        ProjectorKind::Gemma3,
        ProjectorKind::Qwen2Vl,
        ProjectorKind::Qwen25Vl,
        ProjectorKind::Qwen3Vl,
        ProjectorKind::KimiVl,
        ProjectorKind::KimiK25,
    ];

    fn from_name(name: &str) -> Option<ProjectorKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            ProjectorKind::Gemma3 => "gemma3",
            ProjectorKind::Qwen2Vl => "qwen2vl_merger",
            ProjectorKind::Qwen25Vl => "qwen2.5vl_merger",
            ProjectorKind::Qwen3Vl => "qwen3vl_merger",
            ProjectorKind::KimiVl => "kimivl",
            ProjectorKind::KimiK25 => "kimik25",
        }
    }

    /// The Qwen-VL family: two temporal patch kernels, 2x2 merging in blocks, tokens placed
    /// by M-RoPE.
    pub fn qwen(self) -> bool {
        matches!(
            self,
            ProjectorKind::Qwen2Vl | ProjectorKind::Qwen25Vl | ProjectorKind::Qwen3Vl
        )
    }

    /// The Kimi family (MoonViT): raster patches, 2D RoPE over head halves, merged patches
    /// LayerNormed and projected.
    pub fn kimi(self) -> bool {
        matches!(self, ProjectorKind::KimiVl | ProjectorKind::KimiK25)
    }

    /// Whether the encoder takes the image at (about) its own size, as a grid of merged
    /// patches (the Qwen-VL and Kimi families), rather than fitted into a fixed square.
    pub fn dynamic_size(self) -> bool {
        self.qwen() || self.kimi()
    }
}

/// The encoder's normalization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VisionNorm {
    Layer,
    Rms,
}

/// Limits of a dynamic-size encoder's input: the image is resized, aspect kept, to sides that
/// are multiples of `align` pixels with between `min_pixels` and `max_pixels` in all
/// (llama.cpp's `calc_size_preserved_ratio`, Qwen's "smart resize").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DynamicSize {
    pub align: usize,
    pub min_pixels: usize,
    pub max_pixels: usize,
    /// Whether `--image-min-tokens` / `--image-max-tokens` apply: llama.cpp ignores them
    /// for a Kimi-K2.5 file that states its own pixel limits.
    pub adjustable: bool,
}

/// Image-token limits by family, llama.cpp's: Qwen-VL's (from Qwen2.5-VL's preprocessor),
/// Kimi-VL's, and Kimi-K2.5's when the file states no pixel limits.
const QWEN_TOKENS: (usize, usize) = (8, 4096);
const KIMIVL_TOKENS: (usize, usize) = (8, 1024);
const KIMIK25_TOKENS: (usize, usize) = (2, 4096);
/// The most patches merged into one token a side.
const MAX_MERGE: usize = 8;
/// The most pixels a dynamic-size input may have, whatever the file says (4x the most a
/// real Qwen-VL file allows: 4096 tokens of 32x32 pixels).
const MAX_DYNAMIC_PIXELS: usize = 1 << 24;
/// Qwen2.5-VL's attention window, in pixels (llama.cpp's default; files do not say).
const QWEN_WINDOW_PIXELS: usize = 112;

/// The vision feed-forward activation (`clip.use_gelu` / `clip.use_silu`; neither means
/// the "quick" GELU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VisionFfnAct {
    Gelu,
    Silu,
    GeluQuick,
}

/// A vision encoder's shapes and preprocessing.
#[derive(Clone, Debug)]
pub struct ClipConfig {
    pub projector: ProjectorKind,
    pub n_embd: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    /// The language model's width the projector writes (`clip.vision.projection_dim`).
    pub projection_dim: usize,
    pub eps: f32,
    pub image_size: usize,
    pub patch_size: usize,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
    /// Patches per side merged into one token (Gemma 3's pooling kernel).
    pub n_merge: usize,
    pub ffn_act: VisionFfnAct,
    pub resize: ResizeFilter,
    pub norm: VisionNorm,
    /// Dynamic-size encoders' input limits (`None`: the fixed `image_size` square).
    pub dynamic: Option<DynamicSize>,
    /// Window attention in every layer but each `n_wa_pattern`-th (0: none).
    pub n_wa_pattern: usize,
    /// The attention window's side, in merged tokens.
    pub window_tokens: usize,
    /// The epsilon of the norm over the patches before merging (Kimi's projector).
    pub merge_norm_eps: f32,
}

/// The most layers a vision encoder may have (real ones have up to about 48; a count from a
/// hostile file must not size anything).
const MAX_LAYERS: usize = 1024;

/// The longest a side of the encoder's input may be, in patches (bounds the attention's
/// memory for a hostile file).
const MAX_PATCHES_PER_SIDE: usize = 256;

impl ClipConfig {
    pub fn read(meta: &Metadata<'_>) -> Result<ClipConfig, ModelError> {
        let arch = meta.architecture()?;
        if arch != "clip" {
            return Err(ModelError::Config(format!(
                "`general.architecture` is `{arch}`: a vision projector file says `clip`"
            )));
        }
        if meta.opt_bool("clip.has_vision_encoder")? == Some(false) {
            return Err(ModelError::Config(
                "the file has no vision encoder (`clip.has_vision_encoder` is false)".into(),
            ));
        }
        let name = match meta.opt_str("clip.projector_type")? {
            Some(n) => n,
            None => meta.opt_str("clip.vision.projector_type")?.ok_or_else(|| {
                ModelError::Config("no `clip.projector_type` in the vision file".into())
            })?,
        };
        let projector = ProjectorKind::from_name(name).ok_or_else(|| {
            let built: Vec<&str> = ProjectorKind::ALL.iter().map(|k| k.name()).collect();
            ModelError::Config(format!(
                "vision projector `{name}` is not supported (supported: {})",
                built.join(", ")
            ))
        })?;
        let u = |key: &str| -> Result<usize, ModelError> { Ok(meta.get_usize(key)?) };
        let n_embd = u("clip.vision.embedding_length")?;
        let n_head = u("clip.vision.attention.head_count")?;
        let n_ff = u("clip.vision.feed_forward_length")?;
        let n_layer = u("clip.vision.block_count")?;
        let projection_dim = u("clip.vision.projection_dim")?;
        let image_size = u("clip.vision.image_size")?;
        let patch_size = u("clip.vision.patch_size")?;
        let eps = meta.get_f32("clip.vision.attention.layer_norm_epsilon")?;
        if let Some(kv) = meta.opt_usize("clip.vision.attention.head_count_kv")? {
            if kv != n_head {
                return Err(ModelError::Config(format!(
                    "`clip.vision.attention.head_count_kv` = {kv}: the vision encoders built \
                     give every head its own keys ({n_head})"
                )));
            }
        }
        if n_layer == 0 || n_layer > MAX_LAYERS {
            return Err(ModelError::Config(format!(
                "`clip.vision.block_count` is {n_layer}: a vision encoder has 1 to {MAX_LAYERS} layers"
            )));
        }
        if n_embd == 0 || n_head == 0 || !n_embd.is_multiple_of(n_head) || n_ff == 0 {
            return Err(ModelError::Config(format!(
                "vision widths must be positive, the width a multiple of the heads \
                 (embedding {n_embd}, heads {n_head}, feed-forward {n_ff})"
            )));
        }
        let head_dim = match meta.opt_usize("clip.vision.attention.head_dim")? {
            Some(d) if d * n_head != n_embd => {
                return Err(ModelError::Config(format!(
                    "`clip.vision.attention.head_dim` = {d} with {n_head} heads of a \
                     {n_embd}-wide encoder"
                )))
            }
            _ => n_embd / n_head,
        };
        if head_dim > ferrox_core::dense_attn::MAX_HEAD_DIM {
            return Err(ModelError::Config(format!(
                "a vision head of {head_dim} values: at most {}",
                ferrox_core::dense_attn::MAX_HEAD_DIM
            )));
        }
        if patch_size == 0
            || image_size == 0
            || !image_size.is_multiple_of(patch_size)
            || image_size / patch_size > MAX_PATCHES_PER_SIDE
        {
            return Err(ModelError::Config(format!(
                "`clip.vision.image_size` {image_size} must be a positive multiple of \
                 `clip.vision.patch_size` {patch_size}, at most {MAX_PATCHES_PER_SIDE} patches a side"
            )));
        }
        let triple = |key: &str| -> Result<[f32; 3], ModelError> {
            let arr = meta.get_array(key)?;
            let values: Vec<f32> = arr
                .iter()
                .map(|v| v.as_f64().map(|x| x as f32))
                .collect::<Option<_>>()
                .ok_or_else(|| ModelError::Config(format!("`{key}` must hold numbers")))?;
            match values.as_slice() {
                [a, b, c, ..] => Ok([*a, *b, *c]),
                _ => Err(ModelError::Config(format!(
                    "`{key}` must have at least 3 values, one per colour channel"
                ))),
            }
        };
        let image_mean = triple("clip.vision.image_mean")?;
        let image_std = triple("clip.vision.image_std")?;
        if image_std.iter().any(|&s| s == 0.0 || !s.is_finite()) {
            return Err(ModelError::Config(format!(
                "`clip.vision.image_std` {image_std:?} must be finite and non-zero"
            )));
        }
        let ffn_act = match (
            meta.opt_bool("clip.use_gelu")?.unwrap_or(false),
            meta.opt_bool("clip.use_silu")?.unwrap_or(false),
        ) {
            (true, true) => {
                return Err(ModelError::Config(
                    "both `clip.use_gelu` and `clip.use_silu` are set".into(),
                ))
            }
            (true, false) => VisionFfnAct::Gelu,
            (false, true) => VisionFfnAct::Silu,
            (false, false) => VisionFfnAct::GeluQuick,
        };
        let (n_merge, resize) = match projector {
            // Every Gemma 3 size pools 4x4 patches; small test files say otherwise.
            ProjectorKind::Gemma3 => (
                meta.opt_usize("clip.vision.projector.scale_factor")?
                    .unwrap_or(4),
                ResizeFilter::Bilinear,
            ),
            ProjectorKind::Qwen2Vl | ProjectorKind::Qwen25Vl | ProjectorKind::Qwen3Vl => {
                let merge = meta
                    .opt_usize("clip.vision.spatial_merge_size")?
                    .unwrap_or(2);
                if merge != 2 {
                    // llama.cpp's graph merges 2x2 patches whatever the key says.
                    return Err(ModelError::Config(format!(
                        "`clip.vision.spatial_merge_size` {merge}: Qwen-VL encoders merge 2x2 patches"
                    )));
                }
                (merge, ResizeFilter::Bicubic)
            }
            ProjectorKind::KimiVl | ProjectorKind::KimiK25 => {
                let merge = meta
                    .opt_usize("clip.vision.projector.scale_factor")?
                    .unwrap_or(0);
                if !(2..=MAX_MERGE).contains(&merge) {
                    return Err(ModelError::Config(format!(
                        "`clip.vision.projector.scale_factor` {merge}: Kimi encoders merge \
                         2 to {MAX_MERGE} patches a side"
                    )));
                }
                (merge, ResizeFilter::Bicubic)
            }
        };
        let norm = match projector {
            ProjectorKind::Qwen25Vl => VisionNorm::Rms,
            _ => VisionNorm::Layer,
        };
        let n_wa_pattern = match projector {
            ProjectorKind::Qwen25Vl => meta.get_usize("clip.vision.n_wa_pattern")?,
            _ => 0,
        };
        let dynamic = match projector.dynamic_size() {
            true => Some(dynamic_limits(meta, projector, patch_size, n_merge)?),
            false => None,
        };
        if dynamic.is_some() && !head_dim.is_multiple_of(4) {
            return Err(ModelError::Config(format!(
                "a vision head of {head_dim} values: 2D RoPE needs a multiple of 4"
            )));
        }
        let per_side = image_size / patch_size;
        if n_merge == 0 || (dynamic.is_none() && !per_side.is_multiple_of(n_merge)) {
            return Err(ModelError::Config(format!(
                "`clip.vision.projector.scale_factor` {n_merge} must divide the {per_side} \
                 patches a side"
            )));
        }
        Ok(ClipConfig {
            projector,
            n_embd,
            n_head,
            head_dim,
            n_ff,
            n_layer,
            projection_dim,
            eps,
            image_size,
            patch_size,
            image_mean,
            image_std,
            n_merge,
            ffn_act,
            resize,
            norm,
            dynamic,
            n_wa_pattern,
            window_tokens: (QWEN_WINDOW_PIXELS / patch_size / n_merge).max(1),
            merge_norm_eps: match projector {
                // llama.cpp's Kimi-VL graph uses PyTorch's default, whatever the file says.
                ProjectorKind::KimiVl => 1e-5,
                _ => eps,
            },
        })
    }

    /// Sets a dynamic-size encoder's token limits (llama.cpp's `--image-min-tokens` /
    /// `--image-max-tokens`), each `None` keeping the family's; fixed-size encoders ignore
    /// them, as llama.cpp does. A minimum above the maximum, or 0, is refused.
    pub fn limit_image_tokens(
        &mut self,
        min: Option<usize>,
        max: Option<usize>,
    ) -> Result<(), ModelError> {
        let Some(d) = self.dynamic.as_mut().filter(|d| d.adjustable) else {
            return Ok(());
        };
        if min == Some(0) || max == Some(0) {
            return Err(ModelError::Config(
                "image token limits must be positive".into(),
            ));
        }
        if let (Some(lo), Some(hi)) = (min, max) {
            if lo > hi {
                return Err(ModelError::Config(format!(
                    "image token limits: a minimum of {lo} above a maximum of {hi}"
                )));
            }
        }
        let area = d.align.saturating_mul(d.align);
        let max_pixels = max.map_or(d.max_pixels, |n| {
            n.saturating_mul(area).min(MAX_DYNAMIC_PIXELS)
        });
        let min_pixels = min.map_or(d.min_pixels, |n| n.saturating_mul(area));
        d.max_pixels = max_pixels;
        d.min_pixels = min_pixels.min(max_pixels);
        Ok(())
    }

    /// The encoder's input size for an image of `width × height`: the fixed square, or for
    /// dynamic-size encoders the aspect-keeping aligned size within the pixel limits,
    /// computed in f32 as llama.cpp does.
    pub fn input_size(&self, width: usize, height: usize) -> (usize, usize) {
        let Some(d) = self.dynamic else {
            return (self.image_size, self.image_size);
        };
        let f = d.align as f32;
        let round = |x: f32| (x / f).round() as usize * d.align;
        let ceil = |x: f32| (x / f).ceil() as usize * d.align;
        let floor = |x: f32| (x / f).floor() as usize * d.align;
        let (w, h) = (width as f32, height as f32);
        let mut w_bar = d.align.max(round(w));
        let mut h_bar = d.align.max(round(h));
        if h_bar * w_bar > d.max_pixels {
            let beta = (h * w / d.max_pixels as f32).sqrt();
            h_bar = d.align.max(floor(h / beta));
            w_bar = d.align.max(floor(w / beta));
        } else if h_bar * w_bar < d.min_pixels {
            let beta = (d.min_pixels as f32 / (h * w)).sqrt();
            h_bar = ceil(h * beta);
            w_bar = ceil(w * beta);
        }
        (w_bar, h_bar)
    }

    /// Patches a side of the encoder's square input.
    pub fn patches_per_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Tokens one image becomes: for dynamic-size encoders, the most (at the pixel limit).
    pub fn tokens_per_image(&self) -> usize {
        match self.dynamic {
            Some(d) => d.max_pixels / (d.align * d.align),
            None => {
                let side = self.patches_per_side() / self.n_merge;
                side * side
            }
        }
    }
}

/// A dynamic-size encoder's input limits: the family's token limits as pixels of merged
/// patches, or (Kimi-K2.5) the file's `clip.vision.image_{min,max}_pixels` when it states
/// both; capped at [`MAX_DYNAMIC_PIXELS`] whatever the file says.
fn dynamic_limits(
    meta: &Metadata<'_>,
    projector: ProjectorKind,
    patch_size: usize,
    n_merge: usize,
) -> Result<DynamicSize, ModelError> {
    let align = patch_size.saturating_mul(n_merge);
    let area = align.saturating_mul(align);
    let from_tokens = |(lo, hi): (usize, usize)| (lo.saturating_mul(area), hi.saturating_mul(area));
    let ((min_pixels, max_pixels), adjustable) = match projector {
        ProjectorKind::KimiVl => (from_tokens(KIMIVL_TOKENS), true),
        ProjectorKind::KimiK25 => {
            let min = meta.opt_usize("clip.vision.image_min_pixels")?.unwrap_or(0);
            let max = meta.opt_usize("clip.vision.image_max_pixels")?.unwrap_or(0);
            match min > 0 && max > 0 {
                true => ((min, max), false),
                false => (from_tokens(KIMIK25_TOKENS), true),
            }
        }
        _ => (from_tokens(QWEN_TOKENS), true),
    };
    // A hostile patch size or pixel limit must not make the resized input huge.
    let max_pixels = max_pixels.min(MAX_DYNAMIC_PIXELS);
    Ok(DynamicSize {
        align,
        min_pixels: min_pixels.min(max_pixels),
        max_pixels,
        adjustable,
    })
}
