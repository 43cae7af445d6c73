//! Rotary position embeddings: ggml's "normal" (adjacent pairs, llama) and "NeoX" (halves)
//! layouts, with linear and YaRN frequency scaling.

/// Which elements RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (x[2i], x[2i+1]): llama, mistral.
    Normal,
    /// Pairs (x[i], x[i + n/2]): gpt-neox, qwen, gemma, phi3.
    Neox,
}

/// Multimodal RoPE (Qwen-VL): a head's rotated pairs split into sections turned by a row's
/// time, height and width positions and a fourth ("extra") one, which is 0 for every row
/// llama.cpp feeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mrope {
    /// Pairs per section (`rope.dimension_sections`), in order time, height, width, extra.
    pub sections: [usize; 4],
    /// Qwen3-VL's layout: pair `k` of the sections' span takes time, height or width by
    /// `k mod 3` while that section lasts (three times its count), the extra position
    /// past them.
    pub interleaved: bool,
}

/// A row's rotary position: plain RoPE turns by `t`; M-RoPE by time `t`, row `y` and column
/// `x` (a text row has all three equal, an image row of a Qwen-VL grid its own row and
/// column offsets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopePos {
    pub t: usize,
    pub y: usize,
    pub x: usize,
}

impl RopePos {
    /// A text row at position `p`.
    pub fn at(p: usize) -> RopePos {
        RopePos { t: p, y: p, x: p }
    }
}

/// Everything that fixes the rotation angles of one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    pub style: RopeStyle,
    /// Rotated dimensions per head (`rope.dimension_count`), at most the head size.
    pub n_dims: usize,
    pub freq_base: f32,
    /// 1 / linear scaling factor.
    pub freq_scale: f32,
    /// YaRN: 0 disables extrapolation mixing.
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub n_ctx_orig: usize,
    /// Per-dimension-pair frequency divisors (`rope_freqs.weight`, Llama 3.1 style).
    pub freq_factors: Option<Vec<f32>>,
    /// M-RoPE sections, if the layer places rows by several positions.
    pub mrope: Option<Mrope>,
}

impl Rope {
    pub fn plain(style: RopeStyle, n_dims: usize, freq_base: f32) -> Rope {
        Rope {
            style,
            n_dims,
            freq_base,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 0,
            freq_factors: None,
            mrope: None,
        }
    }

    fn corr_dims(&self) -> [f32; 2] {
        let n_dims = self.n_dims as f32;
        let corr_dim = |n_rot: f32| {
            n_dims * (self.n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * self.freq_base.ln())
        };
        let start = corr_dim(self.beta_fast).floor();
        let end = corr_dim(self.beta_slow).ceil();
        [start.max(0.0), end.min(n_dims - 1.0)]
    }

    /// The (cos, sin) pairs for position `pos`, as ggml's rope cache builds them: the angle
    /// is advanced by repeated multiplication, not recomputed by `powf`.
    pub fn angles(&self, pos: usize, out: &mut Vec<(f32, f32)>) {
        out.clear();
        let theta_scale = self.freq_base.powf(-2.0 / self.n_dims as f32);
        let corr = self.corr_dims();
        let mut theta = pos as f32;
        for i in 0..self.n_dims / 2 {
            let ff = self.freq_factors.as_ref().map_or(1.0, |f| f[i]);
            out.push(self.yarn(theta / ff, corr, 2 * i));
            theta *= theta_scale;
        }
    }

    /// The (cos, sin) pairs for a row at `pos`: [`Rope::angles`] of `pos.t`, or with M-RoPE
    /// sections each pair's angle from the position its section takes, as ggml's
    /// `ggml_mrope_cache_init` builds them (every section's angle advanced by repeated
    /// multiplication from the first pair on; the extra position is 0).
    pub fn angles_at(&self, pos: RopePos, out: &mut Vec<(f32, f32)>) {
        let Some(m) = self.mrope else {
            return self.angles(pos.t, out);
        };
        out.clear();
        let theta_scale = self.freq_base.powf(-2.0 / self.n_dims as f32);
        let corr = self.corr_dims();
        let [s0, s1, s2, _] = m.sections;
        let span = m.sections.iter().sum::<usize>().max(1);
        let (mut t, mut h, mut w, mut e) = (pos.t as f32, pos.y as f32, pos.x as f32, 0.0f32);
        for i in 0..self.n_dims / 2 {
            let ff = self.freq_factors.as_ref().map_or(1.0, |f| f[i]);
            let sector = i % span;
            let theta = if m.interleaved {
                if sector % 3 == 1 && sector < 3 * s1 {
                    h
                } else if sector % 3 == 2 && sector < 3 * s2 {
                    w
                } else if sector % 3 == 0 && sector < 3 * s0 {
                    t
                } else {
                    e
                }
            } else if sector < s0 {
                t
            } else if sector < s0 + s1 {
                h
            } else if sector < s0 + s1 + s2 {
                w
            } else {
                e
            };
            out.push(self.yarn(theta / ff, corr, 2 * i));
            t *= theta_scale;
            h *= theta_scale;
            w *= theta_scale;
            e *= theta_scale;
        }
    }

