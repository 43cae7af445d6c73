//! The building blocks every architecture shares: norms, RoPE, attention, feed-forward
//! activations. Each follows ggml's arithmetic (operation order, f16 rounding points) so our
//! logits track llama.cpp's closely.

pub mod activation;
pub mod attention;
pub mod classifier;
pub mod kv_rotation;
pub mod linear;
pub mod mla;
pub mod norm;
pub mod paged_attention;
pub mod rope;
