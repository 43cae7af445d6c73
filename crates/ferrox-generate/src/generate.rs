//! The generation loop every front end shares (CLI and server): prefill the prompt, then
//! sample, detokenize and check for the end until a limit, an end-of-generation token or a
//! stop string. The text side ([`Generation`]) is separate from the engine driver
//! ([`generate`]) so a scheduler that batches many sequences can sample each one itself.

use std::time::{Duration, Instant};

use crate::draft_model::ModelDrafter;
use crate::sampling::{logprob_of, top_logprobs, Sampler, SamplerParams};
use ferrox_engine::{Engine, EngineError, EngineExt, LogitsFor, State};
use ferrox_tokenizer::stop::StopMatcher;
use ferrox_tokenizer::tokenizer::{StreamDecoder, TokenId, Tokenizer};

/// What to generate.
#[derive(Clone, Debug, Default)]
pub struct GenerationParams {
    /// `None`: until an end-of-generation token or a full context.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub sampler: SamplerParams,
    /// Alternatives to report per generated token (0: none).
    pub top_logprobs: usize,
    /// Report the chosen token's log-probability.
    pub logprobs: bool,
    /// Keep going past end-of-generation tokens.
    pub ignore_eog: bool,
    /// Speculative decoding in [`generate`].
    pub draft: Draft,
    /// Restricts which tokens may come next (a grammar or JSON schema); each generation
    /// starts its own matcher from it.
    pub constraint: Option<Constraint>,
    /// Control tokens whose text is part of the output (a tool-call format's markers);
    /// other control tokens print nothing.
    pub preserve: Vec<TokenId>,
}

/// A per-sequence token filter: which tokens may come next, given those accepted so far.
pub trait TokenConstraint: Send {
    /// Computes the set of tokens allowed next. Called ahead of [`TokenConstraint::apply`]
    /// (while the forward pass that produces the logits runs); `apply` computes it itself
    /// when this was not called.
    fn prepare(&mut self);
    /// Sets the logits of the tokens not allowed next to minus infinity.
    fn apply(&mut self, logits: &mut [f32]);
    /// Advances past the chosen token.
    fn accept(&mut self, token: TokenId);
    /// Nothing more can follow: the generation ends here.
    fn finished(&self) -> bool;
}

/// Starts fresh [`TokenConstraint`]s for one compiled grammar.
pub trait ConstraintSource: Send + Sync {
    fn start(&self) -> Box<dyn TokenConstraint>;
    /// What it constrains to, for logs and debugging.
    fn describe(&self) -> String;
}

/// A shared [`ConstraintSource`].
#[derive(Clone)]
pub struct Constraint(pub std::sync::Arc<dyn ConstraintSource>);

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Constraint({})", self.0.describe())
    }
}

/// How [`generate`] proposes tokens to check several at a time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Draft {
    #[default]
    None,
    /// Prompt lookup: the tokens that followed the latest earlier occurrence of the text's
    /// last n-gram (longest n first), up to `max` of them, none when fewer than `min` would
    /// be proposed.
    NGram { min: usize, max: usize },
    /// The engine's multi-token-prediction block ([`Engine::draft_mtp`]): up to `max` of
    /// its greedy tokens, none when fewer than `min`.
    Mtp { min: usize, max: usize },
}

/// The n-gram lengths prompt lookup tries, longest first.
const LOOKUP_NGRAMS: std::ops::RangeInclusive<usize> = 1..=LOOKUP_MAX_NGRAM;

/// Prompt lookup: up to `max` tokens that followed the most recent earlier occurrence of the
/// last n tokens of `history` (the longest n with a match).
pub fn lookup_draft(history: &[TokenId], max: usize, out: &mut Vec<TokenId>) {
    lookup_draft_ngram(history, max, out);
}

/// [`lookup_draft`], returning the length of the n-gram that matched.
pub fn lookup_draft_ngram(
    history: &[TokenId],
    max: usize,
    out: &mut Vec<TokenId>,
) -> Option<usize> {
    out.clear();
    for n in LOOKUP_NGRAMS.rev() {
        if history.len() <= n {
            continue;
        }
        let pattern = &history[history.len() - n..];
        let earlier = &history[..history.len() - 1];
        if let Some(i) = earlier
            .windows(n)
            .rposition(|w| w == pattern)
            .filter(|&i| i + n < history.len())
        {
            let from = i + n;
            out.extend(history[from..].iter().take(max));
            return Some(n);
        }
    }
    None
}

