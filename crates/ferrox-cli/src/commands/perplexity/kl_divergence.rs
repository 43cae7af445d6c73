//! llama-perplexity's KL-divergence mode, file-compatible with it: a *base* run stores every
//! scored position's log-probabilities (`--kl-divergence-base FILE`), a later run of another
//! model or engine on the same tokens compares its own against them (`--kl-divergence`).
//!
//! The file: the magic `_logits_`, `n_ctx` (u32), `n_vocab` (i32), `n_chunk` (i32), the
//! `n_chunk · n_ctx` evaluated tokens (i32), then per chunk and scored position one record
//! of [`record_words`] u16: the f32 scale and the f32 smallest log-probability (as four
//! words), then every token's log-probability quantized to 16 bits over the 16 nats below
//! the largest (little-endian throughout, as llama.cpp writes it on the machines it runs
//! on). The statistics and their printed form are llama-perplexity's.

use std::fmt::Write as _;
use std::io::{Read, Write};

use rayon::prelude::*;

/// The file's first bytes.
pub const MAGIC: &[u8; 8] = b"_logits_";
/// Bytes before the tokens: the magic, `n_ctx`, `n_vocab`, `n_chunk`.
const HEADER_BYTES: u64 = 8 + 3 * 4;
/// Log-probabilities further than this below the largest are stored as the floor.
const FLOOR_NATS: f32 = 16.0;

