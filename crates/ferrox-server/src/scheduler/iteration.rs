//! One scheduler iteration, phase by phase: plan the rows (a token per decoding sequence,
//! prompt chunks, drafts), run them through the engine in one step while constraint masks
//! are computed beside it, sample, settle the drafts (accept or roll back), emit the
//! tokens, and retire the sequences that ended.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::time::Instant;

use ferrox_generate::generate::{FinishReason, Sampled, TokenConstraint};
use ferrox_generate::media::position_shift_at;
use ferrox_models::Engine;
use rayon::prelude::*;

use super::batcher::next_prompt_piece;
use super::batcher::{panic_text, Batcher, Planned, Seq};
use super::{Event, Summary, TokenEvent};
use crate::error::ApiError;
use crate::kv::{KvPool, Work};
use ferrox_models::engine::InputEmbeddings;

/// What the sampling phase produced: each sampled sequence's index in `active` and its
/// tokens (one, or several when it checked a draft).
type SampledRows = Vec<(usize, Vec<Sampled>)>;

/// The sequences an iteration ends, by index in `active`.
#[derive(Default)]
struct Ending {
    indices: Vec<usize>,
    /// Those that finished (rather than failed or lost their client), with what to tell.
    summaries: Vec<(usize, Summary)>,
}

impl Ending {
    fn contains(&self, index: usize) -> bool {
        self.indices.contains(&index)
    }
}

/// Samples a sequence's rows of a step in order: one row, or, when the step checked a draft,
/// the row of each drafted token until a sampled token differs from the drafted one (its
/// successors were computed after a wrong token) or the generation ends.
fn sample_rows(s: &mut Seq<'_>, logits: &[f32], n_vocab: usize) -> Vec<Sampled> {
    if s.checking.is_empty() {
        return vec![s.generation.sample(logits)];
    }
    let drafted = &s.checking[1..];
    let mut rows = Vec::with_capacity(s.checking.len());
    for (j, row) in logits.chunks_exact(n_vocab).enumerate() {
        let sampled = s.generation.sample(row);
        let ends = sampled.finish.is_some() || drafted.get(j).is_none_or(|&t| t != sampled.token);
        rows.push(sampled);
        if ends {
            break;
        }
    }
    rows
}

impl<'t> Batcher<'t> {
    /// One iteration over every active sequence.
    pub(super) fn iterate(&mut self, active: &mut Vec<Seq<'t>>) {
        let mut plan = self.plan_rows(active);
        if let Some(spec) = self.options.speculation {
            self.plan_drafts(spec, active, &mut plan);
        }
        if let Err(message) = self.forward(active, &plan) {
            self.fail_planned(active, &plan, message);
            return;
        }
        let sampled = self.sample(active, &plan);
        let mut ending = Ending::default();
        self.pool_embeddings(active, &plan, &mut ending);
        let tokens = self.settle_drafts(active, sampled, &mut ending);
        self.emit(active, tokens, &mut ending);
        self.retire(active, ending);
    }

