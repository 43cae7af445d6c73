//! Routed experts stored as stacked 3-D tensors, and the batched expert FFN.
//!
//! GGUF stores a layer's experts as `ffn_gate_exps` / `ffn_up_exps` with ggml shape
//! `{n_embd, n_ff_exp, n_expert}` and `ffn_down_exps` with `{n_ff_exp, n_embd, n_expert}`:
//! expert `e` is the `e`-th contiguous 2-D slab. [`ExpertTensor`] views the mapped bytes in
//! place and hands out each slab as a [`WeightMatrix`].
//!
//! [`moe_ffn`] evaluates a batch the way llama.cpp's `build_moe_ffn` does, but grouped by
//! expert: every token is routed, each selected expert gathers its tokens and runs one
//! `matmul` for gate and up, the activation, and one `matmul` for down, so its weights
//! stream once per batch; experts no token selected are never read. The weighted outputs
//! are summed per token in routing order (`((o_0 + o_1) + o_2) + …`, as ggml's chain of
//! adds), so a token's result is bit-identical whatever batch it is in.

use ferrox_core::packed::PackedMatrix;
use ferrox_core::{GgmlType, MatrixProduct, WeightMatrix};
use ferrox_gguf::TensorInfo;
use smallvec::SmallVec;

use crate::cache::{CachedExperts, ExpertViews};
use crate::numerics;
use crate::routing::RouterConfig;
use crate::shared::{SharedExpert, SharedScratch};
use crate::MoeError;

/// The activation of the expert FFNs: `act(gate · x) * (up · x)`, or, for experts without a
/// gate matrix, `act(up · x)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// `gelu(up)` for experts without a gate (ggml's `gelu`, f16-table; nomic-bert-moe).
    Gelu,
    /// `silu(gate) * up` (ggml's `swiglu`), every MoE model so far.
    SwiGlu,
    /// `gelu(gate) * up` (ggml's `geglu`, f16-table GELU).
    GeGlu,
    /// `silu(min(gate, limit)) * clamp(up, -limit, limit)` (ggml's `swiglu_clamp`,
    /// DeepSeek-V4).
    SwiGluClamped { limit: f32 },
    /// `β·tanh(g/β)·sigmoid(g) · λ·tanh(u/λ)` (Kimi-K3's SiTU; `u` as is when `λ ≤ 0`).
    Situ { beta: f32, linear_beta: f32 },
}

impl Activation {
    /// Applies the activation to one token's row, in place over `gate` (for [`Gelu`],
    /// ungated, over `gate` alone: it holds the up projection).
    ///
    /// [`Gelu`]: Activation::Gelu
    pub fn apply(self, gate: &mut [f32], up: &[f32]) {
        match self {
            Activation::Gelu => gate
                .iter_mut()
                .for_each(|x| *x = ferrox_core::glu::gelu(*x)),
            Activation::SwiGlu => numerics::swiglu(gate, up),
            Activation::GeGlu => numerics::geglu(gate, up),
            Activation::SwiGluClamped { limit } => numerics::swiglu_clamped(gate, up, limit),
            Activation::Situ { beta, linear_beta } => numerics::situ(gate, up, beta, linear_beta),
        }
    }
}

/// `n_expert` weight matrices of `rows × cols`, stacked back to back (ggml shape
/// `{cols, rows, n_expert}`), borrowed from the tensor's bytes.
#[derive(Clone, Copy, Debug)]
pub struct ExpertTensor<'a> {
    ty: GgmlType,
    cols: usize,
    rows: usize,
    n_expert: usize,
    expert_bytes: usize,
    /// Bytes from one expert's slab to the next (larger than `expert_bytes` for a view of
    /// some of each expert's rows, see [`ExpertTensor::row_range`]).
    stride: usize,
    /// Where expert 0's first viewed row starts.
    offset: usize,
    bytes: &'a [u8],
    /// Packed copies of the viewed experts, one per expert, used for the products.
    packed: Option<&'a [PackedMatrix]>,
}

