//! `ferrox perplexity`: llama-perplexity's measurement. The text is tokenized once (with
//! BOS), cut into non-overlapping chunks of `ctx` tokens whose first token becomes BOS,
//! and only the second half of each chunk is scored. `--kl-divergence-base FILE` stores the
//! scored log-probabilities as llama-perplexity does; `--kl-divergence` compares against such
//! a file (see [`kl_divergence`]).

pub mod kl_divergence;

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::PathBuf;

use anyhow::Context;
use ferrox_generate::sampling::logprob_of;
use ferrox_models::EngineExt;
use ferrox_models::{Engine, LogitsFor};
use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;

use super::model::{self, ModelArgs};
use super::InputError;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to score (not needed with `--kl-divergence`: the base file holds the tokens).
    #[arg(short = 'f', long = "file", required_unless_present = "kl_divergence")]
    pub file: Option<PathBuf>,
    /// Batch size (accepted for llama-perplexity compatibility; chunks run one at a time).
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048)]
    pub batch: usize,
    /// Score at most this many chunks (-1: all).
    #[arg(long = "chunks", default_value_t = -1, allow_negative_numbers = true)]
    pub chunks: i64,
    /// Write every scored position's log-probabilities to FILE (llama-perplexity's format);
    /// with `--kl-divergence`, read them from FILE instead.
    #[arg(
        long = "kl-divergence-base",
        alias = "save-all-logits",
        value_name = "FILE"
    )]
    pub kl_divergence_base: Option<PathBuf>,
    /// Compare against the log-probabilities of `--kl-divergence-base`: KL divergence,
    /// perplexity ratio, token-probability differences, as llama-perplexity prints them.
    #[arg(long = "kl-divergence", requires = "kl_divergence_base")]
    pub kl_divergence: bool,
}

/// Running negative log-likelihood statistics.
#[derive(Default)]
pub struct NllStats {
    sum: f64,
    sum_sq: f64,
    count: usize,
}

impl NllStats {
    pub fn add(&mut self, nll: f64) {
        self.sum += nll;
        self.sum_sq += nll * nll;
        self.count += 1;
    }

    pub fn ppl(&self) -> f64 {
        (self.sum / self.count.max(1) as f64).exp()
    }

    /// PPL's uncertainty as llama-perplexity reports it: ppl * sqrt(var(nll) / (n - 1)).
    pub fn ppl_error(&self) -> Option<f64> {
        let n = self.count as f64;
        let mean = self.sum / n;
        let var = self.sum_sq / n - mean * mean;
        (var >= 0.0 && self.count > 1).then(|| self.ppl() * (var / (n - 1.0)).sqrt())
    }
}

