//! `ferrox perplexity`: llama-perplexity's measurement. The text is tokenized once (with
//! BOS), cut into non-overlapping chunks of `ctx` tokens whose first token becomes BOS,
//! and only the second half of each chunk is scored.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use ferrox_models::sampling::logprob_of;
use ferrox_models::EngineExt;
use ferrox_models::{Engine, LogitsFor};
use indicatif::{ProgressBar, ProgressStyle};

use super::model::{self, ModelArgs};
use super::InputError;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to score.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Batch size (accepted for llama-perplexity compatibility; chunks run one at a time).
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048)]
    pub batch: usize,
    /// Score at most this many chunks (-1: all).
    #[arg(long = "chunks", default_value_t = -1, allow_negative_numbers = true)]
    pub chunks: i64,
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
    // llama-perplexity's context default is 512, not the model's.
    let n_ctx = *args.model.ctx_size.get_or_insert(512);
    if n_ctx < 4 {
        return Err(InputError(format!("--ctx-size {n_ctx} is too small to score")).into());
    }
    let bytes = std::fs::read(&args.file).with_context(|| format!("{}", args.file.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| InputError(format!("{}: not valid UTF-8 ({e})", args.file.display())))?;
    let loaded = model::load_engine(&args.model)?;
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
    let bar = ProgressBar::new(n_chunk as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:40} {pos}/{len} chunks, {elapsed} elapsed, eta {eta} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut stats = NllStats::default();
    let mut running = String::new();
    let mut state = decoder.new_state()?;
    let mut chunk_tokens = Vec::with_capacity(n_ctx);
    for i in 0..n_chunk {
        chunk_tokens.clear();
        chunk_tokens.extend_from_slice(&tokens[i * n_ctx..(i + 1) * n_ctx]);
        if let Some(b) = bos {
            chunk_tokens[0] = b;
        }
        state.reset();
        let logits = decoder
            .forward_batch(&chunk_tokens, 0, &mut state, LogitsFor::From(first))
            .context("evaluation failed")?;
        let n_vocab = decoder.vocab_size();
        // Logits at chunk index `first + j` predict the original token at `first + j + 1`.
        for j in 0..n_ctx - 1 - first {
            let row = &logits[j * n_vocab..(j + 1) * n_vocab];
            let target = tokens[i * n_ctx + first + j + 1];
            stats.add(-f64::from(logprob_of(row, target)));
        }
        running.push_str(&format!("[{}]{:.4},", i + 1, stats.ppl()));
        bar.set_message(format!("PPL {:.4}", stats.ppl()));
        bar.inc(1);
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
