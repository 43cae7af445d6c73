//! Split checkpoints: llama.cpp's `gguf-split` writes `NAME-00001-of-0000N.gguf` files whose
//! metadata carries `split.no`, `split.count` and (in the first) `split.tensors.count`.

use std::path::{Path, PathBuf};

use crate::error::{GgufError, Result};
use crate::file::{Gguf, Shard};

/// The path of split `index` (0-based) of `count`, as llama.cpp names it.
pub fn split_path(prefix: &str, index: u32, count: u32) -> String {
    format!("{prefix}-{:05}-of-{count:05}.gguf", index + 1)
}

/// The `NAME` in `NAME-00001-of-00003.gguf`, if the file name follows the scheme.
fn split_prefix(path: &Path) -> Option<String> {
    let s = path.to_str()?;
    let stem = s.strip_suffix(".gguf")?;
    let (rest, of) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let digits = |t: &str| t.len() == 5 && t.bytes().all(|b| b.is_ascii_digit());
    (digits(no) && digits(of)).then(|| prefix.to_string())
}

pub(crate) fn open_rest(path: &Path, first: Shard, count: u32) -> Result<Gguf> {
    let err = |p: &Path, reason: String| GgufError::Split {
        path: p.to_path_buf(),
        reason,
    };
    let meta = first.metadata();
    let no = meta.opt_u32("split.no")?.unwrap_or(0);
    if no != 0 {
        return Err(err(
            path,
            format!("this is file {} of {count}; open the first file", no + 1),
        ));
    }
    let expected_tensors = meta.opt_u64("split.tensors.count")?;
    let prefix = split_prefix(path).ok_or_else(|| {
        err(
            path,
            format!("metadata says {count} files, but the name does not follow NAME-00001-of-{count:05}.gguf"),
        )
    })?;

    let mut shards = vec![first];
    for i in 1..count {
        let p = PathBuf::from(split_path(&prefix, i, count));
        let shard = Shard::open(&p)?;
        let m = shard.metadata();
        let (shard_no, shard_count) = (m.opt_u32("split.no")?, m.opt_u32("split.count")?);
        if shard_no != Some(i) || shard_count != Some(count) {
            return Err(err(
                &p,
                format!(
                    "expected split.no = {i} and split.count = {count}, found {shard_no:?} and {shard_count:?}"
                ),
            ));
        }
        shards.push(shard);
    }
    let total: u64 = shards.iter().map(|s| s.tensor_count() as u64).sum();
    if let Some(expected) = expected_tensors {
        if expected != total {
            return Err(err(
                path,
                format!("split.tensors.count is {expected} but the files hold {total} tensors"),
            ));
        }
    }
    Gguf::from_shards(shards)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_llama_cpp() {
        assert_eq!(split_path("/m/x", 0, 3), "/m/x-00001-of-00003.gguf");
        assert_eq!(
            split_prefix(Path::new("/m/x-y-00001-of-00003.gguf")).as_deref(),
            Some("/m/x-y")
        );
        assert_eq!(split_prefix(Path::new("/m/x.gguf")), None);
        assert_eq!(split_prefix(Path::new("/m/x-1-of-3.gguf")), None);
    }
}
