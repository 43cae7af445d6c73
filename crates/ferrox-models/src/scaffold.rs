//! The scaffolding every engine's step shares: checking a step's sequences and laying their
//! tokens out as rows, micro-batching, embeddings, norms and residual adds across the pool,
//! and the output head. An engine supplies only its layers.

use std::any::Any;
use std::sync::Arc;

use ferrox_core::{KvStorage, WeightMatrix};
use ferrox_gguf::Gguf;
use ferrox_memory::{MemorySpec, StepMemory};
use rayon::prelude::*;

use crate::engine::{EngineError, EngineOptions, NumaPolicy, Output, SeqInput, WeightMemory};
use crate::layers::activation::softcap;
use crate::layers::linear::linear;
use crate::layers::norm::{rms_norm, rms_norm_in_place};
use crate::layers::rope::RopePos;
use crate::plan::{ExpertPlacement, MemoryPlan, Packing};
#[cfg(doc)]
use crate::Engine;
use crate::ModelError;
use crate::TokenId;
use ferrox_moe::ExpertCache;

/// Tokens processed together in one pass of a long prompt (bounds scratch memory).
pub const MAX_MICRO_BATCH: usize = 512;

/// Where one row of a step comes from.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    /// The sequence's index in the step.
    pub seq: usize,
    pub pos: usize,
    pub token: TokenId,
    /// Which of the sequence's output rows this token fills, if any.
    pub logits_row: Option<usize>,
    /// What that row holds.
    pub output: Output,
    /// The row of the step's given embeddings that stands in for the token's, if any.
    pub embedding: Option<usize>,
    /// The end (exclusive) of the positions the row attends to: `pos + 1`, or the end of a
    /// bidirectional span it belongs to.
    pub attend_end: usize,
    /// Where RoPE places the row: its position plus the sequence's shift, or its place in
    /// an image grid ([`crate::engine::InputEmbeddings::grid`]). Engines without M-RoPE
    /// sections read `pos`.
    pub rope: RopePos,
}

/// `buf[..len]`, grown if needed.
pub fn sized(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
}

