//! Prompts with images: the text around each image tokenized as llama.cpp's `mtmd` does, and
//! each image's embeddings (from a vision encoder) fed in its own step between its markers.

use std::sync::Arc;

use ferrox_engine::{
    EngineError, EngineExt, ImageGrid, InputEmbeddings, LogitsFor, State, TokenId,
};
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
    /// The tokens' grid, when the language model places them by M-RoPE (Qwen-VL): the image
    /// then takes [`ImageGrid::n_pos`] rotary positions, not one per token.
    pub grid: Option<ImageGrid>,
    /// The text before and after the embeddings (`<start_of_image>`, `<end_of_image>`).
    pub begin: String,
    pub end: String,
    /// Identifies the image's positions for prefix reuse: equal images, equal ids.
    pub ids: Vec<TokenId>,
}

impl EncodedImage {
    /// An image's `n_tokens` rows (from a vision encoder), placed between `markers` (the
    /// text before and after them), its positions named by [`EncodedImage::content_ids`].
    pub fn new(
        rows: Vec<f32>,
        n_tokens: usize,
        bidirectional: bool,
        markers: (&str, &str),
    ) -> EncodedImage {
        EncodedImage {
            ids: EncodedImage::content_ids(&rows, n_tokens),
            rows,
            n_tokens,
            bidirectional,
            grid: None,
            begin: markers.0.to_string(),
            end: markers.1.to_string(),
        }
    }

    /// The image placed as a grid of tokens by M-RoPE (`None`: one position per token).
    pub fn with_grid(mut self, grid: Option<ImageGrid>) -> EncodedImage {
        self.grid = grid;
        self
    }

    /// Rotary positions the image takes beyond its tokens (negative: fewer): what the
    /// positions after it are shifted by.
    pub fn position_shift(&self) -> isize {
        self.grid
            .map_or(0, |g| g.n_pos() as isize - self.n_tokens as isize)
    }

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

/// The shift from cache positions to rotary positions at position `at` of a prompt holding
/// `images`: the sum of the shifts of the images that end by then.
pub fn position_shift_at(images: &[PlacedImage], at: usize) -> isize {
    images
        .iter()
        .filter(|p| p.start + p.image.n_tokens <= at)
        .map(|p| p.image.position_shift())
        .sum()
}

/// A piece of a prompt.
#[derive(Clone, Debug)]
pub enum Chunk {
    Text(Vec<TokenId>),
    Image(Arc<EncodedImage>),
}

impl Chunk {
    /// Positions the chunk takes.
    pub fn len(&self) -> usize {
        match self {
            Chunk::Text(t) => t.len(),
            Chunk::Image(i) => i.n_tokens,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
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
        self.chunks.iter().map(Chunk::len).sum()
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

    /// The longest start of the prompt, at most `n` positions, that does not end inside an
    /// image (an image is fed whole, in one step): how much of a cached prefix of `n`
    /// matching positions can be kept.
    pub fn reusable(&self, n: usize) -> usize {
        self.placed_images()
            .iter()
            .find(|p| p.start < n && n < p.start + p.image.n_tokens)
            .map_or(n, |p| p.start)
    }

    /// The shift from cache positions to rotary positions at position `at` of the prompt
    /// (after the images that end by then; see [`EncodedImage::position_shift`]).
    pub fn position_shift_at(&self, at: usize) -> isize {
        position_shift_at(&self.placed_images(), at)
    }

    /// Feeds every chunk but a final text chunk to `state`, each image in a step of its own;
    /// returns the rest of that final chunk, the prompt to generate after. The positions the
    /// state already holds are taken to be the prompt's start (a reused prefix, which must
    /// not end inside an image: see [`MediaPrompt::reusable`]) and are not fed again.
    pub fn feed_prefix<E: EngineExt + ?Sized>(
        &self,
        engine: &E,
        state: &mut State,
    ) -> Result<Vec<TokenId>, EngineError> {
        let done = state.len();
        let (last, head) = match self.chunks.split_last() {
            Some((Chunk::Text(t), head)) => (&t[..], head),
            _ => (&[][..], &self.chunks[..]),
        };
        if head.iter().any(|c| matches!(c, Chunk::Image(_))) && !engine.accepts_embeddings() {
            return Err(EngineError::State(format!(
                "the {} engine does not take images",
                engine.architecture()
            )));
        }
        let mut at = 0;
        for chunk in head {
            let n = chunk.len();
            let skip = done.saturating_sub(at);
            at += n;
            if skip >= n {
                continue;
            }
            let pos = state.len();
            state.set_position_shift(self.position_shift_at(pos));
            match chunk {
                Chunk::Text(t) => {
                    let t = &t[skip..];
                    engine.forward_batch(t, pos, state, LogitsFor::From(t.len()))?;
                }
                Chunk::Image(_) if skip > 0 => {
                    return Err(EngineError::State(format!(
                        "the cached prefix ({done} positions) ends inside an image"
                    )));
                }
                Chunk::Image(img) => {
                    let embeddings = InputEmbeddings {
                        rows: &img.rows,
                        bidirectional: img.bidirectional,
                        grid: img.grid,
                        grid_first: 0,
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
        // The final text, and what is generated after it, follow every image.
        state.set_position_shift(self.position_shift_at(self.len()));
        let skip = done.saturating_sub(at).min(last.len());
        Ok(last[skip..].to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_prefix_never_ends_inside_an_image() {
        let image = Arc::new(EncodedImage::new(vec![0.5; 4 * 2], 4, true, ("<a>", "<b>")));
        let prompt = MediaPrompt {
            chunks: vec![
                Chunk::Text(vec![1, 2, 3]),
                Chunk::Image(image.clone()),
                Chunk::Text(vec![4, 5]),
            ],
        };
        assert_eq!(prompt.len(), 9);
        assert_eq!(prompt.ids()[3..7], image.ids[..]);
        // Up to the image's start, and from its end on, a prefix is kept as it is; inside
        // the image it goes back to the image's start.
        let kept: Vec<usize> = (0..=9).map(|n| prompt.reusable(n)).collect();
        assert_eq!(kept, [0, 1, 2, 3, 3, 3, 3, 7, 8, 9]);
    }

    #[test]
    fn grid_images_shift_the_positions_after_them() {
        let grid = |nx, ny| {
            Arc::new(
                EncodedImage::new(vec![0.5; nx * ny], nx * ny, false, ("", ""))
                    .with_grid(Some(ImageGrid { nx, ny })),
            )
        };
        // 3x2 tokens take 3 rotary positions, 2x4 take 4.
        let prompt = MediaPrompt {
            chunks: vec![
                Chunk::Text(vec![1, 2]),
                Chunk::Image(grid(3, 2)),
                Chunk::Text(vec![3]),
                Chunk::Image(grid(2, 4)),
                Chunk::Text(vec![4]),
            ],
        };
        let shifts: Vec<isize> = [0, 2, 5, 8, 9, 16, 17]
            .iter()
            .map(|&at| prompt.position_shift_at(at))
            .collect();
        assert_eq!(shifts, [0, 0, 0, -3, -3, -3, -7]);
    }

    #[test]
    fn equal_images_get_equal_ids_outside_the_vocabulary() {
        let a = EncodedImage::new(vec![0.25; 6], 3, false, ("", ""));
        let b = EncodedImage::new(vec![0.25; 6], 3, false, ("", ""));
        let c = EncodedImage::new(vec![0.5; 6], 3, false, ("", ""));
        assert_eq!(a.ids, b.ids);
        assert_ne!(a.ids, c.ids);
        assert!(a.ids.iter().all(|&id| id & 0x8000_0000 != 0));
    }
}
