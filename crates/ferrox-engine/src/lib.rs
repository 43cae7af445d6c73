//! The interface every engine implements, so one generation loop (the CLI's) and one
//! scheduler (the server's) drive them all.
//!
//! An engine runs one **step** over several sequences at once: all their new tokens go
//! through the weights together, each token attending only to its own sequence's memory.
//! What an engine keeps per sequence lives in a model-agnostic
//! [`SequenceMemory`](ferrox_memory::SequenceMemory), laid out by the engine's
//! [`MemorySpec`]: the server shares one paged memory among all its sequences, a
//! single-stream front end gets a [`State`] holding a memory of one sequence. Rolling a
//! sequence back is the memory's business and is refused where the state cannot
//! ([`State::truncate`] returns the error).

use std::any::Any;

use ferrox_core::KvStorage;
use ferrox_gguf::Gguf;
use ferrox_memory::{MemoryError, MemorySpec, SeqId, SequenceMemory, StepMemory};
use smallvec::SmallVec;

/// A token's index in the vocabulary (the same type as `ferrox_tokenizer`'s).
pub type TokenId = u32;

/// Errors loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] ferrox_gguf::GgufError),
    #[error(transparent)]
    Quant(#[from] ferrox_core::QuantError),
    #[error("architecture `{0}` is not supported")]
    UnsupportedArchitecture(String),
    #[error("tensor `{0}` is missing")]
    MissingTensor(String),
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    #[error("tensor `{name}` has type {ty}, which is not supported")]
    UnsupportedTensorType { name: String, ty: String },
    #[error("invalid model configuration: {0}")]
    Config(String),
    #[error(
        "the {engine} engine keeps its cache in f16 or f32 only: a {cache} cache is not built \
         for it (give -ctk/-ctv f16 or f32)"
    )]
    UnsupportedCacheType { engine: String, cache: String },
    #[error("{arch} is an embedding model (an encoder without an output head): it embeds text and cannot generate")]
    EmbeddingOnly { arch: String },
    #[error(
        "a memory budget of {budget} bytes is below the {needed} bytes the weights other than \
         the routed experts need in memory"
    )]
    BudgetTooSmall { budget: u64, needed: u64 },
}

/// How to run an engine.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Context size in tokens; 0 means the model's training context.
    pub n_ctx: usize,
    /// Worker threads; 0 means one per available core.
    pub threads: usize,
    pub kv_storage: KvStorage,
    /// Repack the matrices that multiply faster in an interleaved layout at load (see
    /// `ferrox_core::packed`; llama.cpp's `--no-repack` turns its counterpart off).
    pub repack: bool,
    /// Load the file's multi-token-prediction block and keep what it drafts from (see
    /// [`Engine::draft_mtp`]); an engine without one refuses.
    pub mtp: bool,
    /// Bytes of memory the weights may take (`--memory-budget`); `None`: most of what the
    /// system has available. Routed experts that do not fit are streamed from the file.
    pub memory_budget: Option<u64>,
    /// Lock the weights held in memory (`--mlock`) so that they are never paged out.
    pub mlock: bool,
    /// Read the weights that are copied at load or into the experts' cache past the page
    /// cache (`--direct-io`), where the filesystem allows it.
    pub direct_io: bool,
    /// Where the worker threads run on a machine with several memory nodes (`--numa`).
    pub numa: NumaPolicy,
}

/// How worker threads are placed on the machine's memory nodes (`--numa`, with llama.cpp's
/// meanings).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NumaPolicy {
    /// Threads run wherever the system schedules them.
    #[default]
    Off,
    /// Worker `i` runs on the CPUs of node `i mod nodes`: the threads, and the memory they
    /// touch first, spread evenly over the nodes.
    Distribute,
    /// Every worker runs on the CPUs of the node the process started on.
    Isolate,
    /// Every worker runs on the CPUs the process was given (`numactl --physcpubind`/`-N`).
    Numactl,
}

