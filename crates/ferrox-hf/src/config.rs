//! `config.json` (and the other JSON files of a checkpoint): typed access to its keys, each
//! error naming the key.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{HfError, Result};

/// The most bytes a JSON file of a checkpoint may have (chat templates make
/// `tokenizer_config.json` the largest; real ones are well under 1 MiB).
const MAX_JSON_BYTES: u64 = 64 << 20;

/// Reads a file of at most `max` bytes.
pub(crate) fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>> {
    let io = |err| HfError::Io {
        path: path.to_path_buf(),
        err,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > max {
        return Err(HfError::File {
            path: path.to_path_buf(),
            reason: format!("{len} bytes, more than the {max} such a file may have"),
        });
    }
    std::fs::read(path).map_err(io)
}

/// A JSON object read from a file.
pub(crate) fn read_json_object(path: &Path) -> Result<Map<String, Value>> {
    let bytes = read_bounded(path, MAX_JSON_BYTES)?;
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(HfError::File {
            path: path.to_path_buf(),
            reason: "not a JSON object".into(),
        }),
        Err(e) => Err(HfError::File {
            path: path.to_path_buf(),
            reason: format!("invalid JSON: {e}"),
        }),
    }
}

/// A model's `config.json`, or an object nested in it (`linear_attn_config`); keys in
/// errors are full paths (`linear_attn_config.head_dim`).
pub struct Config {
    map: Map<String, Value>,
    prefix: String,
}

impl Config {
    pub(crate) fn read(path: &Path) -> Result<Config> {
        Ok(Config {
            map: read_json_object(path)?,
            prefix: String::new(),
        })
    }

    /// The config with the keys of its `text_config` object (multimodal models) moved to
    /// the top level, as llama.cpp's converter reads them.
    pub(crate) fn with_text_config(mut self) -> Result<Config> {
        match self.map.get("text_config") {
            None | Some(Value::Null) => Ok(self),
            Some(Value::Object(text)) => {
                let text = text.clone();
                self.map.extend(text);
                Ok(self)
            }
            Some(v) => Err(self.error("text_config", format!("is {v}, expected an object"))),
        }
    }

    /// A config from a JSON object (for tests and tools).
    pub fn from_map(map: Map<String, Value>) -> Config {
        Config {
            map,
            prefix: String::new(),
        }
    }

    fn path(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    pub(crate) fn error(&self, key: &str, reason: impl Into<String>) -> HfError {
        HfError::Config {
            key: self.path(key),
            reason: reason.into(),
        }
    }

    /// The value of `key`; JSON `null` counts as absent.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// The first of `keys` present, as llama.cpp's converter's `find_hparam`.
    pub fn find<'k>(&self, keys: &[&'k str]) -> Option<&'k str> {
        keys.iter().copied().find(|k| self.get(k).is_some())
    }

    /// A non-negative integer up to `u32::MAX` (the width GGUF stores counts in).
    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| self.error(key, format!("is {v}, expected a count")))
            })
            .transpose()
    }

    pub fn u32(&self, key: &str) -> Result<u32> {
        self.opt_u32(key)?
            .ok_or_else(|| self.error(key, "is missing"))
    }

    /// [`Config::u32`] as a size.
    pub fn usize(&self, key: &str) -> Result<usize> {
        Ok(self.u32(key)? as usize)
    }

    /// The first present of `keys` as a count.
    pub fn find_u32(&self, keys: &[&str]) -> Result<Option<u32>> {
        self.find(keys).map_or(Ok(None), |k| self.opt_u32(k))
    }

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        self.get(key)
            .map(|v| {
                v.as_f64()
                    .filter(|f| f.is_finite())
                    .map(|f| f as f32)
                    .ok_or_else(|| self.error(key, format!("is {v}, expected a number")))
            })
            .transpose()
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        self.get(key)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.error(key, format!("is {v}, expected a string")))
            })
            .transpose()
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| self.error(key, format!("is {v}, expected true or false")))
            })
            .transpose()
    }

    /// A list of counts (at most `max_len` of them).
    pub fn u32_list(&self, key: &str, max_len: usize) -> Result<Vec<u32>> {
        let v = self.get(key).ok_or_else(|| self.error(key, "is missing"))?;
        let list = v
            .as_array()
            .filter(|a| a.len() <= max_len)
            .ok_or_else(|| self.error(key, format!("expected a list of at most {max_len}")))?;
        list.iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| self.error(key, format!("holds {x}, expected counts")))
            })
            .collect()
    }

    /// The object under `key`, as a config of its own.
    pub fn sub(&self, key: &str) -> Result<Config> {
        match self.get(key) {
            Some(Value::Object(map)) => Ok(Config {
                map: map.clone(),
                prefix: format!("{}.", self.path(key)),
            }),
            Some(v) => Err(self.error(key, format!("is {v}, expected an object"))),
            None => Err(self.error(key, "is missing")),
        }
    }

    /// The model class: `architectures[0]` (what the converter dispatches on).
    pub fn architecture(&self) -> Result<&str> {
        let first = self
            .get("architectures")
            .and_then(Value::as_array)
            .and_then(|a| a.first());
        match first {
            Some(Value::String(s)) => Ok(s),
            Some(v) => Err(self.error("architectures", format!("holds {v}, expected names"))),
            None => Err(self.error("architectures", "is missing or empty")),
        }
    }
}
