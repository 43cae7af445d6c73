//! Next-token selection: llama.cpp's default sampler chain (penalties, top-k, typical,
//! top-p, min-p, temperature, then a seeded draw), or greedy argmax at temperature 0.

use std::collections::{HashMap, VecDeque};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub use ferrox_core::select::argmax;
use ferrox_tokenizer::tokenizer::TokenId;

/// Sampling settings, with llama.cpp's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerParams {
    /// 0 (or below) selects the most likely token.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1 disables.
    pub top_p: f32,
    /// 0 disables.
    pub min_p: f32,
    /// 1 disables.
    pub typical_p: f32,
    /// 1 disables.
    pub repeat_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub penalty_last_n: usize,
    /// Added to a token's logit before anything else.
    pub logit_bias: Vec<(TokenId, f32)>,
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            typical_p: 1.0,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            logit_bias: Vec::new(),
            seed: 0xF3_77_0C,
        }
    }
}

impl SamplerParams {
    pub fn greedy() -> Self {
        SamplerParams {
            temperature: 0.0,
            ..Default::default()
        }
    }

    /// Checks ranges, naming the offending parameter.
    pub fn validate(&self) -> Result<(), String> {
        let check = |ok: bool, what: &str| if ok { Ok(()) } else { Err(what.to_string()) };
        check(
            self.temperature.is_finite() && self.temperature >= 0.0,
            "temperature must be >= 0",
        )?;
        check((0.0..=1.0).contains(&self.top_p), "top_p must be in [0, 1]")?;
        check((0.0..=1.0).contains(&self.min_p), "min_p must be in [0, 1]")?;
        check(
            (0.0..=1.0).contains(&self.typical_p),
            "typical_p must be in [0, 1]",
        )?;
        check(
            self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0,
            "repeat_penalty must be > 0",
        )?;
        check(
            self.presence_penalty.is_finite() && (-2.0..=2.0).contains(&self.presence_penalty),
            "presence_penalty must be in [-2, 2]",
        )?;
        check(
            self.frequency_penalty.is_finite() && (-2.0..=2.0).contains(&self.frequency_penalty),
            "frequency_penalty must be in [-2, 2]",
        )?;
        Ok(())
    }
}

/// A sampler with its random state and penalty window; one per sequence.
pub struct Sampler {
    params: SamplerParams,
    rng: StdRng,
    recent: VecDeque<TokenId>,
    candidates: Vec<(TokenId, f32)>,
    /// Logits with `logit_bias` applied (greedy choice with biases).
    biased: Vec<f32>,
}

