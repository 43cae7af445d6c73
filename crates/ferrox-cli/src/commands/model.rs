//! Finding and loading a model: `-m FILE`, or the default model, fetched on first use.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use ferrox_core::{KvStorage, KvType};
use ferrox_gguf::Gguf;
use ferrox_models::{default_model_path, AnyEngine, Engine, EngineOptions, NumaPolicy};
use ferrox_tokenizer::tokenizer::Tokenizer;
use indicatif::{ProgressBar, ProgressStyle};

/// The script that fetches the default model (the same one the README and tests use).
const FETCH_SCRIPT: &str = include_str!("../../../../scripts/fetch-model.sh");
/// Context size when `-c` is not given.
const DEFAULT_CTX_SIZE: usize = 4096;

/// Options every model-running command takes.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// GGUF model file, or a Hugging Face checkpoint directory (default: Gemma-3-270M
    /// Q4_K_M, fetched on first use).
    #[arg(short = 'm', long = "model", conflicts_with = "hf_repo")]
    pub model: Option<PathBuf>,
    /// A model from the Hugging Face Hub, ORG/NAME[:QUANT] (`-hf` as llama.cpp; the GGUF
    /// whose name carries QUANT, default Q4_K_M, else the first), downloaded into the Hub
    /// cache unless it is there.
    #[arg(
        long = "hf-repo",
        visible_alias = "hf",
        value_name = "ORG/NAME[:QUANT]"
    )]
    pub hf_repo: Option<String>,
    /// Worker threads (default: one per core).
    #[arg(short = 't', long = "threads", default_value_t = 0)]
    pub threads: usize,
    /// Context size in tokens (0: the model's training context; default 4096, 512 for
    /// perplexity as llama-perplexity).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Store the KV cache as f32 instead of f16 (as `-ctk f32 -ctv f32`).
    #[arg(long, conflicts_with_all = ["cache_type_k", "cache_type_v"])]
    pub kv_f32: bool,
    /// The K cache's element type (`-ctk` as llama.cpp): f16 (default), f32, bf16, or a
    /// quantized type: q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1 (rotated as llama.cpp rotates
    /// them; `FERROX_ATTN_ROT_DISABLE=1` turns that off). Quantized caches are built for the
    /// grouped-query engines, the MLA engine's latent rows and the sparse-attention engines'
    /// latent rows and indexer keys.
    #[arg(long = "cache-type-k", value_parser = cache_type, value_name = "TYPE")]
    pub cache_type_k: Option<KvType>,
    /// The V cache's element type (`-ctv` as llama.cpp): f16 (default) or any of `-ctk`'s.
    #[arg(long = "cache-type-v", value_parser = cache_type, value_name = "TYPE")]
    pub cache_type_v: Option<KvType>,
    /// Keep every matrix in the file's row-major layout (by default the Q4_0, Q4_1, Q5_0,
    /// Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K matrices are repacked at load where the
    /// CPU has AVX2, as llama.cpp repacks).
    #[arg(long = "no-repack")]
    pub no_repack: bool,
    /// Memory the weights may take, e.g. `48G` (default: 85% of what the system has
    /// available, less one sequence's KV cache over the context). Routed experts that do
    /// not fit stay in the file and stream through a cache of packed copies of the most
    /// used.
    #[arg(long = "memory-budget", value_parser = byte_size, value_name = "SIZE")]
    pub memory_budget: Option<u64>,
    /// Lock the weights held in memory so that the system never pages them out (as
    /// llama.cpp's `--mlock`).
    #[arg(long)]
    pub mlock: bool,
    /// Read the weights that are repacked at load, and the experts streamed into the
    /// cache, past the page cache (`O_DIRECT`, as llama.cpp's `--direct-io`), where the
    /// filesystem allows it: the packed copy is all that stays in memory.
    #[arg(long = "direct-io", visible_alias = "dio")]
    pub direct_io: bool,
    /// Run the worker threads on the machine's memory nodes, as llama.cpp's `--numa`:
    /// `distribute` (worker i on the CPUs of node i mod nodes), `isolate` (on the node the
    /// process started on) or `numactl` (on the CPUs `numactl` gave the process). Off by
    /// default.
    #[arg(long, value_enum, value_name = "POLICY")]
    pub numa: Option<NumaArg>,
    /// Load the file's multi-token-prediction block (set by `--spec-type draft-mtp`).
    #[arg(skip)]
    pub mtp: bool,
}

