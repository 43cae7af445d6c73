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

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use ferrox_core::select::argmax;
use ferrox_engine::{step_sequences, Engine, EngineError, LogitsFor, Output, SeqWork, StepScratch};
use ferrox_memory::{MemoryShape, SeqId, SequenceMemory};
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

/// One sequence's drafting request: an id that names its sequence from one proposal to the
/// next, its whole text (prompt, then every generated token, the last of them not yet fed),
/// how many tokens it may draft, and the temperature it drafts at (greedy at `<= 0`).
pub struct DraftRequest<'a> {
    pub id: u64,
    pub text: &'a [TokenId],
    pub room: usize,
    pub temperature: f32,
}

/// The draft model's side of speculative decoding, for any number of sequences: each
/// drafting sequence has its own sequence in the draft's memory, holding its text up to the
/// last token; what the target rejected is rolled back there at the next proposal (the
/// longest prefix the memory shares with the text is kept; a recurrent state that cannot
/// roll back that far starts again from the whole text). All sequences of a proposal go
/// through the draft model together: one step for what each has to catch up on, then one
/// step per drafted token. The CLI drafts one sequence through it ([`ModelDrafter`]), the
/// server every drafting sequence of a batch.
pub struct DraftSequences {
    memory: SequenceMemory,
    scratch: StepScratch,
    /// Drafting stops at a token the draft gives less than this probability.
    p_min: f32,
    /// Drafted tokens must be below this (the target's vocabulary size).
    target_vocab: usize,
    /// Each drafting request's sequence and the tokens its memory holds.
    sequences: HashMap<u64, (SeqId, Vec<TokenId>)>,
    logits: Vec<Vec<f32>>,
    rng: StdRng,
}

impl DraftSequences {
    /// Drafts for a target with `target_vocab` logits per row, in a memory of `shape`;
    /// `seed` seeds the draws of sampled drafts.
    pub fn new(
        engine: &dyn Engine,
        shape: MemoryShape,
        p_min: f32,
        target_vocab: usize,
        seed: u64,
    ) -> Result<DraftSequences, EngineError> {
        Ok(DraftSequences {
            memory: SequenceMemory::new(engine.memory_spec(), shape)?,
            scratch: engine.new_scratch(),
            p_min,
            target_vocab,
            sequences: HashMap::new(),
            logits: Vec::new(),
            rng: StdRng::seed_from_u64(seed ^ 0x5eed_d4af),
        })
    }

    /// Forgets the sequences of requests that are no longer running.
    pub fn retain(&mut self, running: impl Fn(u64) -> bool) {
        let memory = &mut self.memory;
        self.sequences.retain(|id, (seq, _)| {
            let keep = running(*id);
            if !keep {
                memory.release(*seq);
            }
            keep
        });
    }

