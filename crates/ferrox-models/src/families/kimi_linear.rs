//! Kimi Linear (Kimi-Linear-48B-A3B): KDA linear attention interleaved with NoPE MLA layers,
//! routed experts with sigmoid gating and a shared expert. Run by [`crate::kimi`].

use std::sync::Arc;

use ferrox_gguf::Gguf;

use crate::engine::{Engine, EngineOptions};
use crate::kimi::{KimiConfig, KimiEngine};
use crate::ModelError;

/// `kimi-linear`, run by the Kimi engine.
pub const ARCH: super::Architecture = super::Architecture {
    name: "kimi-linear",
    load,
};

fn load(gguf: Arc<Gguf>, options: &EngineOptions) -> Result<Box<dyn Engine>, ModelError> {
    let config = KimiConfig::read(&gguf.metadata())?;
    Ok(Box::new(KimiEngine::with_config(gguf, options, config)?))
}
