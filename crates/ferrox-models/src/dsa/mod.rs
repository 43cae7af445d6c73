//! DeepSeek Sparse Attention: DeepSeek-V3.2 (`deepseek32`) and GLM-5 / GLM-5.2 (`glm-dsa`).
//!
//! The layers are the MLA block's ([`crate::layers::mla`]: the same weights, latent cache
//! and feed-forward blocks), except that each token attends only to the `top_k` cached
//! positions a lightning indexer ([`indexer`]) selects for it, through the absorbed form of
//! MLA attention over exactly those positions ([`crate::layers::mla::sparse`]).
//! While a sequence holds no more than `top_k` positions every one is selected, so short
//! contexts are dense.
//!
//! GLM-5.2 computes selections only in some layers ("full"); the others reuse the last full
//! layer's. Multi-token-prediction layers at the end of a file are not part of the trunk and
//! are not loaded (llama.cpp runs them only as a draft head, never in the trunk).
//!
//! The memory has two paged stores sharing one block table per sequence: the MLA latent
//! rows of every layer, and the indexer's key rows of the full layers.

pub mod config;
pub mod indexer;

use std::sync::Arc;

use ferrox_gguf::Gguf;
use ferrox_memory::{MemorySpec, PagedStoreSpec, StepMemory};

pub use config::{DsaConfig, DsaRules, IndexerConfig};
pub use indexer::IndexerWeights;

use crate::engine::{EngineError, EngineOptions};
use crate::layers::mla::attention::{self, AttnScratch, KeySet};
use crate::layers::mla::sparse::Selection;
use crate::layers::mla::{ffn, MlaWeights, Path, LATENT_STORE};
use crate::scaffold::{self, HeadScratch, OutputHead, Row, Runtime};
use crate::tensors::{name_keys, Loader};
use crate::ModelError;
use indexer::{IndexerScratch, LayerIndexer, INDEXER_STORE};

/// A DeepSeek Sparse Attention model over a memory-mapped GGUF checkpoint.
pub struct DsaEngine {
    rt: Runtime,
    config: DsaConfig,
    weights: MlaWeights,
    /// Per layer: its indexer, or none where the layer reuses the last selection computed.
    indexers: Vec<Option<LayerIndexer>>,
}

#[derive(Default)]
pub struct Scratch {
    residual: scaffold::Residual,
    attn: AttnScratch,
    indexer: IndexerScratch,
    selection: Selection,
    head: HeadScratch,
    router_logits: Vec<f32>,
    moe: ferrox_moe::MoeScratch,
    /// The rows the last layer's feed-forward runs for.
    output_rows: scaffold::OutputRows,
}

fn load_indexers(gguf: &Gguf, c: &DsaConfig) -> Result<Vec<Option<LayerIndexer>>, ModelError> {
    let l = Loader { gguf };
    let mut store_layer = 0;
    let mut indexers = Vec::with_capacity(c.full.len());
    for (il, &full) in c.full.iter().enumerate() {
        indexers.push(if full {
            store_layer += 1;
            Some(LayerIndexer {
                store_layer: store_layer - 1,
                weights: IndexerWeights::load(&l, c, il).map_err(|e| name_keys(e, &c.mla.arch))?,
            })
        } else {
            None
        });
    }
    Ok(indexers)
}

impl DsaEngine {
    /// An engine for a configuration its family has read.
    pub fn with_config(
        gguf: Arc<Gguf>,
        options: &EngineOptions,
        config: DsaConfig,
    ) -> Result<Self, ModelError> {
        // One cache type for the latent rows and the indexer's keys (`-ctk`), as llama.cpp.
        let indexer_keys = [("indexer keys", config.indexer.head_dim)];
        let options =
            &crate::layers::mla::latent_cache_options(options, &config.mla, &indexer_keys)?;
        let mut weights = MlaWeights::load(&gguf, &config.mla)?;
        let mut indexers = load_indexers(&gguf, &config)?;
        let c = &config.mla;
        let mut rt = Runtime::new(
            gguf,
            options,
            (c.n_ctx_train, c.n_vocab, c.n_embd),
            "ferrox-dsa",
        )?;
        rt.repack(options, |g| {
            weights.pack(g)?;
            indexers
                .iter_mut()
                .flatten()
                .try_for_each(|ix| ix.weights.pack(g))
        })?;
        rt.weight_bytes_per_token = weights.bytes_per_token(c)
            + indexers
                .iter()
                .flatten()
                .map(|ix| ix.weights.n_bytes())
                .sum::<u64>();
        Ok(DsaEngine {
            rt,
            config,
            weights,
            indexers,
        })
    }

