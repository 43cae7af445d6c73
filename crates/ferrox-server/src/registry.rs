//! Many models behind one server (`serve --models-dir DIR`, llama-server's router mode and
//! Ollama's everyday one): every GGUF of the directory is listed; a request names its model,
//! which is loaded on first use (requests for it wait meanwhile) with its own sequence memory
//! and scheduler; past `--models-max` loaded models, the least recently used one is unloaded
//! (its running requests finish first, within the shutdown grace). `POST /models/load` and
//! `/models/unload` do it by hand.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::ready::{prepare, Ready};
use crate::{LoadedModel, ServerConfig};

/// Loads one model file.
pub type ModelLoader = Arc<dyn Fn(&Path) -> anyhow::Result<LoadedModel> + Send + Sync>;

/// The models a router serves.
pub struct ModelDirectory {
    /// Each model's id (what requests name) and GGUF file (a split checkpoint by its first
    /// part).
    pub models: Vec<(String, PathBuf)>,
    /// Most models loaded at once.
    pub max_loaded: usize,
    pub load: ModelLoader,
}

/// One model of the directory.
struct Entry {
    /// What requests name and `/v1/models` lists.
    id: String,
    /// Every name a request may use (the id, the file name, the path).
    names: Vec<String>,
    path: PathBuf,
    /// Held while the model loads: requests for it wait here.
    slot: tokio::sync::Mutex<Option<Arc<Ready>>>,
    /// The loaded model, for lookups that must not wait.
    loaded: Mutex<Option<Arc<Ready>>>,
    loading: AtomicBool,
    last_used: AtomicU64,
}

impl Entry {
    fn current(&self) -> Option<Arc<Ready>> {
        self.loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_current(&self, ready: Option<Arc<Ready>>) {
        *self.loaded.lock().unwrap_or_else(|e| e.into_inner()) = ready;
    }

    fn state(&self) -> &'static str {
        if self.current().is_some() {
            "loaded"
        } else if self.loading.load(Ordering::Relaxed) {
            "loading"
        } else {
            "unloaded"
        }
    }
}

/// The directory's models and which are loaded.
pub(crate) struct Router {
    entries: Vec<Entry>,
    max_loaded: usize,
    load: ModelLoader,
    clock: AtomicU64,
}

/// A model file's id: its name without `.gguf` (and without a split's part suffix).
pub fn model_id(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name.strip_suffix(".gguf").unwrap_or(&name);
    match stem.rsplit_once("-00001-of-") {
        Some((base, _)) => base.to_string(),
        None => stem.to_string(),
    }
}

impl Router {
    pub fn new(dir: ModelDirectory) -> Router {
        let entries = dir
            .models
            .into_iter()
            .map(|(id, path)| {
                let file = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                Entry {
                    names: vec![id.clone(), file, path.display().to_string()],
                    id,
                    path,
                    slot: tokio::sync::Mutex::new(None),
                    loaded: Mutex::new(None),
                    loading: AtomicBool::new(false),
                    last_used: AtomicU64::new(0),
                }
            })
            .collect();
        Router {
            entries,
            max_loaded: dir.max_loaded.max(1),
            load: dir.load,
            clock: AtomicU64::new(1),
        }
    }