impl<'a> ExpertTensor<'a> {
    /// Views `bytes` as a tensor of ggml shape `ne = [cols, rows, n_expert]` and type `ty`;
    /// checks the byte length and that each expert is a valid [`WeightMatrix`].
    pub fn new(ty: GgmlType, ne: [usize; 3], bytes: &'a [u8]) -> Result<Self, MoeError> {
        let [cols, rows, n_expert] = ne;
        let row = ferrox_core::row_byte_len(ty, cols)?;
        let expert_bytes = row
            .checked_mul(rows)
            .ok_or_else(|| MoeError::Shape(format!("{ne:?} of {ty:?} overflows")))?;
        if expert_bytes.checked_mul(n_expert) != Some(bytes.len()) {
            return Err(MoeError::Shape(format!(
                "{ne:?} of {ty:?} needs {expert_bytes} × {n_expert} bytes, got {}",
                bytes.len()
            )));
        }
        let t = ExpertTensor {
            ty,
            cols,
            rows,
            n_expert,
            expert_bytes,
            stride: expert_bytes,
            offset: 0,
            bytes,
            packed: None,
        };
        if n_expert > 0 {
            WeightMatrix::new(ty, rows, cols, &bytes[..expert_bytes])?;
        }
        Ok(t)
    }

    /// Views a 3-D tensor of a GGUF file, given its info and its data
    /// (`Gguf::tensor_data(info)`).
    pub fn from_tensor(info: &TensorInfo, bytes: &'a [u8]) -> Result<Self, MoeError> {
        let dims = match info.shape.as_slice() {
            [a, b, c] => [*a, *b, *c],
            s => {
                return Err(MoeError::Shape(format!(
                    "{}: expected 3 dimensions, found {s:?}",
                    info.name
                )))
            }
        };
        let ne = dims.map(|d| usize::try_from(d).unwrap_or(usize::MAX));
        Self::new(info.ty, ne, bytes)
    }

    /// Rows `start..start + len` of every expert, as a tensor of `len`-row experts over the
    /// same bytes (a fused `ffn_gate_up_exps` holds each expert's gate rows, then its up rows).
    pub fn row_range(&self, start: usize, len: usize) -> Result<Self, MoeError> {
        if start.checked_add(len).is_none_or(|end| end > self.rows) {
            return Err(MoeError::Shape(format!(
                "rows {start}..{} of {}-row experts",
                start.saturating_add(len),
                self.rows
            )));
        }
        let row = self.expert_bytes / self.rows.max(1);
        Ok(ExpertTensor {
            rows: len,
            expert_bytes: row * len,
            offset: self.offset + row * start,
            packed: None,
            ..*self
        })
    }

    /// This tensor with each expert's products computed from `packed[e]`, a packed copy of
    /// that expert's viewed rows (see [`ferrox_core::packed`]).
    pub fn with_packed(self, packed: &'a [PackedMatrix]) -> Result<Self, MoeError> {
        let fits =
            |p: &PackedMatrix| (p.ty(), p.rows(), p.cols()) == (self.ty, self.rows, self.cols);
        if packed.len() != self.n_expert || !packed.iter().all(fits) {
            return Err(MoeError::Shape(format!(
                "{} packed experts for {} experts of {} × {} {:?}",
                packed.len(),
                self.n_expert,
                self.rows,
                self.cols,
                self.ty
            )));
        }
        Ok(ExpertTensor {
            packed: Some(packed),
            ..self
        })
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Input width of each expert (ggml `ne0`).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Output width of each expert (ggml `ne1`).
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn n_expert(&self) -> usize {
        self.n_expert
    }

    /// The bytes of expert `e` (its viewed rows), `e × stride` into the tensor.
    ///
    /// # Panics
    /// If `e >= self.n_expert()`.
    pub fn expert_bytes(&self, e: usize) -> &'a [u8] {
        assert!(e < self.n_expert, "expert {e} of {}", self.n_expert);
        let at = e * self.stride + self.offset;
        &self.bytes[at..at + self.expert_bytes]
    }

    /// Expert `e` as a `rows × cols` matrix over its slab of the tensor.
    ///
    /// # Panics
    /// If `e >= self.n_expert()`.
    pub fn expert(&self, e: usize) -> WeightMatrix<'a> {
        let m = WeightMatrix::new(self.ty, self.rows, self.cols, self.expert_bytes(e))
            .expect("validated in ExpertTensor::new");
        match self.packed {
            Some(packed) => m
                .with_packed(&packed[e])
                .expect("validated in ExpertTensor::with_packed"),
            None => m,
        }
    }
}

