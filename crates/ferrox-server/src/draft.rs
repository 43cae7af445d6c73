//! A draft model beside the served one (`--model-draft`): a smaller model with the same
//! vocabulary proposes each drafting sequence's next tokens, greedily, and the served model
//! checks them inside its batch as it checks prompt-lookup drafts.
//!
//! The draft keeps its own sequence memory, one sequence per drafting request, holding the
//! request's text up to its last token; what the served model rejected is rolled back there
//! at the next proposal (the longest prefix its memory shares with the text is kept; a
//! recurrent state that cannot roll back that far starts again from the whole text). All
//! drafting sequences of a step go through the draft model together: one step for what each
//! has to catch up on, then one step per drafted token.

use std::collections::HashMap;

use ferrox_core::{MemoryShape, SeqId, SequenceMemory};
use ferrox_generate::draft_model::greedy_draft;
use ferrox_models::StepScratch;
use ferrox_models::{step_sequences, AnyEngine, Engine, EngineError, LogitsFor, SeqWork};
use ferrox_tokenizer::tokenizer::TokenId;

/// Positions per block of the draft's memory.
const BLOCK_TOKENS: usize = 16;

/// One request's drafting: its id, its whole text (prompt, then every generated token, the
/// last of them not yet fed) and how many tokens it may draft.
pub struct DraftRequest<'a> {
    pub id: u64,
    pub text: &'a [TokenId],
    pub room: usize,
}

/// The draft model and its sequences.
pub struct DraftModel {
    engine: AnyEngine,
    memory: SequenceMemory,
    scratch: StepScratch,
    /// Drafting stops at a token the draft gives less than this probability.
    p_min: f32,
    /// Drafted tokens must be below this (the served model's vocabulary size).
    target_vocab: usize,
    /// Each drafting request's sequence and the tokens its memory holds.
    sequences: HashMap<u64, (SeqId, Vec<TokenId>)>,
    logits: Vec<Vec<f32>>,
}

impl DraftModel {
    /// Memory for `max_sequences` sequences of the draft's whole context.
    pub fn new(
        engine: AnyEngine,
        max_sequences: usize,
        p_min: f32,
        target_vocab: usize,
    ) -> Result<DraftModel, EngineError> {
        let n_ctx = engine.context_size();
        let memory = SequenceMemory::new(
            engine.memory_spec(),
            MemoryShape {
                n_blocks: max_sequences * n_ctx.div_ceil(BLOCK_TOKENS),
                block_tokens: BLOCK_TOKENS,
                max_sequences,
                n_ctx,
                prefix_cache: false,
            },
        )?;
        Ok(DraftModel {
            scratch: engine.new_scratch(),
            engine,
            memory,
            p_min,
            target_vocab,
            sequences: HashMap::new(),
            logits: Vec::new(),
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

    /// Each request's drafted tokens into `out` (one list per request, in order; empty for
    /// a request the draft cannot serve now).
    pub fn propose(
        &mut self,
        requests: &[DraftRequest<'_>],
        out: &mut Vec<Vec<TokenId>>,
    ) -> Result<(), EngineError> {
        out.clear();
        out.resize(requests.len(), Vec::new());
        let n_ctx = self.engine.context_size();
        let n_vocab = self.engine.vocab_size();
        // (request, sequence, tokens to feed first)
        let mut live: Vec<(usize, SeqId, usize)> = Vec::new();
        for (i, r) in requests.iter().enumerate() {
            let readable = r.text.iter().all(|&t| (t as usize) < n_vocab);
            if r.room == 0 || r.text.is_empty() || r.text.len() + r.room > n_ctx || !readable {
                continue;
            }
            let Some((seq, held)) = self.sequence(r.id) else {
                continue;
            };
            let mut keep = held
                .iter()
                .zip(r.text)
                .take_while(|(a, b)| a == b)
                .count()
                .min(r.text.len() - 1);
            let mut seq = *seq;
            if keep < self.memory.len(seq) && self.memory.rollback(seq, keep).is_err() {
                // A recurrent state with no checkpoint there: the sequence starts afresh
                // and is fed the whole text again.
                self.memory.release(seq);
                self.sequences.remove(&r.id);
                let Some((fresh, _)) = self.sequence(r.id) else {
                    continue;
                };
                seq = *fresh;
                keep = 0;
            }
            let held = &mut self.sequences.get_mut(&r.id).expect("just found").1;
            held.truncate(keep);
            held.extend_from_slice(&r.text[keep..]);
            live.push((i, seq, keep));
        }
        // The text each sequence lacks, then one drafted token per step.
        let mut first = true;
        while !live.is_empty() {
            let feeds: Vec<&[TokenId]> = live
                .iter()
                .map(|&(i, _, keep)| match first {
                    true => &requests[i].text[keep..],
                    false => std::slice::from_ref(out[i].last().expect("drafted")),
                })
                .collect();
            let work: Vec<SeqWork<'_>> = live
                .iter()
                .zip(&feeds)
                .map(|(&(_, seq, _), tokens)| SeqWork {
                    seq,
                    tokens,
                    logits: LogitsFor::Last,
                })
                .collect();
            if self.logits.len() < work.len() {
                self.logits.resize(work.len(), Vec::new());
            }
            let mut logits: Vec<&mut Vec<f32>> = self.logits.iter_mut().take(work.len()).collect();
            step_sequences(
                &self.engine,
                &mut self.memory,
                &mut self.scratch,
                &work,
                &mut logits,
            )?;
            let mut still = Vec::with_capacity(live.len());
            for (k, &(i, seq, keep)) in live.iter().enumerate() {
                if !first {
                    let fed = *out[i].last().expect("drafted");
                    let held = &mut self.sequences.get_mut(&requests[i].id).expect("live").1;
                    held.push(fed);
                }
                let Some(token) = greedy_draft(&self.logits[k], self.p_min, self.target_vocab)
                else {
                    continue;
                };
                out[i].push(token);
                if out[i].len() < requests[i].room {
                    still.push((i, seq, keep));
                }
            }
            live = still;
            first = false;
        }
        Ok(())
    }

    /// The request's sequence, admitted now if it has none (`None` when every slot is
    /// taken).
    fn sequence(&mut self, id: u64) -> Option<&mut (SeqId, Vec<TokenId>)> {
        if !self.sequences.contains_key(&id) {
            let n_ctx = self.engine.context_size();
            let admission = self.memory.admit(&[], n_ctx).ok()?;
            self.sequences.insert(id, (admission.seq, Vec::new()));
        }
        self.sequences.get_mut(&id)
    }
}