/// u16 words of one position's record: four for the two f32, the vocabulary padded to even.
pub fn record_words(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// Positions scored per chunk: the second half, less the last (it predicts nothing).
pub fn scored_per_chunk(n_ctx: usize) -> usize {
    n_ctx - 1 - n_ctx / 2
}

/// What a base file holds before its records.
#[derive(Debug)]
pub struct Header {
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_chunk: usize,
    /// The chunks' tokens as evaluated (the first of each chunk before it becomes BOS).
    pub tokens: Vec<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum LogitsFileError {
    #[error("does not look like a file of log-probabilities (no `_logits_` magic)")]
    Magic,
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl Header {
    pub fn write(&self, out: &mut impl Write) -> std::io::Result<()> {
        out.write_all(MAGIC)?;
        for v in [self.n_ctx, self.n_vocab, self.n_chunk] {
            out.write_all(&(v as u32).to_le_bytes())?;
        }
        let mut bytes = Vec::with_capacity(self.tokens.len() * 4);
        for t in &self.tokens {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        out.write_all(&bytes)
    }

    /// Reads and checks a header: the counts must be consistent with `file_len`, so that
    /// nothing is allocated for a file that cannot hold what it claims.
    pub fn read(input: &mut impl Read, file_len: u64) -> Result<Header, LogitsFileError> {
        let mut magic = [0u8; 8];
        input
            .read_exact(&mut magic)
            .map_err(|_| LogitsFileError::Magic)?;
        if &magic != MAGIC {
            return Err(LogitsFileError::Magic);
        }
        let mut word = || -> Result<i64, LogitsFileError> {
            let mut b = [0u8; 4];
            input.read_exact(&mut b)?;
            Ok(i64::from(i32::from_le_bytes(b)))
        };
        let (n_ctx, n_vocab, n_chunk) = (word()?, word()?, word()?);
        let invalid = |what: String| LogitsFileError::Invalid(what);
        if !(4..=1 << 24).contains(&n_ctx) {
            return Err(invalid(format!("context size {n_ctx} out of range")));
        }
        if !(1..=1 << 24).contains(&n_vocab) {
            return Err(invalid(format!("vocabulary size {n_vocab} out of range")));
        }
        if n_chunk < 1 {
            return Err(invalid(format!("{n_chunk} chunks")));
        }
        let (n_ctx, n_vocab, n_chunk) = (n_ctx as u64, n_vocab as u64, n_chunk as u64);
        let record_bytes = 2 * record_words(n_vocab as usize) as u64;
        let per_chunk = 4 * n_ctx + scored_per_chunk(n_ctx as usize) as u64 * record_bytes;
        let expected = n_chunk
            .checked_mul(per_chunk)
            .and_then(|b| b.checked_add(HEADER_BYTES));
        if expected != Some(file_len) {
            return Err(invalid(format!(
                "{file_len} bytes, but {n_chunk} chunks of {n_ctx} tokens over a vocabulary of \
                 {n_vocab} need {}",
                expected.map_or("more".to_string(), |e| e.to_string())
            )));
        }
        let mut bytes = vec![0u8; (n_chunk * n_ctx * 4) as usize];
        input.read_exact(&mut bytes)?;
        let tokens: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        if let Some(bad) = tokens.iter().find(|&&t| u64::from(t) >= n_vocab) {
            return Err(invalid(format!(
                "token {bad} is outside the vocabulary of {n_vocab}"
            )));
        }
        Ok(Header {
            n_ctx: n_ctx as usize,
            n_vocab: n_vocab as usize,
            n_chunk: n_chunk as usize,
            tokens,
        })
    }
}

/// Rounds to the nearest integer, halves to even, as llama-perplexity's `nearest_int`.
fn nearest_int(v: f32) -> i32 {
    ((v + 12_582_912.0).to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// The largest logit and Σ exp(logit − largest) (summed in f64, terms in f32, as
/// llama-perplexity), with the first index of the largest.
fn softmax_terms(logits: &[f32]) -> (f32, usize, f64) {
    let mut max = logits[0];
    let mut arg = 0;
    for (i, &l) in logits.iter().enumerate().skip(1) {
        if l > max {
            max = l;
            arg = i;
        }
    }
    let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    (max, arg, sum)
}

/// Stores one position's log-probabilities into `record` (its [`record_words`]) and
/// returns the negative log-likelihood of `token`.
pub fn encode_record(logits: &[f32], token: usize, record: &mut [u16]) -> f64 {
    let (max, _, sum) = softmax_terms(logits);
    let min = logits.iter().cloned().fold(logits[0], f32::min);
    let min = min.max(max - FLOOR_NATS);
    let log_sum_exp = sum.ln() as f32;
    let min_log_prob = min - max - log_sum_exp;
    let scale = (max - min) / 65535.0;
    let (head, codes) = record.split_at_mut(4);
    for (pair, v) in head.chunks_exact_mut(2).zip([scale, min_log_prob]) {
        let bits = v.to_bits();
        pair[0] = bits as u16;
        pair[1] = (bits >> 16) as u16;
    }
    codes.fill(0);
    if scale != 0.0 {
        let inv = 1.0 / scale;
        for (c, &l) in codes.iter_mut().zip(logits) {
            *c = if l > min {
                nearest_int(inv * (l - min)) as u16
            } else {
                0
            };
        }
    }
    f64::from(max + log_sum_exp - logits[token])
}

/// One scored position compared against its base record.
#[derive(Clone, Copy, Debug, Default)]
pub struct Comparison {
    pub nll: f32,
    pub nll_base: f32,
    pub kld: f64,
    /// p(token) − p_base(token).
    pub p_diff: f32,
    pub same_top: bool,
}

/// Compares `logits` against a base `record` for the observed `token`.
pub fn compare(logits: &[f32], record: &[u16], token: usize) -> Comparison {
    let (max, arg, sum) = softmax_terms(logits);
    let log_sum_exp = sum.ln() as f32;
    let word = |i: usize| f32::from_bits(u32::from(record[i]) | (u32::from(record[i + 1]) << 16));
    let (scale, min_log_prob) = (word(0), word(2));
    let codes = &record[4..];
    let nll = max + log_sum_exp - logits[token];
    let nll_base = -(scale * f32::from(codes[token]) + min_log_prob);
    let log_norm = max + log_sum_exp;
    let mut kld = 0.0f64;
    let mut arg_base = 0;
    let mut max_base = 0.0f32;
    for (i, (&c, &l)) in codes.iter().zip(logits).enumerate() {
        let log_p_base = scale * f32::from(c) + min_log_prob;
        if i == 0 || log_p_base > max_base {
            max_base = log_p_base;
            arg_base = i;
        }
        if log_p_base > -FLOOR_NATS {
            kld += f64::from(log_p_base.exp() * (log_p_base - l + log_norm));
        }
    }
    Comparison {
        nll,
        nll_base,
        kld,
        p_diff: (-nll).exp() - (-nll_base).exp(),
        same_top: arg == arg_base,
    }
}

/// Compares every scored position of a chunk (`logits`: one row of `n_vocab` per position,
/// `records`: their base records, `targets`: the observed next tokens), in parallel.
pub fn compare_chunk(
    logits: &[f32],
    records: &[u16],
    targets: &[u32],
    n_vocab: usize,
) -> Vec<Comparison> {
    let words = record_words(n_vocab);
    targets
        .par_iter()
        .enumerate()
        .map(|(j, &t)| {
            compare(
                &logits[j * n_vocab..(j + 1) * n_vocab],
                &records[j * words..(j + 1) * words],
                t as usize,
            )
        })
        .collect()
}

/// Running sums over the compared positions, as llama-perplexity keeps them.
#[derive(Default)]
pub struct KlStats {
    sum_nll: f64,
    sum_nll2: f64,
    sum_nll_base: f64,
    sum_nll_base2: f64,
    sum_nll_nll_base: f64,
    sum_kld: f64,
    sum_kld2: f64,
    sum_p_diff: f64,
    sum_p_diff2: f64,
    sum_p_diff4: f64,
    n_same_top: usize,
    count: usize,
    kld_values: Vec<f32>,
    p_diff_values: Vec<f32>,
}

/// Mean and its uncertainty, as llama-perplexity computes them.
fn mean_and_uncertainty(sum: f64, sum2: f64, count: usize) -> (f64, f64) {
    if count < 1 {
        return (0.0, 0.0);
    }
    let f = sum / count as f64;
    let df = sum2 / count as f64 - f * f;
    let df = if df > 0.0 && count > 10 {
        (df / (count - 1) as f64).sqrt()
    } else {
        0.0
    };
    (f, df)
}

fn covariance(a: f64, b: f64, ab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let n = count as f64;
    (ab / n - (a / n) * (b / n)) / (n - 1.0)
}

/// The value at `fraction` of sorted `values`, interpolated (llama-perplexity's percentile).
fn percentile(values: &[f32], fraction: f32) -> f32 {
    if fraction <= 0.0 {
        return values[0];
    }
    if fraction >= 1.0 {
        return values[values.len() - 1];
    }
    let p = fraction * (values.len() - 1) as f32;
    let ip = p as usize;
    let p = p - ip as f32;
    (1.0 - p) * values[ip] + p * values[(ip + 1).min(values.len() - 1)]
}

fn median(values: &[f32]) -> f32 {
    let n = values.len();
    if n.is_multiple_of(2) {
        0.5 * (values[n / 2] + values[n / 2 - 1])
    } else {
        values[n / 2]
    }
}

impl KlStats {
    pub fn add(&mut self, c: &Comparison) {
        let (nll, nll_base) = (f64::from(c.nll), f64::from(c.nll_base));
        self.sum_nll += nll;
        self.sum_nll2 += nll * nll;
        self.sum_nll_base += nll_base;
        self.sum_nll_base2 += nll_base * nll_base;
        self.sum_nll_nll_base += nll * nll_base;
        self.sum_kld += c.kld;
        self.sum_kld2 += c.kld * c.kld;
        let p_diff = f64::from(c.p_diff);
        self.sum_p_diff += p_diff;
        self.sum_p_diff2 += p_diff * p_diff;
        self.sum_p_diff4 += p_diff.powi(4);
        self.n_same_top += usize::from(c.same_top);
        self.count += 1;
        self.kld_values.push(c.kld as f32);
        self.p_diff_values.push(c.p_diff);
    }

    /// Mean KL divergence and its uncertainty.
    pub fn mean_kld(&self) -> (f64, f64) {
        mean_and_uncertainty(self.sum_kld, self.sum_kld2, self.count)
    }

    /// The share of positions whose most likely token is the base's.
    pub fn same_top(&self) -> f64 {
        self.n_same_top as f64 / self.count.max(1) as f64
    }

    /// The column header of the per-chunk lines.
    pub fn table_header() -> &'static str {
        "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p"
    }

    /// The per-chunk line after chunk `chunk` (1-based): running figures.
    pub fn chunk_line(&self, chunk: usize) -> String {
        let log_ppl = mean_and_uncertainty(self.sum_nll, self.sum_nll2, self.count);
        let ppl = log_ppl.0.exp();
        let log_ppl_base = mean_and_uncertainty(self.sum_nll_base, self.sum_nll_base2, self.count);
        let cov = covariance(
            self.sum_nll,
            self.sum_nll_base,
            self.sum_nll_nll_base,
            self.count,
        );
        let ratio = log_ppl.0 - log_ppl_base.0;
        let ratio_unc =
            (log_ppl.1 * log_ppl.1 + log_ppl_base.1 * log_ppl_base.1 - 2.0 * cov).sqrt();
        let kld = self.mean_kld();
        let (rms, rms_unc) = self.p_diff_rms();
        let (top, top_unc) = self.same_top_with_uncertainty();
        format!(
            "{chunk:4}    {:9.4} ± {:9.4}    {ratio:10.5} ± {ratio_unc:10.5}    {:10.5} ± {:10.5}    {:6.3} ± {:6.3} %    {:6.3} ± {:6.3} %",
            ppl,
            ppl * log_ppl.1,
            kld.0,
            kld.1,
            100.0 * rms,
            100.0 * rms_unc,
            100.0 * top,
            100.0 * top_unc
        )
    }

    fn p_diff_rms(&self) -> (f64, f64) {
        let mse = mean_and_uncertainty(self.sum_p_diff2, self.sum_p_diff4, self.count);
        let rms = mse.0.sqrt();
        (rms, 0.5 / rms * mse.1)
    }

    fn same_top_with_uncertainty(&self) -> (f64, f64) {
        let p = self.same_top();
        (p, (p * (1.0 - p) / (self.count as f64 - 1.0)).sqrt())
    }

    /// llama-perplexity's three summary blocks (none below 100 positions, as there).
    pub fn summary(&mut self) -> String {
        let mut s = String::new();
        if self.count < 100 {
            return s;
        }
        self.kld_values.sort_by(f32::total_cmp);
        self.p_diff_values.sort_by(f32::total_cmp);
        let log_ppl = mean_and_uncertainty(self.sum_nll, self.sum_nll2, self.count);
        let ppl = log_ppl.0.exp();
        let ppl_unc = ppl * log_ppl.1;
        let log_base = mean_and_uncertainty(self.sum_nll_base, self.sum_nll_base2, self.count);
        let base = log_base.0.exp();
        let base_unc = base * log_base.1;
        let cov = covariance(
            self.sum_nll,
            self.sum_nll_base,
            self.sum_nll_nll_base,
            self.count,
        );
        let cor = cov / (log_ppl.1 * log_base.1);
        let ratio = log_ppl.0 - log_base.0;
        let ratio_unc = (log_ppl.1 * log_ppl.1 + log_base.1 * log_base.1 - 2.0 * cov).sqrt();
        let ppl_ratio = ratio.exp();
        let ppl_cov = ppl * base * cov;
        let diff_unc = (ppl_unc * ppl_unc + base_unc * base_unc - 2.0 * ppl_cov).sqrt();
        let _ = writeln!(s, "====== Perplexity statistics ======");
        let _ = writeln!(
            s,
            "Mean PPL(Q)                   : {ppl:10.6} ± {ppl_unc:10.6}"
        );
        let _ = writeln!(
            s,
            "Mean PPL(base)                : {base:10.6} ± {base_unc:10.6}"
        );
        let _ = writeln!(s, "Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2}%", 100.0 * cor);
        let _ = writeln!(
            s,
            "Mean ln(PPL(Q)/PPL(base))     : {ratio:10.6} ± {ratio_unc:10.6}"
        );
        let _ = writeln!(
            s,
            "Mean PPL(Q)/PPL(base)         : {ppl_ratio:10.6} ± {:10.6}",
            ppl_ratio * ratio_unc
        );
        let _ = writeln!(
            s,
            "Mean PPL(Q)-PPL(base)         : {:10.6} ± {diff_unc:10.6}",
            ppl - base
        );
        let _ = writeln!(s);
        let _ = writeln!(s, "====== KL divergence statistics ======");
        let (kld, kld_unc) = self.mean_kld();
        let k = &self.kld_values;
        let _ = writeln!(s, "Mean    KLD: {kld:10.6} ± {kld_unc:10.6}");
        let _ = writeln!(s, "Maximum KLD: {:10.6}", k[k.len() - 1]);
        for (label, f) in [
            ("99.9", 0.999),
            ("99.0", 0.990),
            ("95.0", 0.950),
            ("90.0", 0.900),
        ] {
            let _ = writeln!(s, "{label}%   KLD: {:10.6}", percentile(k, f));
        }
        let _ = writeln!(s, "Median  KLD: {:10.6}", median(k));
        for (label, f) in [
            ("10.0", 0.100),
            (" 5.0", 0.050),
            (" 1.0", 0.010),
            (" 0.1", 0.001),
        ] {
            let _ = writeln!(s, "{label}%   KLD: {:10.6}", percentile(k, f));
        }
        let _ = writeln!(s, "Minimum KLD: {:10.6}", k[0]);
        let _ = writeln!(s);
        let _ = writeln!(s, "====== Token probability statistics ======");
        let (dp, dp_unc) = mean_and_uncertainty(self.sum_p_diff, self.sum_p_diff2, self.count);
        let p = &self.p_diff_values;
        let pct = |v: f32| 100.0 * f64::from(v);
        let _ = writeln!(
            s,
            "Mean    Δp: {:6.3} ± {:5.3} %",
            100.0 * dp,
            100.0 * dp_unc
        );
        let _ = writeln!(s, "Maximum Δp: {:6.3}%", pct(p[p.len() - 1]));
        for (label, f) in [
            ("99.9", 0.999),
            ("99.0", 0.990),
            ("95.0", 0.950),
            ("90.0", 0.900),
            ("75.0", 0.750),
        ] {
            let _ = writeln!(s, "{label}%   Δp: {:6.3}%", pct(percentile(p, f)));
        }
        let _ = writeln!(s, "Median  Δp: {:6.3}%", pct(median(p)));
        for (label, f) in [
            ("25.0", 0.250),
            ("10.0", 0.100),
            (" 5.0", 0.050),
            (" 1.0", 0.010),
            (" 0.1", 0.001),
        ] {
            let _ = writeln!(s, "{label}%   Δp: {:6.3}%", pct(percentile(p, f)));
        }
        let _ = writeln!(s, "Minimum Δp: {:6.3}%", pct(p[0]));
        let (rms, rms_unc) = self.p_diff_rms();
        let _ = writeln!(
            s,
            "RMS Δp    : {:6.3} ± {:5.3} %",
            100.0 * rms,
            100.0 * rms_unc
        );
        let (top, top_unc) = self.same_top_with_uncertainty();
        let _ = writeln!(
            s,
            "Same top p: {:6.3} ± {:5.3} %",
            100.0 * top,
            100.0 * top_unc
        );
        s
    }
}

/// Reads one chunk's records (`scored · record_words(n_vocab)` words).
pub fn read_records(input: &mut impl Read, out: &mut [u16]) -> std::io::Result<()> {
    let mut bytes = vec![0u8; out.len() * 2];
    input.read_exact(&mut bytes)?;
    for (w, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *w = u16::from_le_bytes([b[0], b[1]]);
    }
    Ok(())
}

/// Writes one chunk's records.
pub fn write_records(out: &mut impl Write, records: &[u16]) -> std::io::Result<()> {
    let mut bytes = Vec::with_capacity(records.len() * 2);
    for w in records {
        bytes.extend_from_slice(&w.to_le_bytes());
    }
    out.write_all(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 50.0 - 10.0)
            .collect()
    }

    #[test]
    fn nearest_int_rounds_halves_to_even() {
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(3.5), 4);
        assert_eq!(nearest_int(65534.6), 65535);
        assert_eq!(nearest_int(0.49), 0);
    }

    #[test]
    fn a_record_compared_with_its_own_logits_has_no_divergence() {
        let n = 301;
        let l = logits(n, 7);
        let mut record = vec![0u16; record_words(n)];
        let nll = encode_record(&l, 5, &mut record);
        let c = compare(&l, &record, 5);
        assert!((f64::from(c.nll) - nll).abs() < 1e-5);
        // Quantization over 16 nats in 65535 steps: the base's log-probabilities are within
        // half a step.
        assert!((c.nll - c.nll_base).abs() < 2e-4, "{c:?}");
        // Rounding to 16 bits leaves a divergence of a few millionths.
        assert!(c.kld.abs() < 1e-5, "{c:?}");
        assert!(c.same_top);
    }

    #[test]
    fn a_different_distribution_diverges() {
        let n = 64;
        let base = logits(n, 1);
        let other: Vec<f32> = base.iter().rev().copied().collect();
        let mut record = vec![0u16; record_words(n)];
        encode_record(&base, 3, &mut record);
        let c = compare(&other, &record, 3);
        assert!(c.kld > 0.1, "{c:?}");
    }

    #[test]
    fn headers_round_trip_and_inconsistent_sizes_are_refused() {
        let header = Header {
            n_ctx: 8,
            n_vocab: 5,
            n_chunk: 2,
            tokens: (0..16).map(|i| i % 5).collect(),
        };
        let mut bytes = Vec::new();
        header.write(&mut bytes).unwrap();
        let records = 2 * scored_per_chunk(8) * record_words(5);
        let len = (bytes.len() + 2 * records) as u64;
        let back = Header::read(&mut bytes.as_slice(), len).unwrap();
        assert_eq!((back.n_ctx, back.n_vocab, back.n_chunk), (8, 5, 2));
        assert_eq!(back.tokens, header.tokens);
        assert!(matches!(
            Header::read(&mut bytes.as_slice(), len + 1),
            Err(LogitsFileError::Invalid(_))
        ));
        assert!(matches!(
            Header::read(&mut &b"_logitz_"[..], 8),
            Err(LogitsFileError::Magic)
        ));
        // A hostile chunk count is refused before anything is allocated.
        let mut hostile = bytes.clone();
        hostile[16..20].copy_from_slice(&i32::MAX.to_le_bytes());
        assert!(Header::read(&mut hostile.as_slice(), len).is_err());
    }
}