/// Where an engine's weights live, as the memory planner placed them at load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WeightMemory {
    /// The budget the plan was made for.
    pub budget: u64,
    /// Bytes of packed copies made at load, in this process's memory.
    pub packed_bytes: u64,
    /// Bytes of the file used in place from the mapping.
    pub mapped_bytes: u64,
    /// The cache of packed routed experts, when the experts are streamed from the file.
    pub expert_cache: Option<ExpertCacheStats>,
}

/// Counters of the cache through which routed experts are streamed from the file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpertCacheStats {
    /// Slots, each one expert's packed matrices.
    pub slots: usize,
    /// Slots holding an expert.
    pub filled: usize,
    /// Bytes of memory one slot takes.
    pub slot_bytes: u64,
    /// Expert uses served from a slot.
    pub hits: u64,
    /// Expert uses that packed the expert from the file.
    pub misses: u64,
    /// Bytes of the file packed into slots.
    pub bytes_read: u64,
    /// Experts whose pages a layer asked for ahead, on the next layer's behalf (those its
    /// router picks for this layer's input, when not cached).
    pub ahead_asked: u64,
    /// Of those, the ones the next layer then used.
    pub ahead_used: u64,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            n_ctx: 4096,
            threads: 0,
            kv_storage: KvStorage::F16,
            repack: true,
            mtp: false,
            memory_budget: None,
            mlock: false,
            direct_io: false,
            numa: NumaPolicy::Off,
        }
    }
}

/// Which positions of a batch need logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsFor {
    /// Only the last token (prompt prefill).
    Last,
    /// Every token (speculative checks).
    All,
    /// The tokens from this index of the batch on (perplexity scores the second half of
    /// each chunk; the rest would be wasted memory with a large vocabulary).
    From(usize),
}

impl LogitsFor {
    /// The batch indices that get logits, for a batch of `n` tokens.
    pub fn range(self, n: usize) -> std::ops::Range<usize> {
        match self {
            LogitsFor::Last => n.saturating_sub(1)..n,
            LogitsFor::All => 0..n,
            LogitsFor::From(i) => i.min(n)..n,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("token id {token} is outside the vocabulary of {vocab_size}")]
    InvalidToken { token: TokenId, vocab_size: usize },
    #[error("position {got} does not continue the sequence ({len} positions so far)")]
    Position { got: usize, len: usize },
    #[error("the context is full: {needed} positions needed, {capacity} available")]
    ContextFull { needed: usize, capacity: usize },
    #[error("a batch needs at least one token")]
    EmptyBatch,
    #[error("{0}: the model has no classification head (cls.output) to rank with")]
    NoClassifier(String),
    #[error("{0}")]
    State(String),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Model(Box<ModelError>),
}

impl From<ModelError> for EngineError {
    fn from(e: ModelError) -> EngineError {
        EngineError::Model(Box::new(e))
    }
}

/// What the rows a step asks for ([`LogitsFor`]) give back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Output {
    /// Next-token logits, [`Engine::vocab_size`] per row.
    #[default]
    Logits,
    /// The hidden state after the final norm, [`Engine::embedding_size`] per row: what
    /// llama.cpp calls a token's embedding (pooled into a text's embedding by the caller).
    Embeddings,
}

impl Output {
    /// Floats per requested row.
    pub fn width<E: Engine + ?Sized>(self, engine: &E) -> usize {
        match self {
            Output::Logits => engine.vocab_size(),
            Output::Embeddings => engine.embedding_size(),
        }
    }
}

/// One sequence's part of a step: tokens to append at its next positions, which of them
/// give back something, and what.
#[derive(Clone, Copy, Debug)]
pub struct SeqInput<'a> {
    pub tokens: &'a [TokenId],
    pub logits: LogitsFor,
    pub output: Output,
    /// Rows that stand in for the tokens' embeddings (an image's), if any.
    pub embeddings: Option<InputEmbeddings<'a>>,
    /// Added to each row's cache position to give its rotary position. Nonzero after an
    /// image whose rows take another number of rotary positions than rows (a Qwen-VL image
    /// takes `max(nx, ny)`, see [`ImageGrid`]); 0 otherwise.
    pub position_shift: isize,
}