    /// The step's rows: the next token of every decoding sequence, then prompt chunks of
    /// those still prefilling, in order, within the prefill budget.
    fn plan_rows(&self, active: &[Seq<'t>]) -> Vec<Planned> {
        let decoding = active.iter().any(|s| s.next.is_some());
        let encoder = self.engine.is_encoder();
        let mut budget = if decoding {
            self.options.prefill_chunk
        } else {
            self.options.prefill_chunk_idle
        }
        .max(1);
        let mut plan = Vec::with_capacity(active.len());
        for (index, s) in active.iter().enumerate() {
            if s.next.is_some() {
                plan.push(Planned {
                    index,
                    tokens: 1,
                    logits: true,
                    embeddings: false,
                    image: None,
                });
                continue;
            }
            let rest = s.job.prompt.len() - s.fed;
            let (piece, image) = next_prompt_piece(&s.job.images, s.fed, s.job.prompt.len());
            // An image goes in whole, in a step of its own rows (its tokens may attend to
            // each other both ways); text stops where the next image starts.
            let mut take = match image {
                Some(_) => piece,
                None => piece.min(budget),
            };
            // An encoder takes each sequence whole: the first in a step whatever its length,
            // the others while they fit the budget.
            if encoder && take < rest {
                take = if plan.is_empty() { rest } else { 0 };
            }
            if take > 0 {
                budget = budget.saturating_sub(take);
                let embeddings = s.pooler.is_some();
                plan.push(Planned {
                    index,
                    tokens: take,
                    logits: !embeddings && s.fed + take == s.job.prompt.len(),
                    embeddings,
                    image,
                });
            }
        }
        plan
    }

    /// Runs the planned rows through the engine in one step. Constrained sequences that
    /// get logits have their next masks computed on another thread meanwhile (a mask
    /// depends only on the tokens accepted so far, not on the logits). `Err`: why the
    /// step failed.
    fn forward(&mut self, active: &mut [Seq<'t>], plan: &[Planned]) -> Result<(), String> {
        let mut masks: Vec<(usize, Box<dyn TokenConstraint>)> = plan
            .iter()
            .filter(|p| p.logits)
            .filter_map(|p| {
                active[p.index]
                    .generation
                    .take_constraint()
                    .map(|c| (p.index, c))
            })
            .collect();
        let work: Vec<Work<'_>> = plan
            .iter()
            .map(|p| {
                let s = &active[p.index];
                let tokens = match &s.next {
                    Some(_) if !s.checking.is_empty() => &s.checking[..],
                    Some(t) => std::slice::from_ref(t),
                    None => &s.job.prompt[s.fed..s.fed + p.tokens],
                };
                let given = p.image.map(|k| {
                    let placed = &s.job.images[k];
                    let width = placed.image.rows.len() / placed.image.n_tokens.max(1);
                    let from = (s.fed - placed.start) * width;
                    InputEmbeddings {
                        rows: &placed.image.rows[from..from + p.tokens * width],
                        bidirectional: placed.image.bidirectional,
                        grid: placed.image.grid,
                        grid_first: s.fed - placed.start,
                    }
                });
                // Images are all in the prompt: a decoding step follows every one.
                let at = match s.next {
                    Some(_) => usize::MAX,
                    None => s.fed,
                };
                Work {
                    slot: s.slot,
                    tokens,
                    logits: p.logits,
                    embeddings: p.embeddings,
                    given,
                    position_shift: position_shift_at(&s.job.images, at),
                }
            })
            .collect();
        let check: Vec<bool> = plan
            .iter()
            .map(|p| !active[p.index].checking.is_empty())
            .collect();
        let (pool, engine) = (&mut self.pool, &self.engine);
        let forward = |pool: &mut KvPool| pool.forward_checking(engine, &work, &check);
        let result = if masks.is_empty() {
            catch_unwind(AssertUnwindSafe(|| forward(pool)))
        } else {
            std::thread::scope(|scope| {
                let masking = scope.spawn(|| {
                    for (_, c) in masks.iter_mut() {
                        c.prepare();
                    }
                });
                let result = catch_unwind(AssertUnwindSafe(|| forward(pool)));
                // A panic there leaves the masks to be computed (or fail) at sampling.
                let _ = masking.join();
                result
            })
        };
        drop(work);
        for (index, c) in masks {
            active[index].generation.restore_constraint(c);
        }
        self.metrics.steps.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("the forward step failed: {e}")),
            Err(panic) => Err(format!(
                "the forward step panicked: {}",
                panic_text(&*panic)
            )),
        }
    }

    /// Fails every sequence the step ran (their memory may be half written); the others
    /// go on.
    fn fail_planned(&mut self, active: &mut Vec<Seq<'t>>, plan: &[Planned], message: String) {
        tracing::error!("{message}");
        let error = ApiError::internal(message);
        let mut failed: Vec<usize> = plan.iter().map(|p| p.index).collect();
        failed.sort_unstable();
        for &i in failed.iter().rev() {
            let s = active.remove(i);
            let _ = s.job.send(Event::Failed(error.clone()));
            s.abort(&mut self.pool, &self.metrics);
        }
    }

