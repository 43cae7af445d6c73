//! Constrained decoding over llguidance: grammars (JSON schema, GBNF, Lark, regular
//! expressions) compiled against the model's vocabulary into per-sequence token matchers.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ferrox_generate::generate::{Constraint, ConstraintSource, TokenConstraint};
use ferrox_tokenizer::tokenizer::{TokenId, Tokenizer};
use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{self, SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{CancellationHandle, Matcher, ParserFactory};
use serde_json::Value;

/// What a generation is constrained to.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// A JSON schema (`response_format: json_schema`, llama-server's `json_schema`).
    JsonSchema(Value),
    /// Any JSON object (`response_format: json_object`).
    JsonObject,
    /// llama.cpp's GBNF.
    Gbnf(String),
    /// llguidance's Lark-like syntax.
    Lark(String),
}

impl GrammarSpec {
    fn kind(&self) -> &'static str {
        match self {
            GrammarSpec::JsonSchema(_) => "JSON schema",
            GrammarSpec::JsonObject => "JSON object",
            GrammarSpec::Gbnf(_) => "GBNF grammar",
            GrammarSpec::Lark(_) => "Lark grammar",
        }
    }
}

/// How JSON is laid out when a schema does not say (`x-guidance`): one line, with a space
/// after `,` and `:` as most JSON a model has read (Python's `json.dumps`). Flexible
/// whitespace lets a small model pad forever.
fn json_options() -> Value {
    serde_json::json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
    })
}

/// The schema with ferrox's layout options, unless it brings its own.
pub fn schema_with_layout(mut schema: Value) -> Value {
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance").or_insert_with(json_options);
    }
    schema
}

/// A tool's schema with ferrox's layout, lenient: keywords llguidance does not enforce are
/// ignored rather than refused (agents send schemas written for other engines; the
/// client's own `response_format` schemas stay strict).
pub fn tool_schema_layout(mut schema: Value) -> Value {
    if let Value::Object(map) = &mut schema {
        let mut options = json_options();
        options["lenient"] = Value::Bool(true);
        map.insert("x-guidance".into(), options);
    }
    schema
}

/// The vocabulary as llguidance sees it.
struct Env {
    tokenizer: Arc<Tokenizer>,
    trie: TokTrie,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<toktrie::TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => self.tokenizer.encode(text, false, false),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// Compiles grammars for one model's vocabulary.
pub struct ConstraintCompiler {
    factory: Arc<ParserFactory>,
    n_vocab: usize,
    /// Longest a compilation may take, waiting for a compiling thread included.
    pub timeout: Duration,
}

/// Grammars and schemas are limited to this size (bytes of source).
pub const MAX_GRAMMAR_BYTES: usize = 1 << 20;

/// Most compilations that run at once in the process (those past their timeout, until they
/// end, included): hostile grammars beyond that wait, then fail as busy, rather than taking
/// the cores generation runs on.
pub const MAX_CONCURRENT_COMPILES: usize = 2;

/// A compiling thread's stack. Compilation recurses over the grammar's nesting (bounded by
/// [`crate::gbnf::MAX_NESTING`] and [`crate::schema_depth::MAX_SCHEMA_DEPTH`]); this leaves
/// a wide margin over what those bounds need. Only the pages touched are committed.
const COMPILE_STACK_BYTES: usize = 64 << 20;

/// Why a grammar was not compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompileError {
    /// The grammar or schema is invalid, too large, or too costly (HTTP 400).
    Invalid(String),
    /// Other compilations hold every compiling thread (HTTP 503: try again).
    Busy(String),
}

impl std::fmt::Display for CompileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CompileError::Invalid(m) | CompileError::Busy(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for CompileError {}

/// A counting semaphore over the compiling threads.
struct Slots {
    running: Mutex<usize>,
    freed: Condvar,
}

static SLOTS: Slots = Slots {
    running: Mutex::new(0),
    freed: Condvar::new(),
};

/// One compiling thread's slot, given back when dropped (when the thread ends).
struct Slot(&'static Slots);

impl Slots {
    fn acquire(&'static self, deadline: Instant) -> Option<Slot> {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let wait = deadline.saturating_duration_since(Instant::now());
        let (mut running, _) = self
            .freed
            .wait_timeout_while(running, wait, |n| *n >= MAX_CONCURRENT_COMPILES)
            .unwrap_or_else(|e| e.into_inner());
        if *running >= MAX_CONCURRENT_COMPILES {
            return None;
        }
        *running += 1;
        Some(Slot(self))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *self.0.running.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        self.0.freed.notify_one();
    }
}

/// Compiling threads yield to generation: a grammar compiled while the batch decodes
/// takes little of the cores the decode step's threads run on.
fn lower_thread_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain system calls on the calling thread; no memory is shared.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
}

fn rename_thread(name: &std::ffi::CStr) {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, name.as_ptr());
    }
    #[cfg(not(target_os = "linux"))]
    let _ = name;
}

