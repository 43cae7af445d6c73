//! The Hub cache on disk, `huggingface_hub`'s layout: `models--ORG--NAME/refs/main` holds the
//! commit of the snapshot in use, `snapshots/COMMIT/FILE` links to `blobs/SHA256`.

use std::path::{Path, PathBuf};

/// `models--ORG--NAME` for `ORG/NAME`.
pub fn repo_dir(cache: &Path, repo: &str) -> PathBuf {
    cache.join(format!("models--{}", repo.replace('/', "--")))
}

/// `ORG/NAME` for a `models--ORG--NAME` directory name.
fn repo_name(dir_name: &str) -> Option<String> {
    let rest = dir_name.strip_prefix("models--")?;
    let (org, name) = rest.split_once("--")?;
    Some(format!("{org}/{name}"))
}

pub fn blob_path(cache: &Path, repo: &str, sha256: &str) -> PathBuf {
    repo_dir(cache, repo).join("blobs").join(sha256)
}

/// The snapshot `refs/main` points at.
pub fn snapshot_dir(cache: &Path, repo: &str) -> Option<PathBuf> {
    let dir = repo_dir(cache, repo);
    let commit = std::fs::read_to_string(dir.join("refs/main")).ok()?;
    let commit = commit.trim();
    // A ref is a commit hash; anything else would escape the snapshot directory.
    if commit.is_empty() || !commit.chars().all(|c| c.is_ascii_alphanumeric()) {
        return None;
    }
    let snapshot = dir.join("snapshots").join(commit);
    snapshot.is_dir().then_some(snapshot)
}

/// The files of a snapshot, as repository paths.
pub fn files_in(snapshot: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![snapshot.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.is_file() {
                if let Ok(rel) = path.strip_prefix(snapshot) {
                    out.push(rel.to_string_lossy().into_owned());
                }
            }
        }
    }
    out.sort();
    out
}

/// Removes `file` from every snapshot of `repo`, and the blobs it linked to.
pub fn remove_file(cache: &Path, repo: &str, file: &str) -> std::io::Result<u64> {
    let dir = repo_dir(cache, repo);
    let mut freed = 0;
    let (Ok(snapshots), Ok(root)) = (
        std::fs::read_dir(dir.join("snapshots")),
        std::fs::canonicalize(&dir),
    ) else {
        return Ok(0);
    };
    for snapshot in snapshots.flatten() {
        let pointer = snapshot.path().join(file);
        if pointer.symlink_metadata().is_err() {
            continue;
        }
        // The linked blob goes too, if it lies inside the repository's directory (a file
        // stored in place of a link is its own blob).
        if let Ok(blob) = std::fs::canonicalize(&pointer) {
            if blob.starts_with(&root) {
                freed += std::fs::metadata(&blob).map_or(0, |m| m.len());
                std::fs::remove_file(&blob)?;
            }
        }
        if pointer.symlink_metadata().is_ok() {
            std::fs::remove_file(&pointer)?;
        }
    }
    Ok(freed)
}

/// One cached GGUF checkpoint (a split one counted once, by its first part).
pub struct CachedModel {
    pub repo: String,
    pub file: String,
    pub path: PathBuf,
    /// Bytes of all its parts.
    pub bytes: u64,
}

/// Every GGUF checkpoint in the cache's current snapshots, by repository then file.
pub fn models(cache: &Path) -> Vec<CachedModel> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(cache) else {
        return out;
    };
    let mut repos: Vec<String> = entries
        .flatten()
        .filter_map(|e| repo_name(&e.file_name().to_string_lossy()))
        .collect();
    repos.sort();
    for repo in repos {
        let Some(snapshot) = snapshot_dir(cache, &repo) else {
            continue;
        };
        let files = files_in(&snapshot);
        for file in files
            .iter()
            .filter(|f| f.to_ascii_lowercase().ends_with(".gguf"))
        {
            let size = |f: &str| std::fs::metadata(snapshot.join(f)).map_or(0, |m| m.len());
            let bytes = match super::select::split_part(file) {
                Some((prefix, 1, count)) => (1..=count)
                    .map(|i| size(&format!("{prefix}-{i:05}-of-{count:05}.gguf")))
                    .sum(),
                Some(_) => continue,
                None => size(file),
            };
            out.push(CachedModel {
                repo: repo.clone(),
                file: file.clone(),
                path: snapshot.join(file),
                bytes,
            });
        }
    }
    out
}
