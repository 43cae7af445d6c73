//! Turning an architecture's tensor table into a [`Gguf`]: tensors stored as F32, F16 or
//! BF16 and used as they are point into the mapped shards; the others (transformed, or
//! FP8 blocks) are computed into memory, one buffer each.

use std::borrow::Cow;

use ::safetensors::Dtype;
use ferrox_gguf::{GgmlType, Gguf, OwnedValue, TensorPart, TensorStorage};
use half::{bf16, f16};

use crate::config::Config;
use crate::error::{HfError, Result};
use crate::shards::{Shards, StoredTensor};

/// How one GGUF tensor is made from the stored ones.
#[derive(Clone, Debug)]
pub enum Op {
    /// The stored values as they are (only the shape may be read differently).
    Stored(String),
    /// `-exp(x)` of the first `take` values, as F32 (`A_log` into the decay rate llama.cpp
    /// stores).
    NegExp { src: String, take: usize },
    /// The elementwise product of two tensors of as many values, as F32.
    Product(String, String),
    /// Tensors of one type laid end to end (per-expert matrices into one stacked tensor).
    Stack(Vec<String>),
    /// A matrix of `n_head` blocks of `rows` rows each (`kv_b_proj`): rows
    /// `start..start + len` of each block, each block's slice transposed if `transpose`.
    HeadRows {
        src: String,
        n_head: usize,
        rows: usize,
        start: usize,
        len: usize,
        transpose: bool,
    },
}

/// One tensor of the GGUF view.
#[derive(Clone, Debug)]
pub struct PlannedTensor {
    pub name: String,
    /// ggml order: `shape[0]` is contiguous.
    pub shape: Vec<u64>,
    pub op: Op,
}

/// The checkpoint as a [`Gguf`].
pub(crate) fn assemble(
    metadata: Vec<(String, OwnedValue)>,
    shards: Shards,
    tensors: Vec<PlannedTensor>,
    config: &Config,
) -> Result<Gguf> {
    let fp8 = Fp8::from_config(config)?;
    let n_files = shards.len();
    let mut owned: Vec<Vec<u8>> = Vec::new();
    let mut parts = Vec::with_capacity(tensors.len());
    for t in tensors {
        let mut to_owned = |ty: GgmlType, bytes: Vec<u8>| {
            owned.push(bytes);
            (ty, n_files + owned.len() - 1, 0u64)
        };
        let (ty, storage, offset) = match &t.op {
            Op::Stored(src) => {
                let st = shards.require(src)?;
                match float_type(st.dtype) {
                    Some(ty) => (ty, st.shard, st.offset as u64),
                    None => {
                        let (ty, bytes) = fp8.resolve(&shards, st)?;
                        to_owned(ty, bytes.into_owned())
                    }
                }
            }
            Op::NegExp { src, take } => {
                let st = shards.require(src)?;
                let (ty, bytes) = fp8.resolve(&shards, st)?;
                let out: Vec<u8> = to_f32(ty, &bytes)
                    .iter()
                    .take(*take)
                    .flat_map(|&a| ((-(f64::from(a)).exp()) as f32).to_le_bytes())
                    .collect();
                to_owned(GgmlType::F32, out)
            }
            Op::Product(a, b) => {
                let (ta, a) = fp8.resolve(&shards, shards.require(a)?)?;
                let (tb, b) = fp8.resolve(&shards, shards.require(b)?)?;
                let out: Vec<u8> = to_f32(ta, &a)
                    .iter()
                    .zip(to_f32(tb, &b))
                    .flat_map(|(x, y)| (x * y).to_le_bytes())
                    .collect();
                to_owned(GgmlType::F32, out)
            }
            Op::Stack(srcs) => {
                let mut out = Vec::new();
                let mut out_ty = None;
                for src in srcs {
                    let (ty, bytes) = fp8.resolve(&shards, shards.require(src)?)?;
                    if *out_ty.get_or_insert(ty) != ty {
                        return Err(HfError::UnsupportedDtype {
                            name: src.clone(),
                            dtype: ty.to_string(),
                            reason: format!(
                                "stacked with tensors of another type into `{}`",
                                t.name
                            ),
                        });
                    }
                    out.extend_from_slice(&bytes);
                }
                to_owned(out_ty.unwrap_or(GgmlType::F32), out)
            }
            Op::HeadRows {
                src,
                n_head,
                rows,
                start,
                len,
                transpose,
            } => {
                let st = shards.require(src)?;
                let (ty, bytes) = fp8.resolve(&shards, st)?;
                let cols = st.shape.last().copied().unwrap_or(1);
                let out = head_rows(&bytes, ty, [*n_head, *rows, cols], *start, *len, *transpose);
                to_owned(ty, out)
            }
        };
        parts.push(TensorPart {
            name: t.name,
            ty,
            shape: t.shape,
            storage,
            offset,
        });
    }
    let mut storages = shards.into_storages();
    storages.extend(owned.into_iter().map(TensorStorage::Owned));
    Ok(Gguf::from_parts(metadata, storages, parts)?)
}

