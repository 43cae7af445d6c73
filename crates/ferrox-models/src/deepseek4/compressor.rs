//! Compressors: one key row every `ratio` positions, pooled from the tokens of its block.
//!
//! Every token projects its normed input into key-value values and gate scores (plus a
//! learned score for its place in the block). They are kept in the sequence memory, one row
//! per position and compressed layer laid out `[compressed row (w) | kv (overlap·w) | score
//! (overlap·w)]`, so the "compressor ring" of llama.cpp is simply the last block's rows: it is
//! paged, shared by prefix and rolled back with everything else. When a token completes block
//! `b` (its position is `b·ratio + ratio − 1`), the block is pooled per channel with a softmax
//! over the scores, RMS-normed, rotated at position `b·ratio` and written into that token's
//! row: it becomes visible to that token and every later one, as in llama.cpp
//! (`n_visible = (pos + 1) / ratio`).
//!
//! The overlapping compressor (ratio 4) pools 8 tokens: the previous block's with the first
//! half of their projections, then this block's with the second half; block 0 has no previous
//! block (those entries count as zero values with −inf scores).

use ferrox_core::{KvRows, StepMemory};
use ferrox_gguf::Gguf;
use ferrox_moe::numerics::softmax;

use super::config::Compression;
use super::weights::CompressorWeights;
use crate::engine::EngineError;
use crate::layers::linear::linear;
use crate::layers::norm::rms_norm_in_place;
use crate::layers::rope::Rope;
use crate::step::{sized, Row};

/// Where one layer's compressor keeps its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompressorStore {
    pub store: usize,
    pub layer: usize,
    /// Width of a compressed row.
    pub width: usize,
    pub kind: Compression,
}

impl CompressorStore {
    /// Values per position: the compressed row, then the projections and the scores.
    pub fn row_width(&self) -> usize {
        self.width * (1 + 2 * self.kind.overlap())
    }

    /// Compressed rows visible to a token at `pos`.
    pub fn visible(&self, pos: usize) -> usize {
        (pos + 1) / self.kind.ratio()
    }

    /// The position whose row holds compressed row `b`.
    pub fn position_of(&self, b: usize) -> usize {
        b * self.kind.ratio() + self.kind.ratio() - 1
    }
}

/// Copies the first `out.len()` values of sequence `seq`'s row at `pos` in `store` into `out`.
pub fn read_row(
    memory: &StepMemory<'_>,
    store: usize,
    seq: usize,
    layer: usize,
    pos: usize,
    out: &mut [f32],
) {
    let len = out.len();
    memory.for_each_run(store, seq, layer, pos, pos + 1, |keys, _, _| match keys {
        KvRows::F32(k) => out.copy_from_slice(&k[..len]),
        KvRows::F16(k) => out
            .iter_mut()
            .zip(&k[..len])
            .for_each(|(o, v)| *o = v.to_f32()),
    });
}

/// Buffers of the compressors, reused across layers and steps.
#[derive(Default)]
pub struct CompressorScratch {
    kv: Vec<f32>,
    score: Vec<f32>,
    row: Vec<f32>,
    block: Vec<f32>,
    entries_kv: Vec<f32>,
    entries_score: Vec<f32>,
    weights: Vec<f32>,
    angles: Vec<(f32, f32)>,
    xq: Vec<u8>,
}

/// Projects the micro-batch's normed inputs `xn` into the compressor's rows, written to the
/// memory in row order, and compresses each block a row completes.
#[allow(clippy::too_many_arguments)]
pub fn record(
    at: CompressorStore,
    w: &CompressorWeights,
    gguf: &Gguf,
    rows: &[Row],
    xn: &[f32],
    memory: &mut StepMemory<'_>,
    (rope, eps): (&Rope, f32),
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
    sized(&mut s.block, at.row_width());
    sized(&mut s.row, at.row_width());
    // Taken out of the scratch while the block compressions use the rest of it.
    let (mut kv_buf, mut score_buf) = (std::mem::take(&mut s.kv), std::mem::take(&mut s.score));
    let kv = sized(&mut kv_buf, n * projected);
    linear(&w.kv.view(gguf)?, xn, n, kv, &mut s.xq)?;
    let score = sized(&mut score_buf, n * projected);
    linear(&w.gate.view(gguf)?, xn, n, score, &mut s.xq)?;
    for (t, r) in rows.iter().enumerate() {
        let ape = &w.ape[(r.pos % ratio) * projected..][..projected];
        let row = sized(&mut s.row, at.row_width());
        row[..width].fill(0.0);
        row[width..width + projected].copy_from_slice(&kv[t * projected..][..projected]);
        let scores = &mut row[width + projected..];
        scores.copy_from_slice(&score[t * projected..][..projected]);
        scores.iter_mut().zip(ape).for_each(|(s, a)| *s += a);
        memory.write(at.store, r.seq, at.layer, r.pos, row, &[]);
        if (r.pos + 1) % ratio == 0 {
            compress(at, w, memory, r.seq, r.pos / ratio, (rope, eps), s);
            memory.write(
                at.store,
                r.seq,
                at.layer,
                r.pos,
                &s.row[..at.row_width()],
                &[],
            );
        }
    }
    (s.kv, s.score) = (kv_buf, score_buf);
    Ok(())
}

/// Compressed row `b` of sequence `seq` into `s.row[..width]` (the rest of `s.row` keeps the
/// completing token's own row): the block's rows read back from the memory, pooled, normed
/// and rotated.
fn compress(
    at: CompressorStore,
    w: &CompressorWeights,
    memory: &StepMemory<'_>,
    seq: usize,
    b: usize,
    (rope, eps): (&Rope, f32),
    s: &mut CompressorScratch,
) {
    let (width, ratio, overlap) = (at.width, at.kind.ratio(), at.kind.overlap());
    let row_width = at.row_width();
    let n_entries = overlap * ratio;
    // Entries channel-major, as llama.cpp lays them out for its softmax over tokens.
    let entries_kv = sized(&mut s.entries_kv, width * n_entries);
    let entries_score = sized(&mut s.entries_score, width * n_entries);
    let block = sized(&mut s.block, row_width);
    let first = b * ratio;
    // (entry index, source position, which half of its projections)
    let mut put = |entry: usize, pos: Option<usize>, half: usize| match pos {
        Some(pos) => {
            read_row(memory, at.store, seq, at.layer, pos, block);
            let kv = &block[width + half * width..][..width];
            let score = &block[width + overlap * width + half * width..][..width];
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
    let row = sized(&mut s.row, row_width);
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
    let comp = &mut row[..width];
    rms_norm_in_place(comp, &w.norm, eps);
    rope.angles(first, &mut s.angles);
    rope.apply_tail(comp, width, &s.angles);
}
