//! Continuous batching: one thread owns the engine (any architecture) and, step after step,
//! advances every active sequence together in one engine step: the next token of each
//! decoding sequence plus a bounded chunk of prompt tokens of those still prefilling, so
//! streams keep flowing while a long prompt is read. New requests join between steps from a
//! bounded queue; a sequence whose client went away (its event receiver dropped) is cancelled
//! at the next step and its slot freed.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferrox_generate::generate::{
    lookup_draft_ngram, DraftPacer, FinishReason, Generation, GenerationParams, Step,
    TokenConstraint,
};
use ferrox_models::{AnyEngine, Engine};
use ferrox_tokenizer::tokenizer::{TokenId, Tokenizer};
use rayon::prelude::*;
use tokio::sync::mpsc::error::SendError;
use tokio::sync::mpsc::UnboundedSender;

use crate::draft::{DraftModel, DraftRequest};
use crate::error::ApiError;
use crate::kv::{KvPool, Lease, Refusal, SlotId, Work};
use crate::metrics::{Finished, Metrics};

/// A request waiting for, or holding, a slot.
pub struct Job {
    pub prompt: Vec<TokenId>,
    pub params: GenerationParams,
    /// Which choice of its request this job generates (`n` > 1 shares one channel).
    pub choice: usize,
    /// The prefix cache's namespace (vLLM's `cache_salt`; `None`: the shared one).
    pub cache_salt: Option<String>,
    pub events: UnboundedSender<(usize, Event)>,
    /// When the request reached the scheduler: queue time, TTFT and end-to-end latency
    /// count from here.
    pub submitted: Instant,
    /// The request's span (its `request_id`): what the scheduler logs about this job is
    /// logged inside it.
    pub span: tracing::Span,
}

impl Job {
    /// Tells the request's handler; fails once it has gone away.
    fn send(&self, event: Event) -> Result<(), SendError<(usize, Event)>> {
        self.events.send((self.choice, event))
    }

    /// Counts the job as ended without finishing (cancelled, refused at shutdown, failed).
    fn aborted(&self, metrics: &Metrics) {
        metrics.observe_finished(Finished::Abort, self.submitted.elapsed());
    }
}

/// What the scheduler tells a request's handler.
#[derive(Debug)]
pub enum Event {
    /// The request got a slot; `cached_tokens` of its prompt were already in the cache.
    Started {
        cached_tokens: usize,
    },
    Token(TokenEvent),
    Done(Summary),
    Failed(ApiError),
}

#[derive(Debug)]
pub struct TokenEvent {
    pub token: TokenId,
    /// Text released by this token (may be empty while held back).
    pub text: String,
    pub logprob: Option<f32>,
    pub top_logprobs: Vec<(TokenId, f32)>,
    /// An end-of-generation token (not part of the content).
    pub eog: bool,
}

#[derive(Clone, Debug)]
pub struct Summary {
    pub finish: FinishReason,
    /// The stop string that ended the sequence, if one did.
    pub stop: Option<String>,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
}

#[derive(Debug)]
pub enum SubmitError {
    QueueFull,
    ShuttingDown,
}

/// Scheduling knobs.
#[derive(Clone, Debug)]
pub struct SchedulerOptions {
    /// Waiting requests beyond which new ones are refused.
    pub max_queue: usize,
    /// Prompt tokens per step while other sequences are decoding.
    pub prefill_chunk: usize,
    /// Prompt tokens per step when nothing is decoding.
    pub prefill_chunk_idle: usize,
    /// Prompt-lookup speculation per sequence, if on.
    pub speculation: Option<Speculation>,
}

/// Speculation inside the batch: a decoding sequence's drafted tokens (from prompt lookup,
/// or from a draft model when the scheduler has one) ride in the same step as the other
/// sequences' tokens, each checked by sampling its row exactly as a plain step would (the
/// output is what it would be without), the rejected ones rolled back in the paged memory.
#[derive(Clone, Copy, Debug)]
pub struct Speculation {
    /// Most tokens drafted per sequence and step.
    pub max: usize,
    /// A draft model stops proposing at a token it gives less than this probability.
    pub p_min: f32,
    /// Draft with the served model's multi-token-prediction block (it must have one).
    pub mtp: bool,
    /// Fewer proposed tokens than this are not checked.
    pub min: usize,
    /// Drafted tokens join a step only while it has fewer rows than this: a large batch
    /// already keeps the cores busy, and extra rows would slow every sequence in it.
    pub max_rows: usize,
}

