pub mod bench;
pub mod chat;
pub mod embedding;
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

/// Opens a checkpoint: a GGUF file, or a Hugging Face checkpoint directory (translated
/// at load into the same form); errors name the file once.
pub fn open_gguf(path: &Path) -> anyhow::Result<Gguf> {
    if path.is_dir() {
        return open_checkpoint_dir(path);
    }
    Gguf::open(path).map_err(|e| match e {
        GgufError::Io { .. } => anyhow::Error::new(e),
        e => anyhow::Error::new(e).context(path.display().to_string()),
    })
}

/// A checkpoint directory; its errors are the user's input being wrong (exit status 2).
fn open_checkpoint_dir(path: &Path) -> anyhow::Result<Gguf> {
    if !ferrox_hf::is_checkpoint_dir(path) {
        return Err(InputError(format!(
            "{}: a directory without config.json (expected a GGUF file or a Hugging Face \
             checkpoint directory)",
            path.display()
        ))
        .into());
    }
    ferrox_hf::open(path).map_err(|e| InputError(format!("{}: {e}", path.display())).into())
}
