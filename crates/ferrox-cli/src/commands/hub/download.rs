//! One file of a repository into the cache, as `huggingface_hub` stores it: the bytes go to
//! `blobs/NAME.incomplete` (an interrupted transfer resumes from its length), are checked
//! against the sha256 when it is known, are renamed to `blobs/NAME`, and only then is
//! `snapshots/COMMIT/FILE` linked to them and `refs/main` set. A lock file under
//! `.locks/models--ORG--NAME/` keeps two downloads of one blob apart.
//!
//! A resumed transfer appends only to an answer `206` whose `Content-Range` starts at the
//! partial file's length (and, when the size is known, whose total is that size); a `200`
//! starts over from byte 0, as does any other answer to a range, once. A partial file at or
//! past the full size starts over too.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use url::Url;

use super::cache;
use super::http::{Client, Failure, Follow};
use super::HubError;

/// What to store, under which names; every name already checked.
pub struct Blob<'a> {
    pub cache: &'a Path,
    pub repo: &'a str,
    pub file: &'a str,
    pub commit: &'a str,
    /// The blob's name: the file's sha256, or its git hash when the Hub lists no sha256.
    pub name: &'a str,
    /// The sha256 the bytes must have, when known.
    pub sha256: Option<&'a str>,
    /// The size in bytes, when known.
    pub size: Option<u64>,
}

/// Stores `blob`, fetching its bytes from `location` unless a good copy is in the cache
/// already. Returns the snapshot path. `fail` words a failed request.
pub fn store(
    client: &Client,
    location: &Url,
    blob: &Blob,
    fail: &dyn Fn(Failure) -> HubError,
) -> Result<PathBuf, HubError> {
    debug_assert!(cache::is_blob_name(blob.name) && cache::is_commit(blob.commit));
    let blobs = cache::ensure_dir(blob.cache, &cache::rel_blobs(blob.repo))?;
    let locks = cache::ensure_dir(blob.cache, &cache::rel_locks(blob.repo))?;
    let _lock = lock(&locks.join(format!("{}.lock", blob.name)), blob.file)?;
    let path = blobs.join(blob.name);
    if !usable(&path, blob)? {
        transfer(client, location, blob, &blobs, fail)?;
        std::fs::rename(blobs.join(format!("{}.incomplete", blob.name)), &path)?;
    }
    let pointer = cache::link_blob(blob.cache, blob.repo, blob.commit, blob.file, blob.name)?;
    cache::set_ref(blob.cache, blob.repo, blob.commit)?;
    Ok(pointer)
}

/// Holds the lock file at `path` (waiting, with a word, while another process holds it).
fn lock(path: &Path, file: &str) -> Result<File, HubError> {
    // A link there would have the lock file created where it points.
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        std::fs::remove_file(path)?;
    }
    let handle = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    match handle.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            eprintln!("{file}: waiting for another download of it to finish");
            handle.lock()?;
        }
        // A file system without locks: go on without.
        Err(TryLockError::Error(_)) => {}
    }
    Ok(handle)
}

/// Whether the blob at `path` is already there with the right bytes (a download by another
/// process, or the same file in another snapshot).
fn usable(path: &Path, blob: &Blob) -> Result<bool, HubError> {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(false);
    };
    if !meta.is_file() {
        cache::clear_entry(path)?;
        return Ok(false);
    }
    if blob.size.is_some_and(|size| size != meta.len()) {
        return Ok(false);
    }
    Ok(match blob.sha256 {
        Some(sha) => sha256_of(path)? == sha,
        None => true,
    })
}

/// `(first byte, total size)` of a `Content-Range: bytes FIRST-LAST/TOTAL` (`TOTAL` may be
/// `*`).
fn content_range(header: Option<&str>) -> Option<(u64, Option<u64>)> {
    let rest = header?.trim().strip_prefix("bytes ")?;
    let (span, total) = rest.split_once('/')?;
    let (first, last) = span.split_once('-')?;
    let (first, last): (u64, u64) = (first.trim().parse().ok()?, last.trim().parse().ok()?);
    if last < first {
        return None;
    }
    let total = match total.trim() {
        "*" => None,
        t => Some(t.parse().ok()?),
    };
    Some((first, total))
}

