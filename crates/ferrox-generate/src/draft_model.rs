//! Speculative decoding with a draft model: a smaller model with the target's vocabulary
//! proposes the next tokens, one cheap step each, and the target checks them all in one
//! step. The draft keeps its own sequence memory beside the target's; what the target
//! rejects is forgotten there too (the next proposal starts from the longest prefix the
//! draft's memory shares with the text).
//!
//! When the target decodes greedily the draft proposes its argmax; when it samples, the
//! draft samples from its own distribution and the target keeps or replaces each token by
//! speculative sampling ([`crate::sampling::Sampler::sample_speculative`]), so the output
//! follows the target's distribution either way.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use ferrox_core::select::argmax;
use ferrox_engine::{Engine, EngineError, EngineExt, LogitsFor, State};
use ferrox_tokenizer::tokenizer::{TokenId, Tokenizer};

/// The largest difference in vocabulary size a draft may have (llama.cpp's limit: the
/// trailing tokens of a padded vocabulary may differ).
pub const MAX_VOCAB_SIZE_DIFFERENCE: usize = 128;

/// Tokens below this id are not compared (llama.cpp's check starts there too: some
/// conversions name their first special tokens differently).
const FIRST_COMPARED_TOKEN: usize = 5;

/// Candidates a sampling draft draws from (its most likely tokens).
const SAMPLED_CANDIDATES: usize = 32;

/// Why a draft model cannot serve a target, or a drafting setting is wrong.
#[derive(Debug, thiserror::Error)]
pub enum DraftError {
    #[error("the draft model's tokenizer is `{draft}`, the target's `{target}`")]
    TokenizerKind { target: String, draft: String },
    #[error("the draft model's {what} is {draft}, the target's {target}")]
    SpecialToken {
        what: &'static str,
        target: String,
        draft: String,
    },
    #[error(
        "the vocabularies differ in size by more than {MAX_VOCAB_SIZE_DIFFERENCE} tokens \
         (target {target}, draft {draft})"
    )]
    VocabSize { target: usize, draft: usize },
    #[error(
        "token {id} is {draft:?} in the draft model's vocabulary but {target:?} in the target's"
    )]
    TokenText {
        id: usize,
        target: String,
        draft: String,
    },
    #[error("{0}")]
    Params(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Checks that `draft`'s vocabulary can stand in for `target`'s, as llama.cpp checks it:
/// the same tokenizer type and BOS/EOS handling, sizes within
/// [`MAX_VOCAB_SIZE_DIFFERENCE`] and the same text for every shared token id.
pub fn check_vocab_compatible(target: &Tokenizer, draft: &Tokenizer) -> Result<(), DraftError> {
    let (t, d) = (target.vocab(), draft.vocab());
    if t.model() != d.model() {
        return Err(DraftError::TokenizerKind {
            target: t.model().to_string(),
            draft: d.model().to_string(),
        });
    }
    let special = |what, a: String, b: String| {
        if a == b {
            Ok(())
        } else {
            Err(DraftError::SpecialToken {
                what,
                target: a,
                draft: b,
            })
        }
    };
    special(
        "BOS-adding",
        t.add_bos().to_string(),
        d.add_bos().to_string(),
    )?;
    special(
        "EOS-adding",
        t.add_eos().to_string(),
        d.add_eos().to_string(),
    )?;
    let id = |t: Option<TokenId>| t.map_or_else(|| "none".to_string(), |t| t.to_string());
    if t.add_bos() {
        special("BOS token", id(t.bos()), id(d.bos()))?;
    }
    if t.add_eos() {
        special("EOS token", id(t.eos()), id(d.eos()))?;
    }
    if t.len().abs_diff(d.len()) > MAX_VOCAB_SIZE_DIFFERENCE {
        return Err(DraftError::VocabSize {
            target: t.len(),
            draft: d.len(),
        });
    }
    for id in FIRST_COMPARED_TOKEN..t.len().min(d.len()) {
        let token = id as TokenId;
        if t.text(token) != d.text(token) {
            return Err(DraftError::TokenText {
                id,
                target: t.text(token).to_string(),
                draft: d.text(token).to_string(),
            });
        }
    }
    Ok(())
}

/// How much a draft model proposes (llama.cpp's `--draft-max`, `--draft-min`,
/// `--draft-p-min`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftParams {
    /// Most tokens proposed per step.
    pub max: usize,
    /// Fewer proposed tokens than this are not checked.
    pub min: usize,
    /// Drafting stops at a token whose draft probability is below this.
    pub p_min: f32,
}

