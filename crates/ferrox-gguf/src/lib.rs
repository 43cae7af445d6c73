//! GGUF, the checkpoint format of llama.cpp: a hardened, memory-mapped reader (single and
//! split files) and a writer for synthetic models and tools.
//!
//! ```no_run
//! let gguf = ferrox_gguf::Gguf::open("model.gguf")?;
//! let ctx = gguf.metadata().get_u32("gemma3.context_length")?;
//! let embd = gguf.require_tensor("token_embd.weight")?;
//! let bytes = gguf.tensor_data(embd)?;
//! # Ok::<(), ferrox_gguf::GgufError>(())
//! ```

mod direct;
mod error;
mod file;
mod file_type;
mod metadata;
mod parse;
mod split;
mod types;
mod value;
mod writer;

pub use direct::DirectBuffer;
pub use error::{GgufError, Result};
pub use file::{Gguf, TensorPart, TensorStorage};
pub use file_type::file_type_name;
pub use metadata::Metadata;
pub use parse::{TensorInfo, DEFAULT_ALIGNMENT, MAX_DIMS};
pub use split::split_path;
pub use types::GgmlType;
pub use value::{ArrayElement, ArrayRef, OwnedArray, OwnedValue, Value, ValueType};
pub use writer::GgufWriter;
