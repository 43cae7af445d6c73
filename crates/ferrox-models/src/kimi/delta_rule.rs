//! The KDA delta-rule recurrence of one head over a run of a sequence's rows, in two forms
//! that agree: token by token (decode) and chunked (prefill). Both are built from
//! [`super::lanes`]' loops and compiled a second time for AVX2 with FMA, picked at run time
//! (the default x86-64 target has 4-lane vectors and no FMA).

use super::lanes::{add_scaled, product, scale, Portable, Sums};
use crate::layers::attention::MAX_HEAD_DIM;
use crate::scaffold::sized;

/// Positions per chunk of the chunked recurrence (llama.cpp's KDA chunk size).
pub const CHUNK: usize = 16;

/// Rows' inputs to the recurrence: q, k, v (`d_inner` per row), log-decays (`d_inner`),
/// betas (`n_head`).
pub type Inputs<'a> = (&'a [f32], &'a [f32], &'a [f32], &'a [f32], &'a [f32]);

/// The output buffer, written by the heads of a run in parallel, each into its own columns.
pub struct SharedOut(pub *mut f32);

// SAFETY: the heads of a run write disjoint `Dh`-wide column slices of the output rows.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// Row `t`'s slice for head `hd`.
    ///
    /// # Safety
    /// No two callers may hold the same (row, head) slice at once.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    unsafe fn head(&self, t: usize, hd: usize, d_inner: usize, dh: usize) -> &mut [f32] {
        // SAFETY: the caller's promise; the offsets stay inside the `n × d_inner` buffer the
        // pointer was taken from.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(t * d_inner + hd * dh), dh) }
    }
}

/// One run of a sequence's rows through the recurrence.
pub struct Run {
    pub rows: std::ops::Range<usize>,
    pub d_inner: usize,
    pub dh: usize,
    pub n_head: usize,
    pub scale: f32,
}

