//! Locating and checking a vision encoder's tensors (`v.*`, `mm.*`). Matrices stay in the
//! mapped file; norms, biases and position rows are decoded to f32 at load.

use ferrox_core::WeightMatrix;
use ferrox_gguf::{GgmlType, Gguf};

use super::config::{ClipConfig, ProjectorKind, VisionNorm};
use crate::tensors::{Loader, MatrixRef};
use crate::ModelError;

/// A norm's weight and (LayerNorm) bias.
#[derive(Clone, Debug)]
pub struct Norm {
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
}

/// A matrix and its bias.
#[derive(Clone, Debug)]
pub struct Affine {
    pub w: MatrixRef,
    pub b: Option<Vec<f32>>,
}

/// Query, key and value projections: three matrices, or one whose rows are the query's,
/// the key's, then the value's (Qwen3-VL's `attn_qkv`).
// One per layer, made once at load: the size of the larger variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum VitQkv {
    Separate { q: Affine, k: Affine, v: Affine },
    Fused(Affine),
}

#[derive(Clone, Debug)]
pub struct VitLayer {
    pub ln1: Norm,
    pub qkv: VitQkv,
    pub o: Affine,
    pub ln2: Norm,
    pub up: Affine,
    /// The gate of a gated feed-forward (Qwen2.5-VL), if any.
    pub gate: Option<Affine>,
    pub down: Affine,
}

/// A matrix transposed at load (its file layout has the inputs as rows): the bytes of the
/// `rows × cols` matrix in the file's element type.
#[derive(Clone, Debug)]
pub struct OwnedMatrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub bytes: Vec<u8>,
}

impl OwnedMatrix {
    pub fn view(&self) -> Result<WeightMatrix<'_>, ModelError> {
        Ok(WeightMatrix::new(
            self.ty,
            self.rows,
            self.cols,
            &self.bytes,
        )?)
    }
}

/// Gemma 3's projector: the RMS norm of the pooled tokens, then the projection.
#[derive(Clone, Debug)]
pub struct Gemma3Projector {
    pub soft_emb_norm: Vec<f32>,
    pub input_projection: OwnedMatrix,
}

/// Qwen-VL's patch merger: each 2x2 block of patches as one row of four, through
/// `mm.0`, GELU and `mm.2`; Qwen3-VL's deepstack mergers besides.
#[derive(Clone, Debug)]
pub struct MergerProjector {
    pub mm0: Affine,
    pub mm2: Affine,
    pub deepstack: Vec<Deepstack>,
}

/// A Qwen3-VL deepstack merger after vision layer `layer`: the layer's output merged 2x2,
/// LayerNorm over the merged row, `fc1`, GELU, `fc2`.
#[derive(Clone, Debug)]
pub struct Deepstack {
    pub layer: usize,
    pub norm: Norm,
    pub fc1: Affine,
    pub fc2: Affine,
}

/// Kimi's projector: each patch row LayerNormed, `n_merge x n_merge` of them as one row
/// through `mm.1`, GELU and `mm.2`.
#[derive(Clone, Debug)]
pub struct KimiProjector {
    pub input_norm: Norm,
    pub mm1: Affine,
    pub mm2: Affine,
}

#[derive(Clone, Debug)]
pub enum ProjectorWeights {
    Gemma3(Gemma3Projector),
    Merger(Box<MergerProjector>),
    Kimi(Box<KimiProjector>),
}

#[derive(Clone, Debug)]
pub struct VisionWeights {
    /// The patch convolution as a matrix: one row per output channel, `3 × patch²` inputs
    /// (channel, then kernel row, then column), in the type ggml's convolution multiplies
    /// in (see [`patch_kernel`]).
    pub patch_embd: OwnedMatrix,
    /// Qwen-VL's second temporal kernel (`v.patch_embd.weight.1`): a still image is both
    /// frames, so its product is added.
    pub patch_embd_1: Option<OwnedMatrix>,
    pub patch_bias: Option<Vec<f32>>,
    /// One learned row per patch position of a grid of `position_grid` (columns, rows),
    /// in raster order (Gemma 3's, the input's; Qwen3-VL's and Kimi's, resized to each
    /// input).
    pub position_embd: Option<Vec<f32>>,
    pub position_grid: (usize, usize),
    pub pre_ln: Option<Norm>,
    pub layers: Vec<VitLayer>,
    pub post_ln: Option<Norm>,
    pub projector: ProjectorWeights,
}