/// Downloads the bytes of `blob` into `blobs/NAME.incomplete` and checks them.
fn transfer(
    client: &Client,
    location: &Url,
    blob: &Blob,
    blobs: &Path,
    fail: &dyn Fn(Failure) -> HubError,
) -> Result<(), HubError> {
    let partial = blobs.join(format!("{}.incomplete", blob.name));
    // Only a file of its own is written to: a link, or a hard link to a file elsewhere, is
    // unlinked first.
    if std::fs::symlink_metadata(&partial).is_ok_and(|m| !m.is_file() || shared(&m)) {
        cache::clear_entry(&partial)?;
    }
    let mut out = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&partial)?;
    let mut have = out.metadata()?.len();
    if have > 0 && blob.size.is_some_and(|size| have >= size) {
        // Not a prefix of the file: start over.
        have = 0;
    }
    let mut restarted = false;
    loop {
        let from = (have > 0).then_some(have);
        let response = match client.send("GET", location.clone(), from, Follow::All) {
            Ok((_, response)) => response,
            Err(Failure::Status(416)) if from.is_some() && !restarted => {
                restarted = true;
                have = 0;
                continue;
            }
            Err(f) => return Err(fail(f)),
        };
        let content_length = response
            .header("Content-Length")
            .and_then(|l| l.trim().parse::<u64>().ok());
        let (start, size) = match response.status() {
            // The whole file, whatever was asked: start over.
            200 => (0, blob.size.or(content_length)),
            206 => match content_range(response.header("Content-Range")) {
                Some((first, total))
                    if first == have && blob.size.is_none_or(|size| total == Some(size)) =>
                {
                    (first, blob.size.or(total))
                }
                other => {
                    let what = match other {
                        Some((first, total)) => format!(
                            "bytes from {first} of {}",
                            total.map_or("?".to_string(), |t| t.to_string())
                        ),
                        None => "no usable Content-Range".to_string(),
                    };
                    if restarted {
                        return Err(HubError::Refused(format!(
                            "{}: asked for the bytes from {have}, the server sent {what}",
                            blob.file
                        )));
                    }
                    eprintln!(
                        "{}: asked for the bytes from {have}, the server sent {what}; \
                         starting over",
                        blob.file
                    );
                    restarted = true;
                    have = 0;
                    continue;
                }
            },
            status => return Err(fail(Failure::Status(status))),
        };
        out.set_len(start)?;
        out.seek(SeekFrom::Start(start))?;
        let bar = progress_bar(blob.file, size, start);
        // One byte past the size is read to tell a longer answer from a complete one.
        let limit = size.map_or(u64::MAX, |size| size.saturating_sub(start) + 1);
        let mut body = response.into_reader().take(limit);
        let mut buffer = vec![0u8; 1 << 20];
        let mut len = start;
        loop {
            let n = match body.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    bar.abandon();
                    return Err(HubError::Download {
                        file: blob.file.to_string(),
                        reason: e.to_string(),
                    });
                }
            };
            out.write_all(&buffer[..n])?;
            len += n as u64;
            bar.inc(n as u64);
        }
        bar.finish();
        match size {
            Some(size) if len > size => {
                drop(out);
                std::fs::remove_file(&partial)?;
                return Err(HubError::Refused(format!(
                    "{}: the server sent more than the {size} bytes the file has",
                    blob.file
                )));
            }
            Some(size) if len < size => {
                return Err(HubError::Download {
                    file: blob.file.to_string(),
                    reason: format!("the transfer ended at byte {len} of {size}"),
                })
            }
            _ => break,
        }
    }
    out.flush()?;
    drop(out);
    if let Some(expected) = blob.sha256 {
        let actual = sha256_of(&partial)?;
        if actual != expected {
            std::fs::remove_file(&partial)?;
            return Err(HubError::Checksum {
                file: blob.file.to_string(),
                expected: expected.to_string(),
                actual,
            });
        }
    }
    Ok(())
}

/// Whether a file has other names (hard links) than the one it was reached by.
#[cfg(unix)]
fn shared(meta: &std::fs::Metadata) -> bool {
    std::os::unix::fs::MetadataExt::nlink(meta) > 1
}

#[cfg(not(unix))]
fn shared(_meta: &std::fs::Metadata) -> bool {
    false
}

/// A progress bar on stderr (drawn only on a terminal).
fn progress_bar(file: &str, size: Option<u64>, start: u64) -> ProgressBar {
    let bar = match size {
        Some(size) => ProgressBar::new(size),
        None => ProgressBar::no_length(),
    };
    if let Ok(style) = ProgressStyle::with_template(
        "{msg} [{elapsed_precise}] [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} ({eta})",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    let name = match file.char_indices().rev().nth(29) {
        Some((at, _)) => format!("..{}", &file[at..]),
        None => file.to_string(),
    };
    bar.set_message(name);
    bar.set_position(start);
    bar
}

pub fn sha256_of(path: &Path) -> Result<String, HubError> {
    let mut file = File::open(path)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges_are_read_strictly() {
        assert_eq!(
            content_range(Some("bytes 100-199/200")),
            Some((100, Some(200)))
        );
        assert_eq!(content_range(Some("bytes 0-9/*")), Some((0, None)));
        for bad in [
            "bytes 5-4/10",
            "100-199/200",
            "bytes x-1/2",
            "bytes 1-2/x",
            "",
        ] {
            assert_eq!(content_range(Some(bad)), None, "{bad}");
        }
        assert_eq!(content_range(None), None);
    }
}
