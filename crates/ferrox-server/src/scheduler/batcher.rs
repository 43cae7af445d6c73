//! The scheduler thread: it owns the engine, the paged memory and the draft model, admits
//! queued jobs as memory allows, and runs one iteration ([`iteration`](super::iteration))
//! after another over the admitted sequences.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrox_generate::embedding::Pooler;
use ferrox_generate::generate::{DraftPacer, Generation};
use ferrox_models::AnyEngine;
use ferrox_tokenizer::tokenizer::{TokenId, Tokenizer};

use super::{lock, Event, Job, SchedulerOptions, Shared};
use crate::draft::DraftModel;
use crate::error::ApiError;
use crate::kv::{KvPool, Lease, Refusal, SlotId};
use crate::metrics::Metrics;

/// One admitted sequence.
pub(super) struct Seq<'t> {
    pub(super) job: Job,
    /// Unique among the sequences the scheduler ever ran.
    pub(super) id: u64,
    pub(super) slot: SlotId,
    pub(super) cached: usize,
    /// Prompt tokens in the cache.
    pub(super) fed: usize,
    pub(super) generation: Generation<'t>,
    /// The sampled token to feed at the next step.
    pub(super) next: Option<TokenId>,
    pub(super) last_token_at: Option<Instant>,
    /// The prompt and the generated tokens, for prompt lookup (empty without speculation).
    pub(super) history: Vec<TokenId>,
    /// This step's tokens while it checks a draft: `next`, then the drafted tokens.
    pub(super) checking: Vec<TokenId>,
    /// Tokens this sequence drafted and had accepted so far (drafting sequences with the
    /// best record go first when a step has little room).
    pub(super) drafted: usize,
    pub(super) accepted: usize,
    /// How long its drafts are, by their acceptance so far.
    pub(super) pacer: DraftPacer,
    /// The n-gram length of the match behind the draft being checked.
    pub(super) matched: usize,
    /// An embedding job's pooling of the rows computed so far (it samples nothing).
    pub(super) pooler: Option<Pooler>,
}

impl Seq<'_> {
    /// Frees the sequence's memory after it ended without finishing.
    pub(super) fn abort(self, pool: &mut KvPool, metrics: &Metrics) {
        self.job.aborted(metrics);
        pool.release(self.slot);
    }
}

/// The scheduler thread's state: the engine, its memory and the draft model, owned here
/// alone.
pub(super) struct Batcher<'t> {
    pub(super) engine: AnyEngine,
    pub(super) pool: KvPool,
    pub(super) tokenizer: &'t Tokenizer,
    pub(super) options: SchedulerOptions,
    pub(super) metrics: Arc<Metrics>,
    pub(super) shared: Arc<Shared>,
    pub(super) draft: Option<DraftModel>,
    /// Sequences admitted so far (each one's id).
    pub(super) admitted: u64,
}

/// One sequence's share of a step.
pub(super) struct Planned {
    pub(super) index: usize,
    pub(super) tokens: usize,
    pub(super) logits: bool,
    /// The rows' embeddings are wanted (an embedding job).
    pub(super) embeddings: bool,
    /// The rows are (the rest of) the job's image of this index: its rows stand in for
    /// the tokens' embeddings.
    pub(super) image: Option<usize>,
}

/// What a prefilling sequence may feed next from position `fed`: the rest of the image
/// covering `fed` (which must go in one step, whole), or text up to the next image.
pub(super) fn next_prompt_piece(
    images: &[ferrox_generate::media::PlacedImage],
    fed: usize,
    prompt_len: usize,
) -> (usize, Option<usize>) {
    for (k, p) in images.iter().enumerate() {
        let end = p.start + p.image.n_tokens;
        if (p.start..end).contains(&fed) {
            return (end - fed, Some(k));
        }
        if p.start > fed {
            return (p.start - fed, None);
        }
    }
    (prompt_len - fed, None)
}

