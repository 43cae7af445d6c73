//! `ferrox bench`: llama-bench's measurements (pp = one batched prefill of random tokens,
//! tg = single-token decode steps, both after `-d` tokens already in the context (an untimed
//! prefill before each repetition, as llama-bench's `-d`); one warm-up, then repetitions;
//! mean and sample standard deviation of per-repetition t/s), optionally side by side with
//! llama-bench itself on the same file and threads.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context};
use ferrox_core::bandwidth::ReadSweep;
use ferrox_core::{KvStorage, KvType};
use ferrox_models::EngineExt;
use ferrox_models::{AnyEngine, Engine, LogitsFor, State};
use ferrox_tokenizer::tokenizer::TokenId;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::model::{self, cache_type, LoadedEngine, ModelArgs};
use super::run::{SpecArgs, SpecType};
use super::InputError;
use ferrox_generate::generate::{generate_speculative, GenerationParams, Outcome};
use ferrox_generate::sampling::SamplerParams;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model file (default: the default model).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// A model from the Hugging Face Hub, ORG/NAME[:QUANT] (see `ferrox run --help`).
    #[arg(long = "hf-repo", visible_alias = "hf", conflicts_with = "model")]
    pub hf_repo: Option<String>,
    /// Prompt tokens for the prefill test (0: skip it).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub n_prompt: usize,
    /// Generated tokens for the decode test (0: skip it).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub n_gen: usize,
    /// Tokens already in the context when each test starts (llama-bench's `-d`): the cost of
    /// attention at that depth.
    #[arg(short = 'd', long = "n-depth", default_value_t = 0)]
    pub n_depth: usize,
    /// Timed repetitions per test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub repetitions: usize,
    /// Threads (default: one per core).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Print a JSON array (llama-bench's field names) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also run this llama-bench binary on the same file, tests and threads, and print the
    /// ratios: `[NAME=]BINARY`, repeatable (NAME heads its columns; `llama.cpp` for a binary
    /// called llama-bench, else the binary's file name). Every repetition of a test runs
    /// ferrox and then each peer once, so all see the same machine conditions.
    #[arg(long, value_parser = peer, value_name = "[NAME=]BINARY")]
    pub compare: Vec<Peer>,
    /// Keep every matrix in the file's row-major layout (no repacking at load; with
    /// `--compare`, llama-bench runs with `--repack 0` too).
    #[arg(long = "no-repack")]
    pub no_repack: bool,
    /// Memory the weights may take (see `run --memory-budget`).
    #[arg(long = "memory-budget", value_parser = super::model::byte_size, value_name = "SIZE")]
    pub memory_budget: Option<u64>,
    /// Worker threads on the memory nodes (see `run --numa`); passed to llama-bench too.
    #[arg(long, value_enum, value_name = "POLICY")]
    pub numa: Option<super::model::NumaArg>,
    /// The K cache's type (`-ctk` as llama-bench; f16 by default), passed to llama-bench too.
    /// A comma-separated list (`f16,q8_0`) measures each, with every combination of the V
    /// types: one engine per combination, their repetitions taking turns.
    #[arg(long = "cache-type-k", value_parser = cache_type, value_name = "TYPE", value_delimiter = ',')]
    pub cache_type_k: Vec<KvType>,
    /// The V cache's type (`-ctv`), or a comma-separated list; llama-bench gets `-fa on`
    /// where it is quantized, as it needs.
    #[arg(long = "cache-type-v", value_parser = cache_type, value_name = "TYPE", value_delimiter = ',')]
    pub cache_type_v: Vec<KvType>,
    /// With --spec-type (alias --spec): instead of pp/tg, generate -n tokens greedily from a
    /// prompt, plain and with speculation alternately, and report both speeds and the
    /// acceptance rate.
    #[command(flatten)]
    pub speculation: SpecArgs,
    /// The prompt file for --spec (default: a code file to give back with one change).
    #[arg(long = "spec-prompt", value_name = "FILE")]
    pub spec_prompt: Option<PathBuf>,
}

/// The default prompt of `bench --spec`: an edit-heavy request, where the answer repeats
/// most of the prompt.
const EDIT_PROMPT: &str = r#"Here is a Python file:

