//! Finding and loading a model: `-m FILE`, or the default model, fetched on first use.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use anyhow::{bail, Context};
use ferrox_core::KvStorage;
use ferrox_models::tokenizer::Tokenizer;
use ferrox_models::{Decoder, DecoderOptions};

/// The script that fetches the default model (the same one the README and tests use).
const FETCH_SCRIPT: &str = include_str!("../../../../scripts/fetch-model.sh");
const DEFAULT_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";
/// Context size when `-c` is not given.
const DEFAULT_CTX_SIZE: usize = 4096;

/// Options every model-running command takes.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// GGUF model file (default: Gemma-3-270M Q4_K_M, fetched on first use).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Worker threads (default: one per core).
    #[arg(short = 't', long = "threads", default_value_t = 0)]
    pub threads: usize,
    /// Context size in tokens (0: the model's training context; default 4096, 512 for
    /// perplexity as llama-perplexity).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Store the KV cache as f32 instead of f16.
    #[arg(long)]
    pub kv_f32: bool,
}

/// Where the default model lives: `$FERROX_MODELS_DIR` or `~/.cache/ferrox/models`.
pub fn default_model_path() -> PathBuf {
    let dir = std::env::var_os("FERROX_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ferrox/models")
        });
    dir.join(DEFAULT_MODEL_FILE)
}

/// The model path: the one given, or the default model (downloaded and checked if absent).
pub fn resolve(model: &Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(path) = model {
        return Ok(path.clone());
    }
    let path = default_model_path();
    if path.is_file() {
        return Ok(path);
    }
    eprintln!(
        "the default model is not at {}; fetching it ...",
        path.display()
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(FETCH_SCRIPT)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cannot run bash to fetch the default model")?;
    if !out.status.success() || !path.is_file() {
        bail!("fetching the default model failed");
    }
    Ok(path)
}

/// A model ready to run: its decoder and tokenizer.
pub struct Loaded {
    pub path: PathBuf,
    pub decoder: Decoder,
    pub tokenizer: Tokenizer,
}

pub fn load(args: &ModelArgs) -> anyhow::Result<Loaded> {
    let path = resolve(&args.model)?;
    let gguf = Arc::new(super::open_gguf(&path)?);
    let tokenizer =
        Tokenizer::from_gguf(&gguf).with_context(|| format!("{}: tokenizer", path.display()))?;
    let options = DecoderOptions {
        n_ctx: args.ctx_size.unwrap_or(DEFAULT_CTX_SIZE),
        threads: args.threads,
        kv_storage: if args.kv_f32 {
            KvStorage::F32
        } else {
            KvStorage::F16
        },
    };
    let decoder =
        Decoder::from_gguf(gguf, &options).with_context(|| format!("{}", path.display()))?;
    Ok(Loaded {
        path,
        decoder,
        tokenizer,
    })
}
