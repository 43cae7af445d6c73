//! Models from the Hugging Face Hub: `-hf ORG/NAME[:QUANT]` on every model command,
//! `ferrox pull`, `ferrox list`, `ferrox rm`.
//!
//! Files land in the cache as `huggingface_hub` lays it out
//! (`models--ORG--NAME/{blobs,refs,snapshots}` under `HF_HUB_CACHE`, else `HF_HOME/hub`, else
//! `~/.cache/huggingface/hub`), so what another tool downloaded is reused and the other way
//! round. Downloads go through the `hf-hub` crate (resumable from the partial file, a progress
//! bar on a terminal), then each file is checked against the sha256 the Hub lists for it.
//! `HF_TOKEN` (or the token file `huggingface-cli login` writes) opens gated repositories,
//! `HF_ENDPOINT` points at a mirror, `HF_HUB_OFFLINE=1` uses only what is cached.

pub mod cache;
pub mod select;

use std::io::Read;
use std::path::{Path, PathBuf};

use hf_hub::api::sync::{ApiBuilder, ApiError};
use hf_hub::{Cache, Repo};
use indicatif::ProgressBar;
use serde::Deserialize;
use sha2::{Digest, Sha256};

pub use select::ModelRef;

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{0}")]
    BadReference(String),
    #[error("repository {0} not found on {1}")]
    NotFound(String, String),
    #[error(
        "repository {0} needs an access token (it is gated or private): set HF_TOKEN, or log \
         in with `huggingface-cli login`"
    )]
    Unauthorized(String),
    #[error("the token was refused for repository {0} (HTTP 403): is access granted on the Hub?")]
    Forbidden(String),
    #[error("the repository has no GGUF file")]
    NoGguf,
    #[error("no GGUF file for {quant} in the repository; it has: {}", available.join(", "))]
    NoQuant {
        quant: String,
        available: Vec<String>,
    },
    #[error("split part {0} is missing from the repository")]
    MissingPart(String),
    #[error(
        "{file}: sha256 {actual} does not match the Hub's {expected}; the download was \
         discarded"
    )]
    Checksum {
        file: String,
        expected: String,
        actual: String,
    },
    #[error("{0} is not in the cache (HF_HUB_OFFLINE is set)")]
    NotCached(String),
    #[error("cannot reach {endpoint}: {reason}")]
    Unreachable { endpoint: String, reason: String },
    #[error("the Hub answered HTTP {status} for {url}")]
    Status { status: u16, url: String },
    #[error("downloading {file}: {reason} (run the command again to resume)")]
    Download { file: String, reason: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl HubError {
    /// Whether the user can fix it by changing the command (exit status 2), as opposed to
    /// the network or the disk failing.
    pub fn is_input(&self) -> bool {
        !matches!(
            self,
            HubError::Unreachable { .. }
                | HubError::Download { .. }
                | HubError::Status { .. }
                | HubError::Io(_)
        )
    }
}

const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Where and how to reach the Hub, from the environment as `huggingface_hub` reads it.
pub struct Hub {
    pub cache_dir: PathBuf,
    endpoint: String,
    token: Option<String>,
    offline: bool,
}

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

impl Hub {
    pub fn from_env() -> Hub {
        let home = env("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            env("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env("HOME").unwrap_or_default()).join(".cache"))
                .join("huggingface")
        });
        let cache_dir = env("HF_HUB_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join("hub"));
        let token = env("HF_TOKEN")
            .or_else(|| env("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| {
                std::fs::read_to_string(home.join("token"))
                    .ok()
                    .map(|t| t.trim().to_string())
                    .filter(|t| !t.is_empty())
            });
        let offline = env("HF_HUB_OFFLINE").is_some_and(|v| {
            matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
        });
        Hub {
            cache_dir,
            endpoint: env("HF_ENDPOINT")
                .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string())
                .trim_end_matches('/')
                .to_string(),
            token,
            offline,
        }
    }

    /// The local path of `model` (the first file of a split checkpoint), downloading what
    /// is missing unless offline; offline, or with the Hub unreachable, what the cache holds.
    pub fn resolve(&self, model: &ModelRef) -> Result<PathBuf, HubError> {
        if self.offline {
            return self.cached(model);
        }
        let files = match self.list_files(&model.repo) {
            Ok(files) => files,
            Err(HubError::Unreachable { endpoint, reason }) => {
                return self
                    .cached(model)
                    .map_err(|_| HubError::Unreachable { endpoint, reason });
            }
            Err(e) => return Err(e),
        };
        let names: Vec<String> = files.iter().map(|f| f.rfilename.clone()).collect();
        let chosen = select::select(&names, model.quant.as_deref())?;
        let mut paths = Vec::new();
        for name in &chosen {
            let listed = files.iter().find(|f| &f.rfilename == name);
            paths.push(self.fetch(&model.repo, name, listed.and_then(RepoFile::sha256))?);
        }
        Ok(paths.swap_remove(0))
    }

    /// `model` from the cache alone.
    fn cached(&self, model: &ModelRef) -> Result<PathBuf, HubError> {
        let snapshot = cache::snapshot_dir(&self.cache_dir, &model.repo)
            .ok_or_else(|| HubError::NotCached(model.to_string()))?;
        let names = cache::files_in(&snapshot);
        let chosen = select::select(&names, model.quant.as_deref())
            .map_err(|_| HubError::NotCached(model.to_string()))?;
        Ok(snapshot.join(&chosen[0]))
    }

    fn get(&self, url: &str) -> ureq::Request {
        let request = ureq::get(url);
        match &self.token {
            Some(token) => request.set("Authorization", &format!("Bearer {token}")),
            None => request,
        }
    }

    /// The repository's files with their LFS sha256 (`?blobs=true`).
    fn list_files(&self, repo: &str) -> Result<Vec<RepoFile>, HubError> {
        let url = format!("{}/api/models/{repo}/revision/main", self.endpoint);
        let response = self
            .get(&url)
            .query("blobs", "true")
            .call()
            .map_err(|e| self.request_error(repo, &url, e))?;
        let info: RepoInfo = response.into_json().map_err(|e| HubError::Status {
            status: 200,
            url: format!("{url} (unreadable answer: {e})"),
        })?;
        Ok(info.siblings)
    }

    fn request_error(&self, repo: &str, url: &str, e: ureq::Error) -> HubError {
        match e {
            ureq::Error::Status(401, _) => HubError::Unauthorized(repo.to_string()),
            ureq::Error::Status(403, _) => HubError::Forbidden(repo.to_string()),
            ureq::Error::Status(404, _) => {
                HubError::NotFound(repo.to_string(), self.endpoint.clone())
            }
            ureq::Error::Status(status, _) => HubError::Status {
                status,
                url: url.to_string(),
            },
            ureq::Error::Transport(t) => HubError::Unreachable {
                endpoint: self.endpoint.clone(),
                reason: t.to_string(),
            },
        }
    }

    /// One file of `repo` in the cache: reused when the cached blob is the one the Hub
    /// lists, else downloaded (resuming a partial download) and checked against `sha256`.
    fn fetch(&self, repo: &str, file: &str, sha256: Option<String>) -> Result<PathBuf, HubError> {
        if let (Some(sha), Some(snapshot)) = (&sha256, cache::snapshot_dir(&self.cache_dir, repo)) {
            let path = snapshot.join(file);
            let blob = cache::blob_path(&self.cache_dir, repo, sha);
            if path.is_file() && blob.is_file() && same_file(&path, &blob) {
                return Ok(path);
            }
        }
        let api = ApiBuilder::from_cache(Cache::new(self.cache_dir.clone()))
            .with_endpoint(self.endpoint.clone())
            .with_token(self.token.clone())
            .with_progress(false)
            .build()
            .map_err(|e| self.api_error(repo, file, e))?;
        let bar = ProgressBar::new(0);
        let path = api
            .repo(Repo::model(repo.to_string()))
            .download_with_progress(file, bar)
            .map_err(|e| self.api_error(repo, file, e))?;
        if let Some(expected) = sha256 {
            let actual = sha256_of(&path)?;
            if actual != expected {
                cache::remove_file(&self.cache_dir, repo, file)?;
                return Err(HubError::Checksum {
                    file: file.to_string(),
                    expected,
                    actual,
                });
            }
        }
        Ok(path)
    }

    fn api_error(&self, repo: &str, file: &str, e: ApiError) -> HubError {
        match e {
            ApiError::RequestError(e) => match *e {
                ureq::Error::Transport(t) => HubError::Download {
                    file: file.to_string(),
                    reason: t.to_string(),
                },
                e => self.request_error(repo, &format!("{repo}/{file}"), e),
            },
            e => HubError::Download {
                file: file.to_string(),
                reason: e.to_string(),
            },
        }
    }
}

/// Whether two paths name the same contents (a snapshot entry is a link to its blob).
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

fn sha256_of(path: &Path) -> Result<String, HubError> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(format!("{:x}", hasher.finalize()))
}

/// The Hub's model info, as far as it is read here.
#[derive(Deserialize)]
struct RepoInfo {
    #[serde(default)]
    siblings: Vec<RepoFile>,
}

#[derive(Deserialize)]
struct RepoFile {
    rfilename: String,
    #[serde(default)]
    lfs: Option<LfsInfo>,
}

#[derive(Deserialize)]
struct LfsInfo {
    #[serde(default)]
    sha256: Option<String>,
    #[serde(default)]
    oid: Option<String>,
}

impl RepoFile {
    fn sha256(&self) -> Option<String> {
        let lfs = self.lfs.as_ref()?;
        let sha = lfs.sha256.as_deref().or(lfs.oid.as_deref())?;
        Some(sha.trim_start_matches("sha256:").to_ascii_lowercase())
    }
}
