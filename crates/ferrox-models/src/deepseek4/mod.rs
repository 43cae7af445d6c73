//! The DeepSeek-V4 engine (`deepseek4`): compressed sparse attention over a sliding window
//! ([`attention`], [`compressor`]), manifold-constrained hyper-connections between the
//! sub-blocks ([`hyper`]), and mixture-of-experts layers with sqrt-softplus gating, the
//! leading ones routed by token id.
//!
//! # Memory
//! As llama.cpp's DeepSeek-V4 cache, a sequence keeps:
//!
//! * in its state, rings of the latest rows: every layer's raw key-value rows (`D`) of the
//!   window, and each compressor's projections and scores of the tokens its next row pools;
//! * paged, in strided stores (one per compressor kind: 4x attention, 128x attention, 4x
//!   indexer keys), the compressed rows: one per `ratio` positions, in the block of the
//!   position that completes it.
//!
//! Every ring holds [`RING_SLACK`] positions more than attention reads, which is how far a
//! sequence can roll back anywhere (llama.cpp's rollback snapshots); further only to a
//! block-end checkpoint of the state, which is also what prefix reuse starts from.
//!
//! Multi-token-prediction layers at the end of a file are not part of the trunk and are not
//! loaded.

pub mod attention;
pub mod compressor;
pub mod config;
pub mod hyper;
pub mod weights;

use std::sync::Arc;

use ferrox_core::KvStorage;
use ferrox_gguf::Gguf;
use ferrox_memory::{MemorySpec, PagedStoreSpec, RecurrentSpec, StepMemory};
use ferrox_moe::{Activation, MoeExperts};

pub use config::{Compression, Deepseek4Config};
pub use weights::Deepseek4Weights;

use crate::engine::{EngineError, EngineOptions};
use crate::hparams::moe_error;
use crate::scaffold::{self, sized, HeadScratch, OutputHead, Row, Runtime};
use crate::ModelError;
use attention::{AttnScratch, LayerStores, RawRing};
use compressor::CompressorStore;
use config::HC_STREAMS as HC;
use hyper::{HcScratch, HyperConnection};
use weights::LayerWeights;

/// Clamps at or below this are no clamp (llama.cpp's threshold).
const NO_CLAMP: f32 = 1e-6;

/// Positions every ring of a sequence's state holds beyond what attention reads: the most a
/// sequence rolls back by anywhere, and the rows one pass of attention writes.
pub const RING_SLACK: usize = 32;

/// A DeepSeek-V4 model over a memory-mapped GGUF checkpoint.
pub struct Deepseek4Engine {
    rt: Runtime,
    config: Deepseek4Config,
    weights: Deepseek4Weights,
    stores: Vec<LayerStores>,
    specs: Vec<PagedStoreSpec>,
    /// Values of a sequence's state: the raw rings, then the compressors' rings.
    state_values: usize,
    bounds: attention::Bounds,
}

#[derive(Default)]
pub struct Scratch {
    /// The hyper-connection streams, `n × hc × n_embd`.
    streams: Vec<f32>,
    /// A sub-block's input (mixed from the streams) and its normed form.
    x_in: Vec<f32>,
    xn: Vec<f32>,
    y: Vec<f32>,
    hc: HcScratch,
    attn: AttnScratch,
    router_logits: Vec<f32>,
    chosen: Vec<usize>,
    moe: ferrox_moe::MoeScratch,
    head: HeadScratch,
    output_rows: scaffold::OutputRows,
}

/// Each layer's rings and stores, the strided stores' shapes (one per compressor kind that
/// some layer has) and the values of a sequence's state.
fn lay_out_memory(
    c: &Deepseek4Config,
    n_ctx: usize,
    storage: KvStorage,
) -> (Vec<LayerStores>, Vec<PagedStoreSpec>, usize) {
    let raw_len = c.window.min(n_ctx) + RING_SLACK;
    let ring = RawRing {
        offset: 0,
        len: raw_len,
        width: c.head_dim,
        ty: storage.keys,
        rotation: storage.key_rotation(c.head_dim),
    };
    let ring_values = raw_len * ring.slot_values();
    let mut stores: Vec<LayerStores> = (0..c.n_layer)
        .map(|il| LayerStores {
            raw: RawRing {
                offset: il * ring_values,
                ..ring
            },
            ..LayerStores::default()
        })
        .collect();
    let mut state_values = c.n_layer * ring_values;
    let mut specs = Vec::new();
    // (kind, width, is the indexer's): one store each.
    let kinds = [
        (Compression::Sparse, c.head_dim, false),
        (Compression::Heavy, c.head_dim, false),
        (Compression::Sparse, c.indexer_dim, true),
    ];
    for (kind, width, indexer) in kinds {
        let layers: Vec<usize> = (0..c.n_layer)
            .filter(|&il| c.compression[il] == kind)
            .collect();
        if layers.is_empty() {
            continue;
        }
        let store = specs.len();
        for (layer, &il) in layers.iter().enumerate() {
            let at = CompressorStore {
                store,
                layer,
                width,
                kind,
                ring: state_values,
            };
            state_values += at.ring_values();
            match indexer {
                true => stores[il].indexer = Some(at),
                false => stores[il].compressor = Some(at),
            }
        }
        specs.push(PagedStoreSpec {
            n_layers: layers.len(),
            key_width: width,
            value_width: 0,
            stride: kind.ratio(),
        });
    }
    (stores, specs, state_values)
}

