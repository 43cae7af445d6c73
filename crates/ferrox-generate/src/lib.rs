//! Generation over any [`Engine`](ferrox_engine::Engine): the sampler chain ([`sampling`]),
//! the single-stream generation loop with stop strings, constraints and speculative decoding
//! ([`generate`]), a draft model's proposals ([`draft_model`]) and pooled embeddings
//! ([`embedding`]). It depends on the engine interface only, never on an engine, so a front
//! end (and `ferrox-agent`, which implements [`generate::ConstraintSource`]) compiles no
//! model code through it.

pub mod draft_model;
pub mod embedding;
pub mod generate;
pub mod media;
pub mod sampling;
