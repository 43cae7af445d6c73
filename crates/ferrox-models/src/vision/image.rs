//! Images as the vision encoders take them: decoded to 8-bit RGB, resized with Pillow's
//! separable resampling in fixed point (what llama.cpp's `mtmd` does, so the pixels match
//! bit for bit), padded, and normalized into planar f32 channels.

use crate::ModelError;

/// The largest width or height accepted, and the largest pixel count: a decoder bomb (a
/// tiny file declaring a huge image) is refused before anything that size is allocated.
pub const MAX_IMAGE_SIDE: u32 = 16_384;
pub const MAX_IMAGE_PIXELS: u64 = 64 * 1024 * 1024;

/// An 8-bit RGB image, row-major, three bytes per pixel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RgbImage {
    pub width: usize,
    pub height: usize,
    pub pixels: Vec<u8>,
}

/// Why an image could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("the image could not be decoded: {0}")]
    Decode(String),
    #[error("the image is {width}x{height}: at most {MAX_IMAGE_SIDE} pixels a side and {MAX_IMAGE_PIXELS} pixels in all")]
    TooLarge { width: u64, height: u64 },
    #[error("the image is empty (0 pixels wide or high)")]
    Empty,
}

impl From<ImageError> for ModelError {
    fn from(e: ImageError) -> ModelError {
        ModelError::Config(e.to_string())
    }
}

fn check_size(width: u64, height: u64) -> Result<(), ImageError> {
    if width == 0 || height == 0 {
        return Err(ImageError::Empty);
    }
    if width > u64::from(MAX_IMAGE_SIDE)
        || height > u64::from(MAX_IMAGE_SIDE)
        || width * height > MAX_IMAGE_PIXELS
    {
        return Err(ImageError::TooLarge { width, height });
    }
    Ok(())
}

impl RgbImage {
    /// Decodes a PNG, JPEG, GIF (first frame), BMP, WebP or PNM file's bytes. Grey images
    /// are spread to three channels and an alpha channel is dropped (not composited), as
    /// llama.cpp's loader does.
    pub fn decode(bytes: &[u8]) -> Result<RgbImage, ImageError> {
        use image::ImageDecoder;
        let reader = image::ImageReader::new(std::io::Cursor::new(bytes))
            .with_guessed_format()
            .map_err(|e| ImageError::Decode(e.to_string()))?;
        let mut decoder = reader
            .into_decoder()
            .map_err(|e| ImageError::Decode(e.to_string()))?;
        let (w, h) = decoder.dimensions();
        check_size(u64::from(w), u64::from(h))?;
        let mut limits = image::Limits::default();
        limits.max_image_width = Some(MAX_IMAGE_SIDE);
        limits.max_image_height = Some(MAX_IMAGE_SIDE);
        limits.max_alloc = Some(MAX_IMAGE_PIXELS * 16);
        decoder
            .set_limits(limits)
            .map_err(|e| ImageError::Decode(e.to_string()))?;
        let decoded = image::DynamicImage::from_decoder(decoder)
            .map_err(|e| ImageError::Decode(e.to_string()))?;
        let rgb = match decoded {
            image::DynamicImage::ImageRgb8(rgb) => rgb,
            // 16-bit samples keep their high byte, as stb_image converts them.
            image::DynamicImage::ImageRgb16(_)
            | image::DynamicImage::ImageRgba16(_)
            | image::DynamicImage::ImageLuma16(_)
            | image::DynamicImage::ImageLumaA16(_) => {
                let wide = decoded.to_rgb16();
                let (w, h) = wide.dimensions();
                let pixels = wide.into_raw().into_iter().map(|v| (v >> 8) as u8);
                image::RgbImage::from_raw(w, h, pixels.collect())
                    .ok_or_else(|| ImageError::Decode("inconsistent pixel buffer".into()))?
            }
            other => other.to_rgb8(),
        };
        let (width, height) = (rgb.width() as usize, rgb.height() as usize);
        Ok(RgbImage {
            width,
            height,
            pixels: rgb.into_raw(),
        })
    }

