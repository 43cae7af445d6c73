//! Continuous batching: one thread owns the engine (any architecture) and, step after step,
//! advances every active sequence together in one engine step: the next token of each
//! decoding sequence plus a bounded chunk of prompt tokens of those still prefilling, so
//! streams keep flowing while a long prompt is read. New requests join between steps from a
//! bounded queue; a sequence whose client went away (its event receiver dropped) is cancelled
//! at the next step and its slot freed.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod batcher;
mod drafting;
mod iteration;

use ferrox_generate::embedding::Pooling;
use ferrox_generate::generate::{FinishReason, GenerationParams};
use ferrox_models::AnyEngine;
use ferrox_tokenizer::tokenizer::{TokenId, Tokenizer};
use tokio::sync::mpsc::error::SendError;
use tokio::sync::mpsc::UnboundedSender;

use crate::draft::DraftModel;
use crate::error::ApiError;
use crate::kv::KvPool;
use crate::metrics::{Finished, Metrics};
use batcher::{drop_abandoned, Batcher};

/// A request waiting for, or holding, a slot.
pub struct Job {
    pub prompt: Vec<TokenId>,
    /// Images whose rows stand in for the prompt's ids at their positions.
    pub images: Vec<ferrox_generate::media::PlacedImage>,
    pub params: GenerationParams,
    /// Which choice of its request this job generates (`n` > 1 shares one channel).
    pub choice: usize,
    /// The prefix cache's namespace (vLLM's `cache_salt`; `None`: the shared one).
    pub cache_salt: Option<String>,
    /// Embed the prompt, pooled this way, instead of generating ([`Event::Embedding`]
    /// then [`Event::Done`]).
    pub embed: Option<Pooling>,
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
    /// An embedding job's result: the pooled embedding, or every token's (not normalized).
    Embedding(Vec<Vec<f32>>),
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
                    Batcher {
                        engine,
                        pool,
                        tokenizer: &tokenizer,
                        options,
                        metrics,
                        shared,
                        draft,
                        admitted: 0,
                    }
                    .run();
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

    /// Waits (blocking) until nothing is queued or running, or `timeout` has passed.
    pub fn wait_idle(&self, timeout: Duration) {
        let started = Instant::now();
        while started.elapsed() < timeout {
            let queued = lock(&self.shared).jobs.len();
            if queued == 0 && self.metrics.active_sequences.load(Ordering::Relaxed) == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
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
