//! Constrained decoding over llguidance: grammars (JSON schema, GBNF, Lark, regular
//! expressions) compiled against the model's vocabulary into per-sequence token matchers.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrox_models::generate::{Constraint, ConstraintSource, TokenConstraint};
use ferrox_models::tokenizer::{TokenId, Tokenizer};
use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{self, SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
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
    /// Longest a compilation may take.
    pub timeout: Duration,
}

/// Grammars and schemas are limited to this size (bytes of source).
pub const MAX_GRAMMAR_BYTES: usize = 1 << 20;

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
    /// layout unless it states one.
    pub fn to_grammar(spec: &GrammarSpec) -> Result<TopLevelGrammar, String> {
        Ok(match spec {
            GrammarSpec::JsonSchema(schema) => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err("the JSON schema must be an object".into());
                }
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

    /// Compiles a spec; the error names the problem. A compilation that takes longer than
    /// [`ConstraintCompiler::timeout`] fails (it goes on in the background, bounded by
    /// llguidance's own limits, and its result is dropped).
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint, String> {
        let size = match spec {
            GrammarSpec::JsonSchema(v) => v.to_string().len(),
            GrammarSpec::JsonObject => 0,
            GrammarSpec::Gbnf(s) | GrammarSpec::Lark(s) => s.len(),
        };
        if size > MAX_GRAMMAR_BYTES {
            return Err(format!(
                "the {} is {size} bytes long; the limit is {MAX_GRAMMAR_BYTES}",
                spec.kind()
            ));
        }
        let grammar = Self::to_grammar(spec)?;
        let kind = spec.kind();
        let factory = self.factory.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let started = Instant::now();
        std::thread::Builder::new()
            .name("ferrox-grammar".into())
            .spawn(move || {
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut matcher = Matcher::new(factory.create_parser(grammar));
                    // The first mask builds the lexer's start: part of compiling.
                    matcher.compute_mask().map(|_| matcher)
                }));
                let _ = tx.send(result);
            })
            .map_err(|e| format!("cannot start compiling the {kind}: {e}"))?;
        let matcher = match rx.recv_timeout(self.timeout) {
            Ok(Ok(Ok(m))) => m,
            Ok(Ok(Err(e))) => return Err(format!("invalid {kind}: {}", clean_error(&e))),
            Ok(Err(_)) => return Err(format!("invalid {kind}: the compiler failed on it")),
            Err(_) => {
                return Err(format!(
                    "the {kind} did not compile within {:.1} s",
                    self.timeout.as_secs_f64()
                ))
            }
        };
        let matcher = match &matcher.get_error() {
            Some(e) => return Err(format!("invalid {kind}: {e}")),
            None => matcher,
        };
        let _ = started;
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