impl DraftParams {
    pub fn validate(&self) -> Result<(), DraftError> {
        if self.max == 0 {
            return Err(DraftError::Params("--draft-max must be at least 1".into()));
        }
        if self.min > self.max {
            return Err(DraftError::Params(format!(
                "--draft-min ({}) exceeds --draft-max ({})",
                self.min, self.max
            )));
        }
        if !(0.0..=1.0).contains(&self.p_min) {
            return Err(DraftError::Params("--draft-p-min must be in [0, 1]".into()));
        }
        Ok(())
    }
}

/// One proposed token and the draft distribution it was drawn from (token, probability).
pub type DraftDistribution = Vec<(TokenId, f32)>;

/// A draft model running one sequence beside the target's.
pub struct ModelDrafter<'e> {
    engine: &'e dyn Engine,
    state: State,
    /// The tokens in the draft's memory, in order.
    held: Vec<TokenId>,
    /// What came before the generation's prompt (a conversation's earlier turns).
    context: Vec<TokenId>,
    params: DraftParams,
    /// Drafted tokens must be below this (the target's vocabulary size).
    target_vocab: usize,
    rng: StdRng,
}

impl<'e> ModelDrafter<'e> {
    /// A drafter for a target with `target_vocab` logits per row; `seed` seeds the draws of
    /// a sampling draft.
    pub fn new(
        engine: &'e dyn Engine,
        params: DraftParams,
        target_vocab: usize,
        seed: u64,
    ) -> Result<ModelDrafter<'e>, DraftError> {
        params.validate()?;
        Ok(ModelDrafter {
            state: engine.new_state()?,
            engine,
            held: Vec::new(),
            context: Vec::new(),
            params,
            target_vocab,
            rng: StdRng::seed_from_u64(seed ^ 0x5eed_d4af),
        })
    }

    pub fn params(&self) -> DraftParams {
        self.params
    }

    /// The tokens before the next generation's prompt (what the target's memory holds below
    /// its start position), so the draft sees the whole text.
    pub fn set_context(&mut self, tokens: &[TokenId]) {
        self.context.clear();
        self.context.extend_from_slice(tokens);
    }

    pub fn context(&self) -> &[TokenId] {
        &self.context
    }

    /// Proposes up to `room` tokens (and at most `max`) to follow `text`, the whole text so
    /// far; `dists[i]` is the distribution `out[i]` was drawn from. Greedy when
    /// `temperature <= 0`, else sampled at that temperature from the draft's most likely
    /// tokens. Nothing is proposed when fewer than `min` tokens would be.
    pub fn propose(
        &mut self,
        text: &[TokenId],
        room: usize,
        temperature: f32,
        out: &mut Vec<TokenId>,
        dists: &mut Vec<DraftDistribution>,
    ) -> Result<(), EngineError> {
        out.clear();
        dists.clear();
        let capacity = self.engine.context_size();
        let n_vocab = self.engine.vocab_size();
        // The draft's memory holds the text but its last token, then the drafted tokens but
        // the last one.
        let room = room
            .min(self.params.max)
            .min((capacity + 1).saturating_sub(text.len()));
        if room == 0 || text.is_empty() {
            return Ok(());
        }
        let mut keep = self
            .held
            .iter()
            .zip(text)
            .take_while(|(a, b)| a == b)
            .count()
            .min(text.len() - 1);
        if text[keep..].iter().any(|&t| t as usize >= n_vocab) {
            // A token the draft cannot read: nothing to propose.
            return Ok(());
        }
        if keep < self.held.len() {
            keep = self.state.truncate_or_reset(keep);
            self.held.truncate(keep);
        }
        let mut logits = self
            .engine
            .forward_batch(&text[keep..], keep, &mut self.state, LogitsFor::Last)?
            .to_vec();
        self.held.extend_from_slice(&text[keep..]);
        while let Some((token, dist)) = self.pick(&logits, temperature) {
            out.push(token);
            dists.push(dist);
            if out.len() >= room {
                break;
            }
            let pos = self.held.len();
            logits.copy_from_slice(self.engine.forward_token(token, pos, &mut self.state)?);
            self.held.push(token);
        }
        if out.len() < self.params.min.max(1) {
            out.clear();
            dists.clear();
        }
        Ok(())
    }

    /// The draft's next token from its logits, or `None` when its most likely token is less
    /// likely than `p_min` or outside the target's vocabulary.
    fn pick(&mut self, logits: &[f32], temperature: f32) -> Option<(TokenId, DraftDistribution)> {
        let best = greedy_draft(logits, self.params.p_min, self.target_vocab)?;
        let (token, dist) = if temperature <= 0.0 {
            (best, vec![(best, 1.0)])
        } else {
            let dist = top_distribution(logits, temperature, SAMPLED_CANDIDATES);
            let r: f32 = self.rng.random();
            let mut acc = 0.0;
            let token = dist
                .iter()
                .find(|&&(_, p)| {
                    acc += p;
                    r < acc
                })
                .unwrap_or(&dist[dist.len() - 1])
                .0;
            (token, dist)
        };
        ((token as usize) < self.target_vocab).then_some((token, dist))
    }
}

