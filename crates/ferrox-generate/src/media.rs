//! Prompts with images: the text around each image tokenized as llama.cpp's `mtmd` does, and
//! each image's embeddings (from a vision encoder) fed in its own step between its markers.

use std::sync::Arc;

use ferrox_engine::{EngineError, EngineExt, InputEmbeddings, LogitsFor, State, TokenId};
use ferrox_tokenizer::tokenizer::Tokenizer;

/// Where an image goes in a prompt's text (llama.cpp's default media marker).
pub const MEDIA_MARKER: &str = "<__media__>";

/// One image as the language model takes it.
#[derive(Clone, Debug)]
pub struct EncodedImage {
    /// `n_tokens` rows of the model's embedding width.
    pub rows: Vec<f32>,
    pub n_tokens: usize,
    /// The image's tokens attend to each other both ways (Gemma 3).
    pub bidirectional: bool,
    /// The text before and after the embeddings (`<start_of_image>`, `<end_of_image>`).
    pub begin: String,
    pub end: String,
    /// Identifies the image's positions for prefix reuse: equal images, equal ids.
    pub ids: Vec<TokenId>,
}

impl EncodedImage {
    /// Position ids for an image's `n_tokens` rows, derived from its content (a hash of the
    /// rows' bits), outside any vocabulary (the top bit set).
    pub fn content_ids(rows: &[f32], n_tokens: usize) -> Vec<TokenId> {
        // FNV-1a over the bits: stable across runs and machines.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for v in rows {
            for b in v.to_bits().to_le_bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        (0..n_tokens as u64)
            .map(|i| {
                0x8000_0000 | ((h.wrapping_add(i.wrapping_mul(0x9e37_79b9)) as u32) & 0x7fff_ffff)
            })
            .collect()
    }
}

/// Why a prompt with images could not be built.
#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    #[error(
        "the prompt has {markers} image markers (`{MEDIA_MARKER}`) but {images} images were given"
    )]
    MarkerCount { markers: usize, images: usize },
}

/// An image and the position in its prompt where its rows start.
#[derive(Clone, Debug)]
pub struct PlacedImage {
    pub start: usize,
    pub image: Arc<EncodedImage>,
}

/// A piece of a prompt.
#[derive(Clone, Debug)]
pub enum Chunk {
    Text(Vec<TokenId>),
    Image(Arc<EncodedImage>),
}

/// A prompt of text and images, in order; it always ends with text (an image's end marker
/// at least).
#[derive(Clone, Debug)]
pub struct MediaPrompt {
    pub chunks: Vec<Chunk>,
}

impl MediaPrompt {
    /// Splits `text` at its media markers, one per image in order. Without any marker the
    /// images go before the text, as llama.cpp's `mtmd` CLI places them. Each text piece is tokenized on its own with special
    /// tokens parsed; the first gets the BOS token when `add_bos`.
    pub fn build(
        tokenizer: &Tokenizer,
        text: &str,
        images: Vec<Arc<EncodedImage>>,
        add_bos: bool,
    ) -> Result<MediaPrompt, MediaError> {
        let markers = text.matches(MEDIA_MARKER).count();
        let owned;
        let text = if markers == 0 && !images.is_empty() {
            owned = format!("{}{text}", MEDIA_MARKER.repeat(images.len()));
            owned.as_str()
        } else {
            text
        };
        let pieces: Vec<&str> = text.split(MEDIA_MARKER).collect();
        if pieces.len() - 1 != images.len() {
            return Err(MediaError::MarkerCount {
                markers: pieces.len() - 1,
                images: images.len(),
            });
        }
        let mut chunks = Vec::new();
        let mut pending = String::new();
        let mut first = true;
        for (i, piece) in pieces.iter().enumerate() {
            pending.push_str(piece);
            if let Some(image) = images.get(i) {
                pending.push_str(&image.begin);
                chunks.push(Chunk::Text(tokenizer.encode(
                    &pending,
                    add_bos && first,
                    true,
                )));
                first = false;
                chunks.push(Chunk::Image(image.clone()));
                pending = image.end.clone();
            }
        }
        chunks.push(Chunk::Text(tokenizer.encode(
            &pending,
            add_bos && first,
            true,
        )));
        chunks.retain(|c| !matches!(c, Chunk::Text(t) if t.is_empty()));
        Ok(MediaPrompt { chunks })
    }

    /// Positions the prompt takes.
    pub fn len(&self) -> usize {
        self.chunks
            .iter()
            .map(|c| match c {
                Chunk::Text(t) => t.len(),
                Chunk::Image(i) => i.n_tokens,
            })
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The position ids of the whole prompt (an image's content ids in its place).
    pub fn ids(&self) -> Vec<TokenId> {
        let mut out = Vec::with_capacity(self.len());
        for c in &self.chunks {
            match c {
                Chunk::Text(t) => out.extend_from_slice(t),
                Chunk::Image(i) => out.extend_from_slice(&i.ids),
            }
        }
        out
    }

    /// The images with their start positions, in order.
    pub fn placed_images(&self) -> Vec<PlacedImage> {
        let mut at = 0;
        let mut out = Vec::new();
        for c in &self.chunks {
            match c {
                Chunk::Text(t) => at += t.len(),
                Chunk::Image(i) => {
                    out.push(PlacedImage {
                        start: at,
                        image: i.clone(),
                    });
                    at += i.n_tokens;
                }
            }
        }
        out
    }

    /// Feeds every chunk but a final text chunk to `state` (from its current length), each
    /// image in a step of its own; returns that final chunk's tokens, the prompt to generate
    /// after.
    pub fn feed_prefix<E: EngineExt + ?Sized>(
        &self,
        engine: &E,
        state: &mut State,
    ) -> Result<Vec<TokenId>, EngineError> {
        let (last, head) = match self.chunks.split_last() {
            Some((Chunk::Text(t), head)) => (t.clone(), head),
            _ => (Vec::new(), &self.chunks[..]),
        };
        if !head.is_empty() && !engine.accepts_embeddings() {
            return Err(EngineError::State(format!(
                "the {} engine does not take images",
                engine.architecture()
            )));
        }
        for chunk in head {
            let pos = state.len();
            match chunk {
                Chunk::Text(t) => {
                    engine.forward_batch(t, pos, state, LogitsFor::From(t.len()))?;
                }
                Chunk::Image(img) => {
                    let embeddings = InputEmbeddings {
                        rows: &img.rows,
                        bidirectional: img.bidirectional,
                    };
                    engine.forward_embeddings(
                        &img.ids,
                        embeddings,
                        pos,
                        state,
                        LogitsFor::From(img.n_tokens),
                    )?;
                }
            }
        }
        Ok(last)
    }
}
