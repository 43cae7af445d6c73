//! Jina's BERT (`jina-bert-v2`: jina-embeddings-v2): ALiBi instead of positions, a GEGLU
//! FFN, optional LayerNorms of the query and key projections and a second post-attention
//! norm; run by the encoder.

use ferrox_gguf::Metadata;

use crate::encoder::{read_encoder, EncoderConfig, EncoderFfn, PositionKind};
use crate::ModelError;

/// `jina-bert-v2`, run by the encoder.
pub const ARCH: super::Architecture = super::Architecture {
    name: "jina-bert-v2",
    load: |gguf, options| super::encoder(gguf, options, config),
};

pub fn config(meta: &Metadata<'_>) -> Result<EncoderConfig, ModelError> {
    read_encoder(meta, "jina-bert-v2", PositionKind::Alibi, EncoderFfn::GeGlu)
}
