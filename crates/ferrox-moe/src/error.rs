use ferrox_core::QuantError;
use ferrox_gguf::GgufError;

/// Everything that can go wrong configuring or evaluating a mixture-of-experts block.
#[derive(Debug, thiserror::Error)]
pub enum MoeError {
    /// A metadata key is missing, has the wrong type, or the file could not be read.
    #[error(transparent)]
    Metadata(#[from] GgufError),
    /// A weight tensor could not be viewed or multiplied.
    #[error(transparent)]
    Quant(#[from] QuantError),
    /// A metadata value is present but unusable (the key is named).
    #[error("{key}: {reason}")]
    BadValue { key: String, reason: String },
    /// The router configuration is inconsistent.
    #[error("invalid router configuration: {0}")]
    Config(String),
    /// Tensor or buffer sizes disagree.
    #[error("shape mismatch: {0}")]
    Shape(String),
}