/// Checks a step's sequences (tokens present and in the vocabulary, room in each
/// sequence's blocks), sizes each sequence's output buffer (logits or embeddings) and lays
/// the tokens out as rows: each sequence's rows contiguous and in position order.
/// A step's given embeddings ([`SeqInput::embeddings`]) are copied, in row order, into
/// `embeddings`; engines that do not take them (`takes_embeddings` false) refuse them.
pub fn layout(
    memory: &StepMemory<'_>,
    seqs: &[SeqInput<'_>],
    (n_vocab, n_embd, input_width): (usize, usize, usize),
    logits: &mut [&mut Vec<f32>],
    rows: &mut Vec<Row>,
    (takes, embeddings): (InputKinds, &mut Vec<f32>),
) -> Result<(), EngineError> {
    rows.clear();
    embeddings.clear();
    if seqs.len() != memory.n_seqs() || logits.len() != seqs.len() {
        return Err(EngineError::State(format!(
            "a step of {} sequences with {} memories and {} logits buffers",
            seqs.len(),
            memory.n_seqs(),
            logits.len()
        )));
    }
    for (seq, input) in seqs.iter().enumerate() {
        if input.tokens.is_empty() {
            return Err(EngineError::EmptyBatch);
        }
        let start = memory.len(seq);
        let needed = start + input.tokens.len();
        if needed > memory.capacity(seq) {
            return Err(EngineError::ContextFull {
                needed,
                capacity: memory.capacity(seq),
            });
        }
        let given = match input.embeddings {
            Some(e) => Some(check_embeddings(e, input.tokens.len(), input_width, takes)?),
            None => None,
        };
        let rope_start = start
            .checked_add_signed(input.position_shift)
            .ok_or_else(|| {
                EngineError::State(format!(
                    "a position shift of {} at position {start}",
                    input.position_shift
                ))
            })?;
        let grid = input
            .embeddings
            .and_then(|e| e.grid.map(|g| (g, e.grid_first)));
        if given.is_none() {
            if let Some(&bad) = input.tokens.iter().find(|&&t| t as usize >= n_vocab) {
                return Err(EngineError::InvalidToken {
                    token: bad,
                    vocab_size: n_vocab,
                });
            }
        }
        let first_embedding = embeddings.len() / input_width.max(1);
        if let Some(e) = input.embeddings {
            embeddings.extend_from_slice(e.rows);
        }
        let wanted = input.logits.range(input.tokens.len());
        let width = match input.output {
            Output::Logits => n_vocab,
            Output::Embeddings => n_embd,
        };
        logits[seq].resize(wanted.len() * width, 0.0);
        for (i, &token) in input.tokens.iter().enumerate() {
            rows.push(Row {
                seq,
                pos: start + i,
                token,
                logits_row: wanted.contains(&i).then(|| i - wanted.start),
                output: input.output,
                embedding: given.map(|_| first_embedding + i),
                attend_end: match given {
                    Some(true) => needed,
                    _ => start + i + 1,
                },
                rope: match grid {
                    // The image's time position is its first row's; a part starts inside.
                    Some((g, first)) => {
                        let t = rope_start.checked_sub(first).ok_or_else(|| {
                            EngineError::State(format!(
                                "image rows from {first} at rotary position {rope_start}"
                            ))
                        })?;
                        RopePos {
                            t,
                            y: t + (first + i) / g.nx,
                            x: t + (first + i) % g.nx,
                        }
                    }
                    None => RopePos::at(rope_start + i),
                },
            });
        }
    }
    Ok(())
}

/// What given rows an engine takes in place of tokens.
#[derive(Clone, Copy, Debug, Default)]
pub struct InputKinds {
    pub embeddings: bool,
    /// Image grids placed by M-RoPE.
    pub grids: bool,
    /// Rows attending to each other both ways.
    pub bidirectional: bool,
}

/// Checks a sequence's given embeddings; returns whether they are bidirectional.
fn check_embeddings(
    e: crate::engine::InputEmbeddings<'_>,
    n_tokens: usize,
    n_embd: usize,
    takes: InputKinds,
) -> Result<bool, EngineError> {
    if !takes.embeddings {
        return Err(EngineError::State(
            "this engine takes tokens only, not embeddings in their place".into(),
        ));
    }
    if e.bidirectional && !takes.bidirectional {
        return Err(EngineError::State(
            "rows attending both ways: this engine's attention is causal only".into(),
        ));
    }
    if let Some(g) = e.grid {
        if !takes.grids {
            return Err(EngineError::State(
                "an image grid placed by M-RoPE: this model's RoPE has no M-RoPE sections".into(),
            ));
        }
        let cells = g.nx.saturating_mul(g.ny);
        if g.nx == 0
            || e.grid_first
                .checked_add(n_tokens)
                .is_none_or(|end| end > cells)
        {
            return Err(EngineError::State(format!(
                "rows {}..{} of an image grid of {}x{}",
                e.grid_first,
                e.grid_first.saturating_add(n_tokens),
                g.nx,
                g.ny
            )));
        }
    }
    if e.rows.len() != n_tokens * n_embd {
        return Err(EngineError::State(format!(
            "{} embedding values for {n_tokens} tokens of width {n_embd}",
            e.rows.len()
        )));
    }
    if e.bidirectional && n_tokens > MAX_MICRO_BATCH {
        return Err(EngineError::State(format!(
            "{n_tokens} embeddings attending both ways: at most {MAX_MICRO_BATCH} at once"
        )));
    }
    Ok(e.bidirectional)
}

/// The length of the micro-batch to take from the front of `rest` (at most `max` rows): a
/// bidirectional span is never split, so the cut moves before one that would be.
pub fn micro_batch_len(rest: &[Row], max: usize) -> usize {
    let len = rest.len().min(max);
    let last = rest[len - 1];
    if last.attend_end <= last.pos + 1 {
        return len;
    }
    // The span's first row: the earliest row of the same sequence with the same end.
    let start = rest[..len]
        .iter()
        .position(|r| r.seq == last.seq && r.attend_end == last.attend_end)
        .unwrap_or(0);
    let span_end_in_rest = len + (last.attend_end - last.pos - 1);
    if span_end_in_rest <= len || start == 0 {
        len
    } else {
        start
    }
}

/// What every engine runs on: the file, the context size, the cache's element type and the
/// thread pool each step enters once.
pub struct Runtime {
    /// `general.architecture`.
    pub arch: String,
    pub gguf: Arc<Gguf>,
    pub n_ctx: usize,
    pub kv_storage: KvStorage,
    pub pool: rayon::ThreadPool,
    pub n_vocab: usize,
    /// Width of the hidden state (of the final norm's output).
    pub n_embd: usize,
    /// Bytes of weights read per decoded token (set once the weights are loaded).
    pub weight_bytes_per_token: u64,
    /// Where the weights go (see [`crate::plan`]).
    pub plan: MemoryPlan,
    /// The cache streamed experts go through, when the plan streams them.
    pub expert_cache: Option<Arc<ExpertCache>>,
    /// Bytes of packed copies made at load.
    pub packed_bytes: u64,
}

impl Runtime {
    /// `options.n_ctx` (0: the model's training context) and a pool of `options.threads`
    /// workers named `name-N`, each with its attention buffers made now rather than by
    /// whichever step first runs on it.
    pub fn new(
        gguf: Arc<Gguf>,
        options: &EngineOptions,
        (n_ctx_train, n_vocab, n_embd): (usize, usize, usize),
        name: &str,
    ) -> Result<Runtime, ModelError> {
        let name = name.to_string();
        let numa = options.numa;
        let topology = (numa != NumaPolicy::Off).then(|| {
            let topology = crate::numa::Topology::read();
            tracing::info!("{}", topology.describe(numa));
            (topology, crate::numa::current_cpu())
        });
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(options.threads)
            .thread_name(move |i| format!("{name}-{i}"))
            .start_handler(move |i| {
                let Some((topology, cpu)) = &topology else {
                    return;
                };
                if let Some(cpus) = topology.cpus_for_worker(numa, i, *cpu) {
                    if let Err(e) = crate::numa::pin_current_thread(cpus) {
                        tracing::warn!("--numa: worker {i} stays unpinned ({e})");
                    }
                }
            })
            .build()
            .map_err(|e| ModelError::Config(format!("cannot start the thread pool: {e}")))?;
        pool.broadcast(|_| {
            crate::layers::attention::with_group_state(|_| ());
            crate::layers::attention::with_typed_group(|_| ());
        });
        if options.direct_io {
            if let Err(e) = gguf.enable_direct_io() {
                tracing::warn!("--direct-io: reading through the page cache instead ({e})");
            }
        }
        let plan = MemoryPlan::new(&gguf, options)?;
        let expert_cache = match plan.experts {
            ExpertPlacement::Streamed { slots, slot_bytes } => {
                let cache = ExpertCache::new(slots, slot_bytes);
                Some(Arc::new(if options.mlock { cache.locked() } else { cache }))
            }
            _ => None,
        };
        Ok(Runtime {
            arch: gguf.metadata().architecture()?.to_string(),
            gguf,
            n_ctx: match options.n_ctx {
                0 => n_ctx_train,
                n => n,
            },
            kv_storage: options.kv_storage,
            pool,
            n_vocab,
            n_embd,
            weight_bytes_per_token: 0,
            plan,
            expert_cache,
            packed_bytes: 0,
        })
    }
}

/// The options of an engine whose cached rows are keys only (each row also its value: MLA
/// latent rows, DeepSeek-V4's rows, indexer keys): `-ctk`'s type for every store and `-ctv`
/// with nothing to store, as in llama.cpp. `rows` names each kind of row it caches and its
/// width; a type whose blocks do not tile one of them is refused by name.
pub fn keys_only_cache(
    options: &EngineOptions,
    rows: &[(&str, usize)],
) -> Result<EngineOptions, ModelError> {
    let storage = KvStorage::uniform(options.kv_storage.keys);
    let block = storage.keys.block_len();
    if let Some((what, width)) = rows.iter().find(|(_, w)| !w.is_multiple_of(block)) {
        return Err(ModelError::Config(format!(
            "a {} cache (-ctk) stores blocks of {block} values, and this model's {what} have \
             {width}: not whole blocks; use f16 or f32",
            storage.name()
        )));
    }
    Ok(EngineOptions {
        kv_storage: storage,
        ..options.clone()
    })
}

impl Runtime {
    /// Repacks the weights on the pool as the memory plan says, when the options ask for it.
    pub fn repack(
        &mut self,
        options: &EngineOptions,
        pack: impl FnOnce(&Packing<'_>) -> Result<(), ModelError> + Send,
    ) -> Result<(), ModelError> {
        if !options.repack {
            return Ok(());
        }
        let packing = Packing::new(
            &self.gguf,
            &self.plan,
            self.expert_cache.as_ref(),
            options.mlock,
        );
        self.pool.install(|| pack(&packing))?;
        self.packed_bytes = packing.packed_bytes();
        Ok(())
    }

    /// Where the weights live now.
    pub fn weight_memory(&self) -> WeightMemory {
        WeightMemory {
            budget: self.plan.budget,
            packed_bytes: self.packed_bytes,
            mapped_bytes: match self.packed_bytes {
                0 => self.gguf.tensor_bytes(),
                _ => self.plan.mapped_bytes(),
            },
            expert_cache: self.expert_cache.as_ref().map(|c| c.stats()),
        }
    }
}

/// An engine's own part: its layers over a micro-batch of rows. The rest of [`Engine`]
/// (checking the step, micro-batching, the thread pool) is the same for every engine and
/// comes with it.
pub trait EngineBody: Send + Sync + 'static {
    /// The engine's activation buffers, kept between steps.
    type Buffers: Any + Default + Send + Sync;

    fn runtime(&self) -> &Runtime;

    fn memory_spec(&self) -> MemorySpec;

    /// Whether the engine keeps a recurrent state: its steps then end a micro-batch at every
    /// block end and checkpoint the state there (for prefix reuse and rollback).
    fn checkpoints(&self) -> bool {
        false
    }

    /// Whether [`draft_mtp`](Self::draft_mtp) drafts (see [`Engine::has_mtp`]).
    fn has_mtp(&self) -> bool {
        false
    }

    /// Whether rows may come as given embeddings ([`Row::embedding`], handed to
    /// [`micro_batch`](Self::micro_batch)).
    fn takes_embeddings(&self) -> bool {
        false
    }

    /// Whether given rows may attend bidirectionally ([`Row::attend_end`]).
    fn takes_bidirectional(&self) -> bool {
        false
    }

    /// Whether given rows may be image grids placed by M-RoPE ([`Row::rope`]).
    fn takes_image_grids(&self) -> bool {
        false
    }

    /// The width of a given row: the model's, or wider where it carries more than the
    /// input (Qwen3-VL's deepstack slices).
    fn input_width(&self) -> usize {
        self.runtime().n_embd
    }

    /// The file's classification head (rerankers), if the engine loaded one.
    fn classifier(&self) -> Option<&crate::layers::classifier::ClassifierHead> {
        None
    }

    /// [`Engine::enable_rollback`]'s preparation, for an engine whose memory needs one.
    fn enable_rollback(&mut self, _tokens: usize) -> Result<(), EngineError> {
        Ok(())
    }

    /// [`Engine::draft_mtp`] on the engine's buffers; only called when
    /// [`has_mtp`](Self::has_mtp).
    #[allow(clippy::too_many_arguments)]
    fn draft_mtp(
        &self,
        _memory: &mut StepMemory<'_>,
        _buffers: &mut Self::Buffers,
        _seq: usize,
        _token: TokenId,
        _pos: usize,
        _max: usize,
        _out: &mut Vec<TokenId>,
    ) -> Result<(), EngineError> {
        unreachable!("only engines with a multi-token-prediction block draft")
    }

    /// One micro-batch of rows (each sequence's rows contiguous, in position order) through
    /// every layer, its memory rows written and its sequences advanced, and the logits of the
    /// rows that want them into their sequences' buffers. `embeddings` holds the step's
    /// given embedding rows (empty unless [`takes_embeddings`](Self::takes_embeddings)).
    fn micro_batch(
        &self,
        rows: &[Row],
        embeddings: &[f32],
        memory: &mut StepMemory<'_>,
        logits: &mut [&mut Vec<f32>],
        buffers: &mut Self::Buffers,
    ) -> Result<(), EngineError>;
}

/// The [`Engine`] implementation of a [`EngineBody`] type: checking the step, micro-batching,
/// the thread pool. Each engine invokes it once beside its `EngineBody` impl (a blanket impl
/// cannot cross from `ferrox-engine`, where the trait lives).
macro_rules! engine_from_body {
    ($engine:ty) => {
        const _: () = {
            use ferrox_gguf::Gguf;
            use ferrox_memory::{MemorySpec, StepMemory};
            use $crate::engine::{Engine, EngineError, SeqInput, StepScratch};
            use $crate::scaffold::{
                layout, micro_batch_len, EngineBody, StepBuffers, MAX_MICRO_BATCH,
            };
            use $crate::TokenId;

            impl Engine for $engine {
                fn architecture(&self) -> &str {
                    &self.runtime().arch
                }

                fn gguf(&self) -> &Gguf {
                    &self.runtime().gguf
                }

                fn memory_spec(&self) -> MemorySpec {
                    EngineBody::memory_spec(self)
                }

                fn vocab_size(&self) -> usize {
                    self.runtime().n_vocab
                }

                fn embedding_size(&self) -> usize {
                    self.runtime().n_embd
                }

                fn context_size(&self) -> usize {
                    self.runtime().n_ctx
                }

                fn threads(&self) -> usize {
                    self.runtime().pool.current_num_threads()
                }

                fn weight_bytes_per_token(&self) -> u64 {
                    self.runtime().weight_bytes_per_token
                }

                fn weight_memory(&self) -> $crate::engine::WeightMemory {
                    self.runtime().weight_memory()
                }

                fn new_scratch(&self) -> StepScratch {
                    StepScratch::new(StepBuffers::<<$engine as EngineBody>::Buffers>::default())
                }

                fn has_mtp(&self) -> bool {
                    EngineBody::has_mtp(self)
                }

                fn accepts_embeddings(&self) -> bool {
                    EngineBody::takes_embeddings(self)
                }

                fn accepts_image_grids(&self) -> bool {
                    EngineBody::takes_image_grids(self)
                }

                fn accepts_bidirectional(&self) -> bool {
                    EngineBody::takes_bidirectional(self)
                }

                fn input_embedding_size(&self) -> usize {
                    EngineBody::input_width(self)
                }

                fn has_classifier(&self) -> bool {
                    EngineBody::classifier(self).is_some()
                }

                fn classify(&self, pooled: &[f32]) -> Result<Vec<f32>, EngineError> {
                    match EngineBody::classifier(self) {
                        Some(head) => Ok(head.apply(&self.runtime().gguf, pooled)?),
                        None => Err(EngineError::NoClassifier(self.runtime().arch.clone())),
                    }
                }

                fn enable_rollback(&mut self, tokens: usize) -> Result<usize, EngineError> {
                    EngineBody::enable_rollback(self, tokens)?;
                    Ok(EngineBody::memory_spec(self).rollback_reach())
                }

                fn draft_mtp(
                    &self,
                    memory: &mut StepMemory<'_>,
                    scratch: &mut StepScratch,
                    seq: usize,
                    token: TokenId,
                    pos: usize,
                    max: usize,
                    out: &mut Vec<TokenId>,
                ) -> Result<(), EngineError> {
                    if !EngineBody::has_mtp(self) {
                        return Err(EngineError::State(format!(
                            "{}: no multi-token-prediction block is loaded",
                            self.runtime().arch
                        )));
                    }
                    out.clear();
                    let StepBuffers { engine, .. } =
                        scratch.get::<StepBuffers<<$engine as EngineBody>::Buffers>>();
                    self.runtime().pool.install(|| {
                        EngineBody::draft_mtp(self, memory, engine, seq, token, pos, max, out)
                    })
                }

                fn step(
                    &self,
                    memory: &mut StepMemory<'_>,
                    scratch: &mut StepScratch,
                    seqs: &[SeqInput<'_>],
                    logits: &mut [&mut Vec<f32>],
                ) -> Result<(), EngineError> {
                    let StepBuffers {
                        rows,
                        embeddings,
                        engine,
                    } = scratch.get::<StepBuffers<<$engine as EngineBody>::Buffers>>();
                    let widths = (
                        self.runtime().n_vocab,
                        self.runtime().n_embd,
                        EngineBody::input_width(self),
                    );
                    let takes = $crate::scaffold::InputKinds {
                        embeddings: EngineBody::takes_embeddings(self),
                        grids: EngineBody::takes_image_grids(self),
                        bidirectional: EngineBody::takes_bidirectional(self),
                    };
                    let given = (takes, &mut *embeddings);
                    layout(memory, seqs, widths, logits, rows, given)?;
                    let checkpoints = self.checkpoints();
                    let block = memory.block_tokens();
                    self.runtime().pool.install(|| {
                        let mut rest = &rows[..];
                        while !rest.is_empty() {
                            let mut len = micro_batch_len(rest, MAX_MICRO_BATCH);
                            if checkpoints {
                                // End the micro-batch where some sequence completes a block.
                                if let Some(i) =
                                    rest[..len].iter().position(|r| (r.pos + 1) % block == 0)
                                {
                                    len = i + 1;
                                }
                            }
                            let (chunk, tail) = rest.split_at(len);
                            self.micro_batch(chunk, embeddings, memory, logits, engine)?;
                            if checkpoints {
                                if let Some(r) = chunk.last().filter(|r| (r.pos + 1) % block == 0) {
                                    memory.checkpoint(r.seq, r.pos + 1);
                                }
                            }
                            rest = tail;
                        }
                        Ok(())
                    })
                }
            }
        };
    };
}
pub(crate) use engine_from_body;

/// What a step keeps between steps: its rows and the engine's own buffers.
#[derive(Default)]
pub(crate) struct StepBuffers<B> {
    pub(crate) rows: Vec<Row>,
    /// The step's given embedding rows ([`SeqInput::embeddings`]), in row order.
    pub(crate) embeddings: Vec<f32>,
    pub(crate) engine: B,
}

/// The rows the last layer's feed-forward runs for. Its output is read only by the output
/// head, so, as llama.cpp keeps only its output rows (`inp_out_ids`) there, the rows that give
/// nothing back skip it. Each row's products do not depend on the others', so what the kept
/// rows give back is unchanged.
#[derive(Default)]
pub struct OutputRows {
    kept: Vec<Row>,
    /// Whether this micro-batch's rows were cut to `kept`.
    pruned: bool,
}

impl OutputRows {
    /// A new micro-batch: every row so far.
    pub fn reset(&mut self) {
        self.pruned = false;
    }

    /// Before the last layer's feed-forward: moves the hidden states (rows of `width` in `x`)
    /// of the rows that give something back (`logits_row`) to the front, in order, when some
    /// row gives nothing back; returns how many rows the feed-forward runs for.
    pub fn keep(&mut self, rows: &[Row], x: &mut [f32], width: usize) -> usize {
        self.pruned = rows.iter().any(|r| r.logits_row.is_none());
        if !self.pruned {
            return rows.len();
        }
        self.kept.clear();
        let kept = rows.iter().filter(|r| r.logits_row.is_some());
        self.kept.extend(kept.copied());
        self.compact(rows, x, width);
        self.kept.len()
    }

    /// Cuts another buffer of the micro-batch's rows (`width` values each, in `x`) as
    /// [`OutputRows::keep`] cut the hidden states.
    pub fn compact(&self, rows: &[Row], x: &mut [f32], width: usize) {
        if !self.pruned {
            return;
        }
        let mut to = 0;
        for (t, row) in rows.iter().enumerate() {
            if row.logits_row.is_some() {
                if to != t {
                    x.copy_within(t * width..(t + 1) * width, to * width);
                }
                to += 1;
            }
        }
    }

    /// The rows the output head reads: the kept ones where [`OutputRows::keep`] cut this
    /// micro-batch, else `rows`.
    pub fn of<'a>(&'a self, rows: &'a [Row]) -> &'a [Row] {
        match self.pruned {
            true => &self.kept,
            false => rows,
        }
    }
}

/// Marks each sequence of a finished micro-batch filled up to its last row.
pub fn advance(memory: &mut StepMemory<'_>, rows: &[Row]) {
    for row in rows {
        memory.advance(row.seq, row.pos + 1);
    }
}

/// The rows' token embeddings (times `scale`, if any) into `x` (`rows.len() × n_embd`); a
/// row with given embeddings takes its row of `given` as it is.
pub fn embed(
    rows: &[Row],
    embd: &WeightMatrix<'_>,
    scale: Option<f32>,
    given: &[f32],
    x: &mut [f32],
) -> Result<(), EngineError> {
    embed_given(rows, embd, scale, (given, embd.cols()), x)
}

/// [`embed`] with given rows `given.1` wide (the first `n_embd` values are the input).
pub fn embed_given(
    rows: &[Row],
    embd: &WeightMatrix<'_>,
    scale: Option<f32>,
    (given, width): (&[f32], usize),
    x: &mut [f32],
) -> Result<(), EngineError> {
    let n_embd = embd.cols();
    for (row, out) in rows.iter().zip(x.chunks_exact_mut(n_embd)) {
        if let Some(i) = row.embedding {
            out.copy_from_slice(&given[i * width..i * width + n_embd]);
            continue;
        }
        embd.dequant_row(row.token as usize, out)
            .map_err(ModelError::from)?;
        if let Some(scale) = scale {
            out.iter_mut().for_each(|v| *v *= scale);
        }
    }
    Ok(())
}

/// `out` row by row: the RMS norm of each `weight.len()`-wide row of `x`, rows in parallel.
pub fn norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let width = weight.len();
    out.par_chunks_mut(width)
        .zip(x.par_chunks(width))
        .for_each(|(o, x)| rms_norm(x, weight, eps, o));
}

/// The residual connection `x += post_norm(y)` (or `x += y` without a post norm), rows of
/// `width` in parallel.
pub fn residual_add(
    x: &mut [f32],
    y: &mut [f32],
    width: usize,
    post_norm: Option<&[f32]>,
    eps: f32,
) {
    y.par_chunks_mut(width)
        .zip(x.par_chunks_mut(width))
        .for_each(|(p, x)| {
            if let Some(w) = post_norm {
                rms_norm_in_place(p, w, eps);
            }
            x.iter_mut().zip(p.iter()).for_each(|(x, p)| *x += p);
        });
}

/// The residual stream of a micro-batch and the buffers of its sublayers.
#[derive(Default)]
pub struct Residual {
    x: Vec<f32>,
    xn: Vec<f32>,
    proj: Vec<f32>,
}

impl Residual {
    /// Starts the stream from the rows' token embeddings, or the step's `given` rows for
    /// rows that have one.
    pub fn embed(
        &mut self,
        rows: &[Row],
        embd: &WeightMatrix<'_>,
        given: &[f32],
    ) -> Result<(), EngineError> {
        let x = sized(&mut self.x, rows.len() * embd.cols());
        embed(rows, embd, None, given, x)
    }

    /// One pre-norm sublayer: `x += f(rms_norm(x; norm))`, `f` writing its output into the
    /// buffer it is given (`n × n_embd`, as `x`).
    pub fn sublayer(
        &mut self,
        n: usize,
        norm: &[f32],
        eps: f32,
        f: impl FnOnce(&[f32], &mut [f32]) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        let n_embd = norm.len();
        let xn = sized(&mut self.xn, n * n_embd);
        norm_rows(&self.x[..n * n_embd], norm, eps, xn);
        let proj = sized(&mut self.proj, n * n_embd);
        f(xn, proj)?;
        residual_add(&mut self.x[..n * n_embd], proj, n_embd, None, eps);
        Ok(())
    }

    /// [`OutputRows::keep`] on the stream (rows of `width`).
    pub fn keep_output_rows(&mut self, rows: &[Row], width: usize, kept: &mut OutputRows) -> usize {
        kept.keep(rows, &mut self.x, width)
    }

    /// The stream (`n × n_embd` rows).
    pub fn x(&self) -> &[f32] {
        &self.x
    }

    /// The stream's first `len` values, to start it from rows computed elsewhere.
    pub fn start(&mut self, len: usize) -> &mut [f32] {
        sized(&mut self.x, len)
    }
}

/// The final norm and output projection.
pub struct OutputHead<'a> {
    pub norm: &'a [f32],
    pub eps: f32,
    pub output: WeightMatrix<'a>,
    pub softcap: Option<f32>,
}