/// A draft's most likely token from its logits, or `None` when its probability is below
/// `p_min` or it lies outside the target's vocabulary (`target_vocab` tokens).
pub fn greedy_draft(logits: &[f32], p_min: f32, target_vocab: usize) -> Option<TokenId> {
    let best = argmax(logits);
    let max = logits[best as usize];
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    (((1.0 / sum) as f32) >= p_min && (best as usize) < target_vocab).then_some(best)
}

/// The softmax at `temperature` over the `k` largest logits (most likely first).
fn top_distribution(logits: &[f32], temperature: f32, k: usize) -> DraftDistribution {
    let mut c: Vec<(TokenId, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as TokenId, l))
        .collect();
    let by_logit = |a: &(TokenId, f32), b: &(TokenId, f32)| b.1.total_cmp(&a.1);
    if k < c.len() {
        c.select_nth_unstable_by(k - 1, by_logit);
        c.truncate(k);
    }
    c.sort_by(by_logit);
    let max = c[0].1;
    let mut total = 0.0;
    for entry in c.iter_mut() {
        entry.1 = ((entry.1 - max) / temperature).exp();
        total += entry.1;
    }
    c.iter_mut().for_each(|e| e.1 /= total);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_checked() {
        let ok = DraftParams {
            max: 4,
            min: 1,
            p_min: 0.5,
        };
        assert!(ok.validate().is_ok());
        assert!(DraftParams { max: 0, ..ok }.validate().is_err());
        assert!(DraftParams { min: 5, ..ok }.validate().is_err());
        assert!(DraftParams { p_min: 1.5, ..ok }.validate().is_err());
    }

    #[test]
    fn top_distribution_is_normalized_and_sorted() {
        let logits = [0.0, 3.0, 1.0, 2.0, -1.0];
        let d = top_distribution(&logits, 0.7, 3);
        assert_eq!(d.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 3, 2]);
        assert!((d.iter().map(|e| e.1).sum::<f32>() - 1.0).abs() < 1e-6);
    }
}