/// The GGUF type of a stored float type used as it is.
fn float_type(dtype: Dtype) -> Option<GgmlType> {
    match dtype {
        Dtype::F32 => Some(GgmlType::F32),
        Dtype::F16 => Some(GgmlType::F16),
        Dtype::BF16 => Some(GgmlType::Bf16),
        _ => None,
    }
}

/// Values of a float type as f32.
fn to_f32(ty: GgmlType, bytes: &[u8]) -> Vec<f32> {
    let pairs = || {
        bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    match ty {
        GgmlType::F16 => pairs().map(|b| f16::from_bits(b).to_f32()).collect(),
        GgmlType::Bf16 => pairs().map(|b| bf16::from_bits(b).to_f32()).collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    }
}

/// Rows `start..start + len` of each of the `n` blocks of a `[n, rows, cols]` tensor of
/// `ty` values, each block's slice transposed (to `[cols, len]`) if `transpose`.
fn head_rows(
    bytes: &[u8],
    ty: GgmlType,
    [n, rows, cols]: [usize; 3],
    start: usize,
    len: usize,
    transpose: bool,
) -> Vec<u8> {
    let es = if ty == GgmlType::F32 { 4 } else { 2 };
    let mut out = Vec::with_capacity(n * len * cols * es);
    for h in 0..n {
        let at = |r: usize, c: usize| ((h * rows + start + r) * cols + c) * es;
        if transpose {
            for c in 0..cols {
                for r in 0..len {
                    out.extend_from_slice(&bytes[at(r, c)..at(r, c) + es]);
                }
            }
        } else {
            out.extend_from_slice(&bytes[at(0, 0)..at(len, 0)]);
        }
    }
    out
}

/// FP8 (E4M3) weights with block scales (`weight_scale_inv`), as DeepSeek and Moonshot
/// publish them: decoded to BF16 at load.
struct Fp8 {
    /// `quantization_config.weight_block_size`: rows and columns a scale covers.
    block: [usize; 2],
}

impl Fp8 {
    fn from_config(config: &Config) -> Result<Fp8> {
        let block = match config.get("quantization_config") {
            Some(_) => {
                let q = config.sub("quantization_config")?;
                match q.opt_str("quant_method")? {
                    None | Some("fp8") => {}
                    Some(other) => {
                        return Err(q.error(
                            "quant_method",
                            format!("is {other:?}: only FP8 block-quantized weights are read"),
                        ))
                    }
                }
                match q.get("weight_block_size") {
                    Some(_) => {
                        let b = q.u32_list("weight_block_size", 2)?;
                        match b[..] {
                            [r, c] if r > 0 && c > 0 => [r as usize, c as usize],
                            _ => return Err(q.error("weight_block_size", "expected two sizes")),
                        }
                    }
                    None => [128, 128],
                }
            }
            None => [128, 128],
        };
        Ok(Fp8 { block })
    }

    /// The tensor's values in a type the engines read: float types as stored, FP8 decoded
    /// to BF16 with its scales.
    fn resolve<'s>(
        &self,
        shards: &'s Shards,
        t: &StoredTensor,
    ) -> Result<(GgmlType, Cow<'s, [u8]>)> {
        if let Some(ty) = float_type(t.dtype) {
            return Ok((ty, Cow::Borrowed(shards.bytes(t))));
        }
        let unsupported = |reason: &str| HfError::UnsupportedDtype {
            name: t.name.clone(),
            dtype: t.dtype.to_string(),
            reason: reason.to_string(),
        };
        if t.dtype != Dtype::F8_E4M3 {
            return Err(unsupported("F32, F16, BF16 and F8_E4M3 are"));
        }
        let [rows, cols] = t.shape[..] else {
            return Err(unsupported("FP8 is read for matrices only"));
        };
        let scale_name = format!("{}_scale_inv", t.name);
        let scale = shards
            .get(&scale_name)
            .ok_or_else(|| unsupported("FP8 without its `_scale_inv` block scales"))?;
        let [br, bc] = self.block;
        let expected = [rows.div_ceil(br), cols.div_ceil(bc)];
        if scale.shape != expected {
            return Err(HfError::TensorShape {
                name: scale_name,
                expected: expected.to_vec(),
                found: scale.shape.clone(),
            });
        }
        let scale_ty = float_type(scale.dtype)
            .ok_or_else(|| unsupported("its block scales are not a float type"))?;
        let scales = to_f32(scale_ty, shards.bytes(scale));
        let weights = shards.bytes(t);
        let mut out = Vec::with_capacity(rows * cols * 2);
        for r in 0..rows {
            for c in 0..cols {
                let s = scales[(r / br) * expected[1] + c / bc];
                let v = e4m3_to_f32(weights[r * cols + c]) * s;
                out.extend_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes());
            }
        }
        Ok((GgmlType::Bf16, Cow::Owned(out)))
    }
}

