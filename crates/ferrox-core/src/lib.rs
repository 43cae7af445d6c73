//! Quantized block formats, kernels and runtime pieces shared by every Ferrox engine.
//!
//! [`quant`] converts between f32 and ggml's block formats, bit-exactly matching
//! llama.cpp's reference code; [`kernels`] holds the quantized dot products (a scalar
//! reference per weight type, AVX2 versions bit-exact with ggml's, AVX-512 VNNI versions
//! bit-identical to those, picked at run time); [`matrix`] views one tensor's bytes as a
//! weight matrix with parallel, batch-invariant matrix-vector and matrix-matrix products,
//! through [`packed`] copies (sixteen rows interleaved for `vpdpbusd`) where faster, a
//! decode step's rows split across threads by claiming ([`work_split`]);
//! [`flash_attn`] is attention's inner loop over f16 caches, [`typed_attn`] over the other
//! cache types; [`kv_cache`] names the element
//! types of cached rows; [`relu_scores`] is the sparse-attention indexer's scoring loop and
//! [`select`] its top-k (with the greedy argmax). The sequence memory that holds cached rows
//! is `ferrox-memory`.

pub mod bandwidth;
pub mod dense_attn;
pub mod flash_attn;
pub mod glu;
pub mod hadamard;
pub mod kernels;
pub mod kv_cache;
pub mod matrix;
pub mod online_softmax;
pub mod packed;
pub mod quant;
pub mod relu_scores;
pub mod select;
pub mod typed_attn;
pub mod work_split;

pub use ferrox_gguf::GgmlType;
pub use kv_cache::{available_memory, KvRows, KvStorage, KvType};
pub use matrix::{MatrixProduct, WeightMatrix};
pub use quant::{
    can_dequantize, can_quantize, dequantize_row, quantize_row, row_byte_len, QuantError,
};