/// Rows given in place of a step's token embeddings (an image's embeddings from a vision
/// encoder): the tokens then only name the positions (for prefix reuse, so they need not be
/// in the vocabulary) and are not looked up. Rows given this way are not scaled as token
/// embeddings are (Gemma's `sqrt(n_embd)`), as llama.cpp treats raw embeddings.
#[derive(Clone, Copy, Debug)]
pub struct InputEmbeddings<'a> {
    /// One row of [`Engine::input_embedding_size`] values per token of the step.
    pub rows: &'a [f32],
    /// The rows attend to each other both ways (Gemma 3's image tokens) rather than
    /// causally; they must then fit one micro-batch.
    pub bidirectional: bool,
    /// The rows are an image's grid of tokens, placed by M-RoPE (Qwen-VL): row `i` turns
    /// by the rotary positions `(t, t + i / nx, t + i % nx)` (time, row, column; `t` the
    /// first row's rotary position), for models whose RoPE has M-RoPE sections
    /// ([`Engine::accepts_image_grids`]). `None`: one position per row.
    pub grid: Option<ImageGrid>,
    /// The grid index of the first row, when an image is fed in parts (the rest of one
    /// whose start a reused prefix holds); 0 otherwise.
    pub grid_first: usize,
}

/// An image's grid of tokens: `nx` a row, `ny` rows, row-major.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageGrid {
    pub nx: usize,
    pub ny: usize,
}

impl ImageGrid {
    /// The rotary positions the image takes (llama.cpp's `mtmd_image_tokens_get_n_pos` for
    /// M-RoPE): the text after it continues from its first position plus this.
    pub fn n_pos(&self) -> usize {
        self.nx.max(self.ny)
    }
}

/// An engine's activation buffers, kept between steps so decoding does not allocate. Each
/// engine keeps its own type inside ([`StepScratch::get`]).
pub struct StepScratch(Box<dyn Any + Send + Sync>);

impl StepScratch {
    pub fn new<T: Any + Send + Sync>(inner: T) -> StepScratch {
        StepScratch(Box::new(inner))
    }

    /// The engine's buffers (fresh ones if these were made by another engine).
    pub fn get<T: Any + Send + Sync + Default>(&mut self) -> &mut T {
        if !self.0.is::<T>() {
            self.0 = Box::new(T::default());
        }
        self.0.downcast_mut().expect("just checked")
    }
}

/// A model that turns tokens into next-token logits.
///
/// Implementations run each step on their own thread pool, entered once per call; calling
/// them from inside any rayon pool (theirs included) is allowed. A sequence's logits do not
/// depend on which other sequences share its step (the kernels are batch-invariant).
pub trait Engine: Send + Sync + Any {
    /// `general.architecture` of the file.
    fn architecture(&self) -> &str;

    fn gguf(&self) -> &Gguf;

    /// What the engine keeps per sequence.
    fn memory_spec(&self) -> MemorySpec;

    fn vocab_size(&self) -> usize;

    /// Width of the hidden state ([`Output::Embeddings`]).
    fn embedding_size(&self) -> usize;

    /// Whether steps may give rows in place of token embeddings ([`SeqInput::embeddings`]).
    fn accepts_embeddings(&self) -> bool {
        false
    }

    /// Whether given rows may be an image grid placed by M-RoPE ([`InputEmbeddings::grid`]).
    fn accepts_image_grids(&self) -> bool {
        false
    }

    /// Whether given rows may attend to each other both ways
    /// ([`InputEmbeddings::bidirectional`]).
    fn accepts_bidirectional(&self) -> bool {
        false
    }

    /// The width of a given row ([`InputEmbeddings::rows`]): [`Engine::embedding_size`],
    /// or wider for models that take more than the input with it (Qwen3-VL's deepstack
    /// features).
    fn input_embedding_size(&self) -> usize {
        self.embedding_size()
    }