struct QueueState {
    jobs: VecDeque<Job>,
    accepting: bool,
    /// After this instant, whatever is still running is cancelled (shutdown).
    deadline: Option<Instant>,
    stop: bool,
}

struct Shared {
    queue: Mutex<QueueState>,
    wake: Condvar,
}

fn lock(shared: &Shared) -> MutexGuard<'_, QueueState> {
    shared.queue.lock().unwrap_or_else(|e| e.into_inner())
}

/// The handle the HTTP side holds.
pub struct Scheduler {
    shared: Arc<Shared>,
    max_queue: usize,
    metrics: Arc<Metrics>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Scheduler {
    /// Starts the scheduler thread, which owns `engine`, `pool` and the draft model, if any
    /// (it drafts when `options.speculation` is on).
    pub fn start(
        engine: AnyEngine,
        pool: KvPool,
        tokenizer: Arc<Tokenizer>,
        options: SchedulerOptions,
        metrics: Arc<Metrics>,
        draft: Option<DraftModel>,
    ) -> Scheduler {
        let shared = Arc::new(Shared {
            queue: Mutex::new(QueueState {
                jobs: VecDeque::new(),
                accepting: true,
                deadline: None,
                stop: false,
            }),
            wake: Condvar::new(),
        });
        let max_queue = options.max_queue;
        let thread = {
            let shared = shared.clone();
            let metrics = metrics.clone();
            std::thread::Builder::new()
                .name("ferrox-scheduler".into())
                .spawn(move || {
                    let mut looper = Loop {
                        engine,
                        pool,
                        tokenizer: &tokenizer,
                        options,
                        metrics,
                        shared,
                        draft,
                        admitted: 0,
                    };
                    looper.run();
                })
                .expect("start the scheduler thread")
        };
        Scheduler {
            shared,
            max_queue,
            metrics,
            thread: Mutex::new(Some(thread)),
        }
    }

    /// Queues a request's jobs (one per choice), all or none: refused when the queue has
    /// no room for all of them or the server is shutting down. Jobs whose client went away
    /// leave the queue first.
    pub fn submit(&self, jobs: Vec<Job>) -> Result<(), SubmitError> {
        let mut q = lock(&self.shared);
        if !q.accepting {
            return Err(SubmitError::ShuttingDown);
        }
        drop_abandoned(&mut q.jobs, &self.metrics);
        if q.jobs.len() + jobs.len() > self.max_queue {
            self.metrics
                .rejected_queue_full
                .fetch_add(1, Ordering::Relaxed);
            self.metrics
                .queue_depth
                .store(q.jobs.len() as u64, Ordering::Relaxed);
            return Err(SubmitError::QueueFull);
        }
        q.jobs.extend(jobs);
        self.metrics
            .queue_depth
            .store(q.jobs.len() as u64, Ordering::Relaxed);
        drop(q);
        self.shared.wake.notify_all();
        Ok(())
    }

    /// Stops taking requests; what is queued or running may finish until `grace` has passed,
    /// then it is cancelled.
    pub fn begin_shutdown(&self, grace: Duration) {
        let mut q = lock(&self.shared);
        q.accepting = false;
        q.deadline = Some(Instant::now() + grace);
        drop(q);
        self.shared.wake.notify_all();
    }

    /// Cancels everything and waits for the thread to end.
    pub fn stop(&self) {
        {
            let mut q = lock(&self.shared);
            q.accepting = false;
            q.stop = true;
        }
        self.shared.wake.notify_all();
        let handle = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

/// One admitted sequence.
struct Seq<'t> {
    job: Job,
    /// Unique among the sequences the scheduler ever ran.
    id: u64,
    slot: SlotId,
    cached: usize,
    /// Prompt tokens in the cache.
    fed: usize,
    generation: Generation<'t>,
    /// The sampled token to feed at the next step.
    next: Option<TokenId>,
    last_token_at: Option<Instant>,
    /// The prompt and the generated tokens, for prompt lookup (empty without speculation).
    history: Vec<TokenId>,
    /// This step's tokens while it checks a draft: `next`, then the drafted tokens.
    checking: Vec<TokenId>,
    /// Tokens this sequence drafted and had accepted so far (drafting sequences with the
    /// best record go first when a step has little room).
    drafted: usize,
    accepted: usize,
    /// How long its drafts are, by their acceptance so far.
    pacer: DraftPacer,
    /// The n-gram length of the match behind the draft being checked.
    matched: usize,
}

impl Seq<'_> {
    /// How many tokens this sequence may draft now: `max`, within its token limit and the
    /// context (so that every token a check may produce still fits).
    fn draft_room(&self, max: usize, n_ctx: usize) -> usize {
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

impl Seq<'_> {
    /// Frees the sequence's memory after it ended without finishing.
    fn abort(self, pool: &mut KvPool, metrics: &Metrics) {
        self.job.aborted(metrics);
        pool.release(self.slot);
    }
}

struct Loop<'t> {
    engine: AnyEngine,
    pool: KvPool,
    tokenizer: &'t Tokenizer,
    options: SchedulerOptions,
    metrics: Arc<Metrics>,
    shared: Arc<Shared>,
    draft: Option<DraftModel>,
    /// Sequences admitted so far (each one's id).
    admitted: u64,
}

/// One sequence's share of a step.
struct Planned {
    index: usize,
    tokens: usize,
    logits: bool,
}

/// The most positions a job's sequence can reach: its prompt plus its token limit (the
/// pool caps it at the context size).
/// Removes the queued jobs whose client went away.
fn drop_abandoned(jobs: &mut VecDeque<Job>, metrics: &Metrics) {
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

fn max_len(job: &Job) -> usize {
    job.prompt
        .len()
        .saturating_add(job.params.max_tokens.unwrap_or(usize::MAX))
}

/// Samples a sequence's rows of a step in order: one row, or, when the step checked a draft,
/// the row of each drafted token until a sampled token differs from the drafted one (its
/// successors were computed after a wrong token) or the generation ends.
fn sample_rows(s: &mut Seq<'_>, logits: &[f32], n_vocab: usize) -> Vec<Step> {
    if s.checking.is_empty() {
        return vec![s.generation.step(logits)];
    }
    let drafted = &s.checking[1..];
    let mut steps = Vec::with_capacity(s.checking.len());
    for (j, row) in logits.chunks_exact(n_vocab).enumerate() {
        let step = s.generation.step(row);
        let ends = step.finish.is_some() || drafted.get(j).is_none_or(|&t| t != step.token);
        steps.push(step);
        if ends {
            break;
        }
    }
    steps
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("unknown cause")
}

fn shutting_down() -> ApiError {
    ApiError::unavailable("shutting_down", "the server is shutting down")
}

impl<'t> Loop<'t> {
    fn run(&mut self) {
        let mut active: Vec<Seq<'t>> = Vec::new();
        self.metrics
            .kv_blocks_total
            .store(self.pool.n_blocks() as u64, Ordering::Relaxed);
        self.metrics
            .kv_block_tokens
            .store(self.pool.block_tokens() as u64, Ordering::Relaxed);
        self.metrics
            .kv_bytes
            .store(self.pool.reserved_bytes() as u64, Ordering::Relaxed);
        self.metrics.kv_bytes_per_position.store(
            self.pool.bytes_per_position().round() as u64,
            Ordering::Relaxed,
        );
        let shared = self.shared.clone();
        loop {
            {
                let mut q = lock(&shared);
                loop {
                    if q.stop {
                        let jobs: Vec<Job> = q.jobs.drain(..).collect();
                        drop(q);
                        for job in jobs {
                            job.aborted(&self.metrics);
                            let _ = job.send(Event::Failed(shutting_down()));
                        }
                        self.cancel_all(&mut active, shutting_down());
                        return;
                    }
                    if q.deadline.is_some_and(|d| Instant::now() >= d) {
                        for job in q.jobs.drain(..) {
                            job.aborted(&self.metrics);
                            let _ = job.send(Event::Failed(shutting_down()));
                        }
                        self.cancel_all(&mut active, shutting_down());
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
                // Wherever they wait, jobs whose client left go at once (they would hold
                // queue places until they reached the front).
                drop_abandoned(&mut q.jobs, &self.metrics);
                // First come, first served: a request waiting for memory holds back those
                // behind it, so a large one is not starved by a stream of small ones.
                while let Some(job) = q.jobs.front() {
                    // A prompt being prefilled right now (another choice of the same
                    // request, usually) is worth waiting for: once its blocks are cached,
                    // this one reuses them instead of computing them again.
                    let sibling_prefilling = active.iter().any(|s| {
                        s.fed < s.job.prompt.len()
                            && s.job.prompt == job.prompt
                            && s.job.cache_salt == job.cache_salt
                    });
                    if sibling_prefilling {
                        break;
                    }
                    match self
                        .pool
                        .acquire(&job.prompt, max_len(job), job.cache_salt.as_deref())
                    {
                        Err(Refusal::Busy) => break,
                        Err(Refusal::TooLarge { needed, capacity }) => {
                            let job = q.jobs.pop_front().expect("the front job");
                            let _ = job.send(Event::Failed(ApiError::invalid(
                                format!("this request may need {needed} KV positions (prompt plus max_tokens); the server's KV memory holds {capacity}"),
                            )));
                        }
                        Ok(lease) => {
                            let job = q.jobs.pop_front().expect("the front job");
                            self.admit(job, lease, &mut active);
                        }
                    }
                }
                self.metrics
                    .queue_depth
                    .store(q.jobs.len() as u64, Ordering::Relaxed);
            }
            self.drop_cancelled(&mut active);
            if !active.is_empty() {
                // A fault in one step fails the sequences it ran, never the server.
                if let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.step(&mut active))) {
                    let message = format!("the scheduler step panicked: {}", panic_text(&*panic));
                    tracing::error!("{message}");
                    let error = ApiError::internal(message);
                    for s in active.drain(..) {
                        let _ = s.job.send(Event::Failed(error.clone()));
                        s.abort(&mut self.pool, &self.metrics);
                    }
                }
            }
            self.publish_occupancy(active.len());
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
            Some(_) => job.prompt.clone(),
            None => Vec::new(),
        };
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

    fn cancel_all(&mut self, active: &mut Vec<Seq<'t>>, error: ApiError) {
        for s in active.drain(..) {
            let _ = s.job.send(Event::Failed(error.clone()));
            s.abort(&mut self.pool, &self.metrics);
        }
    }

    /// Adds prompt-lookup drafts to the decoding sequences of `plan` while the step has
    /// fewer than `max_rows` rows, the sequences that have had the most drafted tokens
    /// accepted first.
    fn plan_drafts(&mut self, spec: Speculation, active: &mut [Seq<'t>], plan: &mut [Planned]) {
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

    fn step(&mut self, active: &mut Vec<Seq<'t>>) {
        let decoding = active.iter().any(|s| s.next.is_some());
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
                });
            } else {
                let take = (s.job.prompt.len() - s.fed).min(budget);
                if take > 0 {
                    budget -= take;
                    plan.push(Planned {
                        index,
                        tokens: take,
                        logits: s.fed + take == s.job.prompt.len(),
                    });
                }
            }
        }
        if let Some(spec) = self.options.speculation {
            self.plan_drafts(spec, active, &mut plan);
        }
        // Constrained sequences that get logits this step: their next masks are computed
        // on another thread while the forward pass runs (the mask depends only on the
        // tokens accepted so far, not on the logits).
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
                Work {
                    slot: s.slot,
                    tokens,
                    logits: p.logits,
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
        let failure = match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("the forward step failed: {e}")),
            Err(panic) => Some(format!(
                "the forward step panicked: {}",
                panic_text(&*panic)
            )),
        };
        if let Some(message) = failure {
            tracing::error!("{message}");
            let error = ApiError::internal(message);
            let mut failed: Vec<usize> = plan.iter().map(|p| p.index).collect();
            failed.sort_unstable();
            for &i in failed.iter().rev() {
                let s = active.remove(i);
                let _ = s.job.send(Event::Failed(error.clone()));
                s.abort(&mut self.pool, &self.metrics);
            }
            return;
        }

        let mut sampling = vec![false; active.len()];
        for p in &plan {
            let s = &mut active[p.index];
            if s.next.take().is_none() {
                s.fed += p.tokens;
            }
            sampling[p.index] = p.logits;
        }
        // Sampling (and logprobs) cost O(vocab) per sequence: spread it over the cores.
        let pool = &self.pool;
        let n_vocab = self.engine.vocab_size();
        let mut picked: Vec<(usize, &mut Seq<'t>)> = active
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| sampling[*i])
            .collect();
        let sample = |s: &mut Seq<'t>| sample_rows(s, pool.logits(s.slot), n_vocab);
        let sampled: Vec<(usize, Vec<Step>)> = if picked.len() > 1 {
            picked
                .par_iter_mut()
                .map(|(i, s)| (*i, sample(s)))
                .collect()
        } else {
            picked.iter_mut().map(|(i, s)| (*i, sample(s))).collect()
        };
        drop(picked);

        let n_ctx = self.pool.capacity_per_sequence();
        let mut finished = Vec::new();
        let mut done: Vec<(usize, Summary)> = Vec::new();
        let mut steps: Vec<(usize, Step)> = Vec::with_capacity(sampled.len());
        for (index, rows) in sampled {
            let s = &mut active[index];
            if !s.checking.is_empty() {
                // Keep the positions of `next` and of the drafted tokens that were accepted.
                let drafted = s.checking.len() - 1;
                let accepted = rows
                    .iter()
                    .zip(&s.checking[1..])
                    .take_while(|(step, &t)| step.token == t)
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
                        finished.push(index);
                        continue;
                    }
                }
            }
            steps.extend(rows.into_iter().map(|step| (index, step)));
        }
        // One time for the step's tokens: those a sequence had checked together arrive
        // together.
        let now = Instant::now();
        for (index, step) in steps {
            if finished.contains(&index) {
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
                s.history.push(step.token);
            }
            let mut text = step.text;
            let mut finish = step.finish;
            // Prompt and completion together never exceed the context (the last sampled
            // token needs no position, but max_tokens is checked the same way).
            if finish.is_none() && s.job.prompt.len() + s.generation.generated() >= n_ctx {
                text.push_str(&s.generation.end_for_length());
                finish = Some(FinishReason::Length);
            }
            let event = Event::Token(TokenEvent {
                token: step.token,
                text,
                logprob: step.logprob,
                top_logprobs: step.top_logprobs,
                eog: self.tokenizer.vocab().is_eog(step.token),
            });
            let delivered = s.job.send(event).is_ok();
            match finish {
                Some(finish) => {
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
                    // Sent once the blocks are back (below): a client that saw its reply
                    // end sees the memory free.
                    done.push((
                        index,
                        Summary {
                            finish,
                            stop: s.generation.stopped_by().map(str::to_string),
                            prompt_tokens: s.job.prompt.len(),
                            completion_tokens: s.generation.generated(),
                            cached_tokens: s.cached,
                        },
                    ));
                    finished.push(index);
                }
                None if !delivered => {
                    tracing::debug!(
                        parent: &s.job.span,
                        slot = s.slot.index(),
                        "client went away; sequence cancelled"
                    );
                    self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                    s.job.aborted(&self.metrics);
                    finished.push(index);
                }
                None => s.next = Some(step.token),
            }
        }
        finished.sort_unstable();
        let mut ended = Vec::with_capacity(finished.len());
        for &i in finished.iter().rev() {
            let s = active.remove(i);
            self.pool.release(s.slot);
            ended.push((i, s.job));
        }
        // The gauges first: a client that saw its reply end and then reads /metrics sees
        // its memory free and its sequence gone.
        self.publish_occupancy(active.len());
        for (i, job) in ended {
            if let Some(at) = done.iter().position(|(index, _)| *index == i) {
                let (_, summary) = done.swap_remove(at);
                let _ = job.send(Event::Done(summary));
            }
        }
    }

    fn publish_occupancy(&self, active: usize) {
        self.metrics.set_kv_usage(self.pool.usage());
        self.metrics
            .active_sequences
            .store(active as u64, Ordering::Relaxed);
    }
}
