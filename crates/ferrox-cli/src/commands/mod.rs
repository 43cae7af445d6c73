pub mod inspect;

/// Marks an error as the user's input being wrong (exit status 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InputError(pub String);
