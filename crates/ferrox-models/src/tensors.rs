//! Tensors shared by the engines: matrices and stacked 3-D tensors referenced in the mapped
//! file (they stay quantized there), the routed-expert weights of MoE layers, and the loader
//! that finds tensors and checks their shapes and types.

use crate::plan::Packing;
use std::sync::Arc;

use ferrox_core::packed::PackedMatrix;
use ferrox_core::{can_dequantize, dequantize_row, WeightMatrix};
use ferrox_gguf::{Gguf, TensorInfo};
use ferrox_moe::{
    Activation as MoeActivation, CachedExperts, ExpertCache, ExpertTensor, MoeExperts, SharedExpert,
};

use crate::hparams::{moe_error, FfnKind, MoeFfnConfig};
use crate::layers::linear::{linear, linear_many};
use crate::names::*;
use crate::ModelError;

/// A 2-D weight tensor in the file: `rows` outputs, each a dot product over `cols` inputs.
#[derive(Clone, Debug)]
pub struct MatrixRef {
    tensor: TensorInfo,
    pub rows: usize,
    pub cols: usize,
    /// A packed copy for the products, made at load where it is faster.
    packed: Option<Arc<PackedMatrix>>,
}

impl MatrixRef {
    /// The matrix view over the mapped bytes, its products going through the packed copy
    /// if there is one (checked at load, so this cannot fail for a `MatrixRef` made from
    /// the same file).
    pub fn view<'a>(&'a self, gguf: &'a Gguf) -> Result<WeightMatrix<'a>, ModelError> {
        let bytes = gguf.tensor_data(&self.tensor)?;
        let view = WeightMatrix::new(self.tensor.ty, self.rows, self.cols, bytes)?;
        Ok(match &self.packed {
            Some(packed) => view.with_packed(packed)?,
            None => view,
        })
    }

    /// Makes the packed copy when this machine has a packed kernel and the matrix's type
    /// and shape allow it (see [`ferrox_core::packed`]); the mapped pages it was copied
    /// from leave memory. Clones made before share nothing; clones made after share it.
    pub fn pack(&mut self, gguf: &Packing<'_>) -> Result<(), ModelError> {
        let ty = self.tensor.ty;
        if self.packed.is_some()
            || !ferrox_core::packed::available()
            || !PackedMatrix::can_pack(ty, self.rows, self.cols)
            || !gguf.packs_dense(ty, (self.rows, self.cols), self.n_bytes())
        {
            return Ok(());
        }
        let bytes = gguf.tensor_data(&self.tensor)?;
        let packed = gguf.pack_matrix(ty, self.rows, self.cols, bytes)?;
        self.packed = Some(Arc::new(packed));
        Ok(())
    }

    pub fn name(&self) -> &str {
        &self.tensor.name
    }

    pub fn n_bytes(&self) -> u64 {
        self.tensor.n_bytes.unwrap_or(0)
    }
}

/// Query, key and value projections: separate, or fused into one matrix whose rows are the
/// query's, then the key's, then the value's (phi3, nomic-bert).
/// (Built once per layer at load, so the variants' size difference costs nothing.)
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum QkvWeights {
    Separate {
        q: MatrixRef,
        k: MatrixRef,
        v: MatrixRef,
    },
    Fused(MatrixRef),
}

impl QkvWeights {
    pub fn matrices_mut(&mut self) -> Vec<&mut MatrixRef> {
        match self {
            QkvWeights::Separate { q, k, v } => vec![q, k, v],
            QkvWeights::Fused(m) => vec![m],
        }
    }

    pub fn n_bytes(&self) -> u64 {
        match self {
            QkvWeights::Separate { q, k, v } => q.n_bytes() + k.n_bytes() + v.n_bytes(),
            QkvWeights::Fused(m) => m.n_bytes(),
        }
    }