    /// An image of one colour.
    pub fn filled(width: usize, height: usize, color: [u8; 3]) -> RgbImage {
        RgbImage {
            width,
            height,
            pixels: color.repeat(width * height),
        }
    }

    /// Checks that the pixel buffer matches the size (for images built by hand).
    pub fn check(&self) -> Result<(), ImageError> {
        check_size(self.width as u64, self.height as u64)?;
        if self.pixels.len() != self.width * self.height * 3 {
            return Err(ImageError::Decode(format!(
                "{} bytes for a {}x{} RGB image",
                self.pixels.len(),
                self.width,
                self.height
            )));
        }
        Ok(())
    }
}

/// The resampling filter of a resize.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResizeFilter {
    Bilinear,
    /// Pillow's bicubic (`a = -0.5`).
    Bicubic,
    Lanczos,
}

impl ResizeFilter {
    fn support(self) -> f64 {
        match self {
            ResizeFilter::Bilinear => 1.0,
            ResizeFilter::Bicubic => 2.0,
            ResizeFilter::Lanczos => 3.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        match self {
            ResizeFilter::Lanczos => {
                let sinc = |v: f64| {
                    if v == 0.0 {
                        1.0
                    } else {
                        let pv = v * std::f64::consts::PI;
                        pv.sin() / pv
                    }
                };
                if (-3.0..3.0).contains(&x) {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            }
            ResizeFilter::Bilinear => {
                let x = x.abs();
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            ResizeFilter::Bicubic => {
                const A: f64 = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
        }
    }
}

/// Fixed-point fraction bits of the resampling weights (32 bits less 8 for the pixel, less
/// 2 of headroom).
const PRECISION_BITS: u32 = 22;

/// One dimension's resampling: for each output pixel the first input pixel, the count, and
/// `ksize` fixed-point weights.
struct Kernel {
    ksize: usize,
    bounds: Vec<(usize, usize)>,
    weights: Vec<i32>,
}

impl Kernel {
    fn new(in_size: usize, out_size: usize, filter: ResizeFilter) -> Kernel {
        let scale = in_size as f64 / out_size as f64;
        // Upsampling keeps the filter's width; downsampling widens it (no aliasing).
        let filterscale = scale.max(1.0);
        let support = filter.support() * filterscale;
        let ksize = support.ceil() as usize * 2 + 1;
        let mut bounds = Vec::with_capacity(out_size);
        let mut weights = vec![0i32; out_size * ksize];
        let mut pre = vec![0.0f64; ksize];
        let fxp_scale = f64::from(1u32 << PRECISION_BITS);
        for xx in 0..out_size {
            let center = (xx as f64 + 0.5) * scale;
            let ss = 1.0 / filterscale;
            // Truncation toward zero, as a C cast does.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
            let count = xmax.saturating_sub(xmin);
            let mut total = 0.0;
            pre.fill(0.0);
            for (x, w) in pre.iter_mut().enumerate().take(count) {
                *w = filter.weight((x as f64 + xmin as f64 - center + 0.5) * ss);
                total += *w;
            }
            if total != 0.0 {
                pre.iter_mut().take(count).for_each(|w| *w /= total);
            }
            for (k, &w) in weights[xx * ksize..(xx + 1) * ksize].iter_mut().zip(&pre) {
                // Pillow adds ±0.5 and truncates.
                let r = w * fxp_scale + if w < 0.0 { -0.5 } else { 0.5 };
                *k = r as i32;
            }
            bounds.push((xmin, count));
        }
        Kernel {
            ksize,
            bounds,
            weights,
        }
    }
}

fn clip8(v: i32) -> u8 {
    (v >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Pillow's separable resize (horizontal pass, then vertical), in fixed point. The sums are
/// 32-bit and wrap as the C code's do.
pub fn resize(img: &RgbImage, width: usize, height: usize, filter: ResizeFilter) -> RgbImage {
    let mut cur = img.clone();
    if width != img.width {
        let k = Kernel::new(img.width, width, filter);
        let mut out = vec![0u8; width * img.height * 3];
        for y in 0..img.height {
            let src = &cur.pixels[y * img.width * 3..(y + 1) * img.width * 3];
            let dst = &mut out[y * width * 3..(y + 1) * width * 3];
            for (xx, &(xmin, count)) in k.bounds.iter().enumerate() {
                let w = &k.weights[xx * k.ksize..xx * k.ksize + count];
                let mut ss = [1i32 << (PRECISION_BITS - 1); 3];
                for (x, &wx) in w.iter().enumerate() {
                    let p = &src[(xmin + x) * 3..(xmin + x) * 3 + 3];
                    for c in 0..3 {
                        ss[c] = ss[c].wrapping_add(i32::from(p[c]).wrapping_mul(wx));
                    }
                }
                for c in 0..3 {
                    dst[xx * 3 + c] = clip8(ss[c]);
                }
            }
        }
        cur = RgbImage {
            width,
            height: img.height,
            pixels: out,
        };
    }
    if height != img.height {
        let k = Kernel::new(img.height, height, filter);
        let row = cur.width * 3;
        let mut out = vec![0u8; row * height];
        let mut acc = vec![0i32; row];
        for (yy, &(ymin, count)) in k.bounds.iter().enumerate() {
            acc.fill(1 << (PRECISION_BITS - 1));
            for y in 0..count {
                let wy = k.weights[yy * k.ksize + y];
                let src = &cur.pixels[(ymin + y) * row..(ymin + y + 1) * row];
                for (a, &p) in acc.iter_mut().zip(src) {
                    *a = a.wrapping_add(i32::from(p).wrapping_mul(wy));
                }
            }
            for (d, &a) in out[yy * row..(yy + 1) * row].iter_mut().zip(&acc) {
                *d = clip8(a);
            }
        }
        cur = RgbImage {
            width: cur.width,
            height,
            pixels: out,
        };
    }
    cur
}

/// Fits the image inside `width × height` keeping its aspect ratio (the scaled sides
/// rounded up, as llama.cpp's default padding does), centred on a `pad` background.
pub fn resize_padded(
    img: &RgbImage,
    width: usize,
    height: usize,
    filter: ResizeFilter,
    pad: [u8; 3],
) -> RgbImage {
    if img.width == width && img.height == height {
        return img.clone();
    }
    let scale = (width as f32 / img.width as f32).min(height as f32 / img.height as f32);
    let new_w = ((img.width as f32 * scale).ceil() as usize).clamp(1, width);
    let new_h = ((img.height as f32 * scale).ceil() as usize).clamp(1, height);
    let inner = resize(img, new_w, new_h, filter);
    let mut out = RgbImage::filled(width, height, pad);
    let (ox, oy) = ((width - new_w) / 2, (height - new_h) / 2);
    for y in 0..new_h {
        let src = &inner.pixels[y * new_w * 3..(y + 1) * new_w * 3];
        let at = ((oy + y) * width + ox) * 3;
        out.pixels[at..at + new_w * 3].copy_from_slice(src);
    }
    out
}

/// The image as planar f32 channels (`[3][height][width]`), each value `(v / 255 - mean) /
/// std` in f32, as llama.cpp normalizes.
pub fn normalize_planar(img: &RgbImage, mean: [f32; 3], std: [f32; 3]) -> Vec<f32> {
    let n = img.width * img.height;
    let mut out = vec![0.0f32; 3 * n];
    for (i, px) in img.pixels.chunks_exact(3).enumerate() {
        for c in 0..3 {
            let v = f32::from(px[c]) / 255.0;
            out[c * n + i] = (v - mean[c]) / std[c];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gradient(w: usize, h: usize) -> RgbImage {
        let mut pixels = Vec::with_capacity(w * h * 3);
        for y in 0..h {
            for x in 0..w {
                pixels.extend([
                    (x * 255 / w.max(1)) as u8,
                    (y * 255 / h.max(1)) as u8,
                    ((x * 7 + y * 13) % 256) as u8,
                ]);
            }
        }
        RgbImage {
            width: w,
            height: h,
            pixels,
        }
    }

    #[test]
    fn resizing_to_the_same_size_changes_nothing() {
        let img = gradient(17, 9);
        assert_eq!(resize(&img, 17, 9, ResizeFilter::Bilinear), img);
        assert_eq!(
            resize_padded(&img, 17, 9, ResizeFilter::Bicubic, [0; 3]),
            img
        );
    }

    #[test]
    fn a_flat_image_stays_flat_whatever_the_filter() {
        let img = RgbImage::filled(13, 7, [200, 10, 99]);
        for f in [
            ResizeFilter::Bilinear,
            ResizeFilter::Bicubic,
            ResizeFilter::Lanczos,
        ] {
            for (w, h) in [(5, 3), (40, 21), (13, 30)] {
                let out = resize(&img, w, h, f);
                assert_eq!(out, RgbImage::filled(w, h, [200, 10, 99]), "{f:?} {w}x{h}");
            }
        }
    }

    #[test]
    fn halving_with_bilinear_averages_pixel_pairs() {
        // Downsampling by 2 with a triangle filter of support 2 weights the two covered
        // pixels 3/8 each and their outer neighbours 1/8 each (edges renormalized).
        let img = RgbImage {
            width: 4,
            height: 1,
            pixels: [0u8, 80, 160, 240]
                .iter()
                .flat_map(|&v| [v, v, v])
                .collect(),
        };
        let out = resize(&img, 2, 1, ResizeFilter::Bilinear);
        // first: (0*3 + 80*3 + 160*1) / 7 = 57.1; second: (80*1 + 160*3 + 240*3) / 7 = 182.9
        assert_eq!(out.pixels, vec![57, 57, 57, 183, 183, 183]);
    }

    #[test]
    fn padding_centres_the_scaled_image() {
        let img = RgbImage::filled(20, 10, [255, 255, 255]);
        let out = resize_padded(&img, 8, 8, ResizeFilter::Bilinear, [0, 0, 0]);
        // 20x10 scaled by 0.4 → 8x4, centred vertically: rows 2..6 white.
        for y in 0..8 {
            let white = (2..6).contains(&y);
            let row = &out.pixels[y * 24..(y + 1) * 24];
            assert!(
                row.iter().all(|&v| v == if white { 255 } else { 0 }),
                "row {y}"
            );
        }
    }

    #[test]
    fn normalization_is_planar() {
        let img = RgbImage {
            width: 2,
            height: 1,
            pixels: vec![255, 0, 51, 0, 255, 102],
        };
        let out = normalize_planar(&img, [0.5; 3], [0.5; 3]);
        assert_eq!(out.len(), 6);
        assert_eq!(&out[..2], &[1.0, -1.0]);
        assert_eq!(&out[2..4], &[-1.0, 1.0]);
        assert!((out[4] - (0.2 - 0.5) / 0.5).abs() < 1e-6);
    }

    #[test]
    fn hostile_bytes_are_refused_cleanly() {
        for bytes in [
            &b""[..],
            b"\x89PNG\r\n\x1a\n",
            b"GIF89a\xff\xff\xff\xff",
            b"not an image",
        ] {
            assert!(RgbImage::decode(bytes).is_err());
        }
    }

    #[test]
    fn a_declared_giant_is_refused_before_decoding() {
        // A PNG header declaring 100000 x 100000 pixels, no data.
        let mut png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
        png.extend(100_000u32.to_be_bytes());
        png.extend(100_000u32.to_be_bytes());
        png.extend([8, 2, 0, 0, 0]);
        let crc = crc32fast::hash(&png[12..]);
        png.extend(crc.to_be_bytes());
        let err = RgbImage::decode(&png).unwrap_err();
        assert!(
            matches!(err, ImageError::TooLarge { .. } | ImageError::Decode(_)),
            "{err}"
        );
    }
}
