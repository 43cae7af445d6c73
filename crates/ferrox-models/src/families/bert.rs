//! BERT (`bert`: bge, MiniLM, e5...): learned positions, token types, GELU FFN, biases
//! everywhere; run by the encoder.

use ferrox_gguf::Metadata;

use crate::encoder::{read_encoder, EncoderConfig, EncoderFfn, PositionKind};
use crate::ModelError;

/// `bert`, run by the encoder.
pub const ARCH: super::Architecture = super::Architecture {
    name: "bert",
    load: |gguf, options| super::encoder(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<EncoderConfig, ModelError> {
    read_encoder(meta, "bert", PositionKind::Learned, EncoderFfn::Gelu)
}