    /// Positions one sequence can hold.
    fn context_size(&self) -> usize;

    fn threads(&self) -> usize;

    /// Bytes of weights read per decoded token.
    fn weight_bytes_per_token(&self) -> u64;

    /// Where the weights live: packed in memory, mapped, streamed through a cache.
    fn weight_memory(&self) -> WeightMemory {
        WeightMemory::default()
    }

    fn new_scratch(&self) -> StepScratch;

    /// Runs one step: sequence `i` of `memory` gets `seqs[i].tokens` at its next positions
    /// (its block table must already cover them) and what its requested rows give back in
    /// `logits[i]` (logits or embeddings, as `seqs[i].output` says, one row per requested
    /// token, in order).
    fn step(
        &self,
        memory: &mut StepMemory<'_>,
        scratch: &mut StepScratch,
        seqs: &[SeqInput<'_>],
        logits: &mut [&mut Vec<f32>],
    ) -> Result<(), EngineError>;

    /// Whether [`draft_mtp`](Self::draft_mtp) drafts: the file's multi-token-prediction
    /// block was loaded ([`EngineOptions::mtp`]).
    fn has_mtp(&self) -> bool {
        false
    }

    /// Whether [`classify`](Self::classify) scores: the file has a classification head
    /// (`cls.*`, a reranker's).
    fn has_classifier(&self) -> bool {
        false
    }

    /// The classification head's scores of a pooled embedding (rank pooling: a reranker's
    /// relevance score first).
    fn classify(&self, _pooled: &[f32]) -> Result<Vec<f32>, EngineError> {
        Err(EngineError::NoClassifier(self.architecture().to_string()))
    }

    /// An encoder (BERT and its kin): its attention may look both ways, so each sequence
    /// comes whole, in one step, from position 0; it keeps nothing between steps and gives
    /// back embeddings only (it has no output head).
    fn is_encoder(&self) -> bool {
        false
    }

    /// Prepares the memory for sequences to roll back `tokens` positions after any step, as
    /// speculative decoding forgets rejected draft tokens, where the engine can (a Kimi-K3
    /// then checkpoints its recurrent state after each of a step's last positions, which
    /// costs a copy of the state per position). Returns the positions a sequence can now
    /// roll back by ([`MemorySpec::rollback_reach`]), which may be fewer than `tokens`.
    fn enable_rollback(&mut self, _tokens: usize) -> Result<usize, EngineError> {
        Ok(self.memory_spec().rollback_reach())
    }

    /// Drafts up to `max` tokens (greedily) to follow `token`, the token to be fed next at
    /// position `pos` of sequence `seq` (its index in `memory`), with the engine's
    /// multi-token-prediction block. The block's rows it writes past the sequence's length
    /// (its table must cover `pos + max - 1` positions) are written again by the step that
    /// checks the draft.
    #[allow(clippy::too_many_arguments)]
    fn draft_mtp(
        &self,
        _memory: &mut StepMemory<'_>,
        _scratch: &mut StepScratch,
        _seq: usize,
        _token: TokenId,
        _pos: usize,
        _max: usize,
        _out: &mut Vec<TokenId>,
    ) -> Result<(), EngineError> {
        Err(EngineError::State(format!(
            "{}: no multi-token-prediction block is loaded",
            self.architecture()
        )))
    }
}

/// One sequence's part of a [`step_sequences`] call.
#[derive(Clone, Copy, Debug)]
pub struct SeqWork<'a> {
    pub seq: SeqId,
    pub tokens: &'a [TokenId],
    pub logits: LogitsFor,
    pub output: Output,
    /// See [`SeqInput::position_shift`].
    pub position_shift: isize,
}