```python
import json
from dataclasses import dataclass


@dataclass
class Item:
    name: str
    price: float
    quantity: int


def load_items(path):
    with open(path) as f:
        return [Item(**row) for row in json.load(f)]


def total(items):
    return sum(item.price * item.quantity for item in items)


def cheapest(items):
    return min(items, key=lambda item: item.price)


def main():
    items = load_items("items.json")
    print("total:", total(items))
    print("cheapest:", cheapest(items).name)


if __name__ == "__main__":
    main()
```

The same file with the function `total` renamed to `order_total`:

```python
"#;

/// One test's result.
struct Measurement {
    name: String,
    n_prompt: usize,
    n_gen: usize,
    n_depth: usize,
    samples_ns: Vec<u64>,
    /// The machine's read bandwidth (bytes/s) measured just before each repetition, where
    /// it is measured (decode tests with `--compare`).
    bandwidth: Vec<f64>,
}

impl Measurement {
    fn tokens(&self) -> usize {
        self.n_prompt + self.n_gen
    }

    fn samples_ts(&self) -> Vec<f64> {
        self.samples_ns
            .iter()
            .map(|&ns| 1e9 * self.tokens() as f64 / ns as f64)
            .collect()
    }

    fn avg_ts(&self) -> f64 {
        mean(&self.samples_ts())
    }

    fn stddev_ts(&self) -> f64 {
        stddev(&self.samples_ts())
    }

    /// The mean, over repetitions, of the speed's share of the decode bound that the read
    /// bandwidth measured beside the repetition sets.
    fn bound_share(&self, bytes_per_token: u64) -> Option<f64> {
        let shares: Vec<f64> = self
            .samples_ts()
            .iter()
            .zip(&self.bandwidth)
            .map(|(ts, bw)| ts * bytes_per_token as f64 / bw)
            .collect();
        (!shares.is_empty()).then(|| mean(&shares))
    }
}

/// A llama-bench-compatible binary that `--compare` runs beside ferrox, and the name its
/// columns take.
#[derive(Clone, Debug)]
pub struct Peer {
    name: String,
    binary: PathBuf,
}

/// `[NAME=]BINARY` (a name holds no `/`, so a path with `=` in it still reads as a path).
fn peer(arg: &str) -> Result<Peer, String> {
    let (name, binary) = match arg.split_once('=') {
        Some((name, path)) if !name.is_empty() && !name.contains('/') => (Some(name), path),
        _ => (None, arg),
    };
    if binary.is_empty() {
        return Err(format!("{arg:?} names no binary"));
    }
    let binary = PathBuf::from(binary);
    let name = match (name, binary.file_name().and_then(|f| f.to_str())) {
        (Some(name), _) => name.to_string(),
        (None, Some("llama-bench") | None) => "llama.cpp".to_string(),
        (None, Some(file)) => file.to_string(),
    };
    Ok(Peer { name, binary })
}

/// A peer's results for one test, one per repetition, with the read bandwidth measured
/// just before and just after each (where measured).
#[derive(Default)]
struct PeerMeasurement {
    samples_ts: Vec<f64>,
    bandwidth: Vec<f64>,
}

impl PeerMeasurement {
    fn avg_ts(&self) -> f64 {
        mean(&self.samples_ts)
    }

    fn bound_share(&self, bytes_per_token: u64) -> Option<f64> {
        (!self.bandwidth.is_empty())
            .then(|| self.avg_ts() * bytes_per_token as f64 / mean(&self.bandwidth))
    }

    /// This peer's result for ferrox's test `m` as a JSON object.
    fn json(&self, peer: &Peer, m: &Measurement, bytes_per_token: u64) -> Value {
        let mut fields = json!({
            "name": peer.name,
            "binary": peer.binary.to_string_lossy(),
            "avg_ts": self.avg_ts(),
            "stddev_ts": stddev(&self.samples_ts),
            "samples_ts": self.samples_ts,
            "ratio": m.avg_ts() / self.avg_ts(),
        });
        if let Some(share) = self.bound_share(bytes_per_token) {
            fields["read_bandwidth_gbs"] = json!(mean(&self.bandwidth) / 1e9);
            fields["bound_share"] = json!(share);
        }
        fields
    }
}

fn mean(x: &[f64]) -> f64 {
    x.iter().sum::<f64>() / x.len().max(1) as f64
}

/// Sample standard deviation (n - 1), as llama-bench reports.
fn stddev(x: &[f64]) -> f64 {
    if x.len() < 2 {
        return 0.0;
    }
    let m = mean(x);
    (x.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (x.len() - 1) as f64).sqrt()
}

/// One combination of cache types under test: its engine's bench and state, and per test
/// ferrox's measurement with each peer's beside it.
struct Combination<'a> {
    kv: KvStorage,
    /// How it is named beside a test where there are several combinations.
    label: String,
    bench: Bench<'a>,
    state: State,
    results: Vec<(Measurement, Vec<PeerMeasurement>)>,
}

struct Bench<'a> {
    decoder: &'a AnyEngine,
    bos: Option<TokenId>,
    rng: rand::rngs::StdRng,
    /// Tokens in the context before each test.
    depth: usize,
    /// Measures the read bandwidth beside each decode repetition (a shared host's drifts
    /// by tens of percent within a minute, so a bound measured once says little).
    reader: Option<&'a ReadSweep>,
}

impl Bench<'_> {
    fn random_tokens(&mut self, n: usize) -> Vec<TokenId> {
        let vocab = self.decoder.vocab_size() as TokenId;
        (0..n)
            .map(|i| match (i, self.bos) {
                (0, Some(bos)) => bos,
                _ => self.rng.random_range(0..vocab),
            })
            .collect()
    }

    /// The context holding `depth` tokens (untimed): the previous repetition's, rolled back
    /// to them (as llama-bench restores its saved depth), or filled afresh where the engine
    /// cannot roll back.
    fn fill_depth(&mut self, state: &mut State) -> anyhow::Result<()> {
        if state.len() >= self.depth && state.truncate_or_reset(self.depth) == self.depth {
            return Ok(());
        }
        state.reset();
        if self.depth > 0 {
            let tokens = self.random_tokens(self.depth);
            self.decoder
                .forward_batch(&tokens, 0, state, LogitsFor::Last)?;
        }
        Ok(())
    }

    fn prefill(&mut self, state: &mut State, n: usize) -> anyhow::Result<u64> {
        self.fill_depth(state)?;
        let mut tokens = self.random_tokens(n);
        if self.depth > 0 {
            // Only a prompt from an empty context starts with BOS.
            tokens[0] = self
                .rng
                .random_range(0..self.decoder.vocab_size() as TokenId);
        }
        let start = Instant::now();
        self.decoder
            .forward_batch(&tokens, self.depth, state, LogitsFor::Last)?;
        Ok(start.elapsed().as_nanos() as u64)
    }

    fn generate(&mut self, state: &mut State, n: usize) -> anyhow::Result<u64> {
        self.fill_depth(state)?;
        let tokens = self.random_tokens(n);
        let start = Instant::now();
        for (i, &t) in tokens.iter().enumerate() {
            self.decoder.forward_token(t, self.depth + i, state)?;
        }
        Ok(start.elapsed().as_nanos() as u64)
    }

    /// One repetition of `m`'s test, its time (and the read bandwidth just before it,
    /// for a decode test where measured) added to `m`.
    fn repetition(&mut self, state: &mut State, m: &mut Measurement) -> anyhow::Result<()> {
        if let Some(reader) = self.reader.filter(|_| m.n_gen > 0) {
            m.bandwidth.push(reader.measure());
        }
        m.samples_ns.push(self.timed(state, m.n_prompt, m.n_gen)?);
        Ok(())
    }

    fn timed(&mut self, state: &mut State, n_prompt: usize, n_gen: usize) -> anyhow::Result<u64> {
        if n_prompt > 0 {
            self.prefill(state, n_prompt)
        } else {
            self.generate(state, n_gen)
        }
    }
}

/// llama-bench's name for a test: `pp512`, `tg128`, `tg128 @ d4096`.
fn test_name(n_prompt: usize, n_gen: usize, depth: usize) -> String {
    let base = if n_prompt > 0 {
        format!("pp{n_prompt}")
    } else {
        format!("tg{n_gen}")
    };
    match depth {
        0 => base,
        d => format!("{base} @ d{d}"),
    }
}

/// What llama-bench calls the model (`gemma3 270M Q4_K - Medium`).
fn model_type(decoder: &AnyEngine) -> String {
    let meta = decoder.gguf().metadata();
    let arch = meta.architecture().unwrap_or("?");
    let size = meta
        .opt_str("general.size_label")
        .ok()
        .flatten()
        .unwrap_or("?");
    let ftype = meta
        .opt_u32("general.file_type")
        .ok()
        .flatten()
        .and_then(ferrox_gguf::file_type_name)
        .unwrap_or("?");
    format!("{arch} {size} {ftype}")
}

fn human_size(bytes: u64) -> String {
    let mib = bytes as f64 / (1u64 << 20) as f64;
    if mib < 1024.0 {
        format!("{mib:.2} MiB")
    } else {
        format!("{:.2} GiB", mib / 1024.0)
    }
}

fn human_params(n: u64) -> String {
    if n < 1_000_000_000 {
        format!("{:.2} M", n as f64 / 1e6)
    } else {
        format!("{:.2} B", n as f64 / 1e9)
    }
}

/// One repetition of a test by a llama-bench-compatible binary (its t/s), run as its own
/// process (with its weight repacking off too when `repack` is false, and the same
/// `--numa`).
fn llama_bench(
    binary: &Path,
    model: &Path,
    m: &Measurement,
    threads: usize,
    (repack, cache, numa): (bool, KvStorage, Option<super::model::NumaArg>),
) -> anyhow::Result<f64> {
    let mut command = Command::new(binary);
    if !repack {
        command.args(["--repack", "0"]);
    }
    if let Some(numa) = numa {
        let name = clap::ValueEnum::to_possible_value(&numa).expect("no variant is skipped");
        command.args(["--numa", name.get_name()]);
    }
    if cache != KvStorage::F16 {
        command.args(["-ctk", cache.keys.name(), "-ctv", cache.values.name()]);
        if cache.values.is_quantized() {
            command.args(["-fa", "on"]);
        }
    }
    let out = command
        .args(["-m", &model.to_string_lossy()])
        .args(["-p", &m.n_prompt.to_string(), "-n", &m.n_gen.to_string()])
        .args(["-d", &m.n_depth.to_string()])
        .args(["-r", "1", "-t", &threads.to_string(), "-o", "json"])
        .output()
        .with_context(|| format!("cannot run {}", binary.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
    }
    let results: Value = serde_json::from_slice(&out.stdout).context("llama-bench JSON")?;
    results
        .as_array()
        .and_then(|a| {
            a.iter().find(|r| {
                r["n_prompt"] == m.n_prompt
                    && r["n_gen"] == m.n_gen
                    && r["n_depth"].as_u64().unwrap_or(0) == m.n_depth as u64
            })
        })
        .and_then(|r| r["avg_ts"].as_f64())
        .context("llama-bench printed no result for the test")
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.repetitions == 0 {
        return Err(InputError("--repetitions must be at least 1".into()).into());
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let model_args = ModelArgs {
        model: args.model.clone(),
        hf_repo: args.hf_repo.clone(),
        threads,
        ctx_size: Some(args.n_depth + args.n_prompt.max(args.n_gen).max(1)),
        kv_f32: false,
        cache_type_k: None,
        cache_type_v: None,
        no_repack: args.no_repack,
        memory_budget: args.memory_budget,
        mlock: false,
        direct_io: false,
        numa: args.numa,
        mtp: false,
    };
    // Every combination of the listed cache types, as llama-bench runs them.
    let listed = |types: &[KvType]| -> Vec<Option<KvType>> {
        match types.is_empty() {
            true => vec![None],
            false => types.iter().copied().map(Some).collect(),
        }
    };
    let variants: Vec<ModelArgs> = listed(&args.cache_type_k)
        .into_iter()
        .flat_map(|k| {
            let base = &model_args;
            listed(&args.cache_type_v)
                .into_iter()
                .map(move |v| ModelArgs {
                    cache_type_k: k,
                    cache_type_v: v,
                    ..base.clone()
                })
        })
        .collect();
    if args.speculation.kind()? != SpecType::None {
        let [model_args] = &variants[..] else {
            return Err(InputError("--spec measures one cache type at a time".into()).into());
        };
        let model_args = ModelArgs {
            ctx_size: None,
            ..model_args.clone()
        };
        return run_spec(&args, &model_args);
    }
    // One engine per combination, all loaded at once so that their repetitions can take
    // turns (the weights are held once per combination).
    let loaded: Vec<LoadedEngine> = variants
        .iter()
        .map(model::load_generator)
        .collect::<anyhow::Result<_>>()?;
    let first = &loaded[0];
    let decoder = &first.engine;
    let vocab = first.tokenizer.vocab();
    let reader = (!args.compare.is_empty())
        .then(|| ReadSweep::new(threads))
        .flatten();
    let several = variants.len() > 1;
    let mut combinations: Vec<Combination> = variants
        .iter()
        .zip(&loaded)
        .map(|(variant, l)| {
            let kv = variant.kv_storage();
            Ok(Combination {
                kv,
                // Named beside a test where there are several.
                label: match several {
                    true => format!(" (K {}, V {})", kv.keys.name(), kv.values.name()),
                    false => String::new(),
                },
                // The same seed for every combination: each is given the same tokens.
                bench: Bench {
                    decoder: &l.engine,
                    bos: vocab.add_bos().then(|| vocab.bos()).flatten(),
                    rng: rand::rngs::StdRng::seed_from_u64(1234),
                    depth: args.n_depth,
                    reader: reader.as_ref(),
                },
                state: l.engine.new_state()?,
                results: Vec::new(),
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let tests: Vec<(usize, usize)> = [(args.n_prompt, 0), (0, args.n_gen)]
        .into_iter()
        .filter(|t| t.0 + t.1 > 0)
        .collect();
    // Positions held at the end of the longest test.
    let deepest = args.n_depth + tests.iter().map(|t| t.0 + t.1).max().unwrap_or(0);
    let bar = indicatif::ProgressBar::new((tests.len() * args.repetitions) as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("bench [{bar:20}] {pos}/{len} {msg} {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    for (n_prompt, n_gen) in tests {
        let name = test_name(n_prompt, n_gen, args.n_depth);
        for c in &mut combinations {
            bar.set_message(format!("{name}{} ferrox warm-up", c.label));
            c.bench.timed(&mut c.state, n_prompt, n_gen)?;
            let measurement = Measurement {
                name: name.clone(),
                n_prompt,
                n_gen,
                n_depth: args.n_depth,
                samples_ns: Vec::with_capacity(args.repetitions),
                bandwidth: Vec::new(),
            };
            let peers = args.compare.iter().map(|_| PeerMeasurement::default());
            c.results.push((measurement, peers.collect()));
        }
        // The read bandwidth just before and just after each peer's run, for decode tests.
        let bandwidth = || {
            reader
                .as_ref()
                .filter(|_| n_gen > 0)
                .map(ReadSweep::measure)
        };
        // Every combination, and after each every peer, take turns repetition by
        // repetition: a shared host's speed drifts within a minute, and each turn sees the
        // same drift.
        for _ in 0..args.repetitions {
            for c in &mut combinations {
                bar.set_message(format!("{name}{} ferrox", c.label));
                let (measured, beside) = c.results.last_mut().expect("this test's entry");
                c.bench.repetition(&mut c.state, measured)?;
                let peer_options = (!args.no_repack, c.kv, args.numa);
                for (peer, peer_measured) in args.compare.iter().zip(beside) {
                    bar.set_message(format!("{name}{} {}", c.label, peer.name));
                    let before = bandwidth();
                    let ts =
                        llama_bench(&peer.binary, &first.path, measured, threads, peer_options)?;
                    peer_measured.samples_ts.push(ts);
                    peer_measured
                        .bandwidth
                        .extend(before.into_iter().chain(bandwidth()));
                }
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();

    let gguf = decoder.gguf();
    let model_size: u64 = gguf.tensors().iter().filter_map(|t| t.n_bytes).sum();
    let n_params: u64 = gguf.tensors().iter().map(|t| t.n_elements).sum();
    let file_name = first
        .path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let bytes_per_token = decoder.weight_bytes_per_token();
    let memory = decoder.weight_memory();

    if args.json {
        let mut rows: Vec<Value> = Vec::new();
        for c in &combinations {
            let kv = c.kv;
            for (m, others) in &c.results {
                let samples_ns = &m.samples_ns;
                let avg_ns = samples_ns.iter().sum::<u64>() / samples_ns.len() as u64;
                let ns: Vec<f64> = samples_ns.iter().map(|&x| x as f64).collect();
                let mut row = json!({
                    "engine": "ferrox",
                    "model_filename": first.path.to_string_lossy(),
                    "model_type": model_type(decoder),
                    "model_size": model_size,
                    "model_n_params": n_params,
                    "n_threads": threads,
                    "n_prompt": m.n_prompt,
                    "n_gen": m.n_gen,
                    "n_depth": m.n_depth,
                    "type_k": kv.keys.name(),
                    "type_v": kv.values.name(),
                    "repack": !args.no_repack,
                    "test_time": chrono_now(),
                    "avg_ns": avg_ns,
                    "stddev_ns": stddev(&ns) as u64,
                    "avg_ts": m.avg_ts(),
                    "stddev_ts": m.stddev_ts(),
                    "samples_ns": samples_ns,
                    "samples_ts": m.samples_ts(),
                });
                let peers: Vec<Value> = args
                    .compare
                    .iter()
                    .zip(others)
                    .map(|(peer, other)| other.json(peer, m, bytes_per_token))
                    .collect();
                // The first peer's figures also under the names one peer always had.
                if let Some(first) = peers.first() {
                    for (from, to) in [
                        ("avg_ts", "llama_cpp_avg_ts"),
                        ("ratio", "ratio"),
                        ("read_bandwidth_gbs", "llama_cpp_read_bandwidth_gbs"),
                        ("bound_share", "llama_cpp_bound_share"),
                    ] {
                        if let Some(v) = first.get(from) {
                            row[to] = v.clone();
                        }
                    }
                    row["peers"] = json!(peers);
                }
                if let Some(share) = m.bound_share(bytes_per_token) {
                    let bw = mean(&m.bandwidth);
                    row["read_bandwidth_gbs"] = json!(bw / 1e9);
                    row["weight_bytes_per_token"] = json!(bytes_per_token);
                    row["bandwidth_bound_ts"] = json!(bw / bytes_per_token as f64);
                    row["bound_share"] = json!(share);
                }
                row["weight_memory"] = weight_memory_json(&memory);
                row["kv_bytes_per_position"] = json!(c.state.bytes_per_position());
                rows.push(row);
            }
        }
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }

    // llama-bench's table, with its type_k and type_v columns where several were asked for.
    let (type_head, type_rule) = match several {
        true => (" type_k | type_v |", " -----: | -----: |"),
        false => ("", ""),
    };
    println!("| model                          |       size |     params | backend    | threads |{type_head}            test |                  t/s |");
    println!("| ------------------------------ | ---------: | ---------: | ---------- | ------: |{type_rule} --------------: | -------------------: |");
    for c in &combinations {
        let types = match several {
            true => format!(" {:>6} | {:>6} |", c.kv.keys.name(), c.kv.values.name()),
            false => String::new(),
        };
        for (m, _) in &c.results {
            println!(
                "| {:<30} | {:>10} | {:>10} | {:<10} | {:>7} |{types} {:>15} | {:>20} |",
                model_type(decoder),
                human_size(model_size),
                human_params(n_params),
                "ferrox",
                threads,
                m.name,
                format!("{:.2} ± {:.2}", m.avg_ts(), m.stddev_ts())
            );
        }
    }
    println!("\nmodel: {file_name}");
    for c in &combinations {
        let kv_per_position = c.state.bytes_per_position();
        println!(
            "sequence memory: {kv_per_position:.0} bytes per position ({}), {:.1} MiB at the deepest test",
            cache_types(c.bench.decoder),
            kv_per_position * deepest as f64 / (1 << 20) as f64
        );
    }
    println!(
        "weights: {:.1} MiB packed in memory, {:.1} MiB read from the mapped file{}",
        memory.packed_bytes as f64 / (1 << 20) as f64,
        memory.mapped_bytes as f64 / (1 << 20) as f64,
        memory.expert_cache.map_or(String::new(), |c| format!(
            "; experts streamed through {} cached ({} hits, {} misses, {:.1} MiB read; \
             {} asked for a layer ahead, {} of them used)",
            c.slots,
            c.hits,
            c.misses,
            c.bytes_read as f64 / (1 << 20) as f64,
            c.ahead_asked,
            c.ahead_used,
        ))
    );
    if !args.compare.is_empty() {
        let (mut head, mut rule) = (
            String::from("\n| test | ferrox t/s |"),
            String::from("| ---- | ---------: |"),
        );
        for peer in &args.compare {
            head += &format!(" {0} t/s | ferrox / {0} |", peer.name);
            rule += " ---: | ---: |";
        }
        println!("{head}\n{rule}");
        for c in &combinations {
            for (m, others) in &c.results {
                let mut line = format!("| {}{} | {:.2} |", m.name, c.label, m.avg_ts());
                for other in others {
                    line += &format!(
                        " {:.2} | {:.3} |",
                        other.avg_ts(),
                        m.avg_ts() / other.avg_ts()
                    );
                }
                println!("{line}");
            }
        }
    }
    for c in &combinations {
        for (m, others) in &c.results {
            let Some(share) = m.bound_share(bytes_per_token) else {
                continue;
            };
            let name = format!("{}{}", m.name, c.label);
            let bw = mean(&m.bandwidth);
            println!(
                "\n{name}: read bandwidth ({threads} threads) measured before each repetition: {:.1} GB/s; weights read per token: {:.1} MB; decode bound: {:.1} t/s",
                bw / 1e9,
                bytes_per_token as f64 / 1e6,
                bw / bytes_per_token as f64
            );
            print!("{name}: ferrox at {:.0}% of the bound", 100.0 * share);
            for (peer, other) in args.compare.iter().zip(others) {
                if let Some(share) = other.bound_share(bytes_per_token) {
                    print!(
                        ", {} at {:.0}% (bandwidth measured before and after its runs: {:.1} GB/s)",
                        peer.name,
                        100.0 * share,
                        mean(&other.bandwidth) / 1e9
                    );
                }
            }
            println!();
        }
    }
    Ok(())
}

/// `bench --spec`: greedy generation from one prompt, plain and speculative alternately
/// (one warm-up each, then `-r` repetitions), the outputs checked to be identical.
fn run_spec(args: &Args, model_args: &ModelArgs) -> anyhow::Result<()> {
    if args.n_gen == 0 {
        return Err(InputError("--spec needs -n above 0".into()).into());
    }
    let text = match &args.spec_prompt {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| InputError(format!("{}: {e}", path.display())))?,
        None => EDIT_PROMPT.to_string(),
    };
    let mut loaded = model::load_generator(&args.speculation.target_args(model_args)?)?;
    args.speculation.prepare_engine(&mut loaded.engine)?;
    let draft = args.speculation.load_draft(model_args, &loaded.tokenizer)?;
    let decoder = &loaded.engine;
    let tokenizer = &loaded.tokenizer;
    let prompt = tokenizer.encode(&text, true, true);
    if prompt.len() + args.n_gen > decoder.context_size() {
        return Err(InputError(format!(
            "the prompt ({} tokens) and -n {} do not fit the context of {}",
            prompt.len(),
            args.n_gen,
            decoder.context_size()
        ))
        .into());
    }
    let plain_params = GenerationParams {
        max_tokens: Some(args.n_gen),
        sampler: SamplerParams::greedy(),
        ignore_eog: true,
        ..GenerationParams::default()
    };
    let spec_params = GenerationParams {
        draft: args.speculation.draft(),
        ..plain_params.clone()
    };
    let mut drafter = match &draft {
        Some(d) => Some(d.drafter(decoder.vocab_size(), &plain_params.sampler)?),
        None => None,
    };
    let mut state = decoder.new_state()?;
    let mut once = |speculative: bool| -> anyhow::Result<Outcome> {
        state.reset();
        let (params, drafter) = match speculative {
            true => (&spec_params, drafter.as_mut()),
            false => (&plain_params, None),
        };
        Ok(generate_speculative(
            decoder,
            &mut state,
            0,
            tokenizer,
            &prompt,
            params,
            drafter,
            |_| true,
        )?)
    };
    once(false)?;
    once(true)?;
    let (mut plain, mut spec) = (Vec::new(), Vec::new());
    let mut identical = true;
    for _ in 0..args.repetitions {
        let a = once(false)?;
        let b = once(true)?;
        identical &= a.tokens == b.tokens;
        plain.push(a.timings);
        spec.push(b.timings);
    }
    let ts = |t: &[ferrox_generate::generate::Timings]| -> Vec<f64> {
        t.iter().map(|t| t.generation_tokens_per_second()).collect()
    };
    let (plain_ts, spec_ts) = (ts(&plain), ts(&spec));
    let drafted: usize = spec.iter().map(|t| t.drafted_tokens).sum();
    let accepted: usize = spec.iter().map(|t| t.accepted_tokens).sum();
    let acceptance = accepted as f64 / drafted.max(1) as f64;
    let kind = match args.speculation.kind()? {
        SpecType::Draft => "draft",
        _ => "ngram",
    };
    if args.json {
        let row = json!({
            "engine": "ferrox",
            "model_filename": loaded.path.to_string_lossy(),
            "draft_filename": draft.as_ref().map(|d| d.loaded.path.to_string_lossy().into_owned()),
            "spec_type": kind,
            "n_threads": decoder.threads(),
            "n_prompt": prompt.len(),
            "n_gen": args.n_gen,
            "plain_avg_ts": mean(&plain_ts),
            "plain_stddev_ts": stddev(&plain_ts),
            "spec_avg_ts": mean(&spec_ts),
            "spec_stddev_ts": stddev(&spec_ts),
            "speedup": mean(&spec_ts) / mean(&plain_ts),
            "draft_n": drafted,
            "draft_n_accepted": accepted,
            "acceptance": acceptance,
            "identical": identical,
        });
        println!("{}", serde_json::to_string_pretty(&row)?);
    } else {
        println!("| test | plain t/s | {kind} t/s | speedup | drafted | accepted | acceptance |");
        println!("| ---- | --------: | ------: | ------: | ------: | -------: | ---------: |");
        println!(
            "| tg{} after {} prompt tokens | {:.2} ± {:.2} | {:.2} ± {:.2} | {:.2} | {drafted} | {accepted} | {:.1}% |",
            args.n_gen,
            prompt.len(),
            mean(&plain_ts),
            stddev(&plain_ts),
            mean(&spec_ts),
            stddev(&spec_ts),
            mean(&spec_ts) / mean(&plain_ts),
            100.0 * acceptance
        );
        println!(
            "\nmodel: {}{}; outputs identical: {}",
            loaded.path.display(),
            draft
                .as_ref()
                .map(|d| format!(", draft: {}", d.loaded.path.display()))
                .unwrap_or_default(),
            if identical { "yes" } else { "NO" }
        );
    }
    if !identical {
        bail!("speculative output differs from plain greedy output");
    }
    Ok(())
}

/// UTC time as llama-bench prints it (`2025-04-24T11:57:09Z`).
fn chrono_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86400, secs % 86400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Where the weights were during the run (the memory plan and the experts' cache).
fn weight_memory_json(m: &ferrox_models::engine::WeightMemory) -> Value {
    json!({
        "budget": m.budget,
        "packed_bytes": m.packed_bytes,
        "mapped_bytes": m.mapped_bytes,
        "expert_cache": m.expert_cache.map(|c| json!({
            "slots": c.slots,
            "slot_bytes": c.slot_bytes,
            "hits": c.hits,
            "misses": c.misses,
            "bytes_read": c.bytes_read,
            "ahead_asked": c.ahead_asked,
            "ahead_used": c.ahead_used,
        })),
    })
}

/// The types the engine's cache stores: its keys' and values', or its keys' alone where
/// every row is also its own value (MLA latent rows, DeepSeek-V4's rows), whatever `-ctv`
/// said.
fn cache_types(engine: &AnyEngine) -> String {
    let spec = engine.memory_spec();
    let keys = spec.storage.keys.name();
    match spec.paged.iter().all(|store| store.value_width == 0) {
        true => format!("K {keys}, values read from the keys"),
        false => format!("K {keys}, V {}", spec.storage.values.name()),
    }
}
