//! Models from the Hugging Face Hub: `-hf ORG/NAME[:QUANT]` on every model command,
//! `ferrox pull`, `ferrox list`, `ferrox rm`.
//!
//! Files land in the cache as `huggingface_hub` lays it out
//! (`models--ORG--NAME/{blobs,refs,snapshots}` under `HF_HUB_CACHE`, else `HF_HOME/hub`, else
//! `~/.cache/huggingface/hub`), so what another tool downloaded is reused and the other way
//! round. Downloads are our own (see [`download`]): resumable from the partial file, a
//! progress bar on a terminal, each file checked against the sha256 the Hub lists before it
//! appears in a snapshot. `HF_TOKEN` (or the token file `huggingface-cli login` writes) opens
//! gated repositories, `HF_ENDPOINT` points at a mirror, `HF_HUB_OFFLINE=1` uses only what is
//! cached.
//!
//! Neither the Hub (or a mirror) nor the cache's own files are trusted to name paths: a
//! commit must be 40 hex digits, a blob a hex digest (the listed sha256, which the file's
//! ETag must equal), a file name a relative path without `..`; the token goes only to the
//! endpoint's own origin; nothing is written or removed where a link leads out of the cache.

pub mod cache;
pub mod download;
pub mod http;
pub mod select;

use std::path::{Path, PathBuf};

use serde::Deserialize;
use url::Url;

