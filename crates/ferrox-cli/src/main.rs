//! `ferrox`: run, inspect and serve GGUF language models on the CPU.

mod commands;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "ferrox",
    version,
    about = "Run large language models from GGUF checkpoints on the CPU"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show a GGUF file's metadata and tensors.
    Inspect(commands::inspect::Args),
    /// Print the token ids (and pieces) a model's tokenizer gives a text.
    Tokenize(commands::tokenize::TokenizeArgs),
    /// Generate a continuation of a prompt.
    Run(commands::run::Args),
    /// Chat interactively using the model's chat template.
    Chat(commands::chat::Args),
    /// Measure perplexity on a text file, as llama-perplexity does.
    Perplexity(commands::perplexity::Args),
    /// Measure prefill and decode speed, as llama-bench does.
    Bench(commands::bench::Args),
    /// Print the text token ids stand for.
    Detokenize(commands::tokenize::DetokenizeArgs),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(commands::serve::Args),
    /// Print the embeddings of texts, as llama-embedding does.
    Embedding(commands::embedding::Args),
    /// Download a model from the Hugging Face Hub into its cache (ORG/NAME[:QUANT]).
    Pull(commands::models::PullArgs),
    /// List the GGUF models in the Hugging Face Hub cache.
    List(commands::models::ListArgs),
    /// Remove a model from the Hugging Face Hub cache.
    Rm(commands::models::RmArgs),
}

/// llama.cpp's multi-letter short flags, spelled as their long forms for the parser.
fn llama_cpp_flags(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    args.map(|a| match a.to_str() {
        Some("-hf" | "-hfr") => "--hf-repo".into(),
        Some("-np") => "--parallel".into(),
        Some("-sys") => "--system".into(),
        Some("-md") => "--model-draft".into(),
        Some("-ctk") => "--cache-type-k".into(),
        Some("-ctv") => "--cache-type-v".into(),
        _ => a,
    })
    .collect()
}

/// The environment variable that sets a flag: `--ctx-size` is `FERROX_CTX_SIZE`.
fn env_name(long: &str) -> String {
    format!("FERROX_{}", long.to_ascii_uppercase().replace('-', "_"))
}

/// Every command's flags but `-m`, each also read from its `FERROX_*` variable (for
/// containers and service managers); a flag on the command line wins. Values stay out of
/// `--help` (one may be an API key).
fn command_with_env() -> clap::Command {
    Cli::command().mut_subcommands(|sub| {
        sub.mut_args(|arg| match arg.get_long() {
            // `FERROX_MODEL` keeps the container entry point's meaning (a name under
            // /models), so `-m` has no variable.
            Some(long) if !arg.is_positional() && !matches!(long, "help" | "version" | "model") => {
                let name = env_name(long);
                let arg = arg.env(name).hide_env_values(true);
                // A switch from the environment: `1`, `yes`, `on` as well as `true`.
                if matches!(arg.get_action(), clap::ArgAction::SetTrue) {
                    arg.value_parser(clap::builder::FalseyValueParser::new())
                } else {
                    arg
                }
            }
            _ => arg,
        })
    })
}

/// Bad input (a file that cannot be read or parsed, a model we cannot run, invalid
/// arguments) exits with 2; anything else that fails exits with 1.
fn exit_code(err: &anyhow::Error) -> u8 {
    let is_input = err.chain().any(|e| {
        e.is::<ferrox_gguf::GgufError>()
            || e.is::<ferrox_models::ModelError>()
            || e.is::<ferrox_tokenizer::tokenizer::TokenizerError>()
            || e.is::<std::io::Error>()
            || e.is::<commands::InputError>()
    });
    if is_input {
        2
    } else {
        1
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The libraries' warnings (a `--mlock` or `--direct-io` the system refuses, an unpinned
/// `--numa` worker) on stderr; `RUST_LOG` shows more. `serve` starts its own logging.
fn init_warnings() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .without_time()
        .try_init();
}

fn main() -> ExitCode {
    let matches = command_with_env().get_matches_from(llama_cpp_flags(std::env::args_os()));
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    if !matches!(cli.command, Command::Serve(_)) {
        init_warnings();
    }
    let result = match cli.command {
        Command::Inspect(args) => commands::inspect::run(args),
        Command::Tokenize(args) => commands::tokenize::run_tokenize(args),
        Command::Run(args) => commands::run::run(args),
        Command::Chat(args) => commands::chat::run(args),
        Command::Perplexity(args) => commands::perplexity::run(args),
        Command::Bench(args) => commands::bench::run(args),
        Command::Detokenize(args) => commands::tokenize::run_detokenize(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::Embedding(args) => commands::embedding::run(args),
        Command::Pull(args) => commands::models::pull(args),
        Command::List(args) => commands::models::list(args),
        Command::Rm(args) => commands::models::rm(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`ferrox inspect ... | head`) is not a failure.
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            // One line: the context chain joined with ": ".
            eprintln!("error: {err:#}");
            ExitCode::from(exit_code(&err))
        }
    }
}