    pub fn config(&self) -> &DsaConfig {
        &self.config
    }
}

crate::scaffold::engine_from_body!(DsaEngine);

impl scaffold::EngineBody for DsaEngine {
    type Buffers = Scratch;

    fn runtime(&self) -> &Runtime {
        &self.rt
    }

    /// The latent row of every layer, and the indexer key of every full layer, per position.
    fn memory_spec(&self) -> MemorySpec {
        let c = &self.config;
        let latent = PagedStoreSpec::per_position(c.mla.n_layer(), c.mla.cache_width(), 0);
        let indexer = PagedStoreSpec::per_position(c.n_indexer_layers(), c.indexer.head_dim, 0);
        // In store order.
        const _: () = assert!(LATENT_STORE == 0 && INDEXER_STORE == 1);
        MemorySpec {
            paged: vec![latent, indexer],
            recurrent: None,
            storage: self.rt.kv_storage,
            row_lag: 0,
        }
    }

    fn takes_embeddings(&self) -> bool {
        true
    }

    fn micro_batch(
        &self,
        rows: &[Row],
        embeddings: &[f32],
        memory: &mut StepMemory<'_>,
        logits: &mut [&mut Vec<f32>],
        s: &mut Scratch,
    ) -> Result<(), EngineError> {
        let c = &self.config;
        let (n, eps, gguf) = (rows.len(), c.mla.norm_eps, &*self.rt.gguf);
        s.residual
            .embed(rows, &self.weights.token_embd.view(gguf)?, embeddings)?;
        // Selecting grows nothing once these hold the largest context and this many rows.
        s.indexer.reserve(self.rt.n_ctx, c.indexer.top_k);
        s.selection.reserve(n, c.indexer.top_k.min(self.rt.n_ctx));
        let last = self.weights.layers.len().saturating_sub(1);
        s.output_rows.reset();
        for (il, (lw, ix)) in self.weights.layers.iter().zip(&self.indexers).enumerate() {
            let Scratch {
                residual,
                attn,
                indexer,
                selection,
                ..
            } = s;
            residual.sublayer(n, &lw.attn_norm, eps, |xn, out| {
                attention::project(&c.mla, lw, gguf, il, rows, xn, memory, attn)?;
                if let Some(ix) = ix {
                    let q_latent = attn.query_latent(n, c.mla.q_lora_rank.unwrap_or(0));
                    indexer::select(
                        &c.indexer, ix, gguf, rows, xn, q_latent, memory, indexer, selection,
                    )?;
                }
                // A shared layer's selection is the last full layer's, for the same rows.
                debug_assert_eq!(selection.rows(), n);
                let keys = KeySet::Selected(selection);
                let absorbed = |_, _| Path::Absorbed;
                attention::attend_and_output(
                    &c.mla, lw, gguf, il, rows, memory, absorbed, keys, attn, out,
                )
            })?;
            let ffn_rows = match il == last {
                true => (s.residual).keep_output_rows(rows, c.mla.n_embd, &mut s.output_rows),
                false => n,
            };
            if ffn_rows > 0 {
                s.residual
                    .sublayer(ffn_rows, &lw.ffn_norm, eps, |xn, out| {
                        let (logits, moe) = (&mut s.router_logits, &mut s.moe);
                        Ok(ffn(gguf, &lw.ffn, &c.mla.ffn[il], xn, out, logits, moe)?)
                    })?;
            }
        }
        scaffold::advance(memory, rows);
        let head = OutputHead {
            norm: &self.weights.output_norm,
            eps,
            output: self.weights.output.view(gguf)?,
            softcap: None,
        };
        head.run(s.output_rows.of(rows), s.residual.x(), logits, &mut s.head)
    }
}
