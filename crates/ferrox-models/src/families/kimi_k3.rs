//! Kimi-K3 (text model): the Kimi Linear hybrid of KDA and NoPE MLA layers with residual
//! attention over block checkpoints, SiTU activations, latent routed experts, an MLA output
//! gate and a full-rank KDA output gate. Run by [`crate::kimi`].

use std::sync::Arc;

use ferrox_gguf::Gguf;

use crate::engine::{Engine, EngineOptions};
use crate::kimi::{KimiConfig, KimiEngine};
use crate::ModelError;

/// `kimi-k3`, run by the Kimi engine.
pub const ARCH: super::Architecture = super::Architecture {
    name: "kimi-k3",
    load,
};

fn load(gguf: Arc<Gguf>, options: &EngineOptions) -> Result<Box<dyn Engine>, ModelError> {
    let config = KimiConfig::read_k3(&gguf.metadata())?;
    Ok(Box::new(KimiEngine::with_config(gguf, options, config)?))
}