    /// Each request's drafted tokens into `out`, and the distribution each was drawn from
    /// into `dists` (one list per request, in order; empty for a request the draft cannot
    /// serve now).
    pub fn propose(
        &mut self,
        engine: &dyn Engine,
        requests: &[DraftRequest<'_>],
        out: &mut Vec<Vec<TokenId>>,
        dists: &mut Vec<Vec<DraftDistribution>>,
    ) -> Result<(), EngineError> {
        out.clear();
        out.resize(requests.len(), Vec::new());
        dists.clear();
        dists.resize(requests.len(), Vec::new());
        let n_ctx = engine.context_size();
        let n_vocab = engine.vocab_size();
        // (request, sequence, tokens to feed first, room)
        let mut live: Vec<(usize, SeqId, usize, usize)> = Vec::new();
        for (i, r) in requests.iter().enumerate() {
            // The draft's memory holds the text but its last token, then the drafted tokens
            // but the last one.
            let room = r.room.min((n_ctx + 1).saturating_sub(r.text.len()));
            let readable = r.text.iter().all(|&t| (t as usize) < n_vocab);
            if room == 0 || r.text.is_empty() || !readable {
                continue;
            }
            let Some((seq, held)) = self.sequence(r.id, n_ctx) else {
                continue;
            };
            let mut keep = held
                .iter()
                .zip(r.text)
                .take_while(|(a, b)| a == b)
                .count()
                .min(r.text.len() - 1);
            let mut seq = *seq;
            if keep < self.memory.len(seq)
                && (keep == 0 || self.memory.rollback(seq, keep).is_err())
            {
                // A recurrent state with no checkpoint there: the sequence starts afresh
                // and is fed the whole text again.
                self.memory.release(seq);
                self.sequences.remove(&r.id);
                let Some((fresh, _)) = self.sequence(r.id, n_ctx) else {
                    continue;
                };
                seq = *fresh;
                keep = 0;
            }
            let held = &mut self.sequences.get_mut(&r.id).expect("just found").1;
            held.truncate(keep);
            held.extend_from_slice(&r.text[keep..]);
            live.push((i, seq, keep, room));
        }
        // The text each sequence lacks, then one drafted token per step.
        let mut first = true;
        while !live.is_empty() {
            let feeds: Vec<&[TokenId]> = live
                .iter()
                .map(|&(i, _, keep, _)| match first {
                    true => &requests[i].text[keep..],
                    false => std::slice::from_ref(out[i].last().expect("drafted")),
                })
                .collect();
            let work: Vec<SeqWork<'_>> = live
                .iter()
                .zip(&feeds)
                .map(|(&(_, seq, _, _), tokens)| SeqWork {
                    seq,
                    tokens,
                    logits: LogitsFor::Last,
                    output: Output::Logits,
                    position_shift: 0,
                })
                .collect();
            if self.logits.len() < work.len() {
                self.logits.resize(work.len(), Vec::new());
            }
            let mut logits: Vec<&mut Vec<f32>> = self.logits.iter_mut().take(work.len()).collect();
            step_sequences(
                engine,
                &mut self.memory,
                &mut self.scratch,
                &work,
                &mut logits,
            )?;
            let mut still = Vec::with_capacity(live.len());
            for (k, &(i, seq, keep, room)) in live.iter().enumerate() {
                if !first {
                    let fed = *out[i].last().expect("drafted");
                    let held = &mut self.sequences.get_mut(&requests[i].id).expect("live").1;
                    held.push(fed);
                }
                let Some((token, dist)) = self.pick(k, requests[i].temperature) else {
                    continue;
                };
                out[i].push(token);
                dists[i].push(dist);
                if out[i].len() < room {
                    still.push((i, seq, keep, room));
                }
            }
            live = still;
            first = false;
        }
        Ok(())
    }

    /// The request's sequence, admitted now if it has none (`None` when every slot is
    /// taken).
    fn sequence(&mut self, id: u64, n_ctx: usize) -> Option<&mut (SeqId, Vec<TokenId>)> {
        if !self.sequences.contains_key(&id) {
            let admission = self.memory.admit(&[], n_ctx).ok()?;
            self.sequences.insert(id, (admission.seq, Vec::new()));
        }
        self.sequences.get_mut(&id)
    }

    /// The next token from the `k`-th logits row, or `None` when the draft's most likely
    /// token is less likely than `p_min` or outside the target's vocabulary.
    fn pick(&mut self, k: usize, temperature: f32) -> Option<(TokenId, DraftDistribution)> {
        let logits = &self.logits[k];
        let best = greedy_draft(logits, self.p_min, self.target_vocab)?;
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

/// A draft model running one sequence beside the target's (the CLI's).
pub struct ModelDrafter<'e> {
    engine: &'e dyn Engine,
    sequences: DraftSequences,
    /// What came before the generation's prompt (a conversation's earlier turns).
    context: Vec<TokenId>,
    params: DraftParams,
    proposed: Vec<Vec<TokenId>>,
    distributions: Vec<Vec<DraftDistribution>>,
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
        let n_ctx = engine.context_size();
        // One block of the whole context, as a single-sequence state has.
        let shape = MemoryShape {
            n_blocks: 1,
            block_tokens: n_ctx.max(1),
            max_sequences: 1,
            n_ctx,
            prefix_cache: false,
        };
        let sequences = DraftSequences::new(engine, shape, params.p_min, target_vocab, seed)?;
        Ok(ModelDrafter {
            engine,
            sequences,
            context: Vec::new(),
            params,
            proposed: Vec::new(),
            distributions: Vec::new(),
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
        let request = DraftRequest {
            id: 0,
            text,
            room: room.min(self.params.max),
            temperature,
        };
        self.sequences.propose(
            self.engine,
            std::slice::from_ref(&request),
            &mut self.proposed,
            &mut self.distributions,
        )?;
        out.clear();
        dists.clear();
        if self.proposed[0].len() >= self.params.min.max(1) {
            out.append(&mut self.proposed[0]);
            dists.append(&mut self.distributions[0]);
        }
        Ok(())
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
