//! One type over every engine, chosen from the file's architecture through the registry
//! ([`crate::families::ARCHITECTURES`]), for front ends that run whatever model they are given.

use std::any::Any;
use std::path::Path;
use std::sync::Arc;

use ferrox_gguf::Gguf;
use ferrox_memory::{MemorySpec, StepMemory};

use crate::engine::{Engine, EngineError, SeqInput, StepScratch};
use crate::TokenId;
use crate::{EngineOptions, ModelError};

/// The engine for a checkpoint.
pub struct AnyEngine(Box<dyn Engine>);

impl AnyEngine {
    /// Loads the engine registered for `general.architecture`.
    pub fn from_gguf(gguf: Arc<Gguf>, options: &EngineOptions) -> Result<AnyEngine, ModelError> {
        let arch = gguf.metadata().architecture()?.to_string();
        let entry = crate::families::architecture(&arch)?;
        Ok(AnyEngine((entry.load)(gguf, options)?))
    }

    pub fn open(path: impl AsRef<Path>, options: &EngineOptions) -> Result<AnyEngine, ModelError> {
        AnyEngine::from_gguf(Arc::new(Gguf::open(path)?), options)
    }

    /// The concrete engine, when it is a `T`.
    pub fn downcast_ref<T: Engine>(&self) -> Option<&T> {
        (&*self.0 as &dyn Any).downcast_ref()
    }

    pub fn downcast_mut<T: Engine>(&mut self) -> Option<&mut T> {
        (&mut *self.0 as &mut dyn Any).downcast_mut()
    }
}

impl Engine for AnyEngine {
    fn architecture(&self) -> &str {
        self.0.architecture()
    }

    fn gguf(&self) -> &Gguf {
        self.0.gguf()
    }

    fn memory_spec(&self) -> MemorySpec {
        self.0.memory_spec()
    }

    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }

    fn embedding_size(&self) -> usize {
        self.0.embedding_size()
    }

    fn accepts_embeddings(&self) -> bool {
        self.0.accepts_embeddings()
    }

    fn accepts_image_grids(&self) -> bool {
        self.0.accepts_image_grids()
    }

    fn accepts_bidirectional(&self) -> bool {
        self.0.accepts_bidirectional()
    }

    fn input_embedding_size(&self) -> usize {
        self.0.input_embedding_size()
    }

    fn is_encoder(&self) -> bool {
        self.0.is_encoder()
    }

    fn has_classifier(&self) -> bool {
        self.0.has_classifier()
    }

    fn classify(&self, pooled: &[f32]) -> Result<Vec<f32>, EngineError> {
        self.0.classify(pooled)
    }

    fn context_size(&self) -> usize {
        self.0.context_size()
    }

    fn threads(&self) -> usize {
        self.0.threads()
    }

    fn weight_bytes_per_token(&self) -> u64 {
        self.0.weight_bytes_per_token()
    }

    fn weight_memory(&self) -> crate::engine::WeightMemory {
        self.0.weight_memory()
    }

    fn new_scratch(&self) -> StepScratch {
        self.0.new_scratch()
    }

    fn step(
        &self,
        memory: &mut StepMemory<'_>,
        scratch: &mut StepScratch,
        seqs: &[SeqInput<'_>],
        logits: &mut [&mut Vec<f32>],
    ) -> Result<(), EngineError> {
        self.0.step(memory, scratch, seqs, logits)
    }

    fn has_mtp(&self) -> bool {
        self.0.has_mtp()
    }

    fn enable_rollback(&mut self, tokens: usize) -> Result<usize, EngineError> {
        self.0.enable_rollback(tokens)
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
        self.0.draft_mtp(memory, scratch, seq, token, pos, max, out)
    }
}
