//! One module per architecture: the model classes of `config.json` it loads, the GGUF
//! metadata it derives from the config and its tensor table (names, expected shapes,
//! transforms), each as llama.cpp's converter has them. Adding an architecture means adding
//! a file here and a line in [`ARCHITECTURES`].

mod kimi_k3;
mod kimi_linear;

use ferrox_gguf::OwnedValue;

use crate::config::Config;
use crate::error::{HfError, Result};
use crate::plan::{Op, PlannedTensor};
use crate::shards::{Shards, StoredTensor};

/// Metadata key/values, in the order they are written.
pub type MetadataKvs = Vec<(String, OwnedValue)>;

/// An architecture loadable from a checkpoint directory.
pub struct Architecture {
    /// The model classes (`architectures[0]` of `config.json`) it loads.
    pub classes: &'static [&'static str],
    /// Its `general.architecture` name.
    pub name: &'static str,
    /// llama.cpp's name for its pre-tokenizer (`tokenizer.ggml.pre`).
    pub pre_tokenizer: &'static str,
    /// EOS is `config.json`'s `eos_token_id` rather than the tokenizer's (Kimi-K3: the
    /// turn terminator, not the document one).
    pub eos_from_config: bool,
    /// The `{arch}.*` metadata.
    pub metadata: fn(&Config) -> Result<MetadataKvs>,
    /// The GGUF tensors and how each is made.
    pub tensors: fn(&Config, &Shards) -> Result<Vec<PlannedTensor>>,
}

/// Every architecture, one line per module.
pub const ARCHITECTURES: &[Architecture] = &[kimi_linear::ARCH, kimi_k3::ARCH];

/// The model classes that can be loaded.
pub fn supported() -> Vec<&'static str> {
    ARCHITECTURES
        .iter()
        .flat_map(|a| a.classes.iter().copied())
        .collect()
}

/// The architecture that loads the config's model class.
pub(crate) fn find(config: &Config) -> Result<&'static Architecture> {
    let class = config.architecture()?;
    ARCHITECTURES
        .iter()
        .find(|a| a.classes.contains(&class))
        .ok_or_else(|| HfError::UnsupportedArchitecture(class.to_string()))
}

/// Metadata keys of one architecture (`{arch}.{key}`).
pub(crate) struct Keys {
    arch: &'static str,
    pub out: MetadataKvs,
}

impl Keys {
    pub fn new(arch: &'static str) -> Keys {
        Keys {
            arch,
            out: Vec::new(),
        }
    }

    /// Sets `{arch}.{key}`, replacing an earlier value (as the converter's writer does).
    pub fn set(&mut self, key: &str, value: impl Into<OwnedValue>) {
        let key = format!("{}.{key}", self.arch);
        let value = value.into();
        match self.out.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.out.push((key, value)),
        }
    }
}

/// Builds a tensor table, checking each stored tensor's shape against the one the config
/// implies (errors name the tensor as the checkpoint does).
pub(crate) struct Table<'s> {
    shards: &'s Shards,
    /// Prepended to every stored name: `language_model.` for checkpoints of multimodal
    /// models, whose text model sits under it.
    prefix: &'static str,
    pub out: Vec<PlannedTensor>,
}

/// ggml's dimension order: PyTorch's reversed.
fn ggml_shape(shape: &[usize]) -> Vec<u64> {
    shape.iter().rev().map(|&d| d as u64).collect()
}

impl<'s> Table<'s> {
    pub fn new(shards: &'s Shards) -> Table<'s> {
        const TEXT_MODEL: &str = "language_model.";
        let nested = shards
            .get(&format!("{TEXT_MODEL}model.embed_tokens.weight"))
            .is_some();
        Table {
            shards,
            prefix: if nested { TEXT_MODEL } else { "" },
            out: Vec::new(),
        }
    }

    /// The stored name of `name`.
    fn src(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// Whether the checkpoint holds `name`.
    pub fn has(&self, name: &str) -> bool {
        self.shards.get(&self.src(name)).is_some()
    }

    /// The stored tensor, checked to have `expected` shape.
    fn checked(&self, name: &str, expected: &[usize]) -> Result<&'s StoredTensor> {
        let name = &self.src(name);
        let t = self.shards.require(name)?;
        if t.shape != expected {
            return Err(HfError::TensorShape {
                name: name.to_string(),
                expected: expected.to_vec(),
                found: t.shape.clone(),
            });
        }
        Ok(t)
    }

    /// The stored tensor, checked to hold `n` values (for tensors whose stored shape varies
    /// between checkpoints only by dimensions of 1).
    fn checked_count(&self, name: &str, n: usize) -> Result<&'s StoredTensor> {
        let name = &self.src(name);
        let t = self.shards.require(name)?;
        if t.shape.iter().product::<usize>() != n {
            return Err(HfError::TensorShape {
                name: name.to_string(),
                expected: vec![n],
                found: t.shape.clone(),
            });
        }
        Ok(t)
    }