/// `--numa`'s policies, by llama.cpp's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NumaArg {
    Distribute,
    Isolate,
    Numactl,
}

impl NumaArg {
    pub fn policy(arg: Option<NumaArg>) -> NumaPolicy {
        match arg {
            None => NumaPolicy::Off,
            Some(NumaArg::Distribute) => NumaPolicy::Distribute,
            Some(NumaArg::Isolate) => NumaPolicy::Isolate,
            Some(NumaArg::Numactl) => NumaPolicy::Numactl,
        }
    }
}

/// A size in bytes: a number with an optional binary suffix, `K`, `M`, `G` or `T` (`KiB`,
/// `GB`... read alike).
pub fn byte_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size (e.g. 512M, 48G)"))?;
    let unit = unit.trim().to_ascii_uppercase();
    let shift = match unit.trim_end_matches('B').trim_end_matches('I') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("`{text}`: unknown unit (K, M, G or T)")),
    };
    let bytes = number * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("`{text}` is too large"));
    }
    Ok(bytes as u64)
}

/// A KV cache type by llama.cpp's name (`-ctk`, `-ctv`).
pub fn cache_type(name: &str) -> Result<KvType, String> {
    KvType::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = KvType::ALL.iter().map(|t| t.name()).collect();
        format!("`{name}` is not a cache type; one of: {}", names.join(", "))
    })
}

impl ModelArgs {
    /// The KV cache's element types: `--kv-f32`, or `-ctk`/`-ctv`, each f16 unless given
    /// (as llama.cpp: `-ctk q8_0` alone keeps f16 values).
    pub fn kv_storage(&self) -> KvStorage {
        if self.kv_f32 {
            return KvStorage::F32;
        }
        let keys = self.cache_type_k.unwrap_or(KvType::F16);
        let values = self.cache_type_v.unwrap_or(KvType::F16);
        KvStorage { keys, values }
    }