/// One FP8 E4M3 (`float8_e4m3fn`: bias 7, no infinities, S.1111.111 is NaN) value.
fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((b >> 3) & 0x0f);
    let man = f32::from(b & 0x07);
    if exp == 0x0f && b & 0x07 == 0x07 {
        return f32::NAN;
    }
    let magnitude = if exp == 0 {
        man / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    };
    sign * magnitude
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_values() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0); // exponent 7, mantissa 0
        assert_eq!(e4m3_to_f32(0xb8), -1.0);
        assert_eq!(e4m3_to_f32(0x7e), 448.0); // the largest finite value
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9)); // the smallest subnormal
        assert!(e4m3_to_f32(0x7f).is_nan());
    }

    #[test]
    fn head_rows_split_and_transpose() {
        // 2 heads of 3 rows x 2 cols, values 0..12.
        let bytes: Vec<u8> = (0..12).flat_map(|v| (v as f32).to_le_bytes()).collect();
        let f = |b: Vec<u8>| to_f32(GgmlType::F32, &b);
        let first = head_rows(&bytes, GgmlType::F32, [2, 3, 2], 0, 1, true);
        assert_eq!(f(first), [0.0, 1.0, 6.0, 7.0]);
        let rest = head_rows(&bytes, GgmlType::F32, [2, 3, 2], 1, 2, false);
        assert_eq!(f(rest), [2.0, 3.0, 4.0, 5.0, 8.0, 9.0, 10.0, 11.0]);
        let t = head_rows(&bytes, GgmlType::F32, [2, 3, 2], 0, 2, true);
        assert_eq!(f(t), [0.0, 2.0, 1.0, 3.0, 6.0, 8.0, 7.0, 9.0]);
    }
}
