//! `ferrox serve`: an OpenAI-compatible HTTP server (see the `ferrox-server` crate).

use std::sync::Arc;
use std::time::Duration;

use ferrox_generate::embedding::Pooling;
use ferrox_models::Engine;
use ferrox_server::{
    AllowedOrigins, LoadedModel, LogFormat, ReasoningFormat, ServerConfig, Speculation,
};

use super::model::{self, ModelArgs};
use super::run::{SpecArgs, SpecType};
use super::InputError;

#[derive(clap::Args)]
pub struct Args {
    /// Model, threads and context: --ctx-size is the most positions one sequence holds.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on; anything but loopback needs --api-key (or --no-auth).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Serve a public address without an API key (a container behind its own gateway);
    /// without this flag or a key such an address is refused.
    #[arg(long = "no-auth", conflicts_with = "api_key")]
    pub no_auth: bool,
    /// Port to listen on (0: any free port; the log says which).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` (default: $FERROX_API_KEY if set).
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// Most sequences decoded together.
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// KV block pool shared by all sequences, in MiB (default: --parallel full contexts).
    /// Requests wait until the blocks their prompt plus max_tokens may need are free.
    #[arg(long = "kv-memory", value_name = "MIB")]
    pub kv_memory: Option<usize>,
    /// Model id reported by /v1/models and accepted in requests (default: the file name).
    #[arg(long)]
    pub alias: Option<String>,
    /// Chat template: `chatml`, a template name stored in the model, or a Jinja file
    /// (default: the model's own, ChatML when it has none).
    #[arg(long = "chat-template", value_name = "NAME|FILE")]
    pub chat_template: Option<String>,
    /// Requests that may wait for a sequence slot or KV memory; more are answered 429.
    #[arg(long = "max-queue", default_value_t = 64)]
    pub max_queue: usize,
    /// Prompt tokens prefilled per step while other sequences decode (smaller: smoother
    /// streams, larger: faster prefill).
    #[arg(long = "prefill-chunk", default_value_t = 128)]
    pub prefill_chunk: usize,
    /// Largest request body in MiB (larger ones get 413).
    #[arg(long = "body-limit", value_name = "MIB", default_value_t = 4)]
    pub body_limit: usize,
    /// Seconds running requests may go on after SIGTERM before they are cancelled.
    #[arg(long = "shutdown-grace", value_name = "SECONDS", default_value_t = 10)]
    pub shutdown_grace: u64,
    /// Seconds between SSE comment pings while a stream waits (long prefills).
    #[arg(long = "sse-ping", value_name = "SECONDS", default_value_t = 15)]
    pub sse_ping: u64,
    /// Log lines on stderr: `text`, or `json` (one object per line, with the request's
    /// `request_id` in its span), for log collectors.
    #[arg(long = "log-format", value_enum, default_value_t = LogFormatArg::Text)]
    pub log_format: LogFormatArg,
    /// Where a thinking model's `<think>` block goes: `deepseek` (or `auto`) puts it in
    /// `reasoning_content`, `none` leaves it in `content`.
    #[arg(long = "reasoning-format", value_enum, default_value_t = ReasoningFormatArg::Deepseek)]
    pub reasoning_format: ReasoningFormatArg,
    /// Speculation per sequence inside the batch (the output is the same): prompt lookup,
    /// a draft model or the model's multi-token-prediction block, as `run` takes them.
    #[command(flatten)]
    pub speculation: SpecArgs,
    /// Browser origins (comma-separated, `scheme://host[:port]`, or `*`) whose pages may call
    /// the API; other pages are refused and get no CORS headers (the server's own chat page
    /// always may). Default: $FERROX_ORIGINS.
    #[arg(long = "cors-origins", value_name = "ORIGINS")]
    pub cors_origins: Option<String>,
    /// Drafted tokens join a step only while it has fewer rows (tokens of all its sequences)
    /// than this: a large batch already keeps the cores busy.
    #[arg(long = "spec-max-rows", default_value_t = 16)]
    pub spec_max_rows: usize,
    /// Serve embeddings: `/v1/embeddings` (OpenAI's shape) and `/embedding`
    /// (llama-server's), batched with generation.
    #[arg(long = "embeddings", visible_alias = "embedding")]
    pub embeddings: bool,
    /// The model's vision projector (an `mmproj` GGUF): chat requests may then send images
    /// as `image_url` content parts (base64 data URLs).
    #[arg(long = "mmproj", value_name = "FILE", conflicts_with = "models_dir")]
    pub mmproj: Option<std::path::PathBuf>,
    /// With -hf: do not fetch the repository's vision projector (fetched by default, as
    /// llama-server does).
    #[arg(long = "no-mmproj")]
    pub no_mmproj: bool,
    /// Fetch images given by `http://` or `https://` URLs (OpenAI `image_url`, Anthropic
    /// `url` sources). Off by default: only `data:` URLs are taken, since fetching lets
    /// any client make this machine open connections to any address it can reach
    #[arg(long = "allow-remote-images", env = "FERROX_ALLOW_REMOTE_IMAGES")]
    pub allow_remote_images: bool,
    #[command(flatten)]
    pub image_tokens: super::model::ImageTokenArgs,
    /// How a text's token embeddings are pooled: none, mean, cls, last, or rank (a
    /// reranker's classification head; default: the file's `pooling_type`, none without one).
    #[arg(long, value_name = "TYPE", value_parser = pooling)]
    pub pooling: Option<Pooling>,
    /// Serve `/v1/rerank` (and `/rerank`): embeddings with rank pooling, as llama-server's
    /// `--reranking`.
    #[arg(
        long = "reranking",
        visible_alias = "rerank",
        conflicts_with = "pooling"
    )]
    pub reranking: bool,
    /// Serve every GGUF of this directory and of the Hugging Face cache (llama-server's
    /// router mode): a request names its model (the file name without `.gguf`; a cached one
    /// as `ORG/NAME/FILE`), which is loaded on first use; `/v1/models` lists them all with
    /// their state.
    #[arg(
        long = "models-dir",
        value_name = "DIR",
        conflicts_with_all = ["alias", "model", "hf_repo"]
    )]
    pub models_dir: Option<std::path::PathBuf>,
    /// With --models-dir: most models loaded at once; past it the least recently used one
    /// is unloaded (after its running requests).
    #[arg(long = "models-max", value_name = "N", default_value_t = 4)]
    pub models_max: usize,
}