/// How many prompt-lookup tokens are worth checking: each drafted token costs a row of the
/// step (on a CPU, with a large vocabulary's output head, not much less than a step of its
/// own), so the draft is only as long as its tokens are likely to be kept. The pacer keeps a
/// running per-token acceptance rate for each matched n-gram length (a long match predicts
/// better than a one-token match) and drafts `k` tokens while rate^k >= 1/2; under a rate of
/// 1/2 it drafts nothing, and the rate creeps back up with every step without a draft so
/// that it is tried again now and then.
#[derive(Clone, Debug)]
pub struct DraftPacer {
    /// Per-token acceptance, indexed by the n-gram length.
    rate: [f32; LOOKUP_MAX_NGRAM + 1],
}

const LOOKUP_MAX_NGRAM: usize = 4;
/// Weight of one checked token in the running rate.
const PACER_STEP: f32 = 0.15;
/// Recovery per step without a draft.
const PACER_RECOVERY: f32 = 0.005;
/// A drafted token must have at least this chance of being reached and kept.
const PACER_KEEP: f32 = 0.5;

impl Default for DraftPacer {
    fn default() -> Self {
        DraftPacer {
            rate: [0.6; LOOKUP_MAX_NGRAM + 1],
        }
    }
}

impl DraftPacer {
    /// Tokens worth drafting after a match of `n` tokens (at most `max`).
    pub fn length(&self, n: usize, max: usize) -> usize {
        let a = self.rate[n.min(LOOKUP_MAX_NGRAM)];
        if a < PACER_KEEP {
            return 0;
        }
        if a >= 0.999 {
            return max;
        }
        ((PACER_KEEP.ln() / a.ln()).floor() as usize).clamp(1, max)
    }

    /// Records a checked draft of `drafted` tokens after an `n`-token match, of which the
    /// first `accepted` were kept.
    pub fn record(&mut self, n: usize, drafted: usize, accepted: usize) {
        let a = &mut self.rate[n.min(LOOKUP_MAX_NGRAM)];
        for _ in 0..accepted {
            *a += PACER_STEP * (1.0 - *a);
        }
        if accepted < drafted {
            *a -= PACER_STEP * *a;
        }
    }

    /// A step went by without a draft after an `n`-token match.
    pub fn idle(&mut self, n: usize) {
        let a = &mut self.rate[n.min(LOOKUP_MAX_NGRAM)];
        *a = (*a + PACER_RECOVERY).min(1.0);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// The token limit or a full context.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// One generated token and the text it released.
#[derive(Clone, Debug)]
pub struct Sampled {
    pub token: TokenId,
    /// Complete UTF-8 text now safe to show (may be empty while a character or a possible
    /// stop string is incomplete).
    pub text: String,
    pub finish: Option<FinishReason>,
    /// log-softmax of the raw logits at the chosen token, when asked for.
    pub logprob: Option<f32>,
    pub top_logprobs: Vec<(TokenId, f32)>,
}

/// The text side of one sequence's generation.
pub struct Generation<'t> {
    tokenizer: &'t Tokenizer,
    sampler: Sampler,
    stream: StreamDecoder<'t>,
    stop: StopMatcher,
    params: GenerationParams,
    generated: usize,
    finish: Option<FinishReason>,
    constraint: Option<Box<dyn TokenConstraint>>,
    /// The logits with the constraint's mask applied.
    masked: Vec<f32>,
    /// The latest generated text, long enough to hold any stop string.
    recent: String,
    /// The stop string that ended the generation.
    stopped_by: Option<String>,
}

impl<'t> Generation<'t> {
    /// Starts a generation after `prompt` (whose tokens feed the repetition penalties).
    pub fn new(
        tokenizer: &'t Tokenizer,
        params: GenerationParams,
        prompt: &[TokenId],
    ) -> Generation<'t> {
        let mut sampler = Sampler::new(params.sampler.clone());
        for &t in prompt {
            sampler.accept(t);
        }
        Generation {
            tokenizer,
            sampler,
            stream: tokenizer.stream_decoder(false),
            stop: StopMatcher::new(params.stop.iter().cloned()),
            constraint: params.constraint.as_ref().map(|c| c.0.start()),
            params,
            generated: 0,
            finish: None,
            masked: Vec::new(),
            recent: String::new(),
            stopped_by: None,
        }
    }

