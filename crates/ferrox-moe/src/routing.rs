//! Expert selection and weighting, step for step as llama.cpp's `build_moe_ffn` computes
//! them on the CPU backend.
//!
//! For one token's router logits (`ffn_gate_inp · x`, one per expert):
//!
//! 1. **Gating** into probabilities `p`: [`Gating::Softmax`] (ggml's softmax: max
//!    subtraction, exponentials, an f64 sum, one multiply by the f32 reciprocal),
//!    [`Gating::Sigmoid`] (`1 / (1 + expf(-x))`), or [`Gating::SoftmaxWeight`] (`p` is the
//!    raw logits; the softmax comes later over the selected ones).
//! 2. **Selection scores** `s = p + b` when a selection bias `b` (`exp_probs_b`, DeepSeek-V3)
//!    is given, else `s = p`. The bias only steers selection; weights come from `p`.
//! 3. **Group-limited selection** (`groups = Some((n_group, n_group_used))`): experts are
//!    split into `n_group` consecutive groups; each group scores the (f64-summed, f32-rounded)
//!    sum of its two best `s`; the best `n_group_used` groups are kept and every other
//!    expert's score becomes -inf.
//! 4. **Top-k**: the `n_used` best scores, best first.
//! 5. **Weights** `w_i = p[e_i]`; for [`Gating::SoftmaxWeight`] a softmax over those.
//! 6. **Normalisation** (`norm_weights`): `w_i / max(sum w, 2^-14)`, the sum in f64
//!    rounded to f32 (a NaN sum clamps to +inf, as ggml's `MAX(MIN(x, inf), min)` does).
//! 7. **Scaling**: `w_i * scale` unless `scale` is 0 or 1 (ggml's convention: 0 = unset).
//!
//! # Ordering and ties
//! Every ranking (top-2 within a group, groups, top-k) is a stable sort by descending score:
//! equal scores keep ascending expert (or group) index. ggml's CPU argsort is `std::sort`
//! with `a > b`; for rows of at most 16 values libstdc++ runs insertion sort, which is
//! stable, so ties resolve identically there. For longer rows `std::sort` is not stable and
//! exact ties at the selection boundary may resolve differently from llama.cpp (exact ties
//! of f32 router scores do not occur in practice). The output keeps the ranked order, which
//! matters: llama.cpp sums the weighted expert outputs in that order.
//!
//! # NaN and infinities
//! [`route`] never panics on non-finite logits or biases. For ranking, NaN counts as lower
//! than every number, -inf included, so a NaN score is chosen only when fewer than `n_used`
//! experts have numeric scores; ±inf rank as themselves. The returned `n_used` experts are
//! always distinct and in range. The weights are whatever ggml's f32 arithmetic gives and
//! may be NaN or infinite (e.g. one NaN logit makes every softmax probability NaN, as in
//! llama.cpp).

use std::cmp::Ordering;

use ferrox_gguf::Metadata;

use crate::numerics;
use crate::MoeError;

/// How router logits become expert probabilities (llama.cpp's `expert_gating_func`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// 1: softmax over all experts (Mixtral, Qwen-MoE, OLMoE, DeepSeek-V2).
    Softmax,
    /// 2: independent sigmoids (DeepSeek-V3, Kimi-K2, GLM-4.5).
    Sigmoid,
    /// 3: selection on the raw logits, softmax over the selected ones.
    SoftmaxWeight,
    /// 4: `sqrt(softplus(x))` (DeepSeek-V4).
    SqrtSoftplus,
}

/// Everything [`route`] needs about one MoE layer's router.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouterConfig {
    /// Experts in the layer (`{arch}.expert_count`).
    pub n_expert: usize,
    /// Experts selected per token (`{arch}.expert_used_count`).
    pub n_used: usize,
    pub gating: Gating,
    /// Divide the selected weights by their sum (`{arch}.expert_weights_norm`).
    pub norm_weights: bool,
    /// Multiply the final weights by this, unless it is 0 or 1
    /// (`{arch}.expert_weights_scale`; llama.cpp's default 0 means "no scaling").
    pub scale: f32,
    /// `(n_group, n_group_used)` for group-limited selection; `None` when the file has no
    /// groups (`{arch}.expert_group_count` ≤ 1).
    pub groups: Option<(usize, usize)>,
}

/// Smallest normalisation divisor: ggml clamps the weight sum to the smallest normal f16.
const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

