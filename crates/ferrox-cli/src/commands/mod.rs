pub mod bench;
pub mod chat;
pub mod hub;
pub mod inspect;
pub mod model;
pub mod models;
pub mod perplexity;
pub mod run;
pub mod serve;
pub mod tokenize;

use std::path::Path;

use ferrox_gguf::{Gguf, GgufError};

/// Marks an error as the user's input being wrong (exit status 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InputError(pub String);

/// Opens a checkpoint; errors name the file once.
pub fn open_gguf(path: &Path) -> anyhow::Result<Gguf> {
    Gguf::open(path).map_err(|e| match e {
        GgufError::Io { .. } => anyhow::Error::new(e),
        e => anyhow::Error::new(e).context(path.display().to_string()),
    })
}
