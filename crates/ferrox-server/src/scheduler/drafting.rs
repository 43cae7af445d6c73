//! Planning drafts for speculation inside the batch: prompt lookup, a draft model or the
//! served model's multi-token-prediction block propose tokens that ride in the same engine
//! step as every other sequence's rows.

use ferrox_generate::generate::lookup_draft_ngram;

use super::batcher::{Batcher, Planned, Seq};
use super::Speculation;
use crate::draft::DraftRequest;

impl Seq<'_> {
    /// How many tokens this sequence may draft now: `max`, within its token limit and the
    /// context (so that every token a check may produce still fits).
    pub(super) fn draft_room(&self, max: usize, n_ctx: usize) -> usize {
        let generated = self.generation.generated();
        let by_limit = self
            .job
            .params
            .max_tokens
            .map_or(usize::MAX, |m| m.saturating_sub(generated + 1));
        let by_context = n_ctx.saturating_sub(self.job.prompt.len() + generated + 2);
        max.min(by_limit).min(by_context)
    }
}

impl<'t> Batcher<'t> {
    /// Adds prompt-lookup drafts to the decoding sequences of `plan` while the step has
    /// fewer than `max_rows` rows, the sequences that have had the most drafted tokens
    /// accepted first.
    pub(super) fn plan_drafts(
        &mut self,
        spec: Speculation,
        active: &mut [Seq<'t>],
        plan: &mut [Planned],
    ) {
        let mut rows: usize = plan.iter().map(|p| p.tokens).sum();
        if let Some(draft) = &mut self.draft {
            draft.retain(|id| active.iter().any(|s| s.id == id));
        }
        if rows >= spec.max_rows {
            return;
        }
        let n_ctx = self.pool.capacity_per_sequence();
        let mut order: Vec<usize> = (0..plan.len())
            .filter(|&i| active[plan[i].index].next.is_some())
            .collect();
        let rate = |s: &Seq<'_>| (s.accepted + 1) as f64 / (s.drafted + 1) as f64;
        order.sort_by(|&a, &b| {
            rate(&active[plan[b].index]).total_cmp(&rate(&active[plan[a].index]))
        });
        if self.draft.is_some() || spec.mtp {
            return self.plan_model_drafts(spec, active, plan, &order, rows);
        }
        let mut proposed = Vec::new();
        for i in order {
            let budget = spec.max_rows.saturating_sub(rows);
            if budget == 0 {
                break;
            }
            let s = &mut active[plan[i].index];
            let room = s.draft_room(spec.max, n_ctx).min(budget);
            if room == 0 {
                continue;
            }
            let Some(n) = lookup_draft_ngram(&s.history, room, &mut proposed) else {
                continue;
            };
            proposed.truncate(s.pacer.length(n, spec.max));
            if proposed.is_empty() {
                s.pacer.idle(n);
            }
            if proposed.len() < spec.min.max(1) {
                continue;
            }
            s.matched = n;
            s.checking.clear();
            s.checking.push(s.next.expect("a decoding sequence"));
            s.checking.extend_from_slice(&proposed);
            plan[i].tokens += proposed.len();
            rows += proposed.len();
        }
    }

    /// [`plan_drafts`](Self::plan_drafts) with the draft model (all sequences drafted
    /// together) or the served model's multi-token-prediction block (one after the other):
    /// the rows left in the step shared among the sequences in `order`, as long as each
    /// one's drafts have been kept (its pacer).
    fn plan_model_drafts(
        &mut self,
        spec: Speculation,
        active: &mut [Seq<'t>],
        plan: &mut [Planned],
        order: &[usize],
        rows: usize,
    ) {
        let n_ctx = self.pool.capacity_per_sequence();
        let with_model = self.draft.is_some();
        let mut chosen = Vec::new();
        let mut budget = spec.max_rows.saturating_sub(rows);
        for &i in order {
            let s = &mut active[plan[i].index];
            // A draft model reads the text only: a conversation with images is not drafted.
            if with_model && !s.job.images.is_empty() {
                continue;
            }
            let room = s.draft_room(spec.max, n_ctx).min(budget);
            // A draft model stops where it is unsure (`p_min`); the block's greedy drafts
            // have no such measure, so their length follows their acceptance.
            let room = match with_model {
                true => room,
                false => room.min(s.pacer.length(0, spec.max)),
            };
            if room == 0 {
                s.pacer.idle(0);
                continue;
            }
            budget -= room;
            chosen.push((i, room));
        }
        if chosen.is_empty() {
            return;
        }
        let requests: Vec<DraftRequest<'_>> = chosen
            .iter()
            .map(|&(i, room)| {
                let s = &active[plan[i].index];
                DraftRequest {
                    id: s.id,
                    text: &s.history,
                    room,
                    temperature: 0.0,
                }
            })
            .collect();
        let mut proposed = Vec::new();
        let drafted = match self.draft.as_mut() {
            Some(draft) => draft.propose(&requests, &mut proposed),
            None => {
                proposed.resize(chosen.len(), Vec::new());
                chosen
                    .iter()
                    .zip(proposed.iter_mut())
                    .try_for_each(|(&(i, room), out)| {
                        let s = &active[plan[i].index];
                        let next = s.next.expect("a decoding sequence");
                        self.pool.draft_mtp(&self.engine, s.slot, next, room, out)
                    })
            }
        };
        if let Err(e) = drafted {
            // Decoding goes on without drafts.
            tracing::warn!("drafting failed: {e}");
            return;
        }
        drop(requests);
        for (&(i, _), drafts) in chosen.iter().zip(&proposed) {
            if drafts.len() < spec.min.max(1) {
                continue;
            }
            let s = &mut active[plan[i].index];
            s.matched = 0;
            s.checking.clear();
            s.checking.push(s.next.expect("a decoding sequence"));
            s.checking.extend_from_slice(drafts);
            plan[i].tokens += drafts.len();
        }
    }
}