impl RouterConfig {
    /// Checks the invariants llama.cpp asserts when loading a model: `0 < n_used ≤ n_expert`,
    /// and with groups: `1 < n_group < n_expert`, `n_expert % n_group == 0`,
    /// `0 < n_group_used < n_group`, and at least two experts per group (the group score
    /// sums each group's top two).
    pub fn validate(&self) -> Result<(), MoeError> {
        let bad = |m: String| Err(MoeError::Config(m));
        if self.n_expert == 0 || self.n_used == 0 || self.n_used > self.n_expert {
            return bad(format!(
                "need 0 < n_used ({}) <= n_expert ({})",
                self.n_used, self.n_expert
            ));
        }
        if let Some((g, gu)) = self.groups {
            if g <= 1 || g >= self.n_expert || !self.n_expert.is_multiple_of(g) {
                return bad(format!(
                    "{g} expert groups do not evenly split {} experts",
                    self.n_expert
                ));
            }
            if gu == 0 || gu >= g {
                return bad(format!("need 0 < n_group_used ({gu}) < n_group ({g})"));
            }
            if self.n_expert / g < 2 {
                return bad(format!("groups of {} expert(s); need 2", self.n_expert / g));
            }
        }
        Ok(())
    }

    /// Reads the router of architecture `arch` (`general.architecture`) from GGUF metadata
    /// with llama.cpp's defaults:
    ///
    /// * `{arch}.expert_count`, `{arch}.expert_used_count`: required (a missing one is an
    ///   error naming the key).
    /// * gating: `qwen2moe`, `qwen3moe`, `qwen3vlmoe`, `olmoe` and `llama` (Mixtral) always use softmax,
    ///   as llama.cpp hard-codes; other architectures read `{arch}.expert_gating_func`
    ///   (1 softmax, 2 sigmoid, 3 softmax-weight; absent or 0 means softmax, except the
    ///   GLM-4.7-Lite files llama.cpp recognises under `deepseek2`: 47 or 48 layers and a
    ///   154880-token vocabulary, which mean sigmoid).
    /// * normalisation: always on for `qwen3moe`, `qwen3vlmoe` and `llama`, always off for `qwen2moe` and
    ///   `olmoe`, otherwise `{arch}.expert_weights_norm` (default false).
    /// * `{arch}.expert_weights_scale` (default 0: no scaling).
    /// * `{arch}.expert_group_count` / `{arch}.expert_group_used_count` (default 0: no groups).
    pub fn from_metadata(md: &Metadata<'_>, arch: &str) -> Result<Self, MoeError> {
        let key = |k: &str| format!("{arch}.{k}");
        let n_expert = count(md, &key("expert_count"))?;
        let n_used = count(md, &key("expert_used_count"))?;
        let gating = match arch {
            "qwen2moe" | "qwen3moe" | "qwen3vlmoe" | "olmoe" | "llama" => Gating::Softmax,
            _ => {
                let k = key("expert_gating_func");
                match md.opt_u32(&k)?.unwrap_or(0) {
                    0 if arch == "deepseek2" && is_glm47_lite(md, arch)? => Gating::Sigmoid,
                    0 | 1 => Gating::Softmax,
                    2 => Gating::Sigmoid,
                    3 => Gating::SoftmaxWeight,
                    4 => Gating::SqrtSoftplus,
                    v => {
                        return Err(MoeError::BadValue {
                            key: k,
                            reason: format!("unknown gating function {v}"),
                        })
                    }
                }
            }
        };
        let norm_weights = match arch {
            "qwen3moe" | "qwen3vlmoe" | "llama" => true,
            "qwen2moe" | "olmoe" => false,
            _ => md.opt_bool(&key("expert_weights_norm"))?.unwrap_or(false),
        };
        let scale = md.opt_f32(&key("expert_weights_scale"))?.unwrap_or(0.0);
        let n_group = opt_count(md, &key("expert_group_count"))?.unwrap_or(0);
        let n_group_used = opt_count(md, &key("expert_group_used_count"))?.unwrap_or(0);
        let groups = (n_group > 1).then_some((n_group, n_group_used));
        let config = RouterConfig {
            n_expert,
            n_used,
            gating,
            norm_weights,
            scale,
            groups,
        };
        config.validate().map_err(|e| match e {
            MoeError::Config(m) => MoeError::Config(format!(
                "{m} (from `{}`, `{}`, `{}`, `{}`)",
                key("expert_count"),
                key("expert_used_count"),
                key("expert_group_count"),
                key("expert_group_used_count")
            )),
            e => e,
        })?;
        Ok(config)
    }
}

/// Largest value a count may hold. llama.cpp keeps these hyperparameters in 32-bit integers;
/// nothing is sized by them before the expert tensors' shapes confirm them, and below 2^32 the
/// product of two counts cannot overflow.
const MAX_COUNT: usize = u32::MAX as usize;