impl Sampler {
    pub fn new(params: SamplerParams) -> Sampler {
        let rng = StdRng::seed_from_u64(params.seed);
        Sampler {
            params,
            rng,
            recent: VecDeque::new(),
            candidates: Vec::new(),
            biased: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// Records a token for the penalty window (prompt tokens and sampled ones).
    pub fn accept(&mut self, token: TokenId) {
        if self.params.penalty_last_n == 0 {
            return;
        }
        if self.recent.len() == self.params.penalty_last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
    }

    /// Picks the next token from raw logits.
    pub fn sample(&mut self, logits: &[f32]) -> TokenId {
        let probs = match self.prepare(logits) {
            Prepared::Chosen(token) => return token,
            Prepared::Draw(probs) => probs,
        };
        let c = &self.candidates;
        let r: f32 = self.rng.random();
        let mut acc = 0.0;
        for (i, pr) in probs.iter().enumerate() {
            acc += pr;
            if r < acc {
                return c[i].0;
            }
        }
        c[c.len() - 1].0
    }

    /// Speculative sampling (Leviathan et al., Chen et al.): `proposed` was drawn from the
    /// draft's distribution `q` (token, probability; `q(proposed) > 0`). It is kept with
    /// probability min(1, p/q), else a token is drawn from the normalized max(0, p - q):
    /// either way the token returned follows `p`, what [`Sampler::sample`] draws from. Greedy
    /// settings return their one choice. The second value says whether `proposed` was kept.
    pub fn sample_speculative(
        &mut self,
        logits: &[f32],
        proposed: TokenId,
        q: &[(TokenId, f32)],
    ) -> (TokenId, bool) {
        let probs = match self.prepare(logits) {
            Prepared::Chosen(token) => return (token, token == proposed),
            Prepared::Draw(probs) => probs,
        };
        let c = &self.candidates;
        let q_of = |id: TokenId| q.iter().find(|&&(t, _)| t == id).map_or(0.0, |&(_, pr)| pr);
        let p_x = c
            .iter()
            .position(|&(t, _)| t == proposed)
            .map_or(0.0, |i| probs[i]);
        let q_x = q_of(proposed);
        let r: f32 = self.rng.random();
        if q_x > 0.0 && r * q_x < p_x {
            return (proposed, true);
        }
        let mut residual: Vec<f32> = if q.len() > 1 {
            let q_map: HashMap<TokenId, f32> = q.iter().copied().collect();
            c.iter()
                .zip(&probs)
                .map(|(&(t, _), &pr)| (pr - q_map.get(&t).copied().unwrap_or(0.0)).max(0.0))
                .collect()
        } else {
            c.iter()
                .zip(&probs)
                .map(|(&(t, _), &pr)| (pr - q_of(t)).max(0.0))
                .collect()
        };
        let mut total: f32 = residual.iter().sum();
        if total <= 0.0 {
            // p and q agree up to rounding: any token but the rejected one, as p weighs it.
            residual = c
                .iter()
                .zip(&probs)
                .map(|(&(t, _), &pr)| if t == proposed { 0.0 } else { pr })
                .collect();
            total = residual.iter().sum();
            if total <= 0.0 {
                return (proposed, true);
            }
        }
        let r: f32 = self.rng.random::<f32>() * total;
        let mut acc = 0.0;
        let mut last = None;
        for (i, w) in residual.iter().enumerate() {
            if *w <= 0.0 {
                continue;
            }
            acc += w;
            last = Some(i);
            if r < acc {
                return (c[i].0, false);
            }
        }
        let i = last.expect("a positive residual weight");
        (c[i].0, false)
    }

    /// Runs the chain: the token itself when the settings are greedy, else the probabilities
    /// of `self.candidates` to draw from.
    fn prepare(&mut self, logits: &[f32]) -> Prepared {
        let p = &self.params;
        let needs_penalties =
            p.repeat_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
        if p.temperature <= 0.0 && !needs_penalties {
            if p.logit_bias.is_empty() {
                return Prepared::Chosen(argmax(logits));
            }
            let biased = &mut self.biased;
            biased.clear();
            biased.extend_from_slice(logits);
            for &(id, bias) in &p.logit_bias {
                if let Some(v) = biased.get_mut(id as usize) {
                    *v += bias;
                }
            }
            return Prepared::Chosen(argmax(biased));
        }
        let c = &mut self.candidates;
        c.clear();
        c.extend(logits.iter().enumerate().map(|(i, &l)| (i as TokenId, l)));
        for &(id, bias) in &p.logit_bias {
            if let Some(entry) = c.get_mut(id as usize) {
                entry.1 += bias;
            }
        }
        if needs_penalties {
            apply_penalties(c, &self.recent, p);
        }
        if p.temperature <= 0.0 {
            return Prepared::Chosen(
                c.iter()
                    .fold(c[0], |best, &x| if x.1 > best.1 { x } else { best })
                    .0,
            );
        }
        top_k(c, p.top_k);
        typical(c, p.typical_p);
        top_p(c, p.top_p);
        min_p(c, p.min_p);
        for entry in c.iter_mut() {
            entry.1 /= p.temperature;
        }
        Prepared::Draw(softmax(c))
    }
}

/// What the sampler chain leaves: one token, or candidates to draw from.
enum Prepared {
    Chosen(TokenId),
    /// The probabilities of `Sampler::candidates`, in their order.
    Draw(Vec<f32>),
}

fn apply_penalties(c: &mut [(TokenId, f32)], recent: &VecDeque<TokenId>, p: &SamplerParams) {
    let mut counts: HashMap<TokenId, u32> = HashMap::new();
    for &t in recent {
        *counts.entry(t).or_default() += 1;
    }
    for (token, count) in counts {
        if let Some(entry) = c.get_mut(token as usize) {
            let l = &mut entry.1;
            *l = if *l <= 0.0 {
                *l * p.repeat_penalty
            } else {
                *l / p.repeat_penalty
            };
            *l -= count as f32 * p.frequency_penalty + p.presence_penalty;
        }
    }
}

/// Keeps the `k` most likely, sorted by descending logit (sorts everything when k = 0).
fn top_k(c: &mut Vec<(TokenId, f32)>, k: usize) {
    let by_logit = |a: &(TokenId, f32), b: &(TokenId, f32)| b.1.total_cmp(&a.1);
    if k > 0 && k < c.len() {
        c.select_nth_unstable_by(k - 1, by_logit);
        c.truncate(k);
    }
    c.sort_by(by_logit);
}

/// Probabilities of sorted candidates.
fn softmax(c: &[(TokenId, f32)]) -> Vec<f32> {
    let max = c.first().map_or(0.0, |x| x.1);
    let mut probs: Vec<f32> = c.iter().map(|x| (x.1 - max).exp()).collect();
    let sum: f32 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= sum);
    probs
}

fn top_p(c: &mut Vec<(TokenId, f32)>, p: f32) {
    if p >= 1.0 {
        return;
    }
    let probs = softmax(c);
    let mut cum = 0.0;
    let mut keep = c.len();
    for (i, pr) in probs.iter().enumerate() {
        cum += pr;
        if cum >= p {
            keep = i + 1;
            break;
        }
    }
    c.truncate(keep.max(1));
}

fn min_p(c: &mut Vec<(TokenId, f32)>, p: f32) {
    if p <= 0.0 || c.is_empty() {
        return;
    }
    let threshold = c[0].1 + p.ln();
    let keep = c.iter().take_while(|x| x.1 >= threshold).count();
    c.truncate(keep.max(1));
}

/// Locally typical sampling: keeps the tokens whose surprise is closest to the entropy.
fn typical(c: &mut Vec<(TokenId, f32)>, p: f32) {
    if p >= 1.0 || c.len() < 2 {
        return;
    }
    let probs = softmax(c);
    let entropy: f32 = -probs
        .iter()
        .filter(|&&x| x > 0.0)
        .map(|x| x * x.ln())
        .sum::<f32>();
    let mut order: Vec<usize> = (0..c.len()).collect();
    let shift = |i: usize| (-probs[i].ln() - entropy).abs();
    order.sort_by(|&a, &b| shift(a).total_cmp(&shift(b)));
    let mut cum = 0.0;
    let mut keep = order.len();
    for (n, &i) in order.iter().enumerate() {
        cum += probs[i];
        if cum > p {
            keep = n + 1;
            break;
        }
    }
    let mut kept: Vec<(TokenId, f32)> = order[..keep].iter().map(|&i| c[i]).collect();
    kept.sort_by(|a, b| b.1.total_cmp(&a.1));
    *c = kept;
}

/// log-softmax of raw logits, and the `k` most likely (id, logprob) pairs.
pub fn top_logprobs(logits: &[f32], k: usize) -> Vec<(TokenId, f32)> {
    let lse = log_sum_exp(logits);
    let mut c: Vec<(TokenId, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as TokenId, l))
        .collect();
    top_k(&mut c, k);
    c.truncate(k);
    c.into_iter().map(|(i, l)| (i, l - lse)).collect()
}

