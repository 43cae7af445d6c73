//! The weights of a checkpoint: `model.safetensors`, or the shards
//! `model.safetensors.index.json` lists, memory-mapped and their headers validated (by the
//! `safetensors` crate: bounded header, offsets inside the file, sizes matching shapes).

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use ::safetensors::{Dtype, SafeTensors};
use ferrox_gguf::TensorStorage;
use serde_json::Value;

use crate::config::read_json_object;
use crate::error::{HfError, Result};

const SINGLE: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";

/// One tensor as a shard stores it.
#[derive(Clone, Debug)]
pub struct StoredTensor {
    pub name: String,
    /// Index of the shard that holds it.
    pub shard: usize,
    pub dtype: Dtype,
    /// PyTorch order: the last dimension is contiguous.
    pub shape: Vec<usize>,
    /// Byte range in the shard's file.
    pub offset: usize,
    pub len: usize,
}

/// The mapped weight files and the tensors they hold.
pub struct Shards {
    files: Vec<(PathBuf, memmap2::Mmap)>,
    tensors: HashMap<String, StoredTensor>,
}

impl Shards {
    pub(crate) fn open(dir: &Path) -> Result<Shards> {
        let index_path = dir.join(INDEX);
        let (names, placed) = if index_path.is_file() {
            read_index(&index_path)?
        } else if dir.join(SINGLE).is_file() {
            (vec![SINGLE.to_string()], HashMap::new())
        } else {
            return Err(HfError::File {
                path: dir.to_path_buf(),
                reason: format!("neither {SINGLE} nor {INDEX} is there"),
            });
        };
        let mut shards = Shards {
            files: Vec::with_capacity(names.len()),
            tensors: HashMap::new(),
        };
        for name in names {
            let path = dir.join(&name);
            if !path.is_file() {
                return Err(HfError::MissingShard { file: name });
            }
            shards.add_file(path)?;
        }
        for (tensor, file) in &placed {
            let held = shards.tensors.get(tensor).map(|t| &shards.files[t.shard].0);
            if held.and_then(|p| p.file_name()) != Some(file.as_ref()) {
                return Err(HfError::File {
                    path: dir.join(file),
                    reason: format!("does not hold tensor `{tensor}`, which {INDEX} places there"),
                });
            }
        }
        Ok(shards)
    }

    fn add_file(&mut self, path: PathBuf) -> Result<()> {
        let io = |err| HfError::Io {
            path: path.clone(),
            err,
        };
        let file = File::open(&path).map_err(io)?;
        // SAFETY: the map is read-only; like every mmap-based loader we rely on the file not
        // being truncated underneath us while it is open.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let parsed = SafeTensors::deserialize(&map).map_err(|e| HfError::File {
            path: path.clone(),
            reason: format!("not a valid safetensors file: {e}"),
        })?;
        let shard = self.files.len();
        for (name, view) in parsed.iter() {
            let data = view.data();
            let tensor = StoredTensor {
                name: name.to_string(),
                shard,
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                offset: data.as_ptr() as usize - map.as_ptr() as usize,
                len: data.len(),
            };
            if self.tensors.insert(name.to_string(), tensor).is_some() {
                return Err(HfError::File {
                    path: path.clone(),
                    reason: format!("tensor `{name}` is also in another shard"),
                });
            }
        }
        drop(parsed);
        self.files.push((path, map));
        Ok(())
    }

    /// Number of weight files.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Number of tensors in all files.
    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }

    pub fn get(&self, name: &str) -> Option<&StoredTensor> {
        self.tensors.get(name)
    }

    pub fn require(&self, name: &str) -> Result<&StoredTensor> {
        self.get(name)
            .ok_or_else(|| HfError::MissingTensor(name.to_string()))
    }

    /// The stored bytes of a tensor.
    pub fn bytes(&self, t: &StoredTensor) -> &[u8] {
        &self.files[t.shard].1[t.offset..t.offset + t.len]
    }

    /// The files as tensor storages, in shard order.
    pub(crate) fn into_storages(self) -> Vec<TensorStorage> {
        self.files
            .into_iter()
            .map(|(path, map)| TensorStorage::Mapped { path, map })
            .collect()
    }
}

/// The shard files an index names (each once, in name order) and where it places each
/// tensor.
type Placement = (Vec<String>, HashMap<String, String>);

fn read_index(path: &Path) -> Result<Placement> {
    let bad = |reason: String| HfError::File {
        path: path.to_path_buf(),
        reason,
    };
    let index = read_json_object(path)?;
    let Some(Value::Object(map)) = index.get("weight_map") else {
        return Err(bad("no `weight_map` object".into()));
    };
    let mut placed = HashMap::with_capacity(map.len());
    let mut files = BTreeSet::new();
    for (tensor, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| bad(format!("`weight_map.{tensor}` is not a file name")))?;
        // Only files beside the index: a name with a directory part could point anywhere.
        if Path::new(file).file_name().and_then(|n| n.to_str()) != Some(file) {
            return Err(bad(format!(
                "`weight_map.{tensor}` = {file:?} is not a plain file name"
            )));
        }
        files.insert(file.to_string());
        placed.insert(tensor.clone(), file.to_string());
    }
    Ok((files.into_iter().collect(), placed))
}