use http::{Client, Failure, Follow};

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
    /// The Hub (or a mirror) sent what cannot be used safely.
    #[error("refused: {0}")]
    Refused(String),
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
                | HubError::Refused(_)
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
        self.resolve_files(model, |_, chosen| Ok(chosen.to_vec()))
            .map(|mut paths| paths.swap_remove(0))
    }

    /// The vision projector (`mmproj`) the repository has for `model`, fetched, as
    /// llama.cpp's `-hf` fetches it ([`select::select_mmproj`]); `None` without one.
    pub fn resolve_mmproj(&self, model: &ModelRef) -> Result<Option<PathBuf>, HubError> {
        let found = self.resolve_files(model, |names, chosen| {
            Ok(select::select_mmproj(names, &chosen[0])
                .into_iter()
                .collect())
        })?;
        Ok(found.into_iter().next())
    }

    /// Lists the repository (or, offline or with the Hub unreachable, its cached snapshot),
    /// chooses `model`'s files, and fetches what `pick(listing, chosen)` names.
    fn resolve_files(
        &self,
        model: &ModelRef,
        pick: impl Fn(&[String], &[String]) -> Result<Vec<String>, HubError>,
    ) -> Result<Vec<PathBuf>, HubError> {
        let from_cache = || -> Result<Vec<PathBuf>, HubError> {
            let snapshot = cache::snapshot_dir(&self.cache_dir, &model.repo)
                .ok_or_else(|| HubError::NotCached(model.to_string()))?;
            let names = cache::files_in(&snapshot);
            let chosen = select::select(&names, model.quant.as_deref())
                .map_err(|_| HubError::NotCached(model.to_string()))?;
            let wanted = pick(&names, &chosen)?;
            Ok(wanted.iter().map(|n| snapshot.join(n)).collect())
        };
        if self.offline {
            return from_cache();
        }
        let client = Client::new(self.endpoint_url()?, self.token.clone());
        let info = match self.list_files(&client, &model.repo) {
            Ok(info) => info,
            Err(HubError::Unreachable { endpoint, reason }) => {
                return from_cache().map_err(|_| HubError::Unreachable { endpoint, reason });
            }
            Err(e) => return Err(e),
        };
        let names: Vec<String> = info.siblings.iter().map(|f| f.rfilename.clone()).collect();
        let chosen = select::select(&names, model.quant.as_deref())?;
        let mut paths = Vec::new();
        for name in &pick(&names, &chosen)? {
            let listed = info
                .siblings
                .iter()
                .find(|f| &f.rfilename == name)
                .expect("chosen among the listed files");
            paths.push(self.fetch(&client, &model.repo, listed, info.sha.as_deref())?);
        }
        Ok(paths)
    }

    fn endpoint_url(&self) -> Result<Url, HubError> {
        let bad =
            |why: String| HubError::BadReference(format!("HF_ENDPOINT `{}`: {why}", self.endpoint));
        let url = Url::parse(&self.endpoint).map_err(|e| bad(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err(bad("not an http(s) URL".to_string()));
        }
        Ok(url)
    }

    /// The endpoint's URL with `parts` appended as path segments (each percent-encoded).
    fn url(client: &Client, parts: &[&str]) -> Url {
        let mut url = client.endpoint().clone();
        url.path_segments_mut()
            .expect("an http(s) URL has a path")
            .pop_if_empty()
            .extend(parts);
        url
    }

    /// The repository's files with their LFS sha256 (`?blobs=true`), and its commit. A file
    /// name that would lead out of a snapshot directory is refused.
    fn list_files(&self, client: &Client, repo: &str) -> Result<RepoInfo, HubError> {
        let (org, name) = repo.split_once('/').expect("a checked reference");
        let mut url = Self::url(client, &["api", "models", org, name, "revision", "main"]);
        url.query_pairs_mut().append_pair("blobs", "true");
        let shown = url.to_string();
        let (_, response) = client
            .send("GET", url, None, Follow::All)
            .map_err(|f| self.request_error(repo, &shown, f, None))?;
        if response.status() != 200 {
            return Err(HubError::Status {
                status: response.status(),
                url: shown,
            });
        }
        let info: RepoInfo = response.into_json().map_err(|e| HubError::Status {
            status: 200,
            url: format!("{shown} (unreadable answer: {e})"),
        })?;
        if let Some(bad) = info
            .siblings
            .iter()
            .find(|f| !cache::is_safe_file_name(&f.rfilename))
        {
            return Err(HubError::Refused(format!(
                "{} lists a file named {:?} in {repo}: not a plain relative path, it would \
                 lead out of the repository's directory",
                self.endpoint, bad.rfilename
            )));
        }
        Ok(info)
    }

    /// The error for a failed request to `url`; a broken connection while fetching `file`
    /// is a download to resume.
    fn request_error(&self, repo: &str, url: &str, f: Failure, file: Option<&str>) -> HubError {
        match f {
            Failure::Status(401) => HubError::Unauthorized(repo.to_string()),
            Failure::Status(403) => HubError::Forbidden(repo.to_string()),
            Failure::Status(404) => HubError::NotFound(repo.to_string(), self.endpoint.clone()),
            Failure::Status(status) => HubError::Status {
                status,
                url: url.to_string(),
            },
            Failure::Transport(reason) => match file {
                Some(file) => HubError::Download {
                    file: file.to_string(),
                    reason,
                },
                None => HubError::Unreachable {
                    endpoint: self.endpoint.clone(),
                    reason,
                },
            },
            Failure::Redirect(what) => HubError::Refused(format!("{url}: {what}")),
        }
    }

    /// One file of `repo` in the cache: reused when the cached blob is the one the Hub
    /// lists, else downloaded (resuming a partial download) and checked against its sha256.
    fn fetch(
        &self,
        client: &Client,
        repo: &str,
        listed: &RepoFile,
        listed_commit: Option<&str>,
    ) -> Result<PathBuf, HubError> {
        let file = listed.rfilename.as_str();
        let endpoint = &self.endpoint;
        let sha256 = listed.sha256().map_err(|sha| {
            HubError::Refused(format!(
                "{endpoint} lists `{sha}` as the sha256 of {file}, not 64 hex digits"
            ))
        })?;
        if let (Some(sha), Some(snapshot)) = (&sha256, cache::snapshot_dir(&self.cache_dir, repo)) {
            let path = snapshot.join(file);
            let blob = cache::blob_path(&self.cache_dir, repo, sha);
            if path.is_file() && blob.is_file() && same_file(&path, &blob) {
                return Ok(path);
            }
        }
        let (org, name) = repo.split_once('/').expect("a checked reference");
        let mut parts = vec![org, name, "resolve", "main"];
        parts.extend(file.split('/'));
        let url = Self::url(client, &parts);
        let shown = url.to_string();
        let fail = |f: Failure| self.request_error(repo, &shown, f, Some(file));
        let meta = file_meta(client, url).map_err(fail)?;
        let commit = match (&meta.commit, listed_commit) {
            (Some(c), _) if cache::is_commit(c) => c.clone(),
            (Some(c), _) => {
                return Err(HubError::Refused(format!(
                    "{endpoint} gives `{c}` as the commit of {repo}, not a 40-digit hex hash"
                )))
            }
            (None, Some(c)) if cache::is_commit(c) => c.to_string(),
            (None, _) => {
                return Err(HubError::Refused(format!(
                    "{endpoint} gives no commit hash for {repo}"
                )))
            }
        };
        let etag = meta.etag.as_deref().map(bare_etag);
        let (blob, expected) = match (sha256, etag) {
            (Some(sha), Some(etag)) if !etag.eq_ignore_ascii_case(&sha) => {
                return Err(HubError::Refused(format!(
                    "{endpoint} gives `{etag}` as the ETag of {file}, not the sha256 its \
                     listing gives ({sha})"
                )))
            }
            (Some(sha), _) => (sha.clone(), Some(sha)),
            (None, Some(etag)) if cache::is_blob_name(etag) => {
                let etag = etag.to_ascii_lowercase();
                let sha = cache::is_sha256(&etag).then(|| etag.clone());
                (etag, sha)
            }
            (None, Some(etag)) => {
                return Err(HubError::Refused(format!(
                    "{endpoint} gives `{etag}` as the ETag of {file}, not a sha256 or git hash"
                )))
            }
            (None, None) => {
                return Err(HubError::Refused(format!(
                    "{endpoint} gives neither a sha256 nor an ETag for {file}"
                )))
            }
        };
        let target = download::Blob {
            cache: &self.cache_dir,
            repo,
            file,
            commit: &commit,
            name: &blob,
            sha256: expected.as_deref(),
            size: listed.size().or(meta.size),
        };
        download::store(client, &meta.location, &target, &fail)
    }
}