    /// The query, key and value rows of `n` input rows `x`, into `q`, `k` and `v` (`n` rows
    /// of each one's width); `fused` holds a fused matrix's rows before they are split.
    #[allow(clippy::too_many_arguments)]
    pub fn project(
        &self,
        gguf: &Gguf,
        x: &[f32],
        n: usize,
        (q, k, v): (&mut [f32], &mut [f32], &mut [f32]),
        fused: &mut Vec<f32>,
        xq: &mut Vec<u8>,
    ) -> Result<(), ModelError> {
        match self {
            QkvWeights::Separate {
                q: wq,
                k: wk,
                v: wv,
            } => {
                let (wq, wk, wv) = (wq.view(gguf)?, wk.view(gguf)?, wv.view(gguf)?);
                linear_many(&[&wq, &wk, &wv], x, n, &mut [q, k, v], xq)
            }
            QkvWeights::Fused(w) => {
                let (q_w, k_w, v_w) = (q.len() / n, k.len() / n, v.len() / n);
                let all = q_w + k_w + v_w;
                if fused.len() < n * all {
                    fused.resize(n * all, 0.0);
                }
                let qkv = &mut fused[..n * all];
                linear(&w.view(gguf)?, x, n, qkv, xq)?;
                for t in 0..n {
                    let row = &qkv[t * all..(t + 1) * all];
                    q[t * q_w..(t + 1) * q_w].copy_from_slice(&row[..q_w]);
                    k[t * k_w..(t + 1) * k_w].copy_from_slice(&row[q_w..q_w + k_w]);
                    v[t * v_w..(t + 1) * v_w].copy_from_slice(&row[q_w + k_w..]);
                }
                Ok(())
            }
        }
    }
}

/// Bytes one decoded token reads outside the layers: its embedding row and the output head.
pub fn embedding_and_head_bytes(token_embd: &MatrixRef, output: &MatrixRef) -> u64 {
    output.n_bytes() + token_embd.n_bytes() / token_embd.rows.max(1) as u64
}

/// A tensor viewed as `n` stacked matrices (ggml shape `{cols, rows, n}`): a layer's
/// experts, or the per-head matrices of MLA's `attn_k_b` / `attn_v_b` / `attn_kv_b`.
#[derive(Clone, Debug)]
pub struct ExpertRef {
    tensor: TensorInfo,
    /// `[cols, rows, n]` of the whole slabs.
    ne: [usize; 3],
    /// Only rows `start..start + len` of each slab (gate or up of a fused `ffn_gate_up_exps`).
    rows: Option<(usize, usize)>,
    /// Packed copies of the viewed slabs, one per matrix, made at load where faster.
    packed: Option<Arc<[PackedMatrix]>>,
}

impl ExpertRef {
    pub fn view<'a>(&'a self, gguf: &'a Gguf) -> Result<ExpertTensor<'a>, ModelError> {
        let all = ExpertTensor::new(self.tensor.ty, self.ne, gguf.tensor_data(&self.tensor)?)
            .map_err(moe_error)?;
        let viewed = match self.rows {
            Some((start, len)) => all.row_range(start, len).map_err(moe_error)?,
            None => all,
        };
        match &self.packed {
            Some(packed) => viewed.with_packed(packed).map_err(moe_error),
            None => Ok(viewed),
        }
    }

    /// Packs every viewed slab, as [`MatrixRef::pack`] does a matrix (routed experts only
    /// when the memory plan packs them).
    pub fn pack(&mut self, gguf: &Packing<'_>) -> Result<(), ModelError> {
        let t = self.view(gguf)?;
        if (is_routed_experts(&self.tensor.name) && !gguf.packs_experts())
            || self.packed.is_some()
            || !ferrox_core::packed::available()
            || !PackedMatrix::can_pack(t.ty(), t.rows(), t.cols())
        {
            return Ok(());
        }
        let experts: Vec<&[u8]> = (0..t.n_expert()).map(|e| t.expert_bytes(e)).collect();
        let packed = gguf.pack_in_turn(t.ty(), (t.rows(), t.cols()), &experts)?;
        self.packed = Some(packed.into());
        Ok(())
    }

    /// Rows `start..start + len` of every slab.
    pub fn with_rows(&self, start: usize, len: usize) -> ExpertRef {
        ExpertRef {
            rows: Some((start, len)),
            packed: None,
            ..self.clone()
        }
    }

    /// Bytes of the viewed rows.
    pub fn n_bytes(&self) -> u64 {
        let all = self.tensor.n_bytes.unwrap_or(0);
        match self.rows {
            Some((_, len)) if self.ne[1] > 0 => all / self.ne[1] as u64 * len as u64,
            _ => all,
        }
    }
}