impl Deepseek4Engine {
    pub fn with_config(
        gguf: Arc<Gguf>,
        options: &EngineOptions,
        config: Deepseek4Config,
    ) -> Result<Self, ModelError> {
        // Every cache of the model holds keys only, in `-ctk`'s type, as llama.cpp's V4
        // cache: the raw and compressed rows (heads) and the indexer's keys.
        let rows = [
            ("heads", config.head_dim),
            ("indexer keys", config.indexer_dim),
        ];
        let options = &crate::scaffold::keys_only_cache(options, &rows)?;
        let mut weights = Deepseek4Weights::load(&gguf, &config)?;
        let c = &config;
        let mut rt = Runtime::new(
            gguf,
            options,
            (c.n_ctx_train, c.n_vocab, c.n_embd),
            "ferrox-ds4",
        )?;
        rt.repack(options, |g| weights.pack(g))?;
        rt.weight_bytes_per_token = weights.bytes_per_token(c);
        let n_ctx = rt.n_ctx;
        let (stores, specs, state_values) = lay_out_memory(c, n_ctx, rt.kv_storage);
        let compressed = c
            .compression
            .iter()
            .map(|k| match k {
                Compression::None => 0,
                Compression::Sparse => c.indexer_top_k.min(n_ctx / 4),
                Compression::Heavy => n_ctx / 128,
            })
            .max()
            .unwrap_or(0);
        let bounds = attention::Bounds {
            keys: c.window.min(n_ctx) + compressed,
            positions: n_ctx,
        };
        Ok(Deepseek4Engine {
            rt,
            config,
            weights,
            stores,
            specs,
            state_values,
            bounds,
        })
    }

    pub fn config(&self) -> &Deepseek4Config {
        &self.config
    }

    /// A sub-block's hyper-connection with these mixing weights.
    fn hyper<'a>(&self, weights: &'a hyper::HcWeights) -> HyperConnection<'a> {
        let c = &self.config;
        HyperConnection {
            weights,
            n_embd: c.n_embd,
            norm_eps: c.norm_eps,
            hc_eps: c.hc_eps,
            sinkhorn_iterations: c.sinkhorn_iterations,
        }
    }

    /// Layer `il`'s mixture of experts over the normed rows `xn` into `out`.
    fn moe(
        &self,
        il: usize,
        lw: &LayerWeights,
        rows: &[Row],
        xn: &[f32],
        out: &mut [f32],
        s: &mut MoeBuffers<'_>,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let gguf = &*self.rt.gguf;
        let activation = |limit: f32| match limit > NO_CLAMP {
            true => Activation::SwiGluClamped { limit },
            false => Activation::SwiGlu,
        };
        let m = &lw.moe;
        let shared = m
            .shared_expert(gguf)?
            .map(|shared| ferrox_moe::SharedExpert {
                activation: activation(c.clamp_shexp[il]),
                ..shared
            });
        let experts = MoeExperts::new(
            m.gate_exps.view(gguf)?,
            m.up_exps.view(gguf)?,
            m.down_exps.view(gguf)?,
            activation(c.clamp_exp[il]),
        )
        .map_err(moe_error)?
        .with_shared(shared);
        s.moe
            .router_logits(&m.gate_inp.view(gguf)?, xn, s.router_logits)
            .map_err(moe_error)?;
        match &lw.tid2eid {
            Some(table) => {
                let k = c.router.n_used;
                s.chosen.clear();
                for r in rows {
                    let t = r.token as usize;
                    s.chosen.extend_from_slice(&table[t * k..(t + 1) * k]);
                }
                ferrox_moe::moe_ffn_chosen(
                    &c.router,
                    &experts,
                    xn,
                    s.router_logits,
                    s.chosen,
                    out,
                    s.moe,
                )
            }
            None => ferrox_moe::moe_ffn(
                &c.router,
                &experts,
                xn,
                s.router_logits,
                m.selection_bias.as_deref(),
                out,
                s.moe,
            ),
        }
        .map_err(moe_error)?;
        Ok(())
    }
}