thread_local! {
    /// Each worker's buffers for the chunked form (sized for the largest run once).
    static CHUNK_SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Run {
    /// Advances head `hd`'s state `m` (kept transposed: `m[j·Dh + i] = S[i][j]`) by the run's
    /// rows and writes the head's outputs: token by token for one row, chunked for more.
    pub fn head(&self, hd: usize, m: &mut [f32], x: Inputs<'_>, o: &SharedOut) {
        CHUNK_SCRATCH.with_borrow_mut(|buf| {
            #[cfg(target_arch = "x86_64")]
            if let Some(avx2) = super::lanes::Avx2::detect() {
                // SAFETY: the CPU has the features `head_avx2` is compiled for.
                return unsafe { self.head_avx2(avx2, hd, m, x, o, buf) };
            }
            self.head_in(Portable, hd, m, x, o, buf)
        })
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn head_avx2(
        &self,
        avx2: super::lanes::Avx2,
        hd: usize,
        m: &mut [f32],
        x: Inputs<'_>,
        o: &SharedOut,
        buf: &mut Vec<f32>,
    ) {
        self.head_in(avx2, hd, m, x, o, buf)
    }

    #[inline(always)]
    fn head_in(
        &self,
        l: impl Sums,
        hd: usize,
        m: &mut [f32],
        x: Inputs<'_>,
        o: &SharedOut,
        buf: &mut Vec<f32>,
    ) {
        if self.rows.len() == 1 {
            self.token(l, hd, m, x, o)
        } else {
            self.chunked(l, hd, m, x, o, buf)
        }
    }

    /// Token by token, as ggml's fused `gated_delta_net` op: decay, delta rule, output. Each
    /// row of the transposed state depends on that row only, so one row goes through every
    /// stage (decay and `Sᵀk`, then the update and `Sᵀq`) while it is in the cache.
    #[inline(always)]
    fn token(&self, l: impl Sums, hd: usize, m: &mut [f32], x: Inputs<'_>, o: &SharedOut) {
        let (q, k, v, g, beta) = x;
        let (dh, d_inner) = (self.dh, self.d_inner);
        let mut decay = [0f32; MAX_HEAD_DIM];
        let decay = &mut decay[..dh];
        for t in self.rows.clone() {
            let at = t * d_inner + hd * dh;
            let (qh, kh, vh) = (&q[at..at + dh], &k[at..at + dh], &v[at..at + dh]);
            let b = beta[t * self.n_head + hd];
            decay
                .iter_mut()
                .zip(&g[at..at + dh])
                .for_each(|(d, &gi)| *d = gi.exp());
            // SAFETY: this head's slice of row t, written by this task only.
            let oh = unsafe { o.head(t, hd, d_inner, dh) };
            for ((row, &vj), oj) in m.chunks_exact_mut(dh).zip(vh).zip(oh.iter_mut()) {
                let delta = (vj - l.scale_then_dot(row, decay, kh)) * b;
                *oj = l.add_scaled_then_dot(row, delta, kh, qh) * self.scale;
            }
        }
    }

    /// The chunked form: with the decays `P_t = Π_{r≤t} e^{g_r}` from the run's start and
    /// the state S0 there, the pseudo-values u_t solve
    /// `u_t = β_t (v_t − S0ᵀ(P_t⊙k_t)) − Σ_{s<t} β_t (k_t·(P_t/P_s⊙k_s)) u_s`,
    /// the outputs are `o_t = S0ᵀ(P_t⊙q_t) + Σ_{s≤t} (q_t·(P_t/P_s⊙k_s)) u_s` and the state
    /// becomes `P_C⊙S0 + Σ_s (P_C/P_s⊙k_s) u_sᵀ`: the token-by-token recurrence unrolled
    /// over the run. Every ratio of decays is a product of the steps' decays between the
    /// two positions, one multiplication per step and channel (no exponential per pair, and
    /// no division, which could overflow where decays underflow).
    #[inline(always)]
    fn chunked(
        &self,
        l: impl Sums,
        hd: usize,
        m: &mut [f32],
        x: Inputs<'_>,
        o: &SharedOut,
        buf: &mut Vec<f32>,
    ) {
        let (q, k, v, g, beta) = x;
        let (dh, d_inner) = (self.dh, self.d_inner);
        let c = self.rows.len();
        let t0 = self.rows.start;
        // Row t's slice for this head.
        let head = |t: usize| (t0 + t) * d_inner + hd * dh..(t0 + t) * d_inner + (hd + 1) * dh;
        let b = |t: usize| beta[(t0 + t) * self.n_head + hd];
        // Per position of the run, Dh each: the step's decays; P_t⊙k_t and P_t⊙q_t; the
        // pseudo-values; S0ᵀ(P_t⊙k_t) and S0ᵀ(P_t⊙q_t); each key decayed to the run's end.
        let all = sized(buf, 7 * c * dh + 2 * dh);
        let (decay, rest) = all.split_at_mut(c * dh);
        let (k_start, rest) = rest.split_at_mut(c * dh);
        let (q_start, rest) = rest.split_at_mut(c * dh);
        let (u, rest) = rest.split_at_mut(c * dh);
        let (s0k, rest) = rest.split_at_mut(c * dh);
        let (s0q, rest) = rest.split_at_mut(c * dh);
        let (k_end, rest) = rest.split_at_mut(c * dh);
        let (run, kp) = rest.split_at_mut(dh);
        let at = |t: usize| t * dh..(t + 1) * dh;

        for t in 0..c {
            let gt = &g[head(t)];
            decay[at(t)]
                .iter_mut()
                .zip(gt)
                .for_each(|(d, &gi)| *d = gi.exp());
        }
        run.fill(1.0);
        for t in 0..c {
            scale(run, &decay[at(t)]);
            product(&mut k_start[at(t)], run, &k[head(t)]);
            product(&mut q_start[at(t)], run, &q[head(t)]);
        }
        // `run` now holds P_C, the decay over the whole run.

        // For s <= t: a[t][s] = β_t k_t·(P_t/P_s⊙k_s) (s < t) and w[t][s] = q_t·(P_t/P_s⊙k_s),
        // the decayed key kept from one t to the next.
        let (mut a, mut w) = ([[0f32; CHUNK]; CHUNK], [[0f32; CHUNK]; CHUNK]);
        for s in 0..c {
            kp.copy_from_slice(&k[head(s)]);
            w[s][s] = l.dot(&q[head(s)], kp);
            for t in s + 1..c {
                scale(kp, &decay[at(t)]);
                a[t][s] = l.dot(&k[head(t)], kp) * b(t);
                w[t][s] = l.dot(&q[head(t)], kp);
            }
        }
        // S0ᵀ(P_t⊙k_t) and S0ᵀ(P_t⊙q_t) for every t in one pass over the state.
        for (j, row) in m.chunks_exact(dh).enumerate() {
            for t in 0..c {
                s0k[t * dh + j] = l.dot(row, &k_start[at(t)]);
                s0q[t * dh + j] = l.dot(row, &q_start[at(t)]);
            }
        }
        for t in 0..c {
            let (done, ut) = u.split_at_mut(t * dh);
            let ut = &mut ut[..dh];
            let bt = b(t);
            for ((uj, &vj), &sj) in ut.iter_mut().zip(&v[head(t)]).zip(&s0k[at(t)]) {
                *uj = bt * (vj - sj);
            }
            for s in 0..t {
                add_scaled(ut, -a[t][s], &done[at(s)]);
            }
        }
        for t in 0..c {
            // SAFETY: this head's slice of the run's row t, written by this task only.
            let oh = unsafe { o.head(t0 + t, hd, d_inner, dh) };
            oh.copy_from_slice(&s0q[at(t)]);
            for s in 0..=t {
                add_scaled(oh, w[t][s], &u[at(s)]);
            }
            oh.iter_mut().for_each(|x| *x *= self.scale);
        }
        // The new state, each key decayed to the run's end (P_C/P_s = the steps after s).
        kp.fill(1.0);
        for s in (0..c).rev() {
            product(&mut k_end[at(s)], kp, &k[head(s)]);
            scale(kp, &decay[at(s)]);
        }
        for (j, row) in m.chunks_exact_mut(dh).enumerate() {
            scale(row, run);
            for s in 0..c {
                add_scaled(row, u[s * dh + j], &k_end[at(s)]);
            }
        }
    }
}