/// Where a timed-out compilation is told to stop: the matcher's cancellation handle once
/// it exists, and whether the caller gave up.
#[derive(Default)]
struct Abandon {
    handle: Option<CancellationHandle>,
    abandoned: bool,
}

impl ConstraintCompiler {
    /// Builds the vocabulary's byte trie; `n_vocab` is the logits row's length (it may be
    /// longer than the tokenizer's vocabulary: the rest is never allowed).
    pub fn new(tokenizer: Arc<Tokenizer>, n_vocab: usize) -> anyhow::Result<ConstraintCompiler> {
        let vocab = tokenizer.vocab();
        let words: Vec<Vec<u8>> = (0..n_vocab)
            .map(|i| {
                let id = i as TokenId;
                if i >= vocab.len() {
                    return Vec::new();
                }
                let text = tokenizer.piece(id, false);
                if !text.is_empty() {
                    return text.to_vec();
                }
                // Control tokens are only reachable by name (`<|im_end|>` in a Lark
                // grammar), never by text.
                let special = tokenizer.token_to_piece(id);
                if special.is_empty() {
                    Vec::new()
                } else {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(special);
                    w
                }
            })
            .collect();
        let eog: Vec<TokenId> = vocab
            .eog_ids()
            .filter(|&t| (t as usize) < n_vocab)
            .collect();
        let eos = vocab
            .eos()
            .filter(|&t| (t as usize) < n_vocab)
            .or(eog.first().copied())
            .unwrap_or(0);
        let mut info = TokRxInfo::new(n_vocab as u32, eos);
        info.tok_bos = vocab.bos();
        info.tok_end_of_turn = vocab.eot();
        let mut trie = TokTrie::from(&info, &words);
        if !eog.is_empty() {
            trie = trie.with_eos_tokens(&eog);
        }
        let env: TokEnv = Arc::new(Env { tokenizer, trie });
        let mut factory = ParserFactory::new_simple(&env)?;
        factory.quiet();
        factory.set_stderr_log_level(0);
        *factory.limits_mut() = ParserLimits {
            verbose_errors: false,
            ..ParserLimits::default()
        };
        Ok(ConstraintCompiler {
            factory: Arc::new(factory),
            n_vocab,
            timeout: Duration::from_secs(2),
        })
    }