/// A layer's routed experts: `ffn_gate_exps` (if they are gated), `ffn_up_exps`,
/// `ffn_down_exps`.
#[derive(Clone, Copy, Debug)]
pub struct MoeExperts<'a> {
    gate: Option<ExpertTensor<'a>>,
    up: ExpertTensor<'a>,
    down: ExpertTensor<'a>,
    activation: Activation,
    shared: Option<SharedExpert<'a>>,
    /// Experts streamed from the file through a cache of packed copies.
    cache: Option<CachedExperts<'a>>,
    /// The next MoE layer, whose experts this one asks for ahead.
    lookahead: Option<Lookahead<'a>>,
}

/// The next MoE layer as seen from the one before it (see [`MoeExperts::with_lookahead`]).
#[derive(Clone, Copy, Debug)]
pub struct Lookahead<'a> {
    /// Its router (`ffn_gate_inp`).
    pub gate_inp: &'a WeightMatrix<'a>,
    /// Its `exp_probs_b`, if any.
    pub selection_bias: Option<&'a [f32]>,
    /// Its experts (only streamed ones are asked for).
    pub experts: &'a MoeExperts<'a>,
}

/// Most tokens in a step whose next layer's experts are asked for ahead: a decode step's or
/// a small batch's. A long prompt's steps use most experts of every layer, and asking for a
/// whole layer ahead would only compete with this layer's reads.
const LOOKAHEAD_TOKENS: usize = 16;

impl<'a> MoeExperts<'a> {
    /// Checks that gate and up are `{n_embd, n_ff, n_expert}` and down `{n_ff, n_embd,
    /// n_expert}`.
    pub fn new(
        gate: ExpertTensor<'a>,
        up: ExpertTensor<'a>,
        down: ExpertTensor<'a>,
        activation: Activation,
    ) -> Result<Self, MoeError> {
        if (gate.n_expert, gate.cols, gate.rows) != (up.n_expert, up.cols, up.rows) {
            return Err(MoeError::Shape(format!(
                "expert tensors disagree: gate {:?}, up {:?}",
                [gate.cols, gate.rows, gate.n_expert],
                [up.cols, up.rows, up.n_expert],
            )));
        }
        let mut experts = Self::ungated(up, down, activation)?;
        experts.gate = Some(gate);
        Ok(experts)
    }

    /// Experts without a gate matrix: `down · act(up · x)` (`activation` is
    /// [`Activation::Gelu`]). Checks that up is `{n_embd, n_ff, n_expert}` and down
    /// `{n_ff, n_embd, n_expert}`.
    pub fn ungated(
        up: ExpertTensor<'a>,
        down: ExpertTensor<'a>,
        activation: Activation,
    ) -> Result<Self, MoeError> {
        let (e, d, f) = (up.n_expert, up.cols, up.rows);
        if (down.n_expert, down.cols, down.rows) != (e, f, d) {
            return Err(MoeError::Shape(format!(
                "expert tensors disagree: up {:?}, down {:?}",
                [up.cols, up.rows, up.n_expert],
                [down.cols, down.rows, down.n_expert]
            )));
        }
        Ok(MoeExperts {
            gate: None,
            up,
            down,
            activation,
            shared: None,
            cache: None,
            lookahead: None,
        })
    }

    /// These experts with the layer's shared expert attached: [`moe_ffn`] and
    /// [`moe_ffn_chosen`] then add its output too (after the routed sum, as llama.cpp
    /// adds them), its products sharing the routed experts' passes over the pool.
    pub fn with_shared(self, shared: Option<SharedExpert<'a>>) -> Self {
        MoeExperts { shared, ..self }
    }

    /// These experts with their products computed from packed copies that `cache` makes
    /// as they are used (the tensors then stay unpacked in the file).
    pub fn with_cache(self, cache: CachedExperts<'a>) -> Self {
        MoeExperts {
            cache: Some(cache),
            ..self
        }
    }

