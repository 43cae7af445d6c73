//! The Hub cache on disk, `huggingface_hub`'s layout: `models--ORG--NAME/refs/main` holds the
//! commit of the snapshot in use, `snapshots/COMMIT/FILE` links to `blobs/SHA256`.
//!
//! What comes from the network or from the cache's own files is checked before it names a
//! path: a commit is 40 hex digits, a blob a hex digest, a file name a relative path without
//! `..`. Nothing is written or removed at a path that resolves outside the cache: directories
//! are created one level at a time and each is resolved; a link is unlinked, never followed
//! into a directory that leaves the cache.

use std::io;
use std::path::{Component, Path, PathBuf};

/// `models--ORG--NAME` for `ORG/NAME`.
pub fn repo_dir(cache: &Path, repo: &str) -> PathBuf {
    cache.join(repo_dir_name(repo))
}

fn repo_dir_name(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

/// `ORG/NAME` for a `models--ORG--NAME` directory name.
fn repo_name(dir_name: &str) -> Option<String> {
    let rest = dir_name.strip_prefix("models--")?;
    let (org, name) = rest.split_once("--")?;
    Some(format!("{org}/{name}"))
}

pub fn blob_path(cache: &Path, repo: &str, blob: &str) -> PathBuf {
    repo_dir(cache, repo).join("blobs").join(blob)
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether `s` is a commit hash: 40 hex digits.
pub fn is_commit(s: &str) -> bool {
    is_hex(s, 40)
}

/// Whether `s` is a sha256: 64 hex digits.
pub fn is_sha256(s: &str) -> bool {
    is_hex(s, 64)
}

/// Whether `s` may name a blob: a sha256 (an LFS file) or a git blob hash (40 hex digits).
pub fn is_blob_name(s: &str) -> bool {
    is_sha256(s) || is_hex(s, 40)
}

/// Whether `name`, a file of a repository, stays inside a snapshot: relative, `/`-separated
/// parts none of which is empty, `.` or `..`, without backslash or NUL.
pub fn is_safe_file_name(name: &str) -> bool {
    !name.is_empty()
        && !name.contains(['\\', '\0'])
        && name
            .split('/')
            .all(|p| !p.is_empty() && p != "." && p != "..")
}

/// The snapshot `refs/main` points at.
pub fn snapshot_dir(cache: &Path, repo: &str) -> Option<PathBuf> {
    let dir = repo_dir(cache, repo);
    let commit = std::fs::read_to_string(dir.join("refs/main")).ok()?;
    let commit = commit.trim();
    // A ref is a commit hash; anything else could lead out of the snapshot directory.
    if !is_commit(commit) {
        return None;
    }
    let snapshot = dir.join("snapshots").join(commit);
    snapshot.is_dir().then_some(snapshot)
}

/// Whether `path` is a real directory (not a link to one).
fn is_real_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

/// The files of a snapshot, as repository paths: the entries that are (or link to) files,
/// in the snapshot's real subdirectories (a link to a directory is not followed).
pub fn files_in(snapshot: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![snapshot.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if is_real_dir(&path) {
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

fn outside(path: &Path) -> io::Error {
    io::Error::other(format!(
        "{} leads outside the cache (through a link); it was not touched",
        path.display()
    ))
}

/// Whether `path` resolves to a place under `root` (itself resolved).
fn resolves_under(path: &Path, root: &Path) -> bool {
    std::fs::canonicalize(path).is_ok_and(|p| p.starts_with(root))
}

/// Creates `cache/rel` one directory at a time, each level resolved and required to lie in
/// the cache, so that a link in the way (`snapshots` pointing elsewhere, say) makes this fail
/// instead of creating directories where it leads. Returns `cache/rel`.
pub fn ensure_dir(cache: &Path, rel: &Path) -> io::Result<PathBuf> {
    std::fs::create_dir_all(cache)?;
    let root = std::fs::canonicalize(cache)?;
    let mut path = cache.to_path_buf();
    for part in rel.components() {
        let Component::Normal(part) = part else {
            return Err(io::Error::other(format!(
                "{}: not a plain relative path",
                rel.display()
            )));
        };
        path.push(part);
        match std::fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        if !(resolves_under(&path, &root) && path.is_dir()) {
            return Err(outside(&path));
        }
    }
    Ok(path)
}

/// Makes room for a file at `path`: a link or a file there is unlinked; a directory is an
/// error.
pub fn clear_entry(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Err(io::Error::other(format!(
            "{} is a directory",
            path.display()
        ))),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The relative cache paths of a repository's directories.
pub fn rel_blobs(repo: &str) -> PathBuf {
    Path::new(&repo_dir_name(repo)).join("blobs")
}

pub fn rel_snapshot(repo: &str, commit: &str) -> PathBuf {
    Path::new(&repo_dir_name(repo))
        .join("snapshots")
        .join(commit)
}

pub fn rel_refs(repo: &str) -> PathBuf {
    Path::new(&repo_dir_name(repo)).join("refs")
}

/// Where `huggingface_hub` keeps the lock files of a repository's downloads.
pub fn rel_locks(repo: &str) -> PathBuf {
    Path::new(".locks").join(repo_dir_name(repo))
}

/// Points `refs/main` of `repo` at `commit` (written beside it, then renamed over it, so a
/// link there is replaced rather than written through).
pub fn set_ref(cache: &Path, repo: &str, commit: &str) -> io::Result<()> {
    debug_assert!(is_commit(commit));
    let refs = ensure_dir(cache, &rel_refs(repo))?;
    let main = refs.join("main");
    if std::fs::symlink_metadata(&main).is_ok_and(|m| m.is_file())
        && std::fs::read_to_string(&main).is_ok_and(|c| c.trim() == commit)
    {
        return Ok(());
    }
    let tmp = refs.join(format!(".main.{}.tmp", std::process::id()));
    clear_entry(&tmp)?;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| io::Write::write_all(&mut f, commit.as_bytes()))?;
    std::fs::rename(&tmp, &main)
}

/// Links `snapshots/COMMIT/FILE` of `repo` to `blobs/BLOB`, with a relative link as
/// `huggingface_hub` makes them. Returns the snapshot path.
pub fn link_blob(
    cache: &Path,
    repo: &str,
    commit: &str,
    file: &str,
    blob: &str,
) -> io::Result<PathBuf> {
    debug_assert!(is_commit(commit) && is_blob_name(blob) && is_safe_file_name(file));
    let rel_file = Path::new(file);
    let mut dir = rel_snapshot(repo, commit);
    if let Some(parent) = rel_file.parent() {
        dir.push(parent);
    }
    let dir = ensure_dir(cache, &dir)?;
    let pointer = dir.join(rel_file.file_name().expect("a checked file name"));
    clear_entry(&pointer)?;
    let depth = file.split('/').count() + 1;
    let mut target = PathBuf::new();
    for _ in 0..depth {
        target.push("..");
    }
    target.push("blobs");
    target.push(blob);
    make_link(&target, &blob_path(cache, repo, blob), &pointer)?;
    Ok(pointer)
}

#[cfg(unix)]
fn make_link(target: &Path, _blob: &Path, pointer: &Path) -> io::Result<()> {
    std::os::unix::fs::symlink(target, pointer)
}

/// Without symlinks, a copy of the blob.
#[cfg(not(unix))]
fn make_link(_target: &Path, blob: &Path, pointer: &Path) -> io::Result<()> {
    std::fs::copy(blob, pointer).map(|_| ())
}

/// `repo`'s directory resolved, if it lies in the cache; `None` if there is none.
fn real_repo_dir(cache: &Path, repo: &str) -> io::Result<Option<PathBuf>> {
    let dir = repo_dir(cache, repo);
    if std::fs::symlink_metadata(&dir).is_err() {
        return Ok(None);
    }
    let root = std::fs::canonicalize(cache)?;
    match std::fs::canonicalize(&dir) {
        Ok(real) if real.starts_with(&root) && real.is_dir() => Ok(Some(real)),
        Ok(_) => Err(outside(&dir)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(outside(&dir)),
        Err(e) => Err(e),
    }
}

/// Removes `file` from every snapshot of `repo`, and the blobs it linked to. Only real
/// directories of the repository are entered (a snapshot that is a link is skipped), a link
/// is unlinked, and a blob is deleted only if it resolves inside the repository's directory.
/// Returns the bytes freed.
pub fn remove_file(cache: &Path, repo: &str, file: &str) -> io::Result<u64> {
    if !is_safe_file_name(file) {
        return Ok(0);
    }
    let Some(root) = real_repo_dir(cache, repo)? else {
        return Ok(0);
    };
    let snapshots = root.join("snapshots");
    if !is_real_dir(&snapshots) {
        return Ok(0);
    }
    let (parents, name) = match file.rsplit_once('/') {
        Some((parents, name)) => (Some(parents), name),
        None => (None, file),
    };
    let mut freed = 0;
    for snapshot in std::fs::read_dir(&snapshots)?.flatten() {
        let mut dir = snapshot.path();
        let mut real = is_real_dir(&dir);
        for part in parents.into_iter().flat_map(|p| p.split('/')) {
            if !real {
                break;
            }
            dir.push(part);
            real = is_real_dir(&dir);
        }
        if !real {
            continue;
        }
        let pointer = dir.join(name);
        let Ok(meta) = std::fs::symlink_metadata(&pointer) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            // The linked blob goes too, if it lies inside the repository's directory.
            if let Ok(blob) = std::fs::canonicalize(&pointer) {
                if blob.starts_with(&root) && blob.is_file() {
                    freed += std::fs::metadata(&blob).map_or(0, |m| m.len());
                    std::fs::remove_file(&blob)?;
                }
            }
            std::fs::remove_file(&pointer)?;
        } else if meta.is_file() {
            // A file stored in place of a link is its own blob.
            freed += meta.len();
            std::fs::remove_file(&pointer)?;
        }
    }
    Ok(freed)
}

/// Removes `repo`'s directory: a link there is unlinked (what it points at stays), a real
/// directory is removed with its contents without following any link inside it.
pub fn remove_repo(cache: &Path, repo: &str) -> io::Result<()> {
    let dir = repo_dir(cache, repo);
    match std::fs::symlink_metadata(&dir) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&dir),
        Ok(_) => std::fs::remove_file(&dir),
        Err(e) => Err(e),
    }
}

/// Whether the cache has an entry (a directory or a link) for `repo`.
pub fn has_repo(cache: &Path, repo: &str) -> bool {
    std::fs::symlink_metadata(repo_dir(cache, repo)).is_ok()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_outside_are_checked() {
        assert!(is_commit("0123456789abcdef0123456789abcdef01234567"));
        assert!(!is_commit("../../evil"));
        assert!(!is_commit("0123456789abcdef0123456789abcdef0123456"));
        assert!(is_blob_name(&"a".repeat(64)));
        assert!(!is_blob_name("../../../tmp/pwned"));
        assert!(is_safe_file_name("model-Q4_K_M.gguf"));
        assert!(is_safe_file_name("sub/model.gguf"));
        for bad in [
            "",
            "../x.gguf",
            "a/../../x",
            "/etc/passwd",
            "a//b",
            "./a",
            "a\\..\\b",
            "a\0b",
        ] {
            assert!(!is_safe_file_name(bad), "{bad:?}");
        }
    }
}