    /// How many models the directory holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    fn ids(&self) -> String {
        let ids: Vec<&str> = self.entries.iter().map(|e| e.id.as_str()).collect();
        ids.join(", ")
    }

    fn entry(&self, name: Option<&str>) -> Result<&Entry, ApiError> {
        let Some(name) = name else {
            return Err(ApiError::param(
                "model",
                format!(
                    "this server serves several models: name one in 'model' ({})",
                    self.ids()
                ),
            ));
        };
        self.entries
            .iter()
            .find(|e| e.names.iter().any(|n| n == name))
            .ok_or_else(|| {
                ApiError::not_found(format!(
                    "The model `{name}` does not exist; this server serves: {}",
                    self.ids()
                ))
                .with_param("model")
                .with_code("model_not_found")
            })
    }

    /// The model a request names, loaded now if it is not (waiting while another request
    /// loads it); past the limit, the least recently used other model is unloaded.
    pub async fn get(
        &self,
        config: &ServerConfig,
        name: Option<&str>,
    ) -> Result<Arc<Ready>, ApiError> {
        let entry = self.entry(name)?;
        entry.last_used.store(
            self.clock.fetch_add(1, Ordering::Relaxed),
            Ordering::Relaxed,
        );
        if let Some(ready) = entry.current() {
            return Ok(ready);
        }
        let mut slot = entry.slot.lock().await;
        if let Some(ready) = slot.as_ref() {
            return Ok(ready.clone());
        }
        entry.loading.store(true, Ordering::Relaxed);
        let (load, path, id) = (self.load.clone(), entry.path.clone(), entry.id.clone());
        let mut model_config = config.clone();
        model_config.alias = Some(id.clone());
        let started = Instant::now();
        let result = tokio::task::spawn_blocking(move || {
            load(&path).and_then(|m| prepare(&model_config, m, Arc::new(Metrics::default())))
        })
        .await;
        entry.loading.store(false, Ordering::Relaxed);
        let ready = match result {
            Ok(Ok(ready)) => Arc::new(ready),
            Ok(Err(e)) => {
                tracing::error!("loading {id} failed: {e:#}");
                return Err(ApiError::internal(format!(
                    "loading the model `{id}` failed: {e:#}"
                )));
            }
            Err(e) => return Err(ApiError::internal(format!("loading `{id}` failed: {e}"))),
        };
        tracing::info!(
            "model {id} loaded in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        *slot = Some(ready.clone());
        entry.set_current(Some(ready.clone()));
        drop(slot);
        self.evict(config.shutdown_grace, &entry.id);
        Ok(ready)
    }

    /// Unloads least recently used models (never `keep`) while more than the limit are
    /// loaded.
    fn evict(&self, grace: Duration, keep: &str) {
        let mut loaded: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| e.id != keep && e.current().is_some())
            .collect();
        loaded.sort_by_key(|e| e.last_used.load(Ordering::Relaxed));
        let mut count = loaded.len() + 1;
        for e in loaded {
            if count <= self.max_loaded {
                break;
            }
            if self.unload_entry(e, grace) {
                count -= 1;
            }
        }
    }

    /// Takes the entry's model out (unless it is loading) and stops it in the background:
    /// its running and queued requests finish within `grace`, then its memory is freed.
    fn unload_entry(&self, e: &Entry, grace: Duration) -> bool {
        let Ok(mut slot) = e.slot.try_lock() else {
            return false;
        };
        let Some(ready) = slot.take() else {
            return false;
        };
        e.set_current(None);
        tracing::info!("unloading model {}", e.id);
        std::thread::spawn(move || {
            ready.scheduler.begin_shutdown(grace);
            ready.scheduler.wait_idle(grace);
            ready.scheduler.stop();
        });
        true
    }

    /// `POST /models/unload`.
    pub fn unload(&self, name: Option<&str>, grace: Duration) -> Result<bool, ApiError> {
        let e = self.entry(name)?;
        Ok(self.unload_entry(e, grace))
    }

    /// Every model with its state, for `/v1/models`.
    pub fn list(&self) -> Vec<Value> {
        self.entries
            .iter()
            .map(|e| {
                let mut m = json!({
                    "id": e.id,
                    "object": "model",
                    "created": 0,
                    "owned_by": "ferrox",
                    "status": {"value": e.state()},
                    "meta": {"path": e.path.display().to_string()},
                });
                if let Some(ready) = e.current() {
                    m["created"] = json!(ready.created);
                    m["meta"] = json!({"n_ctx": ready.n_ctx, "n_vocab": ready.n_vocab,
                        "slots": ready.slots, "path": ready.model_path});
                    m["architecture"] = crate::routes::architecture(&ready);
                }
                m
            })
            .collect()
    }

    /// `/metrics` lines: each model's state.
    pub fn metrics(&self) -> String {
        let mut out = String::from(
            "# HELP ferrox_model_loaded Whether the model is loaded (1) or not (0).\n# TYPE ferrox_model_loaded gauge\n",
        );
        for e in &self.entries {
            let id = e.id.replace('\\', "\\\\").replace('"', "\\\"");
            out.push_str(&format!(
                "ferrox_model_loaded{{model=\"{id}\"}} {}\n",
                u8::from(e.current().is_some())
            ));
        }
        out
    }

    /// Every loaded model (at shutdown).
    pub fn loaded(&self) -> Vec<Arc<Ready>> {
        self.entries.iter().filter_map(Entry::current).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_file_stems() {
        assert_eq!(model_id(Path::new("/m/qwen-0.5b.gguf")), "qwen-0.5b");
        assert_eq!(model_id(Path::new("/m/big-00001-of-00003.gguf")), "big");
    }
}