    /// These experts asking, once they have asked for their own experts' pages, for those
    /// of the experts the next MoE layer's router picks for this layer's input (the
    /// residual stream changes little from one layer to the next), so that the next
    /// layer's reads overlap this layer's products. Only streamed experts (see
    /// [`Self::with_cache`]) are asked for; results do not change.
    pub fn with_lookahead(self, lookahead: Lookahead<'a>) -> Self {
        MoeExperts {
            lookahead: Some(lookahead),
            ..self
        }
    }

    /// Gate (if any), up, down.
    fn tensors(&self) -> crate::cache::LayerTensors<'_, 'a> {
        [self.gate.as_ref(), Some(&self.up), Some(&self.down)]
    }

    /// Calls `f` with the matrices of experts `ids` (distinct, at most
    /// [`Self::max_pass_experts`]).
    fn with_views<R>(
        &self,
        ids: &[usize],
        f: impl for<'b> FnOnce(&[ExpertViews<'b>]) -> Result<R, MoeError>,
    ) -> Result<R, MoeError> {
        match &self.cache {
            Some(cache) => cache.with_views(self.tensors(), ids, f),
            None => {
                let views: SmallVec<[ExpertViews<'_>; CHUNK_EXPERTS]> = ids
                    .iter()
                    .map(|&e| ExpertViews {
                        gate: self.gate.as_ref().map(|g| g.expert(e)),
                        up: self.up.expert(e),
                        down: self.down.expert(e),
                    })
                    .collect();
                f(&views)
            }
        }
    }

    /// Most experts whose products share a pass.
    fn max_pass_experts(&self) -> usize {
        match &self.cache {
            Some(c) => CHUNK_EXPERTS.min(c.cache.capacity()),
            None => CHUNK_EXPERTS,
        }
    }

    pub fn n_embd(&self) -> usize {
        self.up.cols
    }

    pub fn n_ff(&self) -> usize {
        self.up.rows
    }

    pub fn n_expert(&self) -> usize {
        self.up.n_expert
    }

    pub fn activation(&self) -> Activation {
        self.activation
    }

    /// The gate projections (`None` for ungated experts).
    pub fn gate(&self) -> Option<&ExpertTensor<'a>> {
        self.gate.as_ref()
    }

    pub fn up(&self) -> &ExpertTensor<'a> {
        &self.up
    }

    pub fn down(&self) -> &ExpertTensor<'a> {
        &self.down
    }
}

/// Reusable buffers for [`moe_ffn`] and [`SharedExpert::forward_add`]; keep one per
/// thread of inference so that steady-state decoding allocates nothing.
#[derive(Default, Debug)]
pub struct MoeScratch {
    /// Per token, the selected `(expert, weight)` pairs of the last call, best first.
    pub routes: Vec<(usize, f32)>,
    route_tmp: Vec<(usize, f32)>,
    route_scratch: crate::routing::RouteScratch,
    router_xq: Vec<u8>,
    assign: Vec<(usize, usize, usize)>,
    /// The distinct experts of `assign`.
    needed: Vec<usize>,
    /// The next layer's router logits and distinct experts for this layer's input.
    ahead_logits: Vec<f32>,
    ahead: Vec<usize>,
    xq_gate: Vec<u8>,
    xq_up: Vec<u8>,
    xg_gate: Vec<u8>,
    xg_up: Vec<u8>,
    hq: Vec<u8>,
    g: Vec<f32>,
    u: Vec<f32>,
    y: Vec<f32>,
    contrib: Vec<f32>,
    pub(crate) shared: SharedScratch,
}

/// Router logits for a batch: `ffn_gate_inp · x` per token, token-major
/// (`logits[t * n_expert + e]`), computed with the same quantized product as every other
/// matrix so that batching does not change them.
pub fn router_logits(
    gate_inp: &WeightMatrix<'_>,
    x: &[f32],
    logits: &mut Vec<f32>,
) -> Result<(), MoeError> {
    router_logits_with(gate_inp, x, logits, &mut Vec::new())
}

/// [`router_logits`] quantizing the activations into `xq` (reused between calls).
pub fn router_logits_with(
    gate_inp: &WeightMatrix<'_>,
    x: &[f32],
    logits: &mut Vec<f32>,
    xq: &mut Vec<u8>,
) -> Result<(), MoeError> {
    let n_tokens = gate_inp.quantize_activation(x, xq)?;
    logits.clear();
    logits.resize(n_tokens * gate_inp.rows(), 0.0);
    gate_inp.matmul(xq, n_tokens, logits)?;
    Ok(())
}