/// Routed experts, their router and an optional shared expert.
#[derive(Clone, Debug)]
pub struct MoeWeights {
    /// `ffn_gate_inp`: `n_expert` rows of `n_embd`.
    pub gate_inp: MatrixRef,
    pub gate_exps: ExpertRef,
    pub up_exps: ExpertRef,
    pub down_exps: ExpertRef,
    pub shared: Option<SharedExpertWeights>,
    /// `exp_probs_b.bias`: added to the routing scores for selection only (DeepSeek-V3).
    pub selection_bias: Option<Vec<f32>>,
    /// The cache the experts stream through, and this layer's key in it, when the memory
    /// plan leaves them in the file.
    pub streamed: Option<(Arc<ExpertCache>, usize)>,
    /// The next MoE layer's router and streamed experts, when both layers stream (see
    /// [`link_lookahead`]).
    pub lookahead: Option<Box<MoeWeights>>,
}

/// Links each MoE layer whose experts stream to the next MoE layer of `layers` (in order)
/// whose experts stream too: its steps then ask for the experts that layer will likely use
/// while computing their own (see [`ferrox_moe::MoeExperts::with_lookahead`]).
pub fn link_lookahead<'w>(layers: impl IntoIterator<Item = &'w mut MoeWeights>) {
    let mut layers: Vec<&mut MoeWeights> = layers.into_iter().collect();
    for i in 1..layers.len() {
        let next = &*layers[i];
        // Its router and experts only (no shared expert, no link of its own).
        let link = next.streamed.is_some().then(|| {
            Box::new(MoeWeights {
                shared: None,
                lookahead: None,
                ..next.clone()
            })
        });
        let layer = &mut *layers[i - 1];
        layer.lookahead = link.filter(|_| layer.streamed.is_some());
    }
}

#[derive(Clone, Debug)]
pub struct SharedExpertWeights {
    pub gate: MatrixRef,
    pub up: MatrixRef,
    pub down: MatrixRef,
    /// `ffn_gate_inp_shexp`: one row of `n_embd`.
    pub gate_inp: Option<MatrixRef>,
}

impl SharedExpertWeights {
    /// Packs the three projections (see [`MatrixRef::pack`]).
    pub fn pack(&mut self, gguf: &Packing<'_>) -> Result<(), ModelError> {
        for m in [&mut self.gate, &mut self.up, &mut self.down] {
            m.pack(gguf)?;
        }
        Ok(())
    }

    pub fn view<'a>(&'a self, gguf: &'a Gguf) -> Result<SharedExpert<'a>, ModelError> {
        Ok(SharedExpert {
            gate: self.gate.view(gguf)?,
            up: self.up.view(gguf)?,
            down: self.down.view(gguf)?,
            activation: MoeActivation::SwiGlu,
            gate_inp: self.gate_inp.as_ref().map(|g| g.view(gguf)).transpose()?,
        })
    }

    /// Bytes one token reads.
    pub fn n_bytes(&self) -> u64 {
        self.gate.n_bytes()
            + self.up.n_bytes()
            + self.down.n_bytes()
            + self.gate_inp.as_ref().map_or(0, MatrixRef::n_bytes)
    }
}

impl MoeWeights {
    /// Packs the experts (or, when the memory plan streams them, joins its cache) and the
    /// shared expert (see [`MatrixRef::pack`]); the router stays.
    pub fn pack(&mut self, gguf: &Packing<'_>) -> Result<(), ModelError> {
        for experts in [&mut self.gate_exps, &mut self.up_exps, &mut self.down_exps] {
            experts.pack(gguf)?;
        }
        if !gguf.packs_experts() && self.streamed.is_none() {
            self.streamed = gguf.expert_cache();
        }
        if let Some(shared) = &mut self.shared {
            shared.pack(gguf)?;
        }
        Ok(())
    }

    pub fn experts<'a>(&'a self, gguf: &'a Gguf) -> Result<MoeExperts<'a>, ModelError> {
        let experts = MoeExperts::new(
            self.gate_exps.view(gguf)?,
            self.up_exps.view(gguf)?,
            self.down_exps.view(gguf)?,
            MoeActivation::SwiGlu,
        )
        .map_err(moe_error)?;
        Ok(match &self.streamed {
            Some((cache, layer)) => experts.with_cache(CachedExperts {
                cache,
                layer: *layer,
                pages: gguf,
            }),
            None => experts,
        })
    }

