//! Compressors: one key row every `ratio` positions, pooled from the tokens of its block.
//!
//! Every token projects its normed input into key-value values and gate scores (plus a
//! learned score for its place in the block). They go into the compressor's ring in the
//! sequence's state (llama.cpp's compressor ring), an entry `[kv (overlap·w) | score
//! (overlap·w)]` at slot `pos % ring_len`; the ring holds [`super::RING_SLACK`] entries more
//! than a block reads, so a sequence can drop that many positions anywhere. When a token
//! completes block `b` (its position is `b·ratio + ratio − 1`), the block is pooled per
//! channel with a softmax over the scores, RMS-normed, rotated at position `b·ratio` and
//! written to the compressor's strided store at that token's position: it becomes visible to
//! that token and every later one, as in llama.cpp (`n_visible = (pos + 1) / ratio`).
//!
//! The overlapping compressor (ratio 4) pools 8 tokens: the previous block's with the first
//! half of their projections, then this block's with the second half; block 0 has no previous
//! block (those entries count as zero values with −inf scores).

use ferrox_core::hadamard;
use ferrox_gguf::Gguf;
use ferrox_memory::StepMemory;
use ferrox_moe::numerics::softmax;

use super::config::Compression;
use super::weights::CompressorWeights;
use super::RING_SLACK;
use crate::engine::EngineError;
use crate::layers::linear::linear;
use crate::layers::norm::rms_norm_in_place;
use crate::layers::rope::Rope;
use crate::scaffold::{sized, Row};

/// Where one layer's compressor keeps its rows and its ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompressorStore {
    /// The strided store of compressed rows, and the layer's place in it.
    pub store: usize,
    pub layer: usize,
    /// Width of a compressed row.
    pub width: usize,
    pub kind: Compression,
    /// Offset of the ring in a sequence's state.
    pub ring: usize,
}

impl CompressorStore {
    /// Values of one ring entry: the projections, then the scores.
    pub fn entry_width(&self) -> usize {
        2 * self.kind.overlap() * self.width
    }

    /// Entries in the ring: the tokens one compressed row pools, and the slack.
    pub fn ring_len(&self) -> usize {
        self.kind.overlap() * self.kind.ratio() + RING_SLACK
    }

    /// Values of the ring.
    pub fn ring_values(&self) -> usize {
        self.ring_len() * self.entry_width()
    }

    /// The ring entry of position `pos` in a sequence's state.
    fn entry<'s>(&self, state: &'s [f32], pos: usize) -> &'s [f32] {
        let w = self.entry_width();
        &state[self.ring + (pos % self.ring_len()) * w..][..w]
    }

    /// Compressed rows visible to a token at `pos`.
    pub fn visible(&self, pos: usize) -> usize {
        (pos + 1) / self.kind.ratio()
    }

    /// The position that completes compressed row `b`.
    pub fn position_of(&self, b: usize) -> usize {
        b * self.kind.ratio() + self.kind.ratio() - 1
    }
}

/// Copies compressed row `b` of sequence `seq` into `out` (`width` values).
pub fn read_row(
    memory: &StepMemory<'_>,
    at: CompressorStore,
    seq: usize,
    b: usize,
    out: &mut [f32],
) {
    memory
        .key_row(at.store, seq, at.layer, at.position_of(b))
        .copy_to(out);
}

/// Buffers of the compressors, reused across layers and steps.
#[derive(Default)]
pub struct CompressorScratch {
    kv: Vec<f32>,
    score: Vec<f32>,
    row: Vec<f32>,
    entries_kv: Vec<f32>,
    entries_score: Vec<f32>,
    weights: Vec<f32>,
    angles: Vec<(f32, f32)>,
    xq: Vec<u8>,
}