    /// The stop string that ended the generation, if one did.
    pub fn stopped_by(&self) -> Option<&str> {
        self.stopped_by.as_deref()
    }

    /// Remembers generated text and, when a stop string just matched, which one: the
    /// earliest occurrence in the recent text (only the newest text can complete one).
    fn track_stop(&mut self, piece: &str, stopped: bool) {
        let longest = self.params.stop.iter().map(String::len).max().unwrap_or(0);
        if longest == 0 {
            return;
        }
        self.recent.push_str(piece);
        if stopped {
            self.stopped_by = self
                .params
                .stop
                .iter()
                .filter(|s| !s.is_empty())
                .filter_map(|s| self.recent.find(s.as_str()).map(|at| (at, s)))
                .min_by_key(|&(at, _)| at)
                .map(|(_, s)| s.clone());
        }
        let keep = 2 * longest;
        if self.recent.len() > 2 * keep {
            let mut cut = self.recent.len() - keep;
            while !self.recent.is_char_boundary(cut) {
                cut += 1;
            }
            self.recent.drain(..cut);
        }
    }

    /// Whether a constraint filters this generation's tokens.
    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// Takes the constraint out (to compute its next mask on another thread); give it back
    /// with [`Generation::restore_constraint`] before the next [`Generation::sample`].
    pub fn take_constraint(&mut self) -> Option<Box<dyn TokenConstraint>> {
        self.constraint.take()
    }

    pub fn restore_constraint(&mut self, constraint: Box<dyn TokenConstraint>) {
        self.constraint = Some(constraint);
    }

    /// Computes the constraint's next mask now (see [`TokenConstraint::prepare`]).
    pub fn prepare_constraint(&mut self) {
        if let Some(c) = &mut self.constraint {
            c.prepare();
        }
    }

    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.finish
    }

    pub fn generated(&self) -> usize {
        self.generated
    }

    /// Whether another token may be generated (not finished, under the limit).
    pub fn wants_more(&self) -> bool {
        self.finish.is_none()
    }

    /// Picks the next token from `logits` and advances the text.
    pub fn sample(&mut self, logits: &[f32]) -> Sampled {
        let token = self.pick(logits, |sampler, l| sampler.sample(l));
        self.advance(token, logits)
    }

    /// Like [`Generation::sample`] for a row whose token a draft model proposed, drawn from its
    /// distribution `q`: speculative sampling keeps `proposed` or draws another token so that
    /// the token follows the same distribution `sample` draws from (see
    /// [`Sampler::sample_speculative`]).
    pub fn sample_speculative(
        &mut self,
        logits: &[f32],
        proposed: TokenId,
        q: &[(TokenId, f32)],
    ) -> Sampled {
        let token = self.pick(logits, |sampler, l| {
            sampler.sample_speculative(l, proposed, q).0
        });
        self.advance(token, logits)
    }

    /// Chooses a token with `choose` from the logits the constraint allows.
    fn pick(
        &mut self,
        logits: &[f32],
        choose: impl FnOnce(&mut Sampler, &[f32]) -> TokenId,
    ) -> TokenId {
        match &mut self.constraint {
            Some(c) => {
                self.masked.clear();
                self.masked.extend_from_slice(logits);
                c.apply(&mut self.masked);
                let token = choose(&mut self.sampler, &self.masked);
                c.accept(token);
                token
            }
            None => choose(&mut self.sampler, logits),
        }
    }

    /// Advances the text past `token`, chosen from `logits`.
    fn advance(&mut self, token: TokenId, logits: &[f32]) -> Sampled {
        self.sampler.accept(token);
        self.generated += 1;
        let logprob = self.params.logprobs.then(|| logprob_of(logits, token));
        let top = if self.params.top_logprobs > 0 {
            top_logprobs(logits, self.params.top_logprobs)
        } else {
            Vec::new()
        };
        let mut text = String::new();
        if self.tokenizer.vocab().is_eog(token) && !self.params.ignore_eog {
            self.end(FinishReason::Stop, &mut text);
        } else {
            let piece = if self.params.preserve.contains(&token) {
                self.stream
                    .push_bytes(self.tokenizer.token_to_piece(token))
                    .to_string()
            } else {
                self.stream.push(token).to_string()
            };
            let released = self.stop.push(&piece);
            self.track_stop(&piece, released.stopped);
            text.push_str(&released.text);
            if released.stopped {
                self.finish = Some(FinishReason::Stop);
            } else if self.constraint.as_ref().is_some_and(|c| c.finished()) {
                self.end(FinishReason::Stop, &mut text);
            } else if self.params.max_tokens.is_some_and(|m| self.generated >= m) {
                self.end(FinishReason::Length, &mut text);
            }
        }
        Sampled {
            token,
            text,
            finish: self.finish,
            logprob,
            top_logprobs: top,
        }
    }

    /// Ends the generation because the context is full; returns any held-back text.
    pub fn end_for_length(&mut self) -> String {
        let mut text = String::new();
        if self.finish.is_none() {
            self.end(FinishReason::Length, &mut text);
        }
        text
    }

    fn end(&mut self, reason: FinishReason, text: &mut String) {
        // The bytes of a character the last token left incomplete are not text: left out,
        // as llama-server leaves them out.
        self.stream.discard_incomplete();
        text.push_str(&self.stop.flush());
        self.finish = Some(reason);
    }
}