/// What the Hub says of a file before sending it (`huggingface_hub` reads the same).
struct FileMeta {
    commit: Option<String>,
    etag: Option<String>,
    size: Option<u64>,
    /// Where the bytes are: the CDN link the Hub redirects to, else the file's own URL.
    location: Url,
}

/// A `HEAD` of the file's URL, following only redirects on the same server: the answer
/// that redirects elsewhere carries the metadata.
fn file_meta(client: &Client, url: Url) -> Result<FileMeta, Failure> {
    let (at, response) = client.send("HEAD", url, None, Follow::Relative)?;
    let header = |name: &str| response.header(name).map(str::to_string);
    let redirected = (300..400).contains(&response.status());
    let location = match response.header("Location") {
        Some(location) if redirected => http::next_url(&at, location)?,
        _ => at,
    };
    let size = header("X-Linked-Size")
        .or_else(|| header("Content-Length").filter(|_| !redirected))
        .and_then(|s| s.trim().parse().ok());
    Ok(FileMeta {
        commit: header("X-Repo-Commit"),
        etag: header("X-Linked-Etag").or_else(|| header("ETag")),
        size,
        location,
    })
}

/// An ETag without its weak marker and quotes.
fn bare_etag(etag: &str) -> &str {
    let etag = etag.trim();
    etag.strip_prefix("W/").unwrap_or(etag).trim_matches('"')
}

/// Whether two paths name the same contents (a snapshot entry is a link to its blob).
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// The Hub's model info, as far as it is read here.
#[derive(Deserialize)]
struct RepoInfo {
    /// The commit `main` is at.
    #[serde(default)]
    sha: Option<String>,
    #[serde(default)]
    siblings: Vec<RepoFile>,
}

#[derive(Deserialize)]
struct RepoFile {
    rfilename: String,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    lfs: Option<LfsInfo>,
}

#[derive(Deserialize)]
struct LfsInfo {
    #[serde(default)]
    sha256: Option<String>,
    #[serde(default)]
    oid: Option<String>,
    #[serde(default)]
    size: Option<u64>,
}

impl RepoFile {
    /// The listed sha256 (lower case), if any; `Err` with it if it is not 64 hex digits.
    fn sha256(&self) -> Result<Option<String>, String> {
        let Some(lfs) = self.lfs.as_ref() else {
            return Ok(None);
        };
        let Some(sha) = lfs.sha256.as_deref().or(lfs.oid.as_deref()) else {
            return Ok(None);
        };
        let sha = sha.trim_start_matches("sha256:").to_ascii_lowercase();
        if cache::is_sha256(&sha) {
            Ok(Some(sha))
        } else {
            Err(sha)
        }
    }

    fn size(&self) -> Option<u64> {
        self.lfs.as_ref().and_then(|l| l.size).or(self.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_are_read_bare() {
        assert_eq!(bare_etag("\"abc\""), "abc");
        assert_eq!(bare_etag("W/\"abc\""), "abc");
        assert_eq!(bare_etag(" abc "), "abc");
    }
}
