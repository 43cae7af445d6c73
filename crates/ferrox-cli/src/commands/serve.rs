//! `ferrox serve`: an OpenAI-compatible HTTP server (see the `ferrox-server` crate).

use std::time::Duration;

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
    let config = ServerConfig {
        speculation,
        cors_origins,
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