pub fn run(mut args: Args) -> anyhow::Result<()> {
    if args.kl_divergence {
        return compare_with_base(args);
    }
    // llama-perplexity's context default is 512, not the model's.
    let n_ctx = *args.model.ctx_size.get_or_insert(512);
    if n_ctx < 4 {
        return Err(InputError(format!("--ctx-size {n_ctx} is too small to score")).into());
    }
    let file = args.file.clone().expect("clap requires --file here");
    let bytes = std::fs::read(&file).with_context(|| format!("{}", file.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| InputError(format!("{}: not valid UTF-8 ({e})", file.display())))?;
    let loaded = model::load_generator(&args.model)?;
    let (decoder, tokenizer) = (&loaded.engine, &loaded.tokenizer);
    let tokens = tokenizer.encode(&text, true, false);
    let available = tokens.len() / n_ctx;
    if available < 1 || tokens.len() < 2 * n_ctx {
        return Err(InputError(format!(
            "{} tokens: need at least {} (2 x ctx) to score",
            tokens.len(),
            2 * n_ctx
        ))
        .into());
    }
    let n_chunk = match usize::try_from(args.chunks) {
        Ok(limit) => available.min(limit),
        Err(_) => available,
    };
    let bos = tokenizer
        .vocab()
        .add_bos()
        .then(|| tokenizer.vocab().bos())
        .flatten();
    let first = n_ctx / 2;
    eprintln!(
        "perplexity: {} tokens, {n_chunk} chunks, n_ctx={n_ctx}, {} threads",
        tokens.len(),
        decoder.threads()
    );
    let bar = chunk_bar(n_chunk);
    let n_vocab = decoder.vocab_size();
    let mut base = match &args.kl_divergence_base {
        Some(path) => {
            let mut out =
                BufWriter::new(File::create(path).with_context(|| format!("{}", path.display()))?);
            kl_divergence::Header {
                n_ctx,
                n_vocab,
                n_chunk,
                tokens: tokens[..n_chunk * n_ctx].to_vec(),
            }
            .write(&mut out)
            .with_context(|| format!("{}", path.display()))?;
            let words =
                kl_divergence::scored_per_chunk(n_ctx) * kl_divergence::record_words(n_vocab);
            Some((out, vec![0u16; words]))
        }
        None => None,
    };
    let mut stats = NllStats::default();
    let mut running = String::new();
    let mut state = decoder.new_state()?;
    let mut chunk_tokens = Vec::with_capacity(n_ctx);
    for i in 0..n_chunk {
        let chunk = &tokens[i * n_ctx..(i + 1) * n_ctx];
        let logits = score_chunk(decoder, &mut state, &mut chunk_tokens, chunk, bos, first)?;
        // Logits at chunk index `first + j` predict the original token at `first + j + 1`.
        let targets = &chunk[first + 1..];
        match &mut base {
            Some((out, records)) => {
                let words = kl_divergence::record_words(n_vocab);
                let nlls: Vec<f64> = records
                    .par_chunks_mut(words)
                    .zip(logits.par_chunks(n_vocab))
                    .zip(targets.par_iter())
                    .map(|((record, row), &t)| {
                        kl_divergence::encode_record(row, t as usize, record)
                    })
                    .collect();
                nlls.into_iter().for_each(|nll| stats.add(nll));
                kl_divergence::write_records(out, records).context("writing the base file")?;
            }
            None => {
                for (row, &t) in logits.chunks_exact(n_vocab).zip(targets) {
                    stats.add(-f64::from(logprob_of(row, t)));
                }
            }
        }
        running.push_str(&format!("[{}]{:.4},", i + 1, stats.ppl()));
        bar.set_message(format!("PPL {:.4}", stats.ppl()));
        bar.inc(1);
    }
    if let Some((mut out, _)) = base {
        out.flush().context("writing the base file")?;
    }
    bar.finish_and_clear();
    let mut out = std::io::stdout().lock();
    writeln!(out, "{running}")?;
    match stats.ppl_error() {
        Some(err) => writeln!(
            out,
            "Final estimate: PPL = {:.4} +/- {:.5}",
            stats.ppl(),
            err
        )?,
        None => writeln!(out, "Final estimate: PPL = {:.4} +/- nan", stats.ppl())?,
    }
    Ok(())
}

/// A progress bar over chunks (hidden when stderr is not a terminal).
fn chunk_bar(n_chunk: usize) -> ProgressBar {
    let bar = ProgressBar::new(n_chunk as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:40} {pos}/{len} chunks, {elapsed} elapsed, eta {eta} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// Evaluates one chunk from an empty state, its first token replaced by BOS where the
/// model adds one; returns the logits of positions `first..`.
fn score_chunk<'a>(
    engine: &'a ferrox_models::AnyEngine,
    state: &'a mut ferrox_models::State,
    buffer: &mut Vec<u32>,
    chunk: &[u32],
    bos: Option<u32>,
    first: usize,
) -> anyhow::Result<&'a [f32]> {
    buffer.clear();
    buffer.extend_from_slice(chunk);
    if let Some(b) = bos {
        buffer[0] = b;
    }
    state.reset();
    engine
        .forward_batch(buffer, 0, state, LogitsFor::From(first))
        .context("evaluation failed")
}

/// `--kl-divergence`: evaluates the base file's tokens and compares with its records.
fn compare_with_base(mut args: Args) -> anyhow::Result<()> {
    let path = args
        .kl_divergence_base
        .clone()
        .expect("clap requires --kl-divergence-base");
    let file = File::open(&path).with_context(|| format!("{}", path.display()))?;
    let len = file.metadata()?.len();
    let mut input = BufReader::new(file);
    let header = kl_divergence::Header::read(&mut input, len)
        .map_err(|e| InputError(format!("{}: {e}", path.display())))?;
    let n_ctx = header.n_ctx;
    // The chunks are the base's: its context size, not the command line's.
    args.model.ctx_size = Some(args.model.ctx_size.unwrap_or(0).max(n_ctx));
    let loaded = model::load_generator(&args.model)?;
    let (engine, tokenizer) = (&loaded.engine, &loaded.tokenizer);
    let n_vocab = engine.vocab_size();
    if header.n_vocab != n_vocab {
        return Err(InputError(format!(
            "{}: written for a vocabulary of {} tokens, the model has {n_vocab}",
            path.display(),
            header.n_vocab
        ))
        .into());
    }
    let bos = tokenizer
        .vocab()
        .add_bos()
        .then(|| tokenizer.vocab().bos())
        .flatten();
    let first = n_ctx / 2;
    eprintln!(
        "kl-divergence: {} chunks, n_ctx={n_ctx}, {} threads",
        header.n_chunk,
        engine.threads()
    );
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", kl_divergence::KlStats::table_header())?;
    let bar = chunk_bar(header.n_chunk);
    let mut stats = kl_divergence::KlStats::default();
    let mut state = engine.new_state()?;
    let mut chunk_tokens = Vec::with_capacity(n_ctx);
    let words = kl_divergence::scored_per_chunk(n_ctx) * kl_divergence::record_words(n_vocab);
    let mut records = vec![0u16; words];
    for (i, chunk) in header.tokens.chunks_exact(n_ctx).enumerate() {
        let logits = score_chunk(engine, &mut state, &mut chunk_tokens, chunk, bos, first)?;
        kl_divergence::read_records(&mut input, &mut records)
            .with_context(|| format!("{}: reading chunk {}", path.display(), i + 1))?;
        for c in kl_divergence::compare_chunk(logits, &records, &chunk[first + 1..], n_vocab) {
            stats.add(&c);
        }
        bar.suspend(|| writeln!(out, "{}", stats.chunk_line(i + 1)))?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    writeln!(out)?;
    write!(out, "{}", stats.summary())?;
    Ok(())
}