    /// The layer's MoE FFN of `xn` (`n × n_embd` normalized rows) into `out`: routing,
    /// the routed experts, and the shared expert added (its products riding in the routed
    /// experts' passes).
    pub fn forward(
        &self,
        gguf: &Gguf,
        router: &ferrox_moe::RouterConfig,
        xn: &[f32],
        out: &mut [f32],
        router_logits: &mut Vec<f32>,
        scratch: &mut ferrox_moe::MoeScratch,
    ) -> Result<(), ModelError> {
        scratch
            .router_logits(&self.gate_inp.view(gguf)?, xn, router_logits)
            .map_err(moe_error)?;
        let experts = self.experts(gguf)?.with_shared(self.shared_expert(gguf)?);
        let mut run = |experts: &ferrox_moe::MoeExperts<'_>| {
            ferrox_moe::moe_ffn(
                router,
                experts,
                xn,
                router_logits,
                self.selection_bias.as_deref(),
                out,
                scratch,
            )
            .map_err(moe_error)
        };
        match &self.lookahead {
            Some(next) => {
                let next_router = next.gate_inp.view(gguf)?;
                let next_experts = next.experts(gguf)?;
                run(&experts.with_lookahead(ferrox_moe::Lookahead {
                    gate_inp: &next_router,
                    selection_bias: next.selection_bias.as_deref(),
                    experts: &next_experts,
                }))
            }
            None => run(&experts),
        }
    }

    pub fn shared_expert<'a>(
        &'a self,
        gguf: &'a Gguf,
    ) -> Result<Option<SharedExpert<'a>>, ModelError> {
        self.shared.as_ref().map(|sh| sh.view(gguf)).transpose()
    }

    /// Bytes read per decoded token by a layer of `kind` (all of it if the layer is dense).
    pub(crate) fn bytes_per_token_in(&self, kind: &FfnKind) -> u64 {
        match kind {
            FfnKind::Moe(mc) => self.bytes_per_token(mc.router.n_expert, mc.router.n_used),
            FfnKind::Dense => self.bytes_per_token(1, 1),
        }
    }

    /// Bytes read per decoded token: the router, `n_used` experts, the shared expert.
    fn bytes_per_token(&self, n_expert: usize, n_used: usize) -> u64 {
        let per_expert =
            (self.gate_exps.n_bytes() + self.up_exps.n_bytes() + self.down_exps.n_bytes())
                / n_expert.max(1) as u64;
        self.gate_inp.n_bytes()
            + per_expert * n_used as u64
            + self.shared.as_ref().map_or(0, SharedExpertWeights::n_bytes)
    }
}

/// Refuses, naming the tensor, a type we cannot decode.
fn check_type(t: &TensorInfo) -> Result<(), ModelError> {
    if !can_dequantize(t.ty) {
        return Err(ModelError::UnsupportedTensorType {
            name: t.name.clone(),
            ty: t.ty.name().into_owned(),
        });
    }
    Ok(())
}

/// Finds a model's tensors and checks their shapes and types.
pub(crate) struct Loader<'g> {
    pub(crate) gguf: &'g Gguf,
}