/// The models of `--models-dir`: the directory's GGUF files by name without `.gguf` (a
/// split checkpoint by its first part), then the Hugging Face cache's as `ORG/NAME/FILE`.
fn served_models(dir: &std::path::Path) -> anyhow::Result<Vec<(String, std::path::PathBuf)>> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| InputError(format!("--models-dir {}: {e}", dir.display())))?;
    let mut paths: Vec<std::path::PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "gguf"))
        .filter(|p| {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            // `NAME-0000K-of-0000N.gguf`: only the first part names the model.
            !name.contains("-of-") || name.contains("-00001-of-")
        })
        .collect();
    paths.sort();
    let mut models: Vec<(String, std::path::PathBuf)> = paths
        .into_iter()
        .map(|p| (ferrox_server::model_id(&p), p))
        .collect();
    let hub = super::hub::Hub::from_env();
    for m in super::hub::cache::models(&hub.cache_dir) {
        let id = format!("{}/{}", m.repo, ferrox_server::model_id(&m.path));
        models.push((id, m.path));
    }
    if models.is_empty() {
        return Err(InputError(format!(
            "--models-dir {}: no .gguf files (nor any in the Hugging Face cache {})",
            dir.display(),
            hub.cache_dir.display()
        ))
        .into());
    }
    Ok(models)
}