impl VisionWeights {
    pub fn load(gguf: &Gguf, c: &ClipConfig) -> Result<VisionWeights, ModelError> {
        let l = Loader { gguf };
        let e = c.n_embd;
        let p = c.patch_size as u64;
        let norm = |prefix: &str| -> Result<Norm, ModelError> {
            let weight = l.vector(&format!("{prefix}.weight"), e)?;
            let bias = match c.norm {
                VisionNorm::Layer => Some(l.vector(&format!("{prefix}.bias"), e)?),
                VisionNorm::Rms => None,
            };
            Ok(Norm { weight, bias })
        };
        let opt_norm = |prefix: &str| -> Result<Option<Norm>, ModelError> {
            match l.find(&format!("{prefix}.weight")) {
                Some(_) => norm(prefix).map(Some),
                None => Ok(None),
            }
        };
        let affine = |name: &str, cols: usize, rows: usize| -> Result<Affine, ModelError> {
            Ok(Affine {
                w: l.matrix(&format!("{name}.weight"), cols, rows)?,
                b: l.opt_vector(&format!("{name}.bias"), rows)?,
            })
        };
        let kernel = |name: &str| -> Result<OwnedMatrix, ModelError> {
            patch_kernel(
                gguf,
                &l.matrix_of_shape(
                    name,
                    &[p, p, 3, e as u64],
                    (3 * c.patch_size * c.patch_size, e),
                )?,
            )
        };
        let patch_embd = kernel("v.patch_embd.weight")?;
        let patch_embd_1 = match c.projector.qwen() {
            true => Some(kernel("v.patch_embd.weight.1")?),
            false => None,
        };
        const POSITIONS: &str = "v.position_embd.weight";
        let position_grid = match c.projector {
            ProjectorKind::Qwen2Vl | ProjectorKind::Qwen25Vl => (0, 0),
            ProjectorKind::Gemma3 => (c.patches_per_side(), c.patches_per_side()),
            ProjectorKind::Qwen3Vl | ProjectorKind::KimiVl => {
                let t = l.require(POSITIONS)?;
                let n = t.shape.get(1).copied().unwrap_or(0) as usize;
                let side = (n as f64).sqrt() as usize;
                if side == 0 || side * side != n || side > MAX_POSITION_SIDE {
                    return Err(ModelError::Config(format!(
                        "`{POSITIONS}` holds {n} positions: a square grid of at most \
                         {MAX_POSITION_SIDE} a side is needed"
                    )));
                }
                (side, side)
            }
            // [n_embd, width, height].
            ProjectorKind::KimiK25 => {
                let t = l.require(POSITIONS)?;
                match t.shape.as_slice() {
                    &[_, w, h]
                        if (1..=MAX_POSITION_SIDE as u64).contains(&w)
                            && (1..=MAX_POSITION_SIDE as u64).contains(&h) =>
                    {
                        (w as usize, h as usize)
                    }
                    shape => {
                        return Err(ModelError::Config(format!(
                            "`{POSITIONS}` of shape {shape:?}: Kimi-K2.5 keeps [n_embd, width, \
                             height], at most {MAX_POSITION_SIDE} a side"
                        )))
                    }
                }
            }
        };
        let position_embd = match position_grid {
            (0, _) | (_, 0) => None,
            (gw, gh) => {
                let n_pos = gw * gh;
                let m = match c.projector {
                    ProjectorKind::KimiK25 => {
                        l.matrix_of_shape(POSITIONS, &[e as u64, gw as u64, gh as u64], (e, n_pos))?
                    }
                    _ => l.matrix(POSITIONS, e, n_pos)?,
                };
                let view = m.view(gguf)?;
                let mut rows = vec![0.0f32; n_pos * e];
                for (r, out) in rows.chunks_exact_mut(e).enumerate() {
                    view.dequant_row(r, out)?;
                }
                Some(rows)
            }
        };
        let mut layers = Vec::with_capacity(c.n_layer);
        for il in 0..c.n_layer {
            let blk = |t: &str| format!("v.blk.{il}.{t}");
            // Older converters swapped the names of the up and down projections; the
            // shapes tell (llama.cpp swaps them back the same way).
            let up_name = blk("ffn_up");
            let down_name = blk("ffn_down");
            let swapped = l
                .find(&format!("{down_name}.weight"))
                .is_some_and(|t| t.shape.first() == Some(&(e as u64)));
            let (up_name, down_name) = match swapped {
                true => (down_name, up_name),
                false => (up_name, down_name),
            };
            let gate = match l.find(&format!("{}.weight", blk("ffn_gate"))) {
                Some(_) => Some(affine(&blk("ffn_gate"), e, c.n_ff)?),
                None => None,
            };
            let qkv = match l.find(&format!("{}.weight", blk("attn_qkv"))) {
                Some(_) => VitQkv::Fused(affine(&blk("attn_qkv"), e, 3 * e)?),
                None => VitQkv::Separate {
                    q: affine(&blk("attn_q"), e, e)?,
                    k: affine(&blk("attn_k"), e, e)?,
                    v: affine(&blk("attn_v"), e, e)?,
                },
            };
            layers.push(VitLayer {
                ln1: norm(&blk("ln1"))?,
                qkv,
                o: affine(&blk("attn_out"), e, e)?,
                ln2: norm(&blk("ln2"))?,
                up: affine(&up_name, e, c.n_ff)?,
                gate,
                down: affine(&down_name, c.n_ff, e)?,
            });
        }
        if l.find(&format!("v.blk.{}.ln1.weight", c.n_layer)).is_some() {
            return Err(ModelError::Config(format!(
                "`clip.vision.block_count` is {} but the file has more vision layers",
                c.n_layer
            )));
        }
        let projector = match c.projector {
            ProjectorKind::Gemma3 => ProjectorWeights::Gemma3(Gemma3Projector {
                soft_emb_norm: l.vector("mm.soft_emb_norm.weight", e)?,
                input_projection: transposed(
                    &l,
                    "mm.input_projection.weight",
                    e,
                    c.projection_dim,
                )?,
            }),
            ProjectorKind::Qwen2Vl | ProjectorKind::Qwen25Vl | ProjectorKind::Qwen3Vl => {
                let mut deepstack = Vec::new();
                for il in 0..c.n_layer {
                    let name = |t: &str| format!("v.deepstack.{il}.{t}");
                    if l.find(&name("fc1.weight")).is_none() {
                        continue;
                    }
                    deepstack.push(Deepstack {
                        layer: il,
                        norm: Norm {
                            weight: l.vector(&name("norm.weight"), 4 * e)?,
                            bias: Some(l.vector(&name("norm.bias"), 4 * e)?),
                        },
                        fc1: affine(&name("fc1"), 4 * e, 4 * e)?,
                        fc2: affine(&name("fc2"), 4 * e, c.projection_dim)?,
                    });
                }
                ProjectorWeights::Merger(Box::new(MergerProjector {
                    mm0: affine("mm.0", 4 * e, 4 * e)?,
                    mm2: affine("mm.2", 4 * e, c.projection_dim)?,
                    deepstack,
                }))
            }
            ProjectorKind::KimiVl | ProjectorKind::KimiK25 => {
                let wide = c.n_merge * c.n_merge * e;
                ProjectorWeights::Kimi(Box::new(KimiProjector {
                    input_norm: Norm {
                        weight: l.vector("mm.input_norm.weight", e)?,
                        bias: Some(l.vector("mm.input_norm.bias", e)?),
                    },
                    mm1: affine("mm.1", wide, wide)?,
                    mm2: affine("mm.2", wide, c.projection_dim)?,
                }))
            }
        };
        Ok(VisionWeights {
            patch_embd,
            patch_embd_1,
            patch_bias: l.opt_vector("v.patch_embd.bias", e)?,
            position_embd,
            position_grid,
            pre_ln: opt_norm("v.pre_ln")?,
            layers,
            post_ln: opt_norm("v.post_ln")?,
            projector,
        })
    }
}

