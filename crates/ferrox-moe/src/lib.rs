//! Mixture-of-experts feed-forward blocks, computed as llama.cpp's `build_moe_ffn` does on
//! the CPU backend.
//!
//! * [`routing`]: gating (softmax / sigmoid / softmax-over-selected), the DeepSeek-V3
//!   selection bias, group-limited selection, top-k, weight normalisation and scaling.
//! * [`experts`]: stacked expert tensors read in place, and the batched expert FFN that
//!   streams each selected expert's weights once per batch.
//! * [`numerics`]: the few ggml element-wise routines whose exact rounding matters
//!   (AVX2 `ggml_v_expf`, softmax, SwiGLU, GeGLU).

pub mod experts;
pub mod numerics;
pub mod routing;

mod error;

pub use error::MoeError;
pub use experts::{
    moe_ffn, moe_ffn_chosen, router_logits, shared_expert_gate, Activation, ExpertTensor,
    MoeExperts, MoeScratch, SharedExpert,
};
pub use routing::{
    route, route_into, weigh_chosen_into, Gating, MoeHparams, RouteScratch, RouterConfig,
};