/// `--pooling`: a pooling type by llama.cpp's name.
pub fn pooling(name: &str) -> Result<Pooling, String> {
    Pooling::from_name(name).map_err(|e| e.to_string())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReasoningFormatArg {
    None,
    Deepseek,
    Auto,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormatArg {
    Text,
    Json,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let api_key = args
        .api_key
        .clone()
        .or_else(|| std::env::var("FERROX_API_KEY").ok())
        .filter(|k| !k.is_empty());
    // Refuse a bad or public address before loading anything.
    ferrox_server::bind_address(&args.host, args.port, api_key.is_some() || args.no_auth)
        .map_err(InputError)?;
    if args.no_auth && api_key.is_none() {
        eprintln!(
            "warning: --no-auth: {}:{} answers anyone who can reach it",
            args.host, args.port
        );
    }
    if args.parallel == 0 {
        return Err(InputError("--parallel must be at least 1".into()).into());
    }
    let cors_origins = args
        .cors_origins
        .clone()
        .or_else(|| std::env::var("FERROX_ORIGINS").ok())
        .map(|list| AllowedOrigins::parse(&list))
        .transpose()
        .map_err(InputError)?
        .unwrap_or_default();
    let spec = &args.speculation;
    let spec_type = spec.kind()?;
    let speculation = match spec_type {
        SpecType::None => None,
        SpecType::Ngram | SpecType::Draft | SpecType::DraftMtp => {
            let lengths = spec.lengths.params(spec.draft_p_min)?;
            Some(Speculation {
                max: lengths.max,
                min: lengths.min,
                p_min: lengths.p_min,
                mtp: spec_type == SpecType::DraftMtp,
                max_rows: args.spec_max_rows,
            })
        }
    };
    let mmproj = match (&args.mmproj, &args.model.hf_repo) {
        (Some(path), _) => Some(path.clone()),
        (None, Some(repo)) if !args.no_mmproj => super::models::resolve_hf_mmproj(repo)?,
        _ => None,
    };
    let config = ServerConfig {
        mmproj,
        allow_remote_images: args.allow_remote_images,
        image_tokens: args.image_tokens.limits(),
        speculation,
        cors_origins,
        embeddings: args.embeddings || args.reranking,
        pooling: if args.reranking {
            Some(Pooling::Rank)
        } else {
            args.pooling
        },
        host: args.host,
        port: args.port,
        api_key,
        no_auth: args.no_auth,
        parallel: args.parallel,
        kv_memory_mib: args.kv_memory,
        alias: args.alias,
        chat_template: args.chat_template,
        max_queue: args.max_queue,
        prefill_chunk: args.prefill_chunk.max(1),
        body_limit: args.body_limit.max(1) << 20,
        shutdown_grace: Duration::from_secs(args.shutdown_grace),
        ping_interval: Duration::from_secs(args.sse_ping.max(1)),
        log_format: match args.log_format {
            LogFormatArg::Text => LogFormat::Text,
            LogFormatArg::Json => LogFormat::Json,
        },
        reasoning_format: match args.reasoning_format {
            ReasoningFormatArg::None => ReasoningFormat::None,
            ReasoningFormatArg::Deepseek | ReasoningFormatArg::Auto => ReasoningFormat::DeepSeek,
        },
    };
    let model_args = ModelArgs {
        mtp: spec_type == SpecType::DraftMtp,
        ..args.model
    };
    if let Some(dir) = &args.models_dir {
        if args.speculation.model_draft.is_some() || config.speculation.is_some() {
            return Err(InputError("--models-dir serves without speculation".into()).into());
        }
        let models = served_models(dir)?;
        let load: ferrox_server::ModelLoader = Arc::new(move |path: &std::path::Path| {
            let args = ModelArgs {
                model: Some(path.to_path_buf()),
                hf_repo: None,
                ..model_args.clone()
            };
            let loaded = model::load_engine(&args)?;
            Ok(LoadedModel {
                path: loaded.path,
                engine: loaded.engine,
                tokenizer: loaded.tokenizer,
                draft: None,
            })
        });
        let dir = ferrox_server::ModelDirectory {
            models,
            max_loaded: args.models_max.max(1),
            load,
        };
        return ferrox_server::run_directory(config, dir);
    }
    let draft_path = args.speculation.model_draft;
    // Speculation forgets rejected draft tokens: the memory is readied for as many as a
    // draft holds (the server refuses to start where it cannot be).
    let rollback = config.speculation.as_ref().map(|s| s.max);
    ferrox_server::run(config, move || {
        let mut loaded = model::load_engine(&model_args)?;
        if let Some(tokens) = rollback {
            loaded.engine.enable_rollback(tokens)?;
        }
        let draft = match draft_path {
            Some(path) => {
                let mut draft =
                    super::run::load_draft_engine(&model_args, path, &loaded.tokenizer)?;
                // The draft forgets the same rejected tokens (where it cannot, its
                // sequence is fed again from the start).
                if let Some(tokens) = rollback {
                    draft.enable_rollback(tokens)?;
                }
                Some(draft)
            }
            None => None,
        };
        Ok(LoadedModel {
            path: loaded.path,
            engine: loaded.engine,
            tokenizer: loaded.tokenizer,
            draft,
        })
    })
}
