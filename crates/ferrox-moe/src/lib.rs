//! Mixture-of-experts feed-forward blocks, computed as llama.cpp's `build_moe_ffn` does on
//! the CPU backend.
//!
//! * [`routing`]: gating (softmax / sigmoid / softmax-over-selected), the DeepSeek-V3
//!   selection bias, group-limited selection, top-k, weight normalisation and scaling.
//! * [`experts`]: stacked expert tensors read in place, and the batched expert FFN that
//!   streams each selected expert's weights once per batch.
//! * [`cache`]: experts streamed from the mapped file through a cache of packed copies,
//!   for models larger than memory.
//! * [`shared`]: the shared expert, alone or riding in the routed experts' passes.
//! * [`numerics`]: the few ggml element-wise routines whose exact rounding matters
//!   (AVX2 `ggml_v_expf`, softmax, SwiGLU, GeGLU).

pub mod cache;
pub mod experts;
pub mod numerics;
pub mod routing;
pub mod shared;

mod error;

pub use cache::{CachedExperts, ExpertCache, ExpertCacheStats, MappedPages};
pub use error::MoeError;
pub use experts::{
    moe_ffn, moe_ffn_chosen, router_logits, Activation, ExpertTensor, Lookahead, MoeExperts,
    MoeScratch,
};
pub use routing::{
    route, route_into, weigh_chosen_into, Gating, MoeHparams, RouteScratch, RouterConfig,
};
pub use shared::{shared_expert_gate, SharedExpert};