    fn push(&mut self, name: String, shape: Vec<u64>, op: Op) {
        self.out.push(PlannedTensor { name, shape, op });
    }

    /// `src` of `shape` as `dst`, its values as stored.
    pub fn stored(&mut self, src: &str, dst: String, shape: &[usize]) -> Result<()> {
        self.checked(src, shape)?;
        self.push(dst, ggml_shape(shape), Op::Stored(self.src(src)));
        Ok(())
    }

    /// `src`, any shape of `n` values, as `dst` of ggml shape `shape`.
    pub fn reshaped(&mut self, src: &str, dst: String, n: usize, shape: &[u64]) -> Result<()> {
        self.checked_count(src, n)?;
        self.push(dst, shape.to_vec(), Op::Stored(self.src(src)));
        Ok(())
    }

    /// `-exp(src)` (any shape of `n` values) as `dst`, ggml shape reversed from the stored.
    pub fn neg_exp(&mut self, src: &str, dst: String, n: usize) -> Result<()> {
        let t = self.checked_count(src, n)?;
        let op = Op::NegExp {
            src: self.src(src),
            take: n,
        };
        self.push(dst, ggml_shape(&t.shape), op);
        Ok(())
    }

    /// `-exp` of the first `n` values of `src` (which holds at least `n`), as the vector
    /// `dst`.
    pub fn neg_exp_first(&mut self, src: &str, dst: String, n: usize) -> Result<()> {
        let name = self.src(src);
        let t = self.shards.require(&name)?;
        if t.shape.iter().product::<usize>() < n {
            return Err(HfError::TensorShape {
                name,
                expected: vec![n],
                found: t.shape.clone(),
            });
        }
        self.push(dst, vec![n as u64], Op::NegExp { src: name, take: n });
        Ok(())
    }

    /// The elementwise product of `a` and `b` (each `n` values, any shape), as the F32
    /// vector `dst`.
    pub fn product(&mut self, a: &str, b: &str, dst: String, n: usize) -> Result<()> {
        self.checked_count(a, n)?;
        self.checked_count(b, n)?;
        let op = Op::Product(self.src(a), self.src(b));
        self.push(dst, vec![n as u64], op);
        Ok(())
    }

    /// The `srcs`, each of `shape`, stacked as `dst` (PyTorch `stack(dim=0)`).
    pub fn stacked(&mut self, srcs: Vec<String>, dst: String, shape: &[usize]) -> Result<()> {
        for src in &srcs {
            self.checked(src, shape)?;
        }
        let srcs: Vec<String> = srcs.iter().map(|s| self.src(s)).collect();
        let mut stacked = vec![srcs.len()];
        stacked.extend_from_slice(shape);
        self.push(dst, ggml_shape(&stacked), Op::Stack(srcs));
        Ok(())
    }

    /// MLA's `kv_b_proj` (`n_head` blocks of `nope` key rows then `v` value rows, over
    /// `lkv` latent columns) split as the converter splits it: `k_dst` holds each head's
    /// key rows transposed (ggml `{nope, lkv, n_head}`), `v_dst` its value rows (ggml
    /// `{lkv, v, n_head}`).
    pub fn kv_b_split(
        &mut self,
        src: &str,
        [k_dst, v_dst]: [String; 2],
        [n_head, nope, v, lkv]: [usize; 4],
    ) -> Result<()> {
        self.checked(src, &[n_head * (nope + v), lkv])?;
        let rows = nope + v;
        let src = self.src(src);
        let op = |start, len, transpose| Op::HeadRows {
            src: src.clone(),
            n_head,
            rows,
            start,
            len,
            transpose,
        };
        let (h, nope_, v_, lkv_) = (n_head as u64, nope as u64, v as u64, lkv as u64);
        self.push(k_dst, vec![nope_, lkv_, h], op(0, nope, true));
        self.push(v_dst, vec![lkv_, v_, h], op(nope, v, false));
        Ok(())
    }
}