impl Loader<'_> {
    pub(crate) fn find(&self, name: &str) -> Option<&TensorInfo> {
        self.gguf.tensor(name)
    }

    pub(crate) fn require(&self, name: &str) -> Result<&TensorInfo, ModelError> {
        self.find(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    /// Checks a tensor's shape (trailing dimensions of 1 ignored on both sides, so `[n]` is
    /// a one-row `[n, 1]`) and that we can decode its type.
    fn check(&self, t: &TensorInfo, expected: &[u64]) -> Result<(), ModelError> {
        fn trimmed(shape: &[u64]) -> &[u64] {
            let len = shape.iter().rposition(|&d| d != 1).map_or(0, |i| i + 1);
            &shape[..len]
        }
        if trimmed(&t.shape) != trimmed(expected) {
            return Err(ModelError::TensorShape {
                name: t.name.clone(),
                expected: expected.to_vec(),
                found: t.shape.clone(),
            });
        }
        check_type(t)
    }

    /// A matrix with `cols` inputs and `rows` outputs (ggml shape `[cols, rows]`).
    pub(crate) fn matrix(
        &self,
        name: &str,
        cols: usize,
        rows: usize,
    ) -> Result<MatrixRef, ModelError> {
        self.check_matrix(self.require(name)?, cols, rows)
    }

    /// A tensor of ggml shape `shape` whose elements, in memory order, are `rows` rows of
    /// `cols` (a convolution kernel used as a matrix).
    pub(crate) fn matrix_of_shape(
        &self,
        name: &str,
        shape: &[u64],
        (cols, rows): (usize, usize),
    ) -> Result<MatrixRef, ModelError> {
        let t = self.require(name)?;
        self.check(t, shape)?;
        self.matrix_ref(t, cols, rows)
    }

    pub(crate) fn opt_matrix(
        &self,
        name: &str,
        cols: usize,
        rows: usize,
    ) -> Result<Option<MatrixRef>, ModelError> {
        self.find(name)
            .map(|t| self.check_matrix(t, cols, rows))
            .transpose()
    }

    fn check_matrix(
        &self,
        t: &TensorInfo,
        cols: usize,
        rows: usize,
    ) -> Result<MatrixRef, ModelError> {
        self.check(t, &[cols as u64, rows as u64])?;
        self.matrix_ref(t, cols, rows)
    }

    /// A checked tensor as a `rows × cols` matrix (its bytes checked against the shape).
    fn matrix_ref(
        &self,
        t: &TensorInfo,
        cols: usize,
        rows: usize,
    ) -> Result<MatrixRef, ModelError> {
        let m = MatrixRef {
            tensor: t.clone(),
            rows,
            cols,
            packed: None,
        };
        m.view(self.gguf)?;
        Ok(m)
    }

    /// Layer `il`'s query, key and value projections of `n_embd` inputs into rows of the
    /// given widths: one fused `attn_qkv` if the file has it, else `attn_q`, `attn_k`,
    /// `attn_v`.
    pub(crate) fn qkv(
        &self,
        il: usize,
        n_embd: usize,
        (q_w, k_w, v_w): (usize, usize, usize),
    ) -> Result<QkvWeights, ModelError> {
        let fused = q_w
            .checked_add(k_w)
            .and_then(|qk| qk.checked_add(v_w))
            .ok_or_else(|| ModelError::Config(format!("layer {il}: QKV width overflows")))?;
        Ok(match self.opt_matrix(&ATTN_QKV.layer(il), n_embd, fused)? {
            Some(m) => QkvWeights::Fused(m),
            None => QkvWeights::Separate {
                q: self.matrix(&ATTN_Q.layer(il), n_embd, q_w)?,
                k: self.matrix(&ATTN_K.layer(il), n_embd, k_w)?,
                v: self.matrix(&ATTN_V.layer(il), n_embd, v_w)?,
            },
        })
    }

    /// A 1-D tensor of `n` values used as a one-row matrix (ggml shape `[n]` or `[n, 1]`).
    fn row_matrix(&self, name: &str, n: usize) -> Result<MatrixRef, ModelError> {
        self.matrix(name, n, 1)
    }

    /// A stacked expert tensor of ggml shape `[cols, rows, n_expert]`.
    pub(crate) fn experts(
        &self,
        name: &str,
        cols: usize,
        rows: usize,
        n_expert: usize,
    ) -> Result<ExpertRef, ModelError> {
        let t = self.require(name)?;
        self.check(t, &[cols as u64, rows as u64, n_expert as u64])?;
        self.stacked_ref(t, [cols, rows, n_expert])
    }

    /// A 2-D tensor `{cols, rows · n}` viewed as `n` stacked `rows × cols` matrices.
    pub(crate) fn stacked(
        &self,
        name: &str,
        cols: usize,
        rows: usize,
        n: usize,
    ) -> Result<ExpertRef, ModelError> {
        let t = self.require(name)?;
        self.check(t, &[cols as u64, (rows * n) as u64])?;
        self.stacked_ref(t, [cols, rows, n])
    }

    fn stacked_ref(&self, t: &TensorInfo, ne: [usize; 3]) -> Result<ExpertRef, ModelError> {
        let r = ExpertRef {
            tensor: t.clone(),
            ne,
            rows: None,
            packed: None,
        };
        r.view(self.gguf)?;
        Ok(r)
    }

    pub(crate) fn moe(
        &self,
        il: usize,
        n_embd: usize,
        mc: &MoeFfnConfig,
    ) -> Result<MoeWeights, ModelError> {
        let n_expert = mc.router.n_expert;
        let shared = match mc.n_ff_shexp {
            None => None,
            Some(n_sh) => Some(SharedExpertWeights {
                gate: self.matrix(&FFN_GATE_SHEXP.layer(il), n_embd, n_sh)?,
                up: self.matrix(&FFN_UP_SHEXP.layer(il), n_embd, n_sh)?,
                down: self.matrix(&FFN_DOWN_SHEXP.layer(il), n_sh, n_embd)?,
                gate_inp: if mc.shexp_gate {
                    Some(self.row_matrix(&FFN_GATE_INP_SHEXP.layer(il), n_embd)?)
                } else {
                    None
                },
            }),
        };
        let n_ff = mc.n_ff_exp;
        // Gate and up stacked in one tensor (gate rows first), as Mistral-4 files store them.
        let fused = self.find(&FFN_GATE_UP_EXPS.layer(il)).is_some();
        let (gate_exps, up_exps) = if fused {
            let both = self.experts(&FFN_GATE_UP_EXPS.layer(il), n_embd, 2 * n_ff, n_expert)?;
            (both.with_rows(0, n_ff), both.with_rows(n_ff, n_ff))
        } else {
            (
                self.experts(&FFN_GATE_EXPS.layer(il), n_embd, n_ff, n_expert)?,
                self.experts(&FFN_UP_EXPS.layer(il), n_embd, n_ff, n_expert)?,
            )
        };
        Ok(MoeWeights {
            gate_inp: self.matrix(&FFN_GATE_INP.layer(il), n_embd, n_expert)?,
            gate_exps,
            up_exps,
            selection_bias: self.opt_vector(&FFN_EXP_PROBS_B.layer_bias(il), n_expert)?,
            down_exps: self.experts(&FFN_DOWN_EXPS.layer(il), mc.n_ff_exp, n_embd, n_expert)?,
            shared,
            streamed: None,
            lookahead: None,
        })
    }

    /// A 1-D tensor of `n` values, decoded to f32.
    pub(crate) fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
        self.decode_vector(self.require(name)?, n)
    }

    pub(crate) fn opt_vector(&self, name: &str, n: usize) -> Result<Option<Vec<f32>>, ModelError> {
        self.find(name)
            .map(|t| self.decode_vector(t, n))
            .transpose()
    }

    fn decode_vector(&self, t: &TensorInfo, n: usize) -> Result<Vec<f32>, ModelError> {
        if t.n_elements != n as u64 {
            return Err(ModelError::TensorShape {
                name: t.name.clone(),
                expected: vec![n as u64],
                found: t.shape.clone(),
            });
        }
        check_type(t)?;
        let mut out = vec![0.0; n];
        dequantize_row(t.ty, self.gguf.tensor_data(t)?, &mut out)?;
        Ok(out)
    }
}