/// An optional count, at most [`MAX_COUNT`] (an error naming the key and value otherwise).
fn opt_count(md: &Metadata<'_>, key: &str) -> Result<Option<usize>, MoeError> {
    match md.opt_usize(key)? {
        Some(n) if n > MAX_COUNT => Err(MoeError::BadValue {
            key: key.to_string(),
            reason: format!("{n} is more than the {MAX_COUNT} allowed"),
        }),
        n => Ok(n),
    }
}

fn count(md: &Metadata<'_>, key: &str) -> Result<usize, MoeError> {
    opt_count(md, key)?.ok_or_else(|| ferrox_gguf::GgufError::MissingKey(key.to_string()).into())
}

/// llama.cpp's heuristic for GLM-4.7-Lite GGUFs written as `deepseek2` without a gating key.
fn is_glm47_lite(md: &Metadata<'_>, arch: &str) -> Result<bool, MoeError> {
    let layers = md.opt_usize(&format!("{arch}.block_count"))?.unwrap_or(0);
    let nextn = md
        .opt_usize(&format!("{arch}.nextn_predict_layers"))?
        .unwrap_or(0);
    let vocab = md
        .opt_array("tokenizer.ggml.tokens")?
        .map_or(0, |a| a.len());
    let n_layer = layers.saturating_sub(nextn);
    Ok((n_layer == 47 || n_layer == 48) && vocab == 154_880)
}

/// The MoE-related hyperparameters of a model beyond the router itself.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeHparams {
    pub router: RouterConfig,
    /// Leading layers with a dense FFN instead of experts
    /// (`{arch}.leading_dense_block_count`, default 0).
    pub n_leading_dense: usize,
    /// Hidden size of each routed expert (`{arch}.expert_feed_forward_length`), if given.
    pub n_ff_exp: Option<usize>,
    /// Hidden size of the shared expert(s) (`{arch}.expert_shared_feed_forward_length`).
    pub n_ff_shexp: Option<usize>,
    /// Shared experts (`{arch}.expert_shared_count`, default 0).
    pub n_expert_shared: usize,
}

impl MoeHparams {
    pub fn from_metadata(md: &Metadata<'_>, arch: &str) -> Result<Self, MoeError> {
        let key = |k: &str| format!("{arch}.{k}");
        Ok(MoeHparams {
            router: RouterConfig::from_metadata(md, arch)?,
            n_leading_dense: opt_count(md, &key("leading_dense_block_count"))?.unwrap_or(0),
            n_ff_exp: opt_count(md, &key("expert_feed_forward_length"))?,
            n_ff_shexp: opt_count(md, &key("expert_shared_feed_forward_length"))?,
            n_expert_shared: opt_count(md, &key("expert_shared_count"))?.unwrap_or(0),
        })
    }
}

/// Descending order with NaN below everything; callers make the sort stable.
fn desc(a: f32, b: f32) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => b.partial_cmp(&a).unwrap_or(Ordering::Equal),
    }
}

/// Indices `0..scores.len()` ranked best first (stable: ties keep ascending index).
fn argsort_desc(scores: &[f32], idx: &mut Vec<usize>) {
    idx.clear();
    idx.extend(0..scores.len());
    idx.sort_by(|&a, &b| desc(scores[a], scores[b]));
}

/// Buffers of [`route_into`], kept between calls so routing does not allocate.
#[derive(Clone, Debug, Default)]
pub struct RouteScratch {
    probs: Vec<f32>,
    sel: Vec<f32>,
    idx: Vec<usize>,
    group_scores: Vec<f32>,
    keep: Vec<bool>,
    w: Vec<f32>,
    raw: Vec<f32>,
}

/// Selects `config.n_used` experts for one token and computes their weights, replacing the
/// contents of `out` with `(expert, weight)` pairs, best-ranked first. See the module
/// documentation for the exact computation, tie-breaking and non-finite inputs.
///
/// # Panics
/// If `router_logits` (or `selection_bias`) does not hold `config.n_expert` values, or the
/// configuration fails [`RouterConfig::validate`].
pub fn route(
    config: &RouterConfig,
    router_logits: &[f32],
    selection_bias: Option<&[f32]>,
    out: &mut Vec<(usize, f32)>,
) {
    route_into(
        config,
        router_logits,
        selection_bias,
        out,
        &mut RouteScratch::default(),
    );
}