/// Timing of one generation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    pub prompt_tokens: usize,
    pub prompt_time: Duration,
    pub generated_tokens: usize,
    pub generation_time: Duration,
    /// Tokens drafted and checked, and how many of them were kept.
    pub drafted_tokens: usize,
    pub accepted_tokens: usize,
}

impl Timings {
    pub fn prompt_tokens_per_second(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_time.as_secs_f64().max(1e-9)
    }

    pub fn generation_tokens_per_second(&self) -> f64 {
        self.generated_tokens as f64 / self.generation_time.as_secs_f64().max(1e-9)
    }
}

/// What a finished generation produced.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub tokens: Vec<TokenId>,
    pub text: String,
    pub finish: FinishReason,
    pub timings: Timings,
}

/// Generates after `prompt` on a fresh or truncated `state` whose length is where the
/// prompt starts. `on_token` sees every token as it comes and may return `false` to stop
/// early (the outcome then says `Stop`).
///
/// With a [`Draft`], the tokens it proposes are checked together with the token just chosen
/// in one step, and each of their logits rows is sampled in order exactly as a plain step
/// would sample it: the output is the same as without drafting (the engines' steps give a
/// position the same logits whether it comes alone or with others), and a rejected draft is
/// rolled back. Engines whose state cannot roll back run without drafting.
pub fn generate<E: Engine + ?Sized>(
    engine: &E,
    state: &mut State,
    start_pos: usize,
    tokenizer: &Tokenizer,
    prompt: &[TokenId],
    params: &GenerationParams,
    on_token: impl FnMut(&Sampled) -> bool,
) -> Result<Outcome, EngineError> {
    generate_speculative(
        engine, state, start_pos, tokenizer, prompt, params, None, on_token,
    )
}

