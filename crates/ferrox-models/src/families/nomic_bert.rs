//! Nomic's BERT (`nomic-bert`: nomic-embed-text v1/v1.5): NeoX RoPE instead of learned
//! positions, a fused QKV projection and a SwiGLU FFN without biases; run by the encoder.

use ferrox_gguf::Metadata;

use crate::encoder::{read_encoder, EncoderConfig, EncoderFfn, PositionKind};
use crate::ModelError;

/// `nomic-bert`, run by the encoder.
pub const ARCH: super::Architecture = super::Architecture {
    name: "nomic-bert",
    load: |gguf, options| super::encoder(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<EncoderConfig, ModelError> {
    read_encoder(meta, "nomic-bert", PositionKind::Rotary, EncoderFfn::SwiGlu)
}