    /// The model file: `-m`, `-hf` (fetched if needed) or the default model.
    pub fn path(&self) -> anyhow::Result<PathBuf> {
        match &self.hf_repo {
            Some(reference) => super::models::resolve_hf(reference),
            None => resolve(&self.model),
        }
    }
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

/// A model ready to run on whichever engine its architecture needs.
pub struct LoadedEngine {
    pub path: PathBuf,
    pub engine: AnyEngine,
    pub tokenizer: Tokenizer,
}

/// The file, its tokenizer and the engine options the arguments ask for.
fn open(args: &ModelArgs) -> anyhow::Result<(PathBuf, Arc<Gguf>, Tokenizer, EngineOptions)> {
    let path = args.path()?;
    let gguf = Arc::new(super::open_gguf(&path)?);
    let tokenizer =
        Tokenizer::from_gguf(&gguf).with_context(|| format!("{}: tokenizer", path.display()))?;
    let options = EngineOptions {
        n_ctx: args.ctx_size.unwrap_or(DEFAULT_CTX_SIZE),
        threads: args.threads,
        kv_storage: args.kv_storage(),
        repack: !args.no_repack,
        mtp: args.mtp,
        memory_budget: args.memory_budget,
        mlock: args.mlock,
        direct_io: args.direct_io,
        numa: NumaArg::policy(args.numa),
    };
    Ok((path, gguf, tokenizer, options))
}

/// Loads a model for the engine its architecture needs.
pub fn load_engine(args: &ModelArgs) -> anyhow::Result<LoadedEngine> {
    let (path, gguf, tokenizer, options) = open(args)?;
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    // The bar counts the bytes packed at load: all but what the plan leaves in the file.
    let to_pack = ferrox_models::plan::MemoryPlan::new(&gguf, &options)
        .map_or(gguf.tensor_bytes(), |p| {
            gguf.tensor_bytes().saturating_sub(p.mapped_bytes())
        });
    let engine = with_load_progress(&gguf, &name, to_pack, || {
        AnyEngine::from_gguf(gguf.clone(), &options)
    })
    .with_context(|| format!("{}", path.display()))?;
    report_plan(&engine);
    Ok(LoadedEngine {
        path,
        engine,
        tokenizer,
    })
}

/// The memory plan, on stderr when the routed experts are streamed from the file.
fn report_plan(engine: &impl Engine) {
    let w = engine.weight_memory();
    if let Some(cache) = w.expert_cache {
        eprintln!(
            "memory: budget {}, {} packed at load, {} of routed experts streamed from the file \
             through {} cached experts ({})",
            mib(w.budget),
            mib(w.packed_bytes),
            mib(w.mapped_bytes),
            cache.slots,
            mib(cache.slots as u64 * cache.slot_bytes),
        );
    }
}

/// The streamed experts' cache counters after `tokens` tokens, on stderr (nothing when the
/// experts are not streamed).
pub fn report_streamed_experts(engine: &impl Engine, tokens: usize) {
    let Some(c) = engine.weight_memory().expert_cache else {
        return;
    };
    let uses = (c.hits + c.misses).max(1);
    eprintln!(
        "experts: {} hits, {} misses ({:.1}% hits), {} read from the file ({} per token)",
        c.hits,
        c.misses,
        100.0 * c.hits as f64 / uses as f64,
        mib(c.bytes_read),
        mib(c.bytes_read / tokens.max(1) as u64),
    );
    if c.ahead_asked > 0 {
        eprintln!(
            "experts asked for a layer ahead: {}, of which the layer used {} ({:.1}%)",
            c.ahead_asked,
            c.ahead_used,
            100.0 * c.ahead_used as f64 / c.ahead_asked as f64,
        );
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// Loads a model to generate with: an embedding model (an encoder) is refused by name.
pub fn load_generator(args: &ModelArgs) -> anyhow::Result<LoadedEngine> {
    let loaded = load_engine(args)?;
    if loaded.engine.is_encoder() {
        return Err(ferrox_models::ModelError::EmbeddingOnly {
            arch: loaded.engine.architecture().to_string(),
        })
        .with_context(|| format!("{} (use `ferrox embedding`)", loaded.path.display()));
    }
    Ok(loaded)
}

/// Runs `load` with a bar over the weight bytes repacked so far (of `total`) (on a terminal only: hidden
/// when stderr is redirected), cleared when it returns.
fn with_load_progress<T>(gguf: &Gguf, name: &str, total: u64, load: impl FnOnce() -> T) -> T {
    let bar = ProgressBar::new(total);
    if bar.is_hidden() {
        return load();
    }
    bar.set_style(
        ProgressStyle::with_template("loading {msg} [{bar:30}] {bytes}/{total_bytes} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(name.to_string());
    let done = AtomicBool::new(false);
    let out = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                bar.set_position(gguf.released_bytes());
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let out = load();
        done.store(true, Ordering::Relaxed);
        out
    });
    bar.finish_and_clear();
    out
}

/// How many tokens an image may become with a projector that takes images at their own size
/// (Qwen-VL, Kimi), as llama.cpp's flags say it.
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct ImageTokenArgs {
    /// The fewest tokens an image may become (dynamic-size projectors; default: the
    /// projector family's, 8 for Qwen-VL and Kimi-VL). Qwen-VL grounds better from 1024.
    #[arg(
        long = "image-min-tokens",
        value_name = "N",
        env = "FERROX_IMAGE_MIN_TOKENS"
    )]
    pub min: Option<usize>,
    /// The most tokens an image may become (default: the family's, 4096 for Qwen-VL, 1024
    /// for Kimi-VL; a Kimi-K2.5 file's own pixel limits stand, as in llama.cpp).
    #[arg(
        long = "image-max-tokens",
        value_name = "N",
        env = "FERROX_IMAGE_MAX_TOKENS"
    )]
    pub max: Option<usize>,
}