/// Removes the queued jobs whose client went away.
pub(super) fn drop_abandoned(jobs: &mut VecDeque<Job>, metrics: &Metrics) {
    jobs.retain(|job| {
        if !job.events.is_closed() {
            return true;
        }
        tracing::debug!(parent: &job.span, "client went away while queued");
        job.aborted(metrics);
        metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        false
    });
}

/// The most positions a job's sequence can reach: its prompt plus its token limit (the
/// pool caps it at the context size); an embedding job's prompt alone.
fn max_len(job: &Job) -> usize {
    if job.embed.is_some() {
        return job.prompt.len();
    }
    job.prompt
        .len()
        .saturating_add(job.params.max_tokens.unwrap_or(usize::MAX))
}

pub(super) fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("unknown cause")
}

pub(super) fn shutting_down() -> ApiError {
    ApiError::unavailable("shutting_down", "the server is shutting down")
}

impl<'t> Batcher<'t> {
    /// Runs until the scheduler stops: waits for work, admits what fits, runs one
    /// iteration over every active sequence.
    pub(super) fn run(&mut self) {
        let mut active: Vec<Seq<'t>> = Vec::new();
        self.publish_memory_size();
        let shared = self.shared.clone();
        loop {
            if self.wait_for_work(&shared, &mut active).is_break() {
                return;
            }
            self.drop_cancelled(&mut active);
            if !active.is_empty() {
                // A fault in one iteration fails the sequences it ran, never the server.
                if let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.iterate(&mut active))) {
                    let message = format!("the scheduler step panicked: {}", panic_text(&*panic));
                    tracing::error!("{message}");
                    self.cancel_all(&mut active, ApiError::internal(message));
                }
            }
            self.publish_occupancy(active.len());
        }
    }

    fn publish_memory_size(&self) {
        let m = &self.metrics;
        m.set_weight_memory(ferrox_models::Engine::weight_memory(&self.engine));
        m.kv_blocks_total
            .store(self.pool.n_blocks() as u64, Ordering::Relaxed);
        m.kv_block_tokens
            .store(self.pool.block_tokens() as u64, Ordering::Relaxed);
        m.kv_bytes
            .store(self.pool.reserved_bytes() as u64, Ordering::Relaxed);
        m.kv_bytes_per_position
            .store(self.pool.bytes_per_position().to_bits(), Ordering::Relaxed);
    }

    /// Blocks until there is something to run, handling shutdown on the way (`Break`: the
    /// scheduler stops), then admits the waiting jobs that fit.
    fn wait_for_work(&mut self, shared: &Shared, active: &mut Vec<Seq<'t>>) -> ControlFlow<()> {
        let mut q = lock(shared);
        loop {
            if q.stop {
                let jobs: Vec<Job> = q.jobs.drain(..).collect();
                drop(q);
                for job in jobs {
                    job.aborted(&self.metrics);
                    let _ = job.send(Event::Failed(shutting_down()));
                }
                self.cancel_all(active, shutting_down());
                return ControlFlow::Break(());
            }
            if q.deadline.is_some_and(|d| Instant::now() >= d) {
                for job in q.jobs.drain(..) {
                    job.aborted(&self.metrics);
                    let _ = job.send(Event::Failed(shutting_down()));
                }
                self.cancel_all(active, shutting_down());
            }
            if !active.is_empty() || !q.jobs.is_empty() {
                break;
            }
            q = shared
                .wake
                .wait_timeout(q, Duration::from_millis(250))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        // Wherever they wait, jobs whose client left go at once (they would hold queue
        // places until they reached the front).
        drop_abandoned(&mut q.jobs, &self.metrics);
        self.admit_waiting(&mut q.jobs, active);
        self.metrics
            .queue_depth
            .store(q.jobs.len() as u64, Ordering::Relaxed);
        ControlFlow::Continue(())
    }

    /// First come, first served: a request waiting for memory holds back those behind it,
    /// so a large one is not starved by a stream of small ones.
    fn admit_waiting(&mut self, jobs: &mut VecDeque<Job>, active: &mut Vec<Seq<'t>>) {
        while let Some(job) = jobs.front() {
            // A prompt being prefilled right now (another choice of the same request,
            // usually) is worth waiting for: once its blocks are cached, this one reuses
            // them instead of computing them again.
            let sibling_prefilling = active.iter().any(|s| {
                s.fed < s.job.prompt.len()
                    && s.job.prompt == job.prompt
                    && s.job.cache_salt == job.cache_salt
            });
            if sibling_prefilling {
                break;
            }
            // Pooling needs every position's row: an embedding job reuses no cached prefix.
            let lookup = match job.embed {
                Some(_) => &[][..],
                None => &job.prompt[..],
            };
            match self
                .pool
                .acquire(lookup, max_len(job), job.cache_salt.as_deref())
            {
                Err(Refusal::Busy) => break,
                Err(Refusal::TooLarge { needed, capacity }) => {
                    let job = jobs.pop_front().expect("the front job");
                    let _ = job.send(Event::Failed(ApiError::invalid(format!(
                        "this request may need {needed} KV positions (prompt plus max_tokens); the server's KV memory holds {capacity}"
                    ))));
                }
                Ok(lease) => {
                    let job = jobs.pop_front().expect("the front job");
                    self.admit(job, lease, active);
                }
            }
        }
    }

    /// Starts a job on the KV memory `lease` the pool gave it.
    fn admit(&mut self, job: Job, lease: Lease, active: &mut Vec<Seq<'t>>) {
        self.metrics.observe_queue_time(job.submitted.elapsed());
        self.metrics
            .prompt_tokens
            .fetch_add(job.prompt.len() as u64, Ordering::Relaxed);
        self.metrics
            .prefix_hit_tokens
            .fetch_add(lease.reused as u64, Ordering::Relaxed);
        tracing::debug!(
            parent: &job.span,
            slot = lease.slot.index(),
            prompt = job.prompt.len(),
            reused = lease.reused,
            "sequence admitted"
        );
        let _ = job.send(Event::Started {
            cached_tokens: lease.reused,
        });
        let generation = Generation::new(self.tokenizer, job.params.clone(), &job.prompt);
        let history = match self.options.speculation {
            Some(_) if job.embed.is_none() => job.prompt.clone(),
            _ => Vec::new(),
        };
        let pooler = job.embed.map(|pooling| Pooler::new(pooling, &self.engine));
        self.admitted += 1;
        active.push(Seq {
            id: self.admitted,
            slot: lease.slot,
            cached: lease.reused,
            fed: lease.reused,
            generation,
            next: None,
            last_token_at: None,
            history,
            checking: Vec::new(),
            drafted: 0,
            accepted: 0,
            pacer: DraftPacer::default(),
            matched: 0,
            pooler,
            job,
        });
    }

    fn drop_cancelled(&mut self, active: &mut Vec<Seq<'t>>) {
        let pool = &mut self.pool;
        let metrics = &self.metrics;
        active.retain(|s| {
            if s.job.events.is_closed() {
                tracing::debug!(
                    parent: &s.job.span,
                    slot = s.slot.index(),
                    "client went away; sequence cancelled"
                );
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                s.job.aborted(metrics);
                pool.release(s.slot);
                false
            } else {
                true
            }
        });
    }

    pub(super) fn cancel_all(&mut self, active: &mut Vec<Seq<'t>>, error: ApiError) {
        for s in active.drain(..) {
            let _ = s.job.send(Event::Failed(error.clone()));
            s.abort(&mut self.pool, &self.metrics);
        }
    }

    pub(super) fn publish_occupancy(&self, active: usize) {
        self.metrics.set_kv_usage(self.pool.usage());
        self.metrics
            .set_weight_memory(ferrox_models::Engine::weight_memory(&self.engine));
        self.metrics
            .active_sequences
            .store(active as u64, Ordering::Relaxed);
    }
}