/// [`generate`], with a draft model proposing the tokens when `drafter` is given (it then
/// takes the place of `params.draft`). Greedy output is the target's greedy output token for
/// token; sampled output keeps the target's distribution through speculative sampling
/// ([`Generation::sample_speculative`]).
#[allow(clippy::too_many_arguments)]
pub fn generate_speculative<E: Engine + ?Sized>(
    engine: &E,
    state: &mut State,
    start_pos: usize,
    tokenizer: &Tokenizer,
    prompt: &[TokenId],
    params: &GenerationParams,
    mut drafter: Option<&mut ModelDrafter<'_>>,
    mut on_token: impl FnMut(&Sampled) -> bool,
) -> Result<Outcome, EngineError> {
    let capacity = engine.context_size();
    if start_pos + prompt.len() > capacity {
        return Err(EngineError::ContextFull {
            needed: start_pos + prompt.len(),
            capacity,
        });
    }
    let mut timings = Timings {
        prompt_tokens: prompt.len(),
        ..Timings::default()
    };
    let started = Instant::now();
    let mut logits = engine
        .forward_batch(prompt, start_pos, state, LogitsFor::Last)?
        .to_vec();
    timings.prompt_time = started.elapsed();

    // Rejected draft tokens are rolled back: never more than the memory can drop.
    let reach = engine.memory_spec().rollback_reach();
    let draft = match params.draft {
        Draft::NGram { .. } | Draft::Mtp { .. } if reach == 0 => Draft::None,
        d => d,
    };
    if reach == 0 {
        drafter = None;
    }
    let n_vocab = logits.len();
    let mut generation = Generation::new(tokenizer, params.clone(), prompt);
    // The whole text for a draft model (its earlier turns included); the prompt and what
    // follows for prompt lookup.
    let mut history: Vec<TokenId> = match &drafter {
        Some(d) => d.context().to_vec(),
        None => Vec::new(),
    };
    history.extend_from_slice(prompt);
    let mut proposer = Proposer {
        drafter,
        draft,
        temperature: params.sampler.temperature,
        pacer: DraftPacer::default(),
        matched: None,
        drafts: Vec::new(),
        dists: Vec::new(),
    };
    let (mut batch, mut rows) = (Vec::new(), Vec::new());
    let mut tokens = Vec::new();
    let mut text = String::new();
    let mut pos = start_pos + prompt.len();
    let started = Instant::now();
    // Takes a chosen token: Some(reason) when the generation ends with it.
    let mut emit = |step: Sampled, pos: usize, generation: &mut Generation<'_>| {
        tokens.push(step.token);
        text.push_str(&step.text);
        let go_on = on_token(&step);
        if let Some(reason) = step.finish {
            return Some(reason);
        }
        if !go_on {
            return Some(FinishReason::Stop);
        }
        if pos >= capacity {
            let tail = generation.end_for_length();
            if !tail.is_empty() {
                let last = Sampled {
                    text: tail,
                    finish: Some(FinishReason::Length),
                    ..step
                };
                text.push_str(&last.text);
                on_token(&last);
            }
            return Some(FinishReason::Length);
        }
        None
    };
    let finish = 'generate: loop {
        let step = generation.sample(&logits);
        let mut token = step.token;
        if let Some(reason) = emit(step, pos, &mut generation) {
            break reason;
        }
        // Feed `token`, with what the draft proposes after it.
        'feed: loop {
            history.push(token);
            let room = (capacity - pos - 1).min(reach);
            proposer.propose(engine, state, &history, token, room)?;
            if proposer.drafts.is_empty() {
                forward_token(engine, state, token, pos, &mut generation, &mut logits)?;
                pos += 1;
                continue 'generate;
            }
            let (drafts, dists) = (&proposer.drafts, &proposer.dists);
            timings.drafted_tokens += drafts.len();
            batch.clear();
            batch.push(token);
            batch.extend_from_slice(drafts);
            rows.clear();
            rows.extend_from_slice(engine.forward_batch(&batch, pos, state, LogitsFor::All)?);
            pos += 1;
            for (j, &proposed) in drafts.iter().enumerate() {
                let row = &rows[j * n_vocab..(j + 1) * n_vocab];
                let step = match dists.get(j) {
                    Some(q) if proposer.drafter.is_some() => {
                        generation.sample_speculative(row, proposed, q)
                    }
                    _ => generation.sample(row),
                };
                let chosen = step.token;
                if let Some(n) = proposer.matched {
                    if chosen != proposed {
                        proposer.pacer.record(n, j + 1, j);
                    } else if j + 1 == drafts.len() {
                        proposer.pacer.record(n, j + 1, j + 1);
                    }
                }
                if let Some(reason) = emit(step, pos, &mut generation) {
                    state.truncate(pos)?;
                    break 'generate reason;
                }
                if chosen != proposed {
                    // The rest of the draft is wrong: forget it, feed the token chosen.
                    state.truncate(pos)?;
                    token = chosen;
                    continue 'feed;
                }
                history.push(chosen);
                timings.accepted_tokens += 1;
                pos += 1;
            }
            let k = drafts.len();
            logits.copy_from_slice(&rows[k * n_vocab..(k + 1) * n_vocab]);
            continue 'generate;
        }
    };
    timings.generated_tokens = tokens.len();
    timings.generation_time = started.elapsed();
    Ok(Outcome {
        tokens,
        text,
        finish,
        timings,
    })
}

