//! One type over every engine, chosen from the file's architecture, for front ends that run
//! whatever model they are given.

use std::sync::Arc;

use ferrox_core::KvSnapshot;
use ferrox_gguf::Gguf;

use crate::engine::{Engine, EngineError, LogitsFor};
use crate::families::MLA_ARCHITECTURES;
use crate::mla::{MlaEngine, MlaState};
use crate::tokenizer::TokenId;
use crate::{Decoder, DecoderOptions, DecoderState, ModelError};

/// The engine for a checkpoint: the dense decoder (dense and MoE-FFN families) or the
/// Multi-head Latent Attention engine.
pub enum AnyEngine {
    Dense(Decoder),
    Mla(MlaEngine),
}

/// The state of an [`AnyEngine`]'s sequence.
pub enum AnyState {
    Dense(DecoderState),
    Mla(MlaState),
}

impl AnyEngine {
    /// Picks the engine for `general.architecture`.
    pub fn from_gguf(gguf: Arc<Gguf>, options: &DecoderOptions) -> Result<AnyEngine, ModelError> {
        let arch = gguf.metadata().architecture()?.to_string();
        if MLA_ARCHITECTURES.contains(&arch.as_str()) {
            Ok(AnyEngine::Mla(MlaEngine::from_gguf(gguf, options)?))
        } else {
            Ok(AnyEngine::Dense(Decoder::from_gguf(gguf, options)?))
        }
    }

    pub fn gguf(&self) -> &Gguf {
        match self {
            AnyEngine::Dense(e) => e.gguf(),
            AnyEngine::Mla(e) => e.gguf(),
        }
    }

    pub fn threads(&self) -> usize {
        match self {
            AnyEngine::Dense(e) => e.threads(),
            AnyEngine::Mla(e) => e.threads(),
        }
    }

    /// Bytes of weights read per decoded token.
    pub fn weight_bytes_per_token(&self) -> u64 {
        match self {
            AnyEngine::Dense(e) => e.weight_bytes_per_token(),
            AnyEngine::Mla(e) => e.weight_bytes_per_token(),
        }
    }
}

impl AnyState {
    /// Positions held.
    pub fn len(&self) -> usize {
        match self {
            AnyState::Dense(s) => s.len(),
            AnyState::Mla(s) => s.kv_cache().len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every position from `len` on.
    pub fn truncate(&mut self, len: usize) {
        match self {
            AnyState::Dense(s) => s.truncate(len),
            AnyState::Mla(s) => s.kv_cache_mut().truncate(len),
        }
    }

    pub fn snapshot(&self) -> KvSnapshot {
        match self {
            AnyState::Dense(s) => s.snapshot(),
            AnyState::Mla(s) => s.kv_cache().snapshot(),
        }
    }

    pub fn restore(&mut self, snapshot: &KvSnapshot) -> Result<(), EngineError> {
        match self {
            AnyState::Dense(s) => s.restore(snapshot),
            AnyState::Mla(s) => s
                .kv_cache_mut()
                .restore(snapshot)
                .map_err(|e| EngineError::State(e.to_string())),
        }
    }
}

fn mismatch() -> EngineError {
    EngineError::State("the state belongs to another engine".into())
}

impl Engine for AnyEngine {
    type State = AnyState;

    fn new_state(&self) -> AnyState {
        match self {
            AnyEngine::Dense(e) => AnyState::Dense(e.new_state()),
            AnyEngine::Mla(e) => AnyState::Mla(e.new_state()),
        }
    }

    fn vocab_size(&self) -> usize {
        match self {
            AnyEngine::Dense(e) => e.vocab_size(),
            AnyEngine::Mla(e) => e.vocab_size(),
        }
    }

    fn context_size(&self) -> usize {
        match self {
            AnyEngine::Dense(e) => e.context_size(),
            AnyEngine::Mla(e) => e.context_size(),
        }
    }

    fn forward_batch<'s>(
        &self,
        tokens: &[TokenId],
        start_pos: usize,
        state: &'s mut AnyState,
        logits: LogitsFor,
    ) -> Result<&'s [f32], EngineError> {
        match (self, state) {
            (AnyEngine::Dense(e), AnyState::Dense(s)) => {
                e.forward_batch(tokens, start_pos, s, logits)
            }
            (AnyEngine::Mla(e), AnyState::Mla(s)) => e.forward_batch(tokens, start_pos, s, logits),
            _ => Err(mismatch()),
        }
    }
}
