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
}

impl ProjectorKind {
    fn from_name(name: &str) -> Option<ProjectorKind> {
        match name {
            "gemma3" => Some(ProjectorKind::Gemma3),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ProjectorKind::Gemma3 => "gemma3",
        }
    }
}

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
}

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
            ModelError::Config(format!(
                "vision projector `{name}` is not supported (supported: gemma3)"
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
        };
        let per_side = image_size / patch_size;
        if n_merge == 0 || !per_side.is_multiple_of(n_merge) {
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
        })
    }

    /// Patches a side of the encoder's square input.
    pub fn patches_per_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Tokens one image becomes.
    pub fn tokens_per_image(&self) -> usize {
        let side = self.patches_per_side() / self.n_merge;
        side * side
    }
}