/// Checks that the file holds tensors for each of `n_layer` layers (`blk.{il}.*`), so that
/// a `block_count` the file cannot back fails at once, naming the key.
pub fn check_block_count(gguf: &Gguf, arch: &str, n_layer: usize) -> Result<(), ModelError> {
    let in_file = gguf
        .tensors()
        .iter()
        .filter_map(|t| t.name.strip_prefix("blk.")?.split('.').next()?.parse().ok())
        .max()
        .map_or(0, |last: usize| last + 1);
    if n_layer > in_file {
        return Err(ModelError::Config(format!(
            "`{arch}.block_count` = {n_layer}, but the file has tensors for {in_file} layers"
        )));
    }
    Ok(())
}

/// A tensor-shape error with the metadata keys that sized the expected shape named, so
/// that a wrong count in the metadata is recognisable as such.
pub fn name_keys(e: ModelError, arch: &str) -> ModelError {
    let ModelError::TensorShape { name, .. } = &e else {
        return e;
    };
    let sized_by = crate::names::lookup(name).map_or(&[][..], |t| t.sized_by);
    let keys: Vec<String> = ["embedding_length"]
        .iter()
        .chain(sized_by)
        .map(|k| format!("`{arch}.{k}`"))
        .collect();
    ModelError::Config(format!("{e} (sized by {})", keys.join(", ")))
}