    /// Advances each sequence past the rows it fed, then samples those that got logits,
    /// spread over the cores (sampling and logprobs cost O(vocab) per sequence).
    fn sample(&mut self, active: &mut [Seq<'t>], plan: &[Planned]) -> SampledRows {
        let mut sampling = vec![false; active.len()];
        for p in plan {
            let s = &mut active[p.index];
            if s.next.take().is_none() {
                s.fed += p.tokens;
            }
            sampling[p.index] = p.logits;
        }
        let pool = &self.pool;
        let n_vocab = self.engine.vocab_size();
        let mut picked: Vec<(usize, &mut Seq<'t>)> = active
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| sampling[*i])
            .collect();
        let sample = |s: &mut Seq<'t>| sample_rows(s, pool.logits(s.slot), n_vocab);
        if picked.len() > 1 {
            picked
                .par_iter_mut()
                .map(|(i, s)| (*i, sample(s)))
                .collect()
        } else {
            picked.iter_mut().map(|(i, s)| (*i, sample(s))).collect()
        }
    }

    /// Pools the rows of the embedding jobs the step ran; those whose prompt is all in send
    /// their embedding and end.
    fn pool_embeddings(&mut self, active: &mut [Seq<'t>], plan: &[Planned], ending: &mut Ending) {
        let now = Instant::now();
        for p in plan.iter().filter(|p| p.embeddings) {
            let s = &mut active[p.index];
            let Some(pooler) = s.pooler.as_mut() else {
                continue;
            };
            pooler.push(self.pool.logits(s.slot));
            if s.fed < s.job.prompt.len() {
                continue;
            }
            let Some(pooler) = s.pooler.take() else {
                continue;
            };
            let pooled = match pooler.finish(&self.engine) {
                Ok(pooled) => pooled,
                Err(e) => {
                    let message = format!("embedding failed: {e}");
                    tracing::error!(parent: &s.job.span, "{message}");
                    let _ = s.job.send(Event::Failed(ApiError::internal(message)));
                    s.job.aborted(&self.metrics);
                    ending.indices.push(p.index);
                    continue;
                }
            };
            if s.job.send(Event::Embedding(pooled)).is_err() {
                self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                s.job.aborted(&self.metrics);
                ending.indices.push(p.index);
                continue;
            }
            let summary = self.finished(s, FinishReason::Stop, now);
            ending.summaries.push((p.index, summary));
            ending.indices.push(p.index);
        }
    }

    /// For each sequence that checked a draft: counts what was accepted and rolls its
    /// memory back to the last accepted token. Returns every sampled token in order; a
    /// sequence whose rollback failed is told and ends.
    fn settle_drafts(
        &mut self,
        active: &mut [Seq<'t>],
        sampled: SampledRows,
        ending: &mut Ending,
    ) -> Vec<(usize, Sampled)> {
        let mut tokens = Vec::with_capacity(sampled.len());
        for (index, rows) in sampled {
            let s = &mut active[index];
            if !s.checking.is_empty() {
                // Keep the positions of `next` and of the drafted tokens that were accepted.
                let drafted = s.checking.len() - 1;
                let accepted = rows
                    .iter()
                    .zip(&s.checking[1..])
                    .take_while(|(row, &t)| row.token == t)
                    .count();
                s.drafted += drafted;
                s.accepted += accepted;
                s.pacer.record(s.matched, drafted, accepted);
                self.metrics.spec_drafts.fetch_add(1, Ordering::Relaxed);
                self.metrics
                    .spec_draft_tokens
                    .fetch_add(drafted as u64, Ordering::Relaxed);
                self.metrics
                    .spec_accepted_tokens
                    .fetch_add(accepted as u64, Ordering::Relaxed);
                let keep = self.pool.len(s.slot) - drafted + (rows.len() - 1);
                let ends = rows.last().is_some_and(|r| r.finish.is_some());
                s.checking.clear();
                if !ends {
                    if let Err(e) = self.pool.rollback(s.slot, keep) {
                        let message = format!("rolling back a draft failed: {e}");
                        tracing::error!(parent: &s.job.span, "{message}");
                        let _ = s.job.send(Event::Failed(ApiError::internal(message)));
                        s.job.aborted(&self.metrics);
                        ending.indices.push(index);
                        continue;
                    }
                }
            }
            tokens.extend(rows.into_iter().map(|row| (index, row)));
        }
        tokens
    }

    /// Sends each token to its request and records the timings; a sequence that finished,
    /// or whose client went away, ends.
    fn emit(&mut self, active: &mut [Seq<'t>], tokens: Vec<(usize, Sampled)>, ending: &mut Ending) {
        let n_ctx = self.pool.capacity_per_sequence();
        // One time for the iteration's tokens: those a sequence checked together arrive
        // together.
        let now = Instant::now();
        for (index, sampled) in tokens {
            if ending.contains(index) {
                continue;
            }
            let s = &mut active[index];
            self.metrics
                .generated_tokens
                .fetch_add(1, Ordering::Relaxed);
            match s.last_token_at {
                None => self.metrics.observe_ttft(now - s.job.submitted),
                // Tokens checked together: one gap, before the first of them.
                Some(t) if t != now => self.metrics.observe_itl(now - t),
                Some(_) => {}
            }
            s.last_token_at = Some(now);
            if self.options.speculation.is_some() {
                s.history.push(sampled.token);
            }
            let mut text = sampled.text;
            let mut finish = sampled.finish;
            // Prompt and completion together never exceed the context (the last sampled
            // token needs no position, but max_tokens is checked the same way).
            if finish.is_none() && s.job.prompt.len() + s.generation.generated() >= n_ctx {
                text.push_str(&s.generation.end_for_length());
                finish = Some(FinishReason::Length);
            }
            let event = Event::Token(TokenEvent {
                token: sampled.token,
                text,
                logprob: sampled.logprob,
                top_logprobs: sampled.top_logprobs,
                eog: self.tokenizer.vocab().is_eog(sampled.token),
            });
            let delivered = s.job.send(event).is_ok();
            match finish {
                Some(finish) => {
                    let summary = self.finished(s, finish, now);
                    ending.summaries.push((index, summary));
                    ending.indices.push(index);
                }
                None if !delivered => {
                    tracing::debug!(
                        parent: &s.job.span,
                        slot = s.slot.index(),
                        "client went away; sequence cancelled"
                    );
                    self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                    s.job.aborted(&self.metrics);
                    ending.indices.push(index);
                }
                None => s.next = Some(sampled.token),
            }
        }
    }

    /// Records a finished sequence and says what its request is told.
    fn finished(&self, s: &Seq<'t>, finish: FinishReason, now: Instant) -> Summary {
        let e2e = now - s.job.submitted;
        self.metrics.observe_finished(finish.into(), e2e);
        tracing::info!(
            parent: &s.job.span,
            choice = s.job.choice,
            prompt_tokens = s.job.prompt.len(),
            cached_tokens = s.cached,
            completion_tokens = s.generation.generated(),
            finish = finish.as_str(),
            e2e_ms = e2e.as_millis() as u64,
            "sequence finished"
        );
        Summary {
            finish,
            stop: s.generation.stopped_by().map(str::to_string),
            prompt_tokens: s.job.prompt.len(),
            completion_tokens: s.generation.generated(),
            cached_tokens: s.cached,
        }
    }

    /// Frees the ended sequences' memory, publishes the gauges, then tells the finished
    /// ones: a client that saw its reply end and then reads `/metrics` sees its memory free
    /// and its sequence gone.
    fn retire(&mut self, active: &mut Vec<Seq<'t>>, mut ending: Ending) {
        ending.indices.sort_unstable();
        let mut ended = Vec::with_capacity(ending.indices.len());
        for &i in ending.indices.iter().rev() {
            let s = active.remove(i);
            self.pool.release(s.slot);
            ended.push((i, s.job));
        }
        self.publish_occupancy(active.len());
        for (i, job) in ended {
            if let Some(at) = ending.summaries.iter().position(|(index, _)| *index == i) {
                let (_, summary) = ending.summaries.swap_remove(at);
                let _ = job.send(Event::Done(summary));
            }
        }
    }
}
