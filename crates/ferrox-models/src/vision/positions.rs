//! Learned position rows resized to an input's grid of patches, as ggml's `interpolate`
//! computes each mode llama.cpp's graphs use: a table of `gw × gh` rows (raster order, `e`
//! values each) becomes `pw × ph` rows.

use rayon::prelude::*;

/// A table's width `e` and an output buffer of `pw × ph` rows of it.
fn output(table: &[f32], (gw, gh): (usize, usize), (pw, ph): (usize, usize)) -> (usize, Vec<f32>) {
    let e = table.len() / (gw * gh);
    (e, vec![0.0f32; pw * ph * e])
}

/// Bilinear with aligned corners (Qwen3-VL).
pub fn bilinear_aligned(table: &[f32], from: (usize, usize), to: (usize, usize)) -> Vec<f32> {
    let ((gw, gh), (pw, ph)) = (from, to);
    let (e, mut out) = output(table, from, to);
    let scale = |out: usize, side: usize| -> f32 {
        if out > 1 && side > 1 {
            (out - 1) as f32 / (side - 1) as f32
        } else {
            out as f32 / side as f32
        }
    };
    let (sx, sy) = (scale(pw, gw), scale(ph, gh));
    let taps = |i: usize, sf: f32, side: usize| -> (usize, usize, f32) {
        let pos = i as f32 / sf;
        let lo = pos.floor() as isize;
        let clamp = |v: isize| v.clamp(0, side as isize - 1) as usize;
        let (a, b) = (clamp(lo), clamp(lo + 1));
        (a, b, (pos - a as f32).clamp(0.0, 1.0))
    };
    out.par_chunks_mut(e).enumerate().for_each(|(i, row)| {
        let (y0, y1, dy) = taps(i / pw, sy, gh);
        let (x0, x1, dx) = taps(i % pw, sx, gw);
        let at = |y: usize, x: usize| &table[(y * gw + x) * e..(y * gw + x + 1) * e];
        let (a, b, c, d) = (at(y0, x0), at(y0, x1), at(y1, x0), at(y1, x1));
        for (ch, o) in row.iter_mut().enumerate() {
            *o = a[ch] * (1.0 - dx) * (1.0 - dy)
                + b[ch] * dx * (1.0 - dy)
                + c[ch] * (1.0 - dx) * dy
                + d[ch] * dx * dy;
        }
    });
    out
}

/// One axis of an antialiased bilinear resize (PyTorch's `antialias=True`): the source range
/// an output sample covers and each source's triangle weight, in ggml's float steps.
struct AntialiasAxis {
    scale: f32,
    support: f32,
    inv: f32,
    len: usize,
}

impl AntialiasAxis {
    fn new(out: usize, len: usize) -> AntialiasAxis {
        let scale = out as f32 / len as f32;
        let support = (1.0 / scale).max(1.0);
        AntialiasAxis {
            scale,
            support,
            inv: 1.0 / support,
            len,
        }
    }

    /// The centre of output sample `i` in source coordinates and the sources it reads.
    fn span(&self, i: usize) -> (f32, std::ops::Range<usize>) {
        let centre = (i as f32 + 0.5) / self.scale;
        // C's float-to-integer conversion truncates toward zero.
        let lo = ((centre - self.support + 0.5) as i64).max(0) as usize;
        let hi = ((centre + self.support + 0.5) as i64)
            .min(self.len as i64)
            .max(0) as usize;
        (centre, lo..hi)
    }

    fn weight(&self, source: usize, centre: f32) -> f32 {
        let x = (source as f32 - centre + 0.5) * self.inv;
        (1.0 - x.abs()).max(0.0)
    }
}

/// Bilinear with antialiasing, half-pixel centres (Kimi-VL: llama.cpp's default
/// interpolation mode for learned positions).
pub fn bilinear_antialiased(table: &[f32], from: (usize, usize), to: (usize, usize)) -> Vec<f32> {
    let ((gw, gh), (pw, _)) = (from, to);
    let (e, mut out) = output(table, from, to);
    let (ax, ay) = (AntialiasAxis::new(to.0, gw), AntialiasAxis::new(to.1, gh));
    out.par_chunks_mut(e).enumerate().for_each(|(i, row)| {
        let (y, ys) = ay.span(i / pw);
        let (x, xs) = ax.span(i % pw);
        for (ch, o) in row.iter_mut().enumerate() {
            let (mut value, mut total) = (0.0f32, 0.0f32);
            for sy in ys.clone() {
                let wy = ay.weight(sy, y);
                for sx in xs.clone() {
                    let w = ax.weight(sx, x) * wy;
                    if w <= 0.0 {
                        continue;
                    }
                    value += table[(sy * gw + sx) * e + ch] * w;
                    total += w;
                }
            }
            *o = if total > 0.0 { value / total } else { value };
        }
    });
    out
}

/// Bicubic (a = -0.75, half-pixel centres, edges clamped) with the columns of each source
/// row interpolated first, as llama.cpp's Kimi-K2.5 graph resizes its `[e, width, height]`
/// table: it turns the table so that height is ggml's innermost axis, and ggml's bicubic
/// mixes the innermost axis first.
pub fn bicubic_columns_inner(table: &[f32], from: (usize, usize), to: (usize, usize)) -> Vec<f32> {
    const A: f32 = -0.75;
    let weight1 = |x: f32| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let weight2 = |x: f32| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    let cubic = |p: [f32; 4], t: f32| {
        let (w0, w1, w2, w3) = (
            weight2(t + 1.0),
            weight1(t),
            weight1(1.0 - t),
            weight2(2.0 - t),
        );
        p[0] * w0 + p[1] * w1 + p[2] * w2 + p[3] * w3
    };
    let ((gw, gh), (pw, ph)) = (from, to);
    let (e, mut out) = output(table, from, to);
    // Output sample `i` of `out` along an axis of `len` sources: the first tap and the
    // fraction past it.
    let tap = |i: usize, out: usize, len: usize| -> (i64, f32) {
        let scale = out as f32 / len as f32;
        let x = (i as f32 + 0.5) / scale - 0.5;
        let x0 = x.floor();
        (x0 as i64, x - x0)
    };
    out.par_chunks_mut(e).enumerate().for_each(|(i, row)| {
        // ggml's innermost axis (dx) is the height, the outer (dy) the width.
        let (r0, dr) = tap(i / pw, ph, gh);
        let (c0, dc) = tap(i % pw, pw, gw);
        let at = |r: i64, c: i64| {
            let r = r.clamp(0, gh as i64 - 1) as usize;
            let c = c.clamp(0, gw as i64 - 1) as usize;
            (r * gw + c) * e
        };
        for (ch, o) in row.iter_mut().enumerate() {
            let column = |dcol: i64| {
                let p = [-1, 0, 1, 2].map(|drow| table[at(r0 + drow, c0 + dcol) + ch]);
                cubic(p, dr)
            };
            *o = cubic([column(-1), column(0), column(1), column(2)], dc);
        }
    });
    out
}
