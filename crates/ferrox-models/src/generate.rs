//! The generation loop every front end shares (CLI and server): prefill the prompt, then
//! sample, detokenize and check for the end until a limit, an end-of-generation token or a
//! stop string. The text side ([`Generation`]) is separate from the engine driver
//! ([`generate`]) so a scheduler that batches many sequences can step each one itself.

use std::time::{Duration, Instant};

use crate::engine::{Engine, EngineError, EngineExt, LogitsFor, State};
use crate::sampling::{logprob_of, top_logprobs, Sampler, SamplerParams};
use crate::stop::StopMatcher;
use crate::tokenizer::{StreamDecoder, TokenId, Tokenizer};

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
pub struct Step {
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
            params,
            generated: 0,
            finish: None,
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
    pub fn step(&mut self, logits: &[f32]) -> Step {
        let token = self.sampler.sample(logits);
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
            let piece = self.stream.push(token).to_string();
            let released = self.stop.push(&piece);
            text.push_str(&released.text);
            if released.stopped {
                self.finish = Some(FinishReason::Stop);
            } else if self.params.max_tokens.is_some_and(|m| self.generated >= m) {
                self.end(FinishReason::Length, &mut text);
            }
        }
        Step {
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
        let tail = self.stream.flush().to_string();
        let released = self.stop.push(&tail);
        text.push_str(&released.text);
        if !released.stopped {
            text.push_str(&self.stop.flush());
        }
        self.finish = Some(if released.stopped {
            FinishReason::Stop
        } else {
            reason
        });
    }
}

/// Timing of one generation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    pub prompt_tokens: usize,
    pub prompt_time: Duration,
    pub generated_tokens: usize,
    pub generation_time: Duration,
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
/// prompt starts. `on_step` sees every step as it happens and may return `false` to stop
/// early (the outcome then says `Stop`).
pub fn generate<E: Engine + ?Sized>(
    engine: &E,
    state: &mut State,
    start_pos: usize,
    tokenizer: &Tokenizer,
    prompt: &[TokenId],
    params: &GenerationParams,
    mut on_step: impl FnMut(&Step) -> bool,
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

    let mut generation = Generation::new(tokenizer, params.clone(), prompt);
    let mut tokens = Vec::new();
    let mut text = String::new();
    let mut pos = start_pos + prompt.len();
    let started = Instant::now();
    let finish = loop {
        let step = generation.step(&logits);
        tokens.push(step.token);
        text.push_str(&step.text);
        let go_on = on_step(&step);
        if let Some(reason) = step.finish {
            break reason;
        }
        if !go_on {
            break FinishReason::Stop;
        }
        if pos >= capacity {
            let tail = generation.end_for_length();
            if !tail.is_empty() {
                let last = Step {
                    text: tail,
                    finish: Some(FinishReason::Length),
                    ..step
                };
                text.push_str(&last.text);
                on_step(&last);
            }
            break FinishReason::Length;
        }
        let next = engine.forward_token(step.token, pos, state)?;
        logits.copy_from_slice(next);
        pos += 1;
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