/// Buffers of the output head, reused across steps.
#[derive(Default)]
pub struct HeadScratch {
    wanting: Vec<usize>,
    xn: Vec<f32>,
    logits: Vec<f32>,
    xq: Vec<u8>,
}

impl OutputHead<'_> {
    /// What the rows of the micro-batch (hidden states `x`) that want something give back,
    /// copied to their sequences' buffers: the final norm of the row (its embedding), or
    /// that times the output matrix (its logits).
    pub fn run(
        &self,
        rows: &[Row],
        x: &[f32],
        seq_logits: &mut [&mut Vec<f32>],
        s: &mut HeadScratch,
    ) -> Result<(), EngineError> {
        s.wanting.clear();
        s.wanting
            .extend((0..rows.len()).filter(|&t| rows[t].logits_row.is_some()));
        if s.wanting.is_empty() {
            return Ok(());
        }
        let n_embd = self.norm.len();
        let xn = sized(&mut s.xn, s.wanting.len() * n_embd);
        for (i, &t) in s.wanting.iter().enumerate() {
            rms_norm(
                &x[t * n_embd..(t + 1) * n_embd],
                self.norm,
                self.eps,
                &mut xn[i * n_embd..(i + 1) * n_embd],
            );
        }
        // Embedding rows are given back now; the logits rows' inputs close up behind them.
        let mut count = 0;
        for i in 0..s.wanting.len() {
            let t = s.wanting[i];
            let row = &rows[t];
            let slot = row.logits_row.unwrap_or(0);
            match row.output {
                Output::Embeddings => seq_logits[row.seq][slot * n_embd..(slot + 1) * n_embd]
                    .copy_from_slice(&xn[i * n_embd..(i + 1) * n_embd]),
                Output::Logits => {
                    if count != i {
                        xn.copy_within(i * n_embd..(i + 1) * n_embd, count * n_embd);
                    }
                    s.wanting[count] = t;
                    count += 1;
                }
            }
        }
        if count == 0 {
            return Ok(());
        }
        let n_vocab = self.output.rows();
        let logits = sized(&mut s.logits, count * n_vocab);
        linear(
            &self.output,
            &xn[..count * n_embd],
            count,
            logits,
            &mut s.xq,
        )?;
        if let Some(cap) = self.softcap {
            softcap(logits, cap);
        }
        for (i, &t) in s.wanting[..count].iter().enumerate() {
            let row = &rows[t];
            let slot = row.logits_row.unwrap_or(0);
            seq_logits[row.seq][slot * n_vocab..(slot + 1) * n_vocab]
                .copy_from_slice(&logits[i * n_vocab..(i + 1) * n_vocab]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: usize, pos: usize, attend_end: usize) -> Row {
        Row {
            seq,
            pos,
            token: 0,
            logits_row: None,
            output: Output::Logits,
            embedding: None,
            attend_end,
            rope: RopePos::at(pos),
        }
    }

    #[test]
    fn a_bidirectional_span_is_never_split_between_micro_batches() {
        // Sequence 0: 6 causal rows; sequence 1: a span of 4 rows at positions 10..14.
        let mut rows: Vec<Row> = (0..6).map(|p| row(0, p, p + 1)).collect();
        rows.extend((10..14).map(|p| row(1, p, 14)));
        assert_eq!(micro_batch_len(&rows, 16), 10);
        assert_eq!(micro_batch_len(&rows, 10), 10);
        // A cut inside the span moves before it.
        for max in 7..10 {
            assert_eq!(micro_batch_len(&rows, max), 6, "max {max}");
        }
        assert_eq!(micro_batch_len(&rows, 5), 5);
        // The span alone at the front fits whole.
        assert_eq!(micro_batch_len(&rows[6..], 4), 4);
    }
}