/// Runs one step of `engine` over sequences kept in `memory`: grows each sequence's blocks
/// for its new tokens, steps them together (`logits[i]` gets sequence `work[i]`'s logits),
/// then records the tokens (full blocks enter the prefix cache).
pub fn step_sequences<E: Engine + ?Sized>(
    engine: &E,
    memory: &mut SequenceMemory,
    scratch: &mut StepScratch,
    work: &[SeqWork<'_>],
    logits: &mut [&mut Vec<f32>],
) -> Result<(), EngineError> {
    step_sequences_with(engine, memory, scratch, work, &[], logits)
}

/// [`step_sequences`] where sequence `work[i]` takes `embeddings[i]` in place of its tokens'
/// embeddings, if given (`embeddings` may be shorter than `work`: the rest take none).
pub fn step_sequences_with<E: Engine + ?Sized>(
    engine: &E,
    memory: &mut SequenceMemory,
    scratch: &mut StepScratch,
    work: &[SeqWork<'_>],
    embeddings: &[Option<InputEmbeddings<'_>>],
    logits: &mut [&mut Vec<f32>],
) -> Result<(), EngineError> {
    for w in work {
        let needed = memory.len(w.seq) + w.tokens.len();
        memory.grow(w.seq, needed)?;
    }
    let ids: SmallVec<[SeqId; 16]> = work.iter().map(|w| w.seq).collect();
    let inputs: SmallVec<[SeqInput<'_>; 16]> = work
        .iter()
        .enumerate()
        .map(|(i, w)| SeqInput {
            tokens: w.tokens,
            logits: w.logits,
            output: w.output,
            embeddings: embeddings.get(i).copied().flatten(),
            position_shift: w.position_shift,
        })
        .collect();
    let mut view = memory.view(&ids)?;
    engine.step(&mut view, scratch, &inputs, logits)?;
    drop(view);
    for w in work {
        memory.record(w.seq, w.tokens)?;
    }
    Ok(())
}

/// One sequence run on its own (`ferrox run`, `chat`, `perplexity`, `bench`): a memory of
/// one sequence of `context_size()` positions, the engine's scratch and the last logits.
pub struct State {
    memory: SequenceMemory,
    seq: SeqId,
    scratch: StepScratch,
    logits: Vec<f32>,
    position_shift: isize,
}

impl State {
    /// What the next steps add to their rows' cache positions to give their rotary
    /// positions ([`SeqInput::position_shift`]): set by whoever feeds images that take
    /// another number of rotary positions than rows, kept until set again.
    pub fn set_position_shift(&mut self, shift: isize) {
        self.position_shift = shift;
    }

    pub fn position_shift(&self) -> isize {
        self.position_shift
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.memory.len(self.seq)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of memory one position takes.
    pub fn bytes_per_position(&self) -> f64 {
        self.memory.bytes_per_position()
    }

    /// Forgets every position from `len` on (to re-use a shared prefix). An engine whose
    /// state cannot roll back there says so.
    pub fn truncate(&mut self, len: usize) -> Result<(), EngineError> {
        Ok(self.memory.rollback(self.seq, len)?)
    }

    /// Empties the sequence (always possible, whatever the engine keeps).
    pub fn reset(&mut self) {
        let max_len = self.memory.capacity_per_sequence();
        self.memory.release(self.seq);
        self.seq = self
            .memory
            .admit(&[], max_len)
            .expect("the memory's only sequence was just released")
            .seq;
    }

    /// Rolls back to the longest of `len` and the positions it can roll back to, emptying
    /// the sequence where it cannot roll back at all; returns the positions kept.
    pub fn truncate_or_reset(&mut self, len: usize) -> usize {
        if len == 0 || self.truncate(len).is_err() {
            self.reset();
            return 0;
        }
        len
    }

    /// The logits of the last step (`vocab_size` per requested token).
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }
}

/// Single-sequence use of any engine.
pub trait EngineExt: Engine {
    /// A fresh sequence (its memory allocated now: an error when it cannot be).
    fn new_state(&self) -> Result<State, EngineError> {
        let mut memory = SequenceMemory::solo(self.memory_spec(), self.context_size())?;
        let seq = memory
            .admit(&[], self.context_size())
            .map_err(|r| EngineError::State(format!("cannot admit a sequence: {r:?}")))?
            .seq;
        Ok(State {
            memory,
            seq,
            scratch: self.new_scratch(),
            logits: Vec::new(),
            position_shift: 0,
        })
    }

    /// Runs a batch of tokens at positions `start_pos..` (which must follow what the state
    /// holds) and returns the logits of the batch indices in `logits.range(tokens.len())`
    /// (`vocab_size()` each, in order).
    fn forward_batch<'s>(
        &self,
        tokens: &[TokenId],
        start_pos: usize,
        state: &'s mut State,
        logits: LogitsFor,
    ) -> Result<&'s [f32], EngineError> {
        self.forward_rows(tokens, start_pos, state, logits, Output::Logits)
    }

    /// [`forward_batch`](Self::forward_batch) giving back `output` for the rows in
    /// `rows.range(tokens.len())` (`output.width(self)` floats each, in order).
    fn forward_rows<'s>(
        &self,
        tokens: &[TokenId],
        start_pos: usize,
        state: &'s mut State,
        rows: LogitsFor,
        output: Output,
    ) -> Result<&'s [f32], EngineError> {
        self.forward_with(tokens, None, start_pos, state, rows, output)
    }

    /// The step behind [`forward_rows`](Self::forward_rows) and
    /// [`forward_embeddings`](Self::forward_embeddings).
    fn forward_with<'s>(
        &self,
        tokens: &[TokenId],
        embeddings: Option<InputEmbeddings<'_>>,
        start_pos: usize,
        state: &'s mut State,
        rows: LogitsFor,
        output: Output,
    ) -> Result<&'s [f32], EngineError> {
        let len = state.len();
        if start_pos != len {
            return Err(EngineError::Position {
                got: start_pos,
                len,
            });
        }
        let needed = len + tokens.len();
        if needed > self.context_size() {
            return Err(EngineError::ContextFull {
                needed,
                capacity: self.context_size(),
            });
        }
        let State {
            memory,
            seq,
            scratch,
            logits: out,
            position_shift,
        } = state;
        let work = SeqWork {
            seq: *seq,
            tokens,
            logits: rows,
            output,
            position_shift: *position_shift,
        };
        step_sequences_with(self, memory, scratch, &[work], &[embeddings], &mut [out])?;
        Ok(&state.logits)
    }

    /// [`forward_rows`](Self::forward_rows) with `embeddings` in place of the tokens'
    /// embeddings (`tokens` then only name the positions), as an image is fed.
    fn forward_embeddings<'s>(
        &self,
        tokens: &[TokenId],
        embeddings: InputEmbeddings<'_>,
        start_pos: usize,
        state: &'s mut State,
        rows: LogitsFor,
    ) -> Result<&'s [f32], EngineError> {
        self.forward_with(
            tokens,
            Some(embeddings),
            start_pos,
            state,
            rows,
            Output::Logits,
        )
    }

    /// Drafts up to `max` tokens to follow `token`, which is to be fed at the state's next
    /// position, with the engine's multi-token-prediction block ([`Engine::draft_mtp`]).
    fn draft_mtp_next(
        &self,
        state: &mut State,
        token: TokenId,
        max: usize,
        out: &mut Vec<TokenId>,
    ) -> Result<(), EngineError> {
        out.clear();
        let pos = state.len();
        let max = max.min(self.context_size().saturating_sub(pos + 1));
        if max == 0 || pos == 0 {
            return Ok(());
        }
        let State {
            memory,
            seq,
            scratch,
            ..
        } = state;
        memory.grow(*seq, pos + max - 1)?;
        let mut view = memory.view(&[*seq])?;
        self.draft_mtp(&mut view, scratch, 0, token, pos, max, out)
    }

    /// Runs one token at position `pos` and returns the next-token logits.
    fn forward_token<'s>(
        &self,
        token: TokenId,
        pos: usize,
        state: &'s mut State,
    ) -> Result<&'s [f32], EngineError> {
        self.forward_batch(&[token], pos, state, LogitsFor::Last)
    }
}

impl<E: Engine + ?Sized> EngineExt for E {}