/// What proposes the tokens [`generate_speculative`] checks: a draft model, prompt lookup
/// or the model's multi-token-prediction block (`draft`).
struct Proposer<'a, 'd> {
    drafter: Option<&'a mut ModelDrafter<'d>>,
    draft: Draft,
    temperature: f32,
    pacer: DraftPacer,
    /// The n-gram length of the prompt-lookup match behind the current draft.
    matched: Option<usize>,
    drafts: Vec<TokenId>,
    /// A draft model's distribution behind each drafted token.
    dists: Vec<crate::draft_model::DraftDistribution>,
}

impl Proposer<'_, '_> {
    /// Fills `drafts` with at most `room` tokens to follow `history` (whose last token,
    /// `token`, is about to be fed); empty when there is nothing worth checking.
    fn propose<E: Engine + ?Sized>(
        &mut self,
        engine: &E,
        state: &mut State,
        history: &[TokenId],
        token: TokenId,
        room: usize,
    ) -> Result<(), EngineError> {
        let (drafts, dists) = (&mut self.drafts, &mut self.dists);
        if let Some(d) = self.drafter.as_deref_mut() {
            return d.propose(history, room, self.temperature, drafts, dists);
        }
        drafts.clear();
        dists.clear();
        match self.draft {
            Draft::NGram { min, max } => {
                self.matched = lookup_draft_ngram(history, room.min(max), drafts);
                if let Some(n) = self.matched {
                    drafts.truncate(self.pacer.length(n, max));
                    if drafts.is_empty() {
                        self.pacer.idle(n);
                    }
                }
                if drafts.len() < min.max(1) {
                    drafts.clear();
                }
            }
            Draft::Mtp { min, max } => {
                engine.draft_mtp_next(state, token, room.min(max), drafts)?;
                if drafts.len() < min.max(1) {
                    drafts.clear();
                }
            }
            Draft::None => {}
        }
        Ok(())
    }
}

/// Feeds one token and puts its logits in `logits`. A constrained generation's next mask
/// depends only on the tokens so far: it is computed while the forward pass computes the
/// logits it will filter.
fn forward_token<E: Engine + ?Sized>(
    engine: &E,
    state: &mut State,
    token: TokenId,
    pos: usize,
    generation: &mut Generation<'_>,
    logits: &mut [f32],
) -> Result<(), EngineError> {
    if !generation.is_constrained() {
        logits.copy_from_slice(engine.forward_token(token, pos, state)?);
        return Ok(());
    }
    std::thread::scope(|scope| {
        let mask = scope.spawn(|| generation.prepare_constraint());
        let result = engine
            .forward_token(token, pos, state)
            .map(|l| logits.copy_from_slice(l));
        if let Err(panic) = mask.join() {
            std::panic::resume_unwind(panic);
        }
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacer_drafts_longer_as_drafts_are_kept_and_stops_when_they_are_not() {
        let mut pacer = DraftPacer::default();
        assert_eq!(pacer.length(4, 16), 1);
        for _ in 0..4 {
            pacer.record(4, 8, 8);
        }
        let long = pacer.length(4, 16);
        assert!(long > 2, "{long}");
        // Other match lengths keep their own record.
        assert_eq!(pacer.length(1, 16), 1);
        for _ in 0..6 {
            pacer.record(1, 1, 0);
        }
        assert_eq!(pacer.length(1, 16), 0);
        // Steps without a draft bring it back, slowly.
        let mut steps = 0;
        while pacer.length(1, 16) == 0 {
            pacer.idle(1);
            steps += 1;
        }
        assert!(steps > 10, "{steps}");
        assert_eq!(pacer.length(4, 3), 3.min(long));
    }
}