/// The log-probability of one token under the raw logits.
pub fn logprob_of(logits: &[f32], token: TokenId) -> f32 {
    logits[token as usize] - log_sum_exp(logits)
}

/// log Σ exp(logits), shifted by the maximum and summed in f64 so a large vocabulary
/// neither overflows nor loses the small terms.
fn log_sum_exp(logits: &[f32]) -> f32 {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    max + sum.ln() as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        (0..100).map(|i| ((i * 37) % 100) as f32 / 10.0).collect()
    }

    #[test]
    fn biases_apply_to_greedy() {
        let l: Vec<f32> = (0..40).map(|i| (i % 9) as f32).collect();
        let mut s = Sampler::new(SamplerParams {
            temperature: 0.0,
            logit_bias: vec![(8, -100.0), (30, 0.5)],
            ..SamplerParams::default()
        });
        // 8 (the first 8.0) is banned; 30 (a 3.0) rises to 3.5 but 17 and 26 hold 8.0.
        assert_eq!(s.sample(&l), 17);
    }

    #[test]
    fn greedy_takes_the_argmax() {
        let l = logits();
        let mut s = Sampler::new(SamplerParams::greedy());
        assert_eq!(s.sample(&l), argmax(&l));
        assert_eq!(l[argmax(&l) as usize], 9.9);
    }

    #[test]
    fn same_seed_same_draws_and_filters_hold() {
        let l = logits();
        let params = SamplerParams {
            temperature: 1.0,
            top_k: 5,
            seed: 42,
            ..Default::default()
        };
        let draw = |params: &SamplerParams| {
            let mut s = Sampler::new(params.clone());
            (0..50).map(|_| s.sample(&l)).collect::<Vec<_>>()
        };
        let a = draw(&params);
        assert_eq!(a, draw(&params));
        // top-k 5: only the five best logits can appear.
        let mut sorted = l.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        assert!(a.iter().all(|&t| l[t as usize] >= sorted[4]));
        assert!(a.iter().collect::<std::collections::HashSet<_>>().len() > 1);
        let other = draw(&SamplerParams { seed: 43, ..params });
        assert_ne!(a, other);
    }

    #[test]
    fn min_p_and_top_p_cut_the_tail() {
        let l = vec![10.0, 9.0, 0.0, -5.0];
        let params = SamplerParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.2,
            seed: 1,
            ..Default::default()
        };
        let mut s = Sampler::new(params);
        for _ in 0..100 {
            assert!(s.sample(&l) < 2);
        }
        let params = SamplerParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            min_p: 0.0,
            seed: 1,
            ..Default::default()
        };
        let mut s = Sampler::new(params);
        for _ in 0..100 {
            assert_eq!(s.sample(&l), 0);
        }
    }

    #[test]
    fn repetition_penalty_discourages_recent_tokens() {
        let l = vec![5.0, 4.9, 0.0];
        let mut s = Sampler::new(SamplerParams {
            temperature: 0.0,
            repeat_penalty: 1.5,
            ..Default::default()
        });
        assert_eq!(s.sample(&l), 0);
        s.accept(0);
        assert_eq!(s.sample(&l), 1);
    }

    #[test]
    fn logprobs_are_normalized() {
        let l = logits();
        let top = top_logprobs(&l, 3);
        assert_eq!(top.len(), 3);
        assert!(top[0].1 >= top[1].1 && top[1].1 >= top[2].1);
        let total: f32 = l
            .iter()
            .map(|&x| logprob_of(&l, 0) - l[0] + x)
            .map(f32::exp)
            .sum();
        assert!((total - 1.0).abs() < 1e-4);
    }
}