    /// The llguidance grammar for a spec: GBNF is translated to Lark, JSON gets ferrox's
    /// layout unless it states one; a schema that would compile too deeply is refused.
    pub fn to_grammar(spec: &GrammarSpec) -> Result<TopLevelGrammar, String> {
        Ok(match spec {
            GrammarSpec::JsonSchema(schema) => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err("the JSON schema must be an object".into());
                }
                crate::schema_depth::check(schema)?;
                TopLevelGrammar::from_json_schema(schema_with_layout(schema.clone()))
            }
            GrammarSpec::JsonObject => TopLevelGrammar::from_json_schema(schema_with_layout(
                serde_json::json!({"type": "object"}),
            )),
            GrammarSpec::Gbnf(source) => {
                let lark = crate::gbnf::gbnf_to_lark(source).map_err(|e| e.to_string())?;
                TopLevelGrammar::from_lark(lark)
            }
            GrammarSpec::Lark(source) => TopLevelGrammar::from_lark(source.clone()),
        })
    }

    /// Compiles a spec; the error names the problem. Everything (translation included)
    /// runs on a compiling thread of its own, at most [`MAX_CONCURRENT_COMPILES`] at once,
    /// within [`ConstraintCompiler::timeout`]: past it the compilation is cancelled (the
    /// parser's construction, bounded by llguidance's limits, finishes first, still holding
    /// its slot) and this fails.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint, CompileError> {
        let size = match spec {
            GrammarSpec::JsonSchema(v) => v.to_string().len(),
            GrammarSpec::JsonObject => 0,
            GrammarSpec::Gbnf(s) | GrammarSpec::Lark(s) => s.len(),
        };
        let kind = spec.kind();
        if size > MAX_GRAMMAR_BYTES {
            return Err(CompileError::Invalid(format!(
                "the {kind} is {size} bytes long; the limit is {MAX_GRAMMAR_BYTES}"
            )));
        }
        let deadline = Instant::now() + self.timeout;
        let slot = SLOTS.acquire(deadline).ok_or_else(|| {
            CompileError::Busy(format!(
                "the server is busy compiling other grammars; the {kind} waited {:.1} s \
                 (try again)",
                self.timeout.as_secs_f64()
            ))
        })?;
        let factory = self.factory.clone();
        let spec = spec.clone();
        let abandon: Arc<Mutex<Abandon>> = Arc::default();
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let abandon = abandon.clone();
            std::thread::Builder::new()
                .name("ferrox-grammar".into())
                .stack_size(COMPILE_STACK_BYTES)
                .spawn(move || {
                    let _slot = slot;
                    lower_thread_priority();
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        let grammar = Self::to_grammar(&spec).map_err(CompileError::Invalid)?;
                        let mut matcher =
                            Matcher::new(factory.create_parser(grammar)).into_cancellable();
                        {
                            let mut abandon = abandon.lock().unwrap_or_else(|e| e.into_inner());
                            if abandon.abandoned {
                                return Err(CompileError::Invalid("abandoned".into()));
                            }
                            abandon.handle = matcher.cancellation_handle();
                        }
                        // The first mask builds the lexer's start: part of compiling.
                        match matcher.compute_mask() {
                            Ok(_) => Ok(matcher),
                            Err(e) => Err(CompileError::Invalid(format!(
                                "invalid {kind}: {}",
                                clean_error(&e)
                            ))),
                        }
                    }));
                    let _ = tx.send(result);
                    // The slot is given back as the closure returns; from here the thread
                    // only exits, and its name says so to whoever lists threads.
                    rename_thread(c"ferrox-grammar-");
                })
                .map_err(|e| {
                    CompileError::Busy(format!("cannot start compiling the {kind}: {e}"))
                })?;
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        let matcher = match rx.recv_timeout(wait) {
            Ok(Ok(Ok(m))) => m,
            Ok(Ok(Err(e))) => return Err(e),
            Ok(Err(_)) => {
                return Err(CompileError::Invalid(format!(
                    "invalid {kind}: the compiler failed on it"
                )))
            }
            Err(_) => {
                let mut abandon = abandon.lock().unwrap_or_else(|e| e.into_inner());
                abandon.abandoned = true;
                if let Some(handle) = &abandon.handle {
                    handle.cancel();
                }
                return Err(CompileError::Invalid(format!(
                    "the {kind} did not compile within {:.1} s",
                    self.timeout.as_secs_f64()
                )));
            }
        };
        if let Some(e) = matcher.get_error() {
            return Err(CompileError::Invalid(format!("invalid {kind}: {e}")));
        }
        let eos: Vec<TokenId> = self.factory.tok_env().tok_trie().eos_tokens().to_vec();
        Ok(Constraint(Arc::new(Compiled {
            matcher: Mutex::new(matcher),
            kind,
            eos,
            n_vocab: self.n_vocab,
        })))
    }
}

fn clean_error(e: &anyhow::Error) -> String {
    let text = format!("{e:#}");
    text.lines().take(4).collect::<Vec<_>>().join("; ")
}

struct Compiled {
    matcher: Mutex<Matcher>,
    kind: &'static str,
    eos: Vec<TokenId>,
    n_vocab: usize,
}

impl ConstraintSource for Compiled {
    fn start(&self) -> Box<dyn TokenConstraint> {
        let matcher = self
            .matcher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Box::new(Llg {
            matcher,
            mask: None,
            eos: self.eos.clone(),
            n_vocab: self.n_vocab,
        })
    }

    fn describe(&self) -> String {
        self.kind.to_string()
    }
}

/// One sequence's matcher.
struct Llg {
    matcher: Matcher,
    /// The mask for the next token, once computed.
    mask: Option<SimpleVob>,
    eos: Vec<TokenId>,
    n_vocab: usize,
}

impl TokenConstraint for Llg {
    fn prepare(&mut self) {
        if self.mask.is_none() {
            let mask = self.matcher.compute_mask_or_eos().unwrap_or_else(|_| {
                // A matcher in error allows only the end.
                let mut m = SimpleVob::alloc(self.n_vocab);
                for &t in &self.eos {
                    m.allow_token(t);
                }
                m
            });
            self.mask = Some(mask);
        }
    }

    fn apply(&mut self, logits: &mut [f32]) {
        self.prepare();
        let mask = self.mask.take().expect("prepared");
        let words = mask.as_slice();
        let mut any = false;
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX && chunk.len() == 32 {
                any = true;
                continue;
            }
            for (b, l) in chunk.iter_mut().enumerate() {
                if bits & (1 << b) == 0 {
                    *l = f32::NEG_INFINITY;
                } else {
                    any = true;
                }
            }
        }
        if !any {
            // Nothing allowed (cannot happen with a sound matcher): end the sequence.
            if let Some(&t) = self.eos.first() {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = 0.0;
                }
            }
        }
    }

    fn accept(&mut self, token: TokenId) {
        self.mask = None;
        let _ = self.matcher.consume_token(token);
    }

    fn finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}