/// The widest grid of learned positions taken (real files hold 64).
const MAX_POSITION_SIDE: usize = 1024;

/// ggml's `conv_2d` unfolds the image into f16 columns (f32 for a bf16 kernel) and
/// multiplies them by the kernel in that type: an f32 or f16 kernel becomes f16 (its values
/// and the patches rounded to f16, the sums f32), a bf16 kernel f32.
fn patch_kernel(gguf: &Gguf, m: &MatrixRef) -> Result<OwnedMatrix, ModelError> {
    let view = m.view(gguf)?;
    let ty = match view.ty() {
        GgmlType::F32 | GgmlType::F16 => GgmlType::F16,
        GgmlType::Bf16 => GgmlType::F32,
        ty => {
            return Err(ModelError::UnsupportedTensorType {
                name: m.name().to_string(),
                ty: format!(
                    "{} (the patch convolution takes f32, f16 or bf16)",
                    ty.name()
                ),
            })
        }
    };
    let mut row = vec![0.0f32; m.cols];
    let mut bytes = Vec::with_capacity(m.rows * m.cols * 4);
    for r in 0..m.rows {
        view.dequant_row(r, &mut row)?;
        for &v in &row {
            match ty {
                GgmlType::F16 => bytes.extend(half::f16::from_f32(v).to_le_bytes()),
                _ => bytes.extend(v.to_le_bytes()),
            }
        }
    }
    let out = OwnedMatrix {
        ty,
        rows: m.rows,
        cols: m.cols,
        bytes,
    };
    out.view()?;
    Ok(out)
}

