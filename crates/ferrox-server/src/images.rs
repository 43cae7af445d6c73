//! A request's images: decoded and encoded with the server's vision encoder on a worker
//! thread, each distinct image once (a small cache keyed by the file's bytes, so a
//! conversation that sends its image again is not encoded again).

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferrox_generate::media::EncodedImage;
use ferrox_models::vision::{RgbImage, VisionEncoder};

use crate::api::{ImageInput, MAX_IMAGE_BYTES};
use crate::error::ApiError;
use crate::routes::blocking;
use crate::Ready;

/// Encoded images kept for reuse.
const CACHED_IMAGES: usize = 32;
/// How long connecting to an image's server may take.
const FETCH_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long fetching one image may take in all.
const FETCH_TIMEOUT: Duration = Duration::from_secs(60);
/// Redirects followed when fetching an image.
const FETCH_REDIRECTS: u32 = 5;

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

/// Encodes a request's images in order, fetching those given by URL: an undecodable image
/// or a failed fetch is a 400 naming it, images sent to a server without `--mmproj` a 400
/// saying so, an image URL sent to a server without `--allow-remote-images` as well.
pub(crate) async fn encode(
    ready: &Arc<Ready>,
    images: Vec<ImageInput>,
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
    let remote = images.iter().position(|i| matches!(i, ImageInput::Url(_)));
    if let (Some(i), false) = (remote, ready.allow_remote_images) {
        return Err(ApiError::param(
            "messages",
            format!(
                "image {}: image URLs are not fetched by this server (start it with \
                 --allow-remote-images to fetch them); send the image as a data: URL",
                i + 1
            ),
        )
        .with_code("remote_images_disabled"));
    }
    let ready = ready.clone();
    blocking(move || {
        images
            .into_iter()
            .enumerate()
            .map(|(i, input)| {
                let bytes = match input {
                    ImageInput::Bytes(bytes) => bytes,
                    ImageInput::Url(url) => fetch(&url, i)?,
                };
                let bytes = &bytes;
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
    let grid = encoder.image_grid(&emb);
    Ok(Arc::new(
        EncodedImage::new(
            emb.data,
            emb.n_tokens,
            encoder.bidirectional(),
            encoder.markers(),
        )
        .with_grid(grid),
    ))
}

/// The bytes of the image at `url` (image `i` of the request): a status other than success,
/// a body over [`MAX_IMAGE_BYTES`], a timeout or a network error is a 400 naming the URL.
fn fetch(url: &str, i: usize) -> Result<Vec<u8>, ApiError> {
    let fail = |why: String| {
        ApiError::param(
            "messages",
            format!("image {}: fetching {url}: {why}", i + 1),
        )
    };
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(FETCH_CONNECT_TIMEOUT)
        .timeout(FETCH_TIMEOUT)
        .redirects(FETCH_REDIRECTS)
        .user_agent(concat!("ferrox/", env!("CARGO_PKG_VERSION")))
        .build();
    let response = agent.get(url).call().map_err(|e| match e {
        ureq::Error::Status(code, _) => fail(format!("HTTP status {code}")),
        ureq::Error::Transport(t) => fail(t.to_string()),
    })?;
    let too_large = || fail(format!("the image is larger than {MAX_IMAGE_BYTES} bytes"));
    let declared = response
        .header("Content-Length")
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_IMAGE_BYTES as u64) {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    response
        .into_reader()
        .take(MAX_IMAGE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| fail(e.to_string()))?;
    if bytes.len() > MAX_IMAGE_BYTES {
        return Err(too_large());
    }
    tracing::info!("image {}: fetched {} bytes from {url}", i + 1, bytes.len());
    Ok(bytes)
}