impl ImageTokenArgs {
    pub fn limits(&self) -> (Option<usize>, Option<usize>) {
        (self.min, self.max)
    }
}

/// The vision projector of `--mmproj FILE` for the loaded model (`ferrox_server::open_vision`:
/// the server's checks); a file that cannot feed the model is an input error.
pub fn open_vision(
    path: &std::path::Path,
    engine: &AnyEngine,
    tokens: &ImageTokenArgs,
) -> anyhow::Result<ferrox_models::vision::VisionEncoder> {
    ferrox_server::open_vision(path, engine, tokens.limits())
        .map_err(|e| super::InputError(format!("{e:#}")).into())
}

/// An image file decoded and encoded for a prompt; a file that cannot be read or decoded is
/// an input error naming it.
pub fn encode_image_file(
    encoder: &ferrox_models::vision::VisionEncoder,
    path: &std::path::Path,
) -> anyhow::Result<Arc<ferrox_generate::media::EncodedImage>> {
    use super::InputError;
    let bytes = std::fs::read(path).map_err(|e| InputError(format!("{}: {e}", path.display())))?;
    let img = ferrox_models::vision::RgbImage::decode(&bytes)
        .map_err(|e| InputError(format!("{}: {e}", path.display())))?;
    let emb = encoder
        .encode(&img)
        .with_context(|| format!("encoding {}", path.display()))?;
    let grid = encoder.image_grid(&emb);
    Ok(Arc::new(
        ferrox_generate::media::EncodedImage::new(
            emb.data,
            emb.n_tokens,
            encoder.bidirectional(),
            encoder.markers(),
        )
        .with_grid(grid),
    ))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        model: ModelArgs,
    }

    #[test]
    fn sizes_read_with_binary_units() {
        assert_eq!(byte_size("1024").unwrap(), 1024);
        assert_eq!(byte_size("48G").unwrap(), 48 << 30);
        assert_eq!(byte_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(byte_size("512mb").unwrap(), 512 << 20);
        assert_eq!(byte_size(" 2 T ").unwrap(), 2 << 40);
        for bad in ["", "G", "-1G", "1e9", "12Q", "99999999999999999999T"] {
            assert!(byte_size(bad).is_err(), "{bad:?} read as a size");
        }
    }

    fn storage(args: &[&str]) -> anyhow::Result<KvStorage> {
        let flags = Flags::try_parse_from(std::iter::once("ferrox").chain(args.iter().copied()))?;
        Ok(flags.model.kv_storage())
    }

    #[test]
    fn cache_types_by_llama_cpp_names() {
        assert_eq!(storage(&[]).unwrap(), KvStorage::F16);
        assert_eq!(storage(&["--kv-f32"]).unwrap(), KvStorage::F32);
        let both = ["--cache-type-k", "f32", "--cache-type-v", "f32"];
        assert_eq!(storage(&both).unwrap(), KvStorage::F32);
        // Each defaults to f16 on its own, as in llama.cpp.
        let k_only = storage(&["--cache-type-k", "q8_0"]).unwrap();
        assert_eq!((k_only.keys, k_only.values), (KvType::Q8_0, KvType::F16));
        let v_only = storage(&["--cache-type-v", "iq4_nl"]).unwrap();
        assert_eq!((v_only.keys, v_only.values), (KvType::F16, KvType::Iq4Nl));
        for ty in KvType::ALL {
            let s = storage(&["--cache-type-k", ty.name(), "--cache-type-v", ty.name()]).unwrap();
            assert_eq!(s, KvStorage::uniform(ty));
        }
    }

    #[test]
    fn unknown_or_conflicting_cache_types_are_refused() {
        assert!(storage(&["--cache-type-k", "q9_9"]).is_err());
        assert!(storage(&["--kv-f32", "--cache-type-k", "f16"]).is_err());
    }
}