/// A matrix stored with its inputs as rows (ggml shape `[rows, cols]`), transposed into a
/// `rows × cols` matrix of the same element type, as llama.cpp's `ggml_cont(ggml_transpose)`
/// makes it.
fn transposed(
    l: &Loader<'_>,
    name: &str,
    cols: usize,
    rows: usize,
) -> Result<OwnedMatrix, ModelError> {
    let t = l.require(name)?;
    if t.shape.as_slice() != [rows as u64, cols as u64] {
        return Err(ModelError::TensorShape {
            name: name.to_string(),
            expected: vec![rows as u64, cols as u64],
            found: t.shape.clone(),
        });
    }
    let width = match t.ty {
        GgmlType::F32 => 4,
        GgmlType::F16 | GgmlType::Bf16 => 2,
        ty => {
            return Err(ModelError::UnsupportedTensorType {
                name: name.to_string(),
                ty: format!(
                    "{} (this matrix is transposed at load: f32, f16 or bf16 only)",
                    ty.name()
                ),
            })
        }
    };
    let src = l.gguf.tensor_data(t)?;
    let mut bytes = vec![0u8; rows * cols * width];
    // File element (c, r) — row c of `rows` values — becomes (r, c).
    for c in 0..cols {
        for r in 0..rows {
            let from = (c * rows + r) * width;
            let to = (r * cols + c) * width;
            bytes[to..to + width].copy_from_slice(&src[from..from + width]);
        }
    }
    // Decodable by construction; checked once here so products cannot fail later.
    let m = OwnedMatrix {
        ty: t.ty,
        rows,
        cols,
        bytes,
    };
    m.view()?;
    Ok(m)
}
