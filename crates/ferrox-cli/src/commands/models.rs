//! `ferrox pull`, `ferrox list`, `ferrox rm`: the Hub cache (see [`super::hub`]).

use std::io::Write;

use anyhow::Context;
use ferrox_gguf::{file_type_name, Gguf};

use super::hub::{cache, select, Hub, ModelRef};
use super::InputError;

#[derive(clap::Args)]
pub struct PullArgs {
    /// ORG/NAME[:QUANT] (default quantization Q4_K_M, else the first GGUF).
    pub model: String,
}

#[derive(clap::Args)]
pub struct ListArgs {
    /// Print one JSON object per model instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct RmArgs {
    /// ORG/NAME (the whole repository) or ORG/NAME:QUANT (that checkpoint).
    pub model: String,
}

/// Resolves `-hf ORG/NAME[:QUANT]` to a local file, downloading it if needed.
pub fn resolve_hf(reference: &str) -> anyhow::Result<std::path::PathBuf> {
    let model = ModelRef::parse(reference).map_err(hub_error)?;
    Hub::from_env().resolve(&model).map_err(hub_error)
}

/// The vision projector the `-hf` repository has for the model, downloaded if needed (as
/// llama.cpp's `-hf` fetches `mmproj-*.gguf`); `None` when it has none.
pub fn resolve_hf_mmproj(reference: &str) -> anyhow::Result<Option<std::path::PathBuf>> {
    let model = ModelRef::parse(reference).map_err(hub_error)?;
    Hub::from_env().resolve_mmproj(&model).map_err(hub_error)
}

/// Hub errors the user can fix exit with status 2.
fn hub_error(e: super::hub::HubError) -> anyhow::Error {
    if e.is_input() {
        InputError(e.to_string()).into()
    } else {
        e.into()
    }
}

pub fn pull(args: PullArgs) -> anyhow::Result<()> {
    let path = resolve_hf(&args.model)?;
    println!("{}", path.display());
    Ok(())
}

/// What `list` shows of one checkpoint.
struct Described {
    architecture: String,
    quant: String,
    parameters: u64,
}

fn describe(path: &std::path::Path) -> Option<Described> {
    let gguf = Gguf::open(path).ok()?;
    let meta = gguf.metadata();
    let architecture = meta.architecture().ok()?.to_string();
    let quant = meta
        .opt_u32("general.file_type")
        .ok()
        .flatten()
        .and_then(file_type_name)
        .unwrap_or("?")
        .to_string();
    let parameters = gguf.tensors().iter().map(|t| t.n_elements).sum();
    Some(Described {
        architecture,
        quant,
        parameters,
    })
}

pub fn list(args: ListArgs) -> anyhow::Result<()> {
    let hub = Hub::from_env();
    let models = cache::models(&hub.cache_dir);
    let mut out = std::io::stdout().lock();
    if !args.json {
        writeln!(
            out,
            "{:<40} {:<48} {:>10} {:<12} {:<16} {:>10}",
            "REPO", "FILE", "SIZE", "ARCH", "QUANT", "PARAMS"
        )?;
    }
    for m in &models {
        let d = describe(&m.path);
        if args.json {
            let line = serde_json::json!({
                "repo": m.repo,
                "file": m.file,
                "path": m.path,
                "bytes": m.bytes,
                "architecture": d.as_ref().map(|d| d.architecture.clone()),
                "quant": d.as_ref().map(|d| d.quant.clone()),
                "parameters": d.as_ref().map(|d| d.parameters),
            });
            writeln!(out, "{line}")?;
        } else {
            let (arch, quant, params) = match &d {
                Some(d) => (
                    d.architecture.as_str(),
                    d.quant.as_str(),
                    format!("{:.2}B", d.parameters as f64 / 1e9),
                ),
                None => ("?", "?", "?".to_string()),
            };
            writeln!(
                out,
                "{:<40} {:<48} {:>10} {arch:<12} {quant:<16} {params:>10}",
                m.repo,
                m.file,
                format!("{:.1} MB", m.bytes as f64 / 1e6),
            )?;
        }
    }
    if models.is_empty() && !args.json {
        eprintln!("no models in {}", hub.cache_dir.display());
    }
    Ok(())
}

/// Removes from the cache only: a link is unlinked (what it points at stays), a directory
/// reached through a link that leads out of the cache is not entered, and a blob is deleted
/// only where it lies inside the repository's directory (see [`cache::remove_file`]).
pub fn rm(args: RmArgs) -> anyhow::Result<()> {
    let model = ModelRef::parse(&args.model).map_err(hub_error)?;
    let hub = Hub::from_env();
    let dir = cache::repo_dir(&hub.cache_dir, &model.repo);
    if !cache::has_repo(&hub.cache_dir, &model.repo) {
        return Err(InputError(format!(
            "{} is not in {}",
            model.repo,
            hub.cache_dir.display()
        ))
        .into());
    }
    let Some(quant) = &model.quant else {
        cache::remove_repo(&hub.cache_dir, &model.repo)
            .with_context(|| format!("{}", dir.display()))?;
        eprintln!("removed {}", model.repo);
        return Ok(());
    };
    let snapshot = cache::snapshot_dir(&hub.cache_dir, &model.repo);
    let names = snapshot.as_deref().map(cache::files_in).unwrap_or_default();
    let files = select::select(&names, Some(quant)).map_err(hub_error)?;
    let mut freed = 0;
    for file in &files {
        freed += cache::remove_file(&hub.cache_dir, &model.repo, file)
            .with_context(|| format!("{}", dir.display()))?;
        eprintln!("removed {}/{file}", model.repo);
    }
    eprintln!("freed {:.1} MB", freed as f64 / 1e6);
    Ok(())
}
