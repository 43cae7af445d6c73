use std::path::PathBuf;

/// Everything that can go wrong reading a checkpoint directory. Messages name the file,
/// the `config.json` key or the tensor (by its name in the checkpoint) at fault.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    /// The OS error is part of the message (not a `source()`), so it is printed once.
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("{path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("config.json: `{key}` {reason}")]
    Config { key: String, reason: String },
    #[error(
        "config.json names architecture `{0}`, which cannot be loaded from a checkpoint \
         directory (supported: {supported})",
        supported = crate::arch::supported().join(", ")
    )]
    UnsupportedArchitecture(String),
    #[error("shard `{file}` (listed in model.safetensors.index.json) is missing")]
    MissingShard { file: String },
    #[error("tensor `{0}` is not in the checkpoint")]
    MissingTensor(String),
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("tensor `{name}` is stored as {dtype}, which cannot be loaded ({reason})")]
    UnsupportedDtype {
        name: String,
        dtype: String,
        reason: String,
    },
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] ferrox_tokenizer::tokenizer::TokenizerError),
    #[error(transparent)]
    Gguf(#[from] ferrox_gguf::GgufError),
}

pub type Result<T, E = HfError> = std::result::Result<T, E>;
