//! Hugging Face checkpoint directories — `config.json`, safetensors weights (one file or an
//! index and shards), the tokenizer files — presented as a [`Gguf`], so that the engines
//! that load GGUF files load them unchanged.
//!
//! The translation is llama.cpp's converter's (`convert_hf_to_gguf.py`): the same metadata
//! keys, tensor names, shapes and transforms, done at load. Weights stored as F32, F16 or
//! BF16 stay memory-mapped in their files; tensors that need a transform (stacked experts,
//! split projections, folded constants, FP8 blocks) are computed into memory.
//!
//! One module per architecture under [`arch`]: its metadata from `config.json` and its
//! tensor table.
//!
//! ```no_run
//! let gguf = ferrox_hf::open("Kimi-Linear-48B-A3B-Instruct")?;
//! assert_eq!(gguf.metadata().architecture()?, "kimi-linear");
//! # Ok::<(), ferrox_hf::HfError>(())
//! ```

pub mod arch;
mod config;
mod error;
mod plan;
mod shards;
mod tokenizer;

use std::path::Path;

use ferrox_gguf::Gguf;

pub use error::{HfError, Result};

/// Whether `path` looks like a checkpoint directory (a directory with a `config.json`).
pub fn is_checkpoint_dir(path: &Path) -> bool {
    path.is_dir() && path.join("config.json").is_file()
}

/// Opens a checkpoint directory as a GGUF checkpoint of the architecture `config.json`
/// names.
pub fn open(dir: impl AsRef<Path>) -> Result<Gguf> {
    let dir = dir.as_ref();
    let config = config::Config::read(&dir.join("config.json"))?;
    // The model class is the top level's (as the converter reads it), the rest may be in a
    // `text_config`.
    let arch = arch::find(&config)?;
    let config = config.with_text_config()?;
    let shards = shards::Shards::open(dir)?;
    let mut metadata = vec![
        ("general.architecture".to_string(), arch.name.into()),
        (
            "general.name".to_string(),
            dir.file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
                .into(),
        ),
    ];
    metadata.extend((arch.metadata)(&config)?);
    metadata.extend(tokenizer::metadata(dir, &config, arch)?);
    let tensors = (arch.tensors)(&config, &shards)?;
    plan::assemble(metadata, shards, tensors, &config)
}
