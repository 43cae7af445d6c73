//! A request's images: decoded and encoded with the server's vision encoder on a worker
//! thread, each distinct image once (a small cache keyed by the file's bytes, so a
//! conversation that sends its image again is not encoded again).

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

use ferrox_generate::media::EncodedImage;
use ferrox_models::vision::{RgbImage, VisionEncoder};

use crate::error::ApiError;
use crate::routes::blocking;
use crate::Ready;

/// Encoded images kept for reuse.
const CACHED_IMAGES: usize = 32;

/// An image's bytes as the cache knows them: their hash and length.
type ImageKey = (u64, usize);

/// The most recently encoded images, most recent first, keyed by a hash of their bytes
/// (keyed per process, so no client can aim a collision at another's image) and length.
#[derive(Default)]
pub(crate) struct ImageCache {
    hasher: std::collections::hash_map::RandomState,
    entries: Mutex<VecDeque<(ImageKey, Arc<EncodedImage>)>>,
}

impl ImageCache {
    fn key(&self, bytes: &[u8]) -> ImageKey {
        (self.hasher.hash_one(bytes), bytes.len())
    }

    fn get(&self, key: ImageKey) -> Option<Arc<EncodedImage>> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let at = entries.iter().position(|(k, _)| *k == key)?;
        let entry = entries.remove(at)?;
        let image = entry.1.clone();
        entries.push_front(entry);
        Some(image)
    }

    fn put(&self, key: ImageKey, image: Arc<EncodedImage>) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.retain(|(k, _)| *k != key);
        entries.push_front((key, image));
        entries.truncate(CACHED_IMAGES);
    }
}

/// Encodes a request's images in order: an undecodable image is a 400 naming it, images
/// sent to a server without `--mmproj` a 400 saying so.
pub(crate) async fn encode(
    ready: &Arc<Ready>,
    images: Vec<Vec<u8>>,
) -> Result<Vec<Arc<EncodedImage>>, ApiError> {
    if images.is_empty() {
        return Ok(Vec::new());
    }
    let Some(encoder) = ready.vision.clone() else {
        return Err(ApiError::unsupported(
            "messages",
            format!(
                "`{}` takes text only: start the server with --mmproj FILE (the model's vision projector) to send images",
                ready.model_id
            ),
        )
        .with_code("images_not_supported"));
    };
    let ready = ready.clone();
    blocking(move || {
        images
            .iter()
            .enumerate()
            .map(|(i, bytes)| {
                let key = ready.image_cache.key(bytes);
                if let Some(hit) = ready.image_cache.get(key) {
                    return Ok(hit);
                }
                let started = std::time::Instant::now();
                let image = encode_one(&encoder, bytes, i)?;
                tracing::info!(
                    "image {}: encoded in {:.1} ms ({} tokens)",
                    i + 1,
                    started.elapsed().as_secs_f64() * 1e3,
                    image.n_tokens
                );
                ready.image_cache.put(key, image.clone());
                Ok(image)
            })
            .collect()
    })
    .await?
}

fn encode_one(
    encoder: &VisionEncoder,
    bytes: &[u8],
    i: usize,
) -> Result<Arc<EncodedImage>, ApiError> {
    let img = RgbImage::decode(bytes)
        .map_err(|e| ApiError::param("messages", format!("image {}: {e}", i + 1)))?;
    let emb = encoder
        .encode(&img)
        .map_err(|e| ApiError::internal(format!("encoding image {}: {e}", i + 1)))?;
    Ok(Arc::new(EncodedImage::new(
        emb.data,
        emb.n_tokens,
        encoder.bidirectional(),
        encoder.markers(),
    )))
}