    fn yarn(&self, theta_extrap: f32, corr: [f32; 2], i0: usize) -> (f32, f32) {
        let theta_interp = self.freq_scale * theta_extrap;
        let mut theta = theta_interp;
        let mut mscale = self.attn_factor;
        if self.ext_factor != 0.0 {
            let y = ((i0 / 2) as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
            let ramp_mix = (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor;
            theta = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
            mscale *= 1.0 + 0.1 * (1.0 / self.freq_scale).ln();
        }
        (theta.cos() * mscale, theta.sin() * mscale)
    }

    /// Rotates the last `n_dims` dims of every head of `x` (ggml's `rope_set_offset` to
    /// `head_dim - n_dims`: DeepSeek-V4 keeps its rotated dims at the tail).
    pub fn apply_tail(&self, x: &mut [f32], head_dim: usize, angles: &[(f32, f32)]) {
        let offset = head_dim - self.n_dims;
        for head in x.chunks_exact_mut(head_dim) {
            self.apply(&mut head[offset..], self.n_dims, angles);
        }
    }

    /// Undoes [`Rope::apply_tail`] (ggml's `rope_ext_back`: the same angles, sines negated).
    pub fn unapply_tail(&self, x: &mut [f32], head_dim: usize, angles: &mut [(f32, f32)]) {
        angles.iter_mut().for_each(|a| a.1 = -a.1);
        self.apply_tail(x, head_dim, angles);
        angles.iter_mut().for_each(|a| a.1 = -a.1);
    }

    /// Rotates every head of `x` (`x.len() / head_dim` heads) by the given angles.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, angles: &[(f32, f32)]) {
        for head in x.chunks_exact_mut(head_dim) {
            let half = self.n_dims / 2;
            for (i, &(cos, sin)) in angles.iter().enumerate() {
                let (a, b) = match self.style {
                    RopeStyle::Normal => (2 * i, 2 * i + 1),
                    RopeStyle::Neox => (i, i + half),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos - x1 * sin;
                head[b] = x0 * sin + x1 * cos;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_rotation_preserves_norm() {
        for style in [RopeStyle::Normal, RopeStyle::Neox] {
            let rope = Rope::plain(style, 8, 10000.0);
            let mut angles = Vec::new();
            rope.angles(0, &mut angles);
            let orig: Vec<f32> = (0..16).map(|i| i as f32 * 0.1 - 0.5).collect();
            let mut x = orig.clone();
            rope.apply(&mut x, 8, &angles);
            assert_eq!(x, orig);
            rope.angles(37, &mut angles);
            rope.apply(&mut x, 8, &angles);
            let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
            assert!((norm(&x) - norm(&orig)).abs() < 1e-4);
            assert_ne!(x, orig);
        }
    }

    #[test]
    fn tail_rotation_is_undone() {
        let rope = Rope::plain(RopeStyle::Normal, 4, 10000.0);
        let mut angles = Vec::new();
        rope.angles(9, &mut angles);
        let orig: Vec<f32> = (0..12).map(|i| i as f32 * 0.3 - 1.0).collect();
        let mut x = orig.clone();
        rope.apply_tail(&mut x, 6, &angles);
        assert_eq!(x[..2], orig[..2]);
        assert_eq!(x[6..8], orig[6..8]);
        assert_ne!(x, orig);
        rope.unapply_tail(&mut x, 6, &mut angles);
        x.iter()
            .zip(&orig)
            .for_each(|(a, b)| assert!((a - b).abs() < 1e-5));
    }

    #[test]
    fn neox_rotates_halves_and_normal_rotates_neighbours() {
        let mut angles = Vec::new();
        let rope = Rope::plain(RopeStyle::Neox, 4, 10000.0);
        rope.angles(1, &mut angles);
        // Only the first pair (theta = 1 rad) matters for this vector.
        let mut x = [1.0, 0.0, 0.0, 0.0];
        rope.apply(&mut x, 4, &angles);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[2] - 1f32.sin()).abs() < 1e-6);
        let rope = Rope::plain(RopeStyle::Normal, 4, 10000.0);
        let mut x = [1.0, 0.0, 0.0, 0.0];
        rope.apply(&mut x, 4, &angles);
        assert!((x[1] - 1f32.sin()).abs() < 1e-6);
    }
}
