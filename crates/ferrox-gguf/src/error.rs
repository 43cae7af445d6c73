use std::path::PathBuf;

/// Everything that can go wrong reading a GGUF file. Parse errors name the field and the
/// byte offset where it sits, so a bad file can be diagnosed with a hex dump.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The OS error is part of the message (not a `source()`), so it is printed once.
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("not a GGUF file (magic at offset 0 is {found:02x?}, expected \"GGUF\")")]
    BadMagic { found: Vec<u8> },
    #[error("big-endian GGUF files are not supported")]
    BigEndian,
    #[error("unsupported GGUF version {0} (supported: 2 and 3)")]
    UnsupportedVersion(u32),
    #[error("{field} at offset {offset}: file ends after {available} bytes, {needed} needed")]
    Truncated {
        field: String,
        offset: u64,
        needed: u64,
        available: u64,
    },
    #[error("{field} at offset {offset}: {reason}")]
    Invalid {
        field: String,
        offset: u64,
        reason: String,
    },
    #[error("metadata key `{0}` is missing")]
    MissingKey(String),
    #[error("metadata key `{key}` is {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("tensor `{0}` is not in the file")]
    MissingTensor(String),
    #[error("tensor `{name}` has type {ty}, whose byte layout is unknown")]
    UnknownTensorType { name: String, ty: String },
    #[error("split checkpoint {path}: {reason}")]
    Split { path: PathBuf, reason: String },
    #[error("cannot write GGUF: {0}")]
    Write(String),
}

pub type Result<T, E = GgufError> = std::result::Result<T, E>;