/// Projects the micro-batch's normed inputs `xn` into the compressor's ring entries, in row
/// order, and compresses each block a row completes into the strided store (rotated in blocks
/// of `rotation` values, the indexer's, before it is stored).
#[allow(clippy::too_many_arguments)]
pub fn record(
    at: CompressorStore,
    w: &CompressorWeights,
    gguf: &Gguf,
    rows: &[Row],
    xn: &[f32],
    memory: &mut StepMemory<'_>,
    (rope, eps): (&Rope, f32),
    rotation: Option<usize>,
    s: &mut CompressorScratch,
) -> Result<(), EngineError> {
    let n = rows.len();
    let (width, ratio) = (at.width, at.kind.ratio());
    let projected = at.kind.overlap() * width;
    // Sized now for this compressor's blocks, so that the first block completed while
    // decoding grows nothing.
    let entries = width * at.kind.overlap() * ratio;
    sized(&mut s.entries_kv, entries);
    sized(&mut s.entries_score, entries);
    sized(&mut s.weights, at.kind.overlap() * ratio);
    sized(&mut s.row, width);
    let kv = sized(&mut s.kv, n * projected);
    linear(&w.kv.view(gguf)?, xn, n, kv, &mut s.xq)?;
    let score = sized(&mut s.score, n * projected);
    linear(&w.gate.view(gguf)?, xn, n, score, &mut s.xq)?;
    let entry_width = at.entry_width();
    for (t, r) in rows.iter().enumerate() {
        let ape = &w.ape[(r.pos % ratio) * projected..][..projected];
        let state = memory.state(r.seq);
        let slot = at.ring + (r.pos % at.ring_len()) * entry_width;
        let entry = &mut state[slot..slot + entry_width];
        entry[..projected].copy_from_slice(&s.kv[t * projected..][..projected]);
        let scores = &mut entry[projected..];
        scores.copy_from_slice(&s.score[t * projected..][..projected]);
        scores.iter_mut().zip(ape).for_each(|(s, a)| *s += a);
        if (r.pos + 1) % ratio == 0 {
            compress(
                at,
                w,
                memory.state_ref(r.seq),
                r.pos / ratio,
                (rope, eps),
                s,
            );
            if let Some(rotation) = rotation {
                hadamard::rotate_fast(&mut s.row[..width], rotation);
            }
            memory.write(at.store, r.seq, at.layer, r.pos, &s.row[..width], &[]);
        }
    }
    Ok(())
}

/// Compressed row `b` into `s.row[..width]`: the block's ring entries (in `state`) pooled,
/// normed and rotated.
fn compress(
    at: CompressorStore,
    w: &CompressorWeights,
    state: &[f32],
    b: usize,
    (rope, eps): (&Rope, f32),
    s: &mut CompressorScratch,
) {
    let (width, ratio, overlap) = (at.width, at.kind.ratio(), at.kind.overlap());
    let n_entries = overlap * ratio;
    // Entries channel-major, as llama.cpp lays them out for its softmax over tokens.
    let entries_kv = sized(&mut s.entries_kv, width * n_entries);
    let entries_score = sized(&mut s.entries_score, width * n_entries);
    let first = b * ratio;
    // (entry index, source position, which half of its projections)
    let mut put = |entry: usize, pos: Option<usize>, half: usize| match pos {
        Some(pos) => {
            let e = at.entry(state, pos);
            let kv = &e[half * width..][..width];
            let score = &e[overlap * width + half * width..][..width];
            for c in 0..width {
                entries_kv[c * n_entries + entry] = kv[c];
                entries_score[c * n_entries + entry] = score[c];
            }
        }
        None => {
            for c in 0..width {
                entries_kv[c * n_entries + entry] = 0.0;
                entries_score[c * n_entries + entry] = f32::NEG_INFINITY;
            }
        }
    };
    if overlap == 2 {
        for i in 0..ratio {
            put(i, b.checked_sub(1).map(|p| p * ratio + i), 0);
        }
        for i in 0..ratio {
            put(ratio + i, Some(first + i), 1);
        }
    } else {
        for i in 0..ratio {
            put(i, Some(first + i), 0);
        }
    }
    let weights = sized(&mut s.weights, n_entries);
    let row = sized(&mut s.row, width);
    for c in 0..width {
        softmax(&entries_score[c * n_entries..][..n_entries], weights);
        // ggml multiplies in f32 and sums the products in f64.
        let sum: f64 = entries_kv[c * n_entries..][..n_entries]
            .iter()
            .zip(weights.iter())
            .map(|(&v, &p)| (v * p) as f64)
            .sum();
        row[c] = sum as f32;
    }
    rms_norm_in_place(row, &w.norm, eps);
    rope.angles(first, &mut s.angles);
    rope.apply_tail(row, width, &s.angles);
}