/// [`route`] with its buffers in `scratch`.
pub fn route_into(
    config: &RouterConfig,
    router_logits: &[f32],
    selection_bias: Option<&[f32]>,
    out: &mut Vec<(usize, f32)>,
    scratch: &mut RouteScratch,
) {
    if let Err(e) = config.validate() {
        panic!("{e}");
    }
    let n = config.n_expert;
    assert_eq!(router_logits.len(), n, "router logits: one per expert");
    let RouteScratch {
        probs,
        sel,
        idx,
        group_scores,
        keep,
        w,
        raw,
    } = scratch;
    gate(config.gating, router_logits, probs);
    sel.clear();
    sel.extend_from_slice(probs);
    if let Some(bias) = selection_bias {
        assert_eq!(bias.len(), n, "selection bias: one per expert");
        sel.iter_mut().zip(bias).for_each(|(s, &b)| *s += b);
    }
    if let Some((n_group, n_group_used)) = config.groups {
        let per = n / n_group;
        group_scores.clear();
        for g in sel.chunks_exact(per) {
            argsort_desc(g, idx);
            group_scores.push(numerics::sum_f32(&[g[idx[0]], g[idx[1]]]));
        }
        argsort_desc(group_scores, idx);
        keep.clear();
        keep.resize(n_group, false);
        idx[..n_group_used].iter().for_each(|&g| keep[g] = true);
        for (g, chunk) in sel.chunks_exact_mut(per).enumerate() {
            if !keep[g] {
                chunk.fill(f32::NEG_INFINITY);
            }
        }
    }
    argsort_desc(sel, idx);
    let chosen = &idx[..config.n_used];
    weigh(config, probs, chosen, w, raw);
    out.clear();
    out.extend(chosen.iter().copied().zip(w.iter().copied()));
}

/// The gating function of `logits` into `probs` (one per expert).
fn gate(gating: Gating, logits: &[f32], probs: &mut Vec<f32>) {
    probs.clear();
    probs.resize(logits.len(), 0.0);
    match gating {
        Gating::Softmax => numerics::softmax(logits, probs),
        Gating::Sigmoid => probs
            .iter_mut()
            .zip(logits)
            .for_each(|(p, &x)| *p = numerics::sigmoid(x)),
        Gating::SoftmaxWeight => probs.copy_from_slice(logits),
        Gating::SqrtSoftplus => probs
            .iter_mut()
            .zip(logits)
            .for_each(|(p, &x)| *p = numerics::softplus(x).sqrt()),
    }
}

/// The weights of the `chosen` experts: their probabilities, softmaxed for
/// [`Gating::SoftmaxWeight`], normalised and scaled as the configuration says.
fn weigh(
    config: &RouterConfig,
    probs: &[f32],
    chosen: &[usize],
    w: &mut Vec<f32>,
    raw: &mut Vec<f32>,
) {
    w.clear();
    w.extend(chosen.iter().map(|&e| probs[e]));
    if config.gating == Gating::SoftmaxWeight {
        raw.clear();
        raw.extend_from_slice(w);
        numerics::softmax(raw, w);
    }
    if config.norm_weights {
        let sum = numerics::sum_f32(w);
        // ggml_clamp: MAX(MIN(x, inf), min), where MIN(NaN, inf) is inf.
        let sum = if sum < f32::INFINITY {
            sum
        } else {
            f32::INFINITY
        };
        let sum = if sum > MIN_WEIGHT_SUM {
            sum
        } else {
            MIN_WEIGHT_SUM
        };
        w.iter_mut().for_each(|v| *v /= sum);
    }
    if config.scale != 0.0 && config.scale != 1.0 {
        w.iter_mut().for_each(|v| *v *= config.scale);
    }
}

/// Weights for experts chosen outside the router (DeepSeek-V4's hash-routed layers pick
/// them by token id): `(expert, weight)` pairs in `chosen`'s order, the weights computed from
/// `router_logits` exactly as [`route_into`] computes a selected expert's. An expert out of
/// range is an error.
pub fn weigh_chosen_into(
    config: &RouterConfig,
    router_logits: &[f32],
    chosen: &[usize],
    out: &mut Vec<(usize, f32)>,
    scratch: &mut RouteScratch,
) -> Result<(), MoeError> {
    config.validate()?;
    if router_logits.len() != config.n_expert || chosen.len() != config.n_used {
        return Err(MoeError::Shape(format!(
            "{} router logits and {} chosen experts for {} experts, {} used",
            router_logits.len(),
            chosen.len(),
            config.n_expert,
            config.n_used
        )));
    }
    if let Some(&bad) = chosen.iter().find(|&&e| e >= config.n_expert) {
        return Err(MoeError::Shape(format!(
            "expert {bad} chosen among {}",
            config.n_expert
        )));
    }
    gate(config.gating, router_logits, &mut scratch.probs);
    weigh(
        config,
        &scratch.probs,
        chosen,
        &mut scratch.w,
        &mut scratch.raw,
    );
    out.clear();
    out.extend(chosen.iter().copied().zip(scratch.w.iter().copied()));
    Ok(())
}