impl MoeScratch {
    /// [`router_logits`] with the activation buffer kept in the scratch.
    pub fn router_logits(
        &mut self,
        gate_inp: &WeightMatrix<'_>,
        x: &[f32],
        logits: &mut Vec<f32>,
    ) -> Result<(), MoeError> {
        router_logits_with(gate_inp, x, logits, &mut self.router_xq)
    }
}

/// Most experts whose products share one pass over the pool (two products each).
const CHUNK_EXPERTS: usize = ferrox_core::packed::MAX_PRODUCTS / 2;
/// Most rows (token-expert pairs) a multi-expert chunk holds: a decode step's, a small
/// batch's; larger groups run one expert at a time, with enough rows each to fill the pool.
const CHUNK_ROWS: usize = 64;

/// The experts of `s.assign[range]` (`(expert, token, slot)` triples, grouped by expert)
/// on their tokens' quantized activations in `s.xq_gate` / `s.xq_up` (rows of
/// `ag` / `au` bytes): their outputs in `s.y`, one row per triple. Every expert's gate and
/// up products run in one pass over the pool, then every down product in another; each
/// result is the one the expert alone gives. With `shared` (prepared in `s.shared`), the
/// shared expert's products join the two passes, its output left in `s.shared`.
fn experts_chunk(
    experts: &MoeExperts<'_>,
    views: &[ExpertViews<'_>],
    range: std::ops::Range<usize>,
    shared_q: bool,
    (ag, au): (usize, usize),
    shared: Option<&SharedExpert<'_>>,
    s: &mut MoeScratch,
) -> Result<(), MoeError> {
    let assign = &s.assign[range];
    let rows = assign.len();
    let n_ff = experts.n_ff();
    s.xg_gate.clear();
    s.xg_up.clear();
    for &(_, t, _) in assign {
        s.xg_gate
            .extend_from_slice(&s.xq_gate[t * ag..(t + 1) * ag]);
        if !shared_q {
            s.xg_up.extend_from_slice(&s.xq_up[t * au..(t + 1) * au]);
        }
    }
    // (first row, rows) per group; group `i` is expert `views[i]`.
    let groups = expert_groups(assign);
    let gates: SmallVec<[WeightMatrix<'_>; CHUNK_EXPERTS]> =
        views.iter().filter_map(|v| v.gate).collect();
    let ups: SmallVec<[WeightMatrix<'_>; CHUNK_EXPERTS]> = views.iter().map(|v| v.up).collect();
    let downs: SmallVec<[WeightMatrix<'_>; CHUNK_EXPERTS]> = views.iter().map(|v| v.down).collect();

    s.g.clear();
    s.g.resize(rows * n_ff, 0.0);
    s.u.clear();
    s.u.resize(rows * n_ff, 0.0);
    {
        let xu: &[u8] = if shared_q { &s.xg_gate } else { &s.xg_up };
        let mut products: SmallVec<[MatrixProduct<'_, '_>; 2 * CHUNK_EXPERTS]> = SmallVec::new();
        let (mut g_rest, mut u_rest) = (&mut s.g[..], &mut s.u[..]);
        for (i, &(first, m)) in groups.iter().enumerate() {
            let (g, g_tail) = std::mem::take(&mut g_rest).split_at_mut(m * n_ff);
            let (u, u_tail) = std::mem::take(&mut u_rest).split_at_mut(m * n_ff);
            (g_rest, u_rest) = (g_tail, u_tail);
            // Ungated experts: the up projection goes where the gate's would.
            let up_out = match gates.get(i) {
                Some(gate) => {
                    products.push(MatrixProduct {
                        matrix: gate,
                        xq: &s.xg_gate[first * ag..(first + m) * ag],
                        n_tokens: m,
                        out: g,
                    });
                    u
                }
                None => g,
            };
            products.push(MatrixProduct {
                matrix: &ups[i],
                xq: &xu[first * au..(first + m) * au],
                n_tokens: m,
                out: up_out,
            });
        }
        if let Some(sh) = shared {
            products.extend(sh.gate_up(&mut s.shared));
        }
        WeightMatrix::matmul_products(&mut products)?;
    }
    if let Some(sh) = shared {
        sh.activate(&mut s.shared)?;
    }
    if n_ff > 0 {
        for (gr, ur) in s.g.chunks_exact_mut(n_ff).zip(s.u.chunks_exact(n_ff)) {
            experts.activation.apply(gr, ur);
        }
    }
    // Quantization is row by row: one call for every expert's rows.
    downs[0].quantize_activation(&s.g, &mut s.hq)?;
    let ad = downs[0].activation_row_bytes();
    let n_embd = experts.n_embd();
    s.y.clear();
    s.y.resize(rows * n_embd, 0.0);
    let mut products: SmallVec<[MatrixProduct<'_, '_>; CHUNK_EXPERTS]> = SmallVec::new();
    let mut y_rest = &mut s.y[..];
    for (i, &(first, m)) in groups.iter().enumerate() {
        let (y, tail) = std::mem::take(&mut y_rest).split_at_mut(m * n_embd);
        y_rest = tail;
        products.push(MatrixProduct {
            matrix: &downs[i],
            xq: &s.hq[first * ad..(first + m) * ad],
            n_tokens: m,
            out: y,
        });
    }
    if let Some(sh) = shared {
        products.push(sh.down(&mut s.shared));
    }
    WeightMatrix::matmul_products(&mut products)?;
    Ok(())
}

/// `(first row, rows)` of each expert's run of `(expert, token, slot)` triples.
fn expert_groups(assign: &[(usize, usize, usize)]) -> SmallVec<[(usize, usize); CHUNK_EXPERTS]> {
    let mut groups = SmallVec::new();
    let mut at = 0;
    while at < assign.len() {
        let e = assign[at].0;
        let m = assign[at..].iter().take_while(|a| a.0 == e).count();
        groups.push((at, m));
        at += m;
    }
    groups
}

/// The routed-expert part of an MoE FFN for a batch of tokens.
///
/// * `x`: `n_tokens × n_embd` activations (the FFN input after its norm), token-major.
/// * `router_logits`: `n_tokens × n_expert`, token-major (see [`router_logits`]).
/// * `selection_bias`: `exp_probs_b`, one per expert, if the layer has it.
/// * `out`: `n_tokens × n_embd`, overwritten with `Σ_i w_i · expert_{e_i}(x)`.
///
/// The routes are left in `scratch.routes` (`n_used` per token). Only the experts some
/// token selected are read; each of those is read once for the whole batch.
pub fn moe_ffn(
    router: &RouterConfig,
    experts: &MoeExperts<'_>,
    x: &[f32],
    router_logits: &[f32],
    selection_bias: Option<&[f32]>,
    out: &mut [f32],
    scratch: &mut MoeScratch,
) -> Result<(), MoeError> {
    router.validate()?;
    let (n_embd, n_expert) = (experts.n_embd(), experts.n_expert());
    if router.n_expert != n_expert {
        return Err(MoeError::Shape(format!(
            "router has {} experts, tensors {n_expert}",
            router.n_expert
        )));
    }
    if n_embd == 0 || !x.len().is_multiple_of(n_embd) {
        return Err(MoeError::Shape(format!(
            "{} activations are not whole rows of {n_embd}",
            x.len()
        )));
    }
    let n_tokens = x.len() / n_embd;
    if router_logits.len() != n_tokens * n_expert || out.len() != x.len() {
        return Err(MoeError::Shape(format!(
            "{n_tokens} tokens need {} logits and {} outputs, got {} and {}",
            n_tokens * n_expert,
            x.len(),
            router_logits.len(),
            out.len()
        )));
    }
    if selection_bias.is_some_and(|b| b.len() != n_expert) {
        return Err(MoeError::Shape("selection bias: one per expert".into()));
    }
    if n_tokens == 0 {
        scratch.routes.clear();
        return Ok(());
    }

    // Route every token.
    let s = scratch;
    s.routes.clear();
    for logits in router_logits.chunks_exact(n_expert) {
        crate::routing::route_into(
            router,
            logits,
            selection_bias,
            &mut s.route_tmp,
            &mut s.route_scratch,
        );
        s.routes.extend_from_slice(&s.route_tmp);
    }
    run_routes(router, experts, x, out, s)
}

/// [`moe_ffn`] with the experts chosen outside the router: `chosen` holds `n_used` experts
/// per token (DeepSeek-V4's hash-routed layers pick them by token id); their weights come
/// from the router's logits as for routed ones (see [`crate::routing::weigh_chosen_into`]).
pub fn moe_ffn_chosen(
    router: &RouterConfig,
    experts: &MoeExperts<'_>,
    x: &[f32],
    router_logits: &[f32],
    chosen: &[usize],
    out: &mut [f32],
    scratch: &mut MoeScratch,
) -> Result<(), MoeError> {
    let (n_embd, n_expert, n_used) = (experts.n_embd(), experts.n_expert(), router.n_used);
    if router.n_expert != n_expert || n_embd == 0 || !x.len().is_multiple_of(n_embd) {
        return Err(MoeError::Shape(format!(
            "router of {} experts over {n_expert} experts of {n_embd} inputs, {} activations",
            router.n_expert,
            x.len()
        )));
    }
    let n_tokens = x.len() / n_embd;
    if router_logits.len() != n_tokens * n_expert
        || chosen.len() != n_tokens * n_used
        || out.len() != x.len()
    {
        return Err(MoeError::Shape(format!(
            "{n_tokens} tokens need {} logits, {} chosen experts and {} outputs",
            n_tokens * n_expert,
            n_tokens * n_used,
            x.len()
        )));
    }
    let s = scratch;
    s.routes.clear();
    for (logits, chosen) in router_logits
        .chunks_exact(n_expert)
        .zip(chosen.chunks_exact(n_used))
    {
        crate::routing::weigh_chosen_into(
            router,
            logits,
            chosen,
            &mut s.route_tmp,
            &mut s.route_scratch,
        )?;
        s.routes.extend_from_slice(&s.route_tmp);
    }
    if n_tokens == 0 {
        return Ok(());
    }
    run_routes(router, experts, x, out, s)
}

/// Asks for the pages of the streamed experts `next`'s router picks for `x` (see
/// [`MoeExperts::with_lookahead`]).
fn ask_ahead(
    router: &RouterConfig,
    next: &Lookahead<'_>,
    x: &[f32],
    s: &mut MoeScratch,
) -> Result<(), MoeError> {
    let Some(cache) = &next.experts.cache else {
        return Ok(());
    };
    let n_expert = next.experts.n_expert();
    if next.gate_inp.rows() != n_expert || router.n_expert != n_expert {
        return Err(MoeError::Shape(format!(
            "the next layer's router has {} experts, its tensors {n_expert}",
            next.gate_inp.rows()
        )));
    }
    router_logits_with(next.gate_inp, x, &mut s.ahead_logits, &mut s.router_xq)?;
    s.ahead.clear();
    for logits in s.ahead_logits.chunks_exact(n_expert) {
        crate::routing::route_into(
            router,
            logits,
            next.selection_bias,
            &mut s.route_tmp,
            &mut s.route_scratch,
        );
        s.ahead.extend(s.route_tmp.iter().map(|&(e, _)| e));
    }
    s.ahead.sort_unstable();
    s.ahead.dedup();
    cache.prefetch_ahead(next.experts.tensors(), &s.ahead);
    Ok(())
}

/// Quantizes every token once per activation type for the experts' products, with the
/// matrices of `first` (any expert's serve: they all have one type and layout); returns
/// whether gate and up share the quantized rows, and the row bytes of each. Quantization is
/// row by row, so gathering quantized rows equals quantizing gathered rows. Ungated experts
/// quantize for their up projection alone.
fn quantize_tokens(
    first: &ExpertViews<'_>,
    x: &[f32],
    s: &mut MoeScratch,
) -> Result<(bool, usize, usize), MoeError> {
    let up = first.up;
    let gate = first.gate.unwrap_or(up);
    gate.quantize_activation(x, &mut s.xq_gate)?;
    let shared_q = up.vec_dot_type() == gate.vec_dot_type();
    if !shared_q {
        up.quantize_activation(x, &mut s.xq_up)?;
    }
    Ok((
        shared_q,
        gate.activation_row_bytes(),
        up.activation_row_bytes(),
    ))
}

/// The experts of `scratch.routes` (`n_used` per token) over `x`, weighted and summed per
/// token into `out`, and the shared expert's output added when one is attached.
fn run_routes(
    router: &RouterConfig,
    experts: &MoeExperts<'_>,
    x: &[f32],
    out: &mut [f32],
    s: &mut MoeScratch,
) -> Result<(), MoeError> {
    let n_used = router.n_used;
    let n_embd = experts.n_embd();
    let n_tokens = x.len() / n_embd;
    // List (expert, token, slot) triples grouped by expert.
    s.assign.clear();
    for (t, routes) in s.routes.chunks_exact(n_used).enumerate() {
        for (slot, &(e, _)) in routes.iter().enumerate() {
            s.assign.push((e, t, slot));
        }
    }
    s.assign.sort_unstable();

    if let Some(cache) = &experts.cache {
        s.needed.clear();
        s.needed.extend(s.assign.iter().map(|a| a.0));
        s.needed.dedup();
        cache.prefetch(experts.tensors(), &s.needed);
    }
    if let Some(next) = &experts.lookahead {
        if n_tokens <= LOOKAHEAD_TOKENS {
            ask_ahead(router, next, x, s)?;
        }
    }

    // The activations, quantized with the first chunk's views (see `quantize_tokens`):
    // whether gate and up share them, and each one's row bytes.
    let mut quantized: Option<(bool, usize, usize)> = None;

    let shared = experts.shared.as_ref();
    if let Some(sh) = shared {
        sh.check(x, out)?;
        sh.prepare(x, &mut s.shared)?;
    }
    // The shared expert takes a place in a chunk's passes.
    let max_experts =
        (CHUNK_EXPERTS - usize::from(shared.is_some())).min(experts.max_pass_experts());
    let mut shared_done = false;

    s.contrib.clear();
    s.contrib.resize(n_tokens * n_used * n_embd, 0.0);
    let mut start = 0;
    while start < s.assign.len() {
        // A chunk of consecutive experts' groups: up to CHUNK_EXPERTS of them while their
        // rows stay few (a decode step's experts all at once), else one expert.
        let mut end = start;
        let mut experts_in_chunk = 0;
        while end < s.assign.len() && experts_in_chunk < max_experts {
            let e = s.assign[end].0;
            let m = s.assign[end..].iter().take_while(|a| a.0 == e).count();
            if experts_in_chunk > 0 && end + m - start > CHUNK_ROWS {
                break;
            }
            end += m;
            experts_in_chunk += 1;
        }
        // When one chunk holds every expert, the shared expert rides in its passes.
        let joined = shared.filter(|_| start == 0 && end == s.assign.len());
        shared_done |= joined.is_some();
        let ids: SmallVec<[usize; CHUNK_EXPERTS]> = expert_groups(&s.assign[start..end])
            .iter()
            .map(|&(first, _)| s.assign[start + first].0)
            .collect();
        let (shared_q, ag, au) = experts.with_views(&ids, |views| {
            let q = match quantized {
                Some(q) => q,
                None => quantize_tokens(&views[0], x, s)?,
            };
            experts_chunk(experts, views, start..end, q.0, (q.1, q.2), joined, s)?;
            Ok(q)
        })?;
        quantized = Some((shared_q, ag, au));
        for (i, &(_, t, slot)) in s.assign[start..end].iter().enumerate() {
            let w = s.routes[t * n_used + slot].1;
            let y = &s.y[i * n_embd..(i + 1) * n_embd];
            let dst = &mut s.contrib[(t * n_used + slot) * n_embd..][..n_embd];
            dst.iter_mut().zip(y).for_each(|(d, &v)| *d = v * w);
        }
        start = end;
    }

    // Sum each token's weighted expert outputs in routing order.
    for (o, c) in out
        .chunks_exact_mut(n_embd)
        .zip(s.contrib.chunks_exact(n_used * n_embd))
    {
        o.copy_from_slice(&c[..n_embd]);
        for slot in c.chunks_exact(n_embd).skip(1) {
            o.iter_mut().zip(slot).for_each(|(a, &b)| *a += b);
        }
    }
    if let Some(sh) = shared {
        if !shared_done {
            sh.run_alone(&mut s.shared)?;
        }
        sh.add_output(x, out, &mut s.shared)?;
    }
    Ok(())
}