/// The buffers of one layer's mixture of experts.
struct MoeBuffers<'a> {
    router_logits: &'a mut Vec<f32>,
    chosen: &'a mut Vec<usize>,
    moe: &'a mut ferrox_moe::MoeScratch,
}

crate::scaffold::engine_from_body!(Deepseek4Engine);

impl scaffold::EngineBody for Deepseek4Engine {
    type Buffers = Scratch;

    fn runtime(&self) -> &Runtime {
        &self.rt
    }

    /// Paged: per ratio-4 layer a compressed row (`D`) and an indexer key (`Di`) every 4
    /// positions, per ratio-128 layer a compressed row every 128. Per sequence: every
    /// layer's raw ring (`(W + slack) · D`), each ratio-4 compressor's ring (`(8 + slack) ·
    /// 4w`) and each ratio-128 one's (`(128 + slack) · 2D`), f32.
    fn memory_spec(&self) -> MemorySpec {
        MemorySpec {
            paged: self.specs.clone(),
            recurrent: Some(RecurrentSpec {
                values: self.state_values,
                ring_slack: RING_SLACK,
                step_checkpoints: 0,
            }),
            storage: self.rt.kv_storage,
            row_lag: 0,
        }
    }

    fn checkpoints(&self) -> bool {
        true
    }

    fn micro_batch(
        &self,
        rows: &[Row],
        _embeddings: &[f32],
        memory: &mut StepMemory<'_>,
        logits: &mut [&mut Vec<f32>],
        s: &mut Scratch,
    ) -> Result<(), EngineError> {
        let c = &self.config;
        let (n, e, gguf) = (rows.len(), c.n_embd, &*self.rt.gguf);
        let x_in = sized(&mut s.x_in, n * e);
        scaffold::embed(rows, &self.weights.token_embd.view(gguf)?, None, &[], x_in)?;
        let streams = sized(&mut s.streams, n * HC * e);
        for (t, stream) in streams.chunks_exact_mut(HC * e).enumerate() {
            for copy in stream.chunks_exact_mut(e) {
                copy.copy_from_slice(&x_in[t * e..(t + 1) * e]);
            }
        }
        s.output_rows.reset();
        let last = self.weights.layers.len().saturating_sub(1);
        for (il, lw) in self.weights.layers.iter().enumerate() {
            let Scratch {
                streams,
                x_in,
                xn,
                y,
                hc: hs,
                attn,
                router_logits,
                chosen,
                moe,
                output_rows,
                ..
            } = s;
            let (x_in, xn, y) = (sized(x_in, n * e), sized(xn, n * e), sized(y, n * e));
            let mix = self.hyper(&lw.hc_attn);
            mix.pre(gguf, streams, n, x_in, hs)?;
            scaffold::norm_rows(x_in, &lw.attn_norm, c.norm_eps, xn);
            let stores = self.stores[il];
            attention::attention(
                c,
                lw,
                stores,
                gguf,
                il,
                rows,
                xn,
                memory,
                self.bounds,
                attn,
                y,
            )?;
            mix.post(streams, y, n, hs);

            // The last layer's experts only for the rows that give something back.
            let (n, rows) = match il == last {
                true => (
                    output_rows.keep(rows, streams, HC * e),
                    output_rows.of(rows),
                ),
                false => (n, rows),
            };
            let (x_in, xn, y) = (&mut x_in[..n * e], &mut xn[..n * e], &mut y[..n * e]);
            let mix = self.hyper(&lw.hc_ffn);
            mix.pre(gguf, streams, n, x_in, hs)?;
            scaffold::norm_rows(x_in, &lw.ffn_norm, c.norm_eps, xn);
            let mut buffers = MoeBuffers {
                router_logits,
                chosen,
                moe,
            };
            self.moe(il, lw, rows, xn, y, &mut buffers)?;
            mix.post(streams, y, n, hs);
        }
        scaffold::advance(memory, rows);
        let head_rows = s.output_rows.of(rows);
        let n = head_rows.len();
        let x_in = sized(&mut s.x_in, n * e);
        hyper::collapse(
            gguf,
            &self.weights.hc_head,
            &s.streams,
            n,
            e,
            (c.norm_eps, c.hc_eps),
            x_in,
            &mut s.hc,
        )?;
        let head = OutputHead {
            norm: &self.weights.output_norm,
            eps: c.norm_eps,
            output: self.weights.output.view(gguf)?,
            softcap: None,
        };
        head.run(head_rows, &s.x_in[..n * e], logits, &mut s.head)
    }
}
