//! Server metrics in Prometheus' text exposition format (`GET /metrics`).
//!
//! Two sets of names: ferrox's own (`ferrox_*`), and vLLM's (`vllm:*`, with its types,
//! bucket bounds and `model_name`/`engine` labels), which the Gateway API Inference
//! Extension's endpoint picker, vLLM's and SGLang's routers and vLLM dashboards scrape without
//! configuration. The vLLM names appear once the model is loaded (they carry its id).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use ferrox_generate::generate::FinishReason;
use ferrox_models::engine::WeightMemory;

/// A cumulative histogram with fixed bucket bounds (seconds).
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        for (i, &b) in self.bounds.iter().enumerate() {
            if v <= b {
                self.counts[i] += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    /// `labels` are the series' labels besides `le`, already rendered (`a="x",b="y"`), or
    /// empty.
    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let (sep, braced) = if labels.is_empty() {
            ("", String::new())
        } else {
            (",", format!("{{{labels}}}"))
        };
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {c}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}",
            self.count
        );
        let _ = writeln!(out, "{name}_sum{braced} {}", self.sum);
        let _ = writeln!(out, "{name}_count{braced} {}", self.count);
    }
}

const TTFT_BOUNDS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0];
const ITL_BOUNDS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];

// vLLM's own bounds (vllm/v1/metrics/loggers.py), so that quantiles computed by dashboards
// and autoscalers built for vLLM mean the same here.
const VLLM_TTFT_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const VLLM_ITL_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const VLLM_REQUEST_LATENCY_BOUNDS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// How a sequence ended, as vLLM's `finished_reason` label names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finished {
    Stop,
    Length,
    /// Cancelled (the client went away, shutdown) or failed before it finished.
    Abort,
}

impl Finished {
    const ALL: [Finished; 3] = [Finished::Stop, Finished::Length, Finished::Abort];

    pub fn label(self) -> &'static str {
        match self {
            Finished::Stop => "stop",
            Finished::Length => "length",
            Finished::Abort => "abort",
        }
    }
}

impl From<FinishReason> for Finished {
    fn from(reason: FinishReason) -> Finished {
        match reason {
            FinishReason::Stop => Finished::Stop,
            FinishReason::Length => Finished::Length,
        }
    }
}

/// What the vLLM-named series need to know about the loaded model.
#[derive(Clone, Debug)]
pub struct ServedModel {
    /// The id clients use (`--alias` or the file name): the `model_name` label.
    pub name: String,
    /// The KV cache's element type, in vLLM's spelling (`float16`, `float32`).
    pub cache_dtype: String,
}

/// A Prometheus label value: backslash, double quote and line feed escaped.
fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Everything `/metrics` reports. Counters are atomics; histograms sit behind a mutex (they
/// are touched once per token, far below contention).
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub prefix_hit_tokens: AtomicU64,
    pub rejected_queue_full: AtomicU64,
    pub cancelled: AtomicU64,
    pub queue_depth: AtomicU64,
    pub active_sequences: AtomicU64,
    pub kv_blocks_used: AtomicU64,
    pub kv_blocks_cached: AtomicU64,
    pub kv_blocks_total: AtomicU64,
    pub kv_block_tokens: AtomicU64,
    pub kv_bytes: AtomicU64,
    /// An f64's bits: a strided store's rows spread over their positions (a fraction).
    pub kv_bytes_per_position: AtomicU64,
    pub steps: AtomicU64,
    /// Speculative decoding: drafts checked, the tokens they proposed, and those kept.
    pub spec_drafts: AtomicU64,
    pub spec_draft_tokens: AtomicU64,
    pub spec_accepted_tokens: AtomicU64,
    ttft: Mutex<Histogram>,
    itl: Mutex<Histogram>,
    served: OnceLock<ServedModel>,
    /// Sequences ended, indexed like [`Finished::ALL`].
    finished: [AtomicU64; 3],
    vllm_ttft: Mutex<Histogram>,
    vllm_itl: Mutex<Histogram>,
    e2e: Mutex<Histogram>,
    queue_time: Mutex<Histogram>,
    /// Where the engine's weights live, as of the last iteration.
    weights: Mutex<WeightMemory>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            prefix_hit_tokens: AtomicU64::new(0),
            rejected_queue_full: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            queue_depth: AtomicU64::new(0),
            active_sequences: AtomicU64::new(0),
            kv_blocks_used: AtomicU64::new(0),
            kv_blocks_cached: AtomicU64::new(0),
            kv_blocks_total: AtomicU64::new(0),
            kv_block_tokens: AtomicU64::new(0),
            kv_bytes: AtomicU64::new(0),
            kv_bytes_per_position: AtomicU64::new(0),
            steps: AtomicU64::new(0),
            spec_drafts: AtomicU64::new(0),
            spec_draft_tokens: AtomicU64::new(0),
            spec_accepted_tokens: AtomicU64::new(0),
            ttft: Mutex::new(Histogram::new(TTFT_BOUNDS)),
            itl: Mutex::new(Histogram::new(ITL_BOUNDS)),
            served: OnceLock::new(),
            finished: Default::default(),
            vllm_ttft: Mutex::new(Histogram::new(VLLM_TTFT_BOUNDS)),
            vllm_itl: Mutex::new(Histogram::new(VLLM_ITL_BOUNDS)),
            e2e: Mutex::new(Histogram::new(VLLM_REQUEST_LATENCY_BOUNDS)),
            queue_time: Mutex::new(Histogram::new(VLLM_REQUEST_LATENCY_BOUNDS)),
            weights: Mutex::new(WeightMemory::default()),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One single-sample metric family: HELP, TYPE and the sample.
fn family(out: &mut String, kind: &str, name: &str, help: &str, labels: &str, value: f64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {value}"
    );
}

impl Metrics {
    pub fn set_kv_usage(&self, usage: ferrox_memory::BlockUsage) {
        self.kv_blocks_used
            .store(usage.used as u64, Ordering::Relaxed);
        self.kv_blocks_cached
            .store(usage.cached as u64, Ordering::Relaxed);
    }

    /// Names the loaded model; the vLLM-named series appear from then on.
    pub fn set_served(&self, served: ServedModel) {
        let _ = self.served.set(served);
    }

    pub fn count_request(&self, route: &str, status: u16) {
        *lock(&self.requests)
            .entry((route.to_string(), status))
            .or_default() += 1;
    }

    /// From the request's arrival at the scheduler to its first generated token.
    pub fn observe_ttft(&self, d: Duration) {
        lock(&self.ttft).observe(d.as_secs_f64());
        lock(&self.vllm_ttft).observe(d.as_secs_f64());
    }

    pub fn observe_itl(&self, d: Duration) {
        lock(&self.itl).observe(d.as_secs_f64());
        lock(&self.vllm_itl).observe(d.as_secs_f64());
    }

    /// From the request's arrival at the scheduler to its admission into a running slot.
    pub fn observe_queue_time(&self, d: Duration) {
        lock(&self.queue_time).observe(d.as_secs_f64());
    }

    /// A sequence ended `e2e` after its arrival at the scheduler.
    pub fn observe_finished(&self, how: Finished, e2e: Duration) {
        let index = Finished::ALL
            .iter()
            .position(|&f| f == how)
            .expect("every outcome is listed");
        self.finished[index].fetch_add(1, Ordering::Relaxed);
        lock(&self.e2e).observe(e2e.as_secs_f64());
    }

    fn kv_usage_ratio(&self) -> f64 {
        let used = self.kv_blocks_used.load(Ordering::Relaxed);
        let total = self.kv_blocks_total.load(Ordering::Relaxed);
        if total == 0 {
            0.0
        } else {
            used as f64 / total as f64
        }
    }

    pub fn set_weight_memory(&self, memory: WeightMemory) {
        *lock(&self.weights) = memory;
    }

    /// The memory planner's placement and the streamed experts' cache.
    fn render_weights(&self, out: &mut String) {
        let w = *lock(&self.weights);
        let mut gauges = vec![
            (
                "ferrox_weight_memory_budget_bytes",
                "Bytes the memory planner let the weights take.",
                w.budget,
            ),
            (
                "ferrox_weight_packed_bytes",
                "Bytes of weights packed into memory at load.",
                w.packed_bytes,
            ),
            (
                "ferrox_weight_mapped_bytes",
                "Bytes of weights read in place from the mapped file.",
                w.mapped_bytes,
            ),
        ];
        let cache = w.expert_cache.unwrap_or_default();
        if w.expert_cache.is_some() {
            gauges.push((
                "ferrox_expert_cache_slots",
                "Slots of the streamed experts' cache, one expert each.",
                cache.slots as u64,
            ));
            gauges.push((
                "ferrox_expert_cache_bytes",
                "Bytes the streamed experts' cache takes when full.",
                cache.slots as u64 * cache.slot_bytes,
            ));
        }
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        if w.expert_cache.is_some() {
            for (name, help, v) in [
                (
                    "ferrox_expert_cache_hits_total",
                    "Routed-expert uses served from the cache.",
                    cache.hits,
                ),
                (
                    "ferrox_expert_cache_misses_total",
                    "Routed-expert uses that packed the expert from the file.",
                    cache.misses,
                ),
                (
                    "ferrox_expert_bytes_read_total",
                    "Bytes of routed experts read from the file into the cache.",
                    cache.bytes_read,
                ),
                (
                    "ferrox_expert_ahead_asked_total",
                    "Routed experts whose pages a layer asked for on the next layer's behalf.",
                    cache.ahead_asked,
                ),
                (
                    "ferrox_expert_ahead_used_total",
                    "Of the experts asked for ahead, those the next layer used.",
                    cache.ahead_used,
                ),
            ] {
                let _ = writeln!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
                );
            }
        }
    }

    pub fn render(&self, ready: bool) -> String {
        let mut out = String::new();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let _ = writeln!(out, "# HELP ferrox_ready Whether the model is loaded (1) or still loading (0).\n# TYPE ferrox_ready gauge\nferrox_ready {}", ready as u8);
        let _ = writeln!(out, "# HELP ferrox_requests_total HTTP requests answered, by route and status.\n# TYPE ferrox_requests_total counter");
        for ((route, status), n) in lock(&self.requests).iter() {
            let _ = writeln!(
                out,
                "ferrox_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        let counters = [
            (
                "ferrox_prompt_tokens_total",
                "Prompt tokens of admitted requests (rendered, cached ones included).",
                &self.prompt_tokens,
            ),
            (
                "ferrox_generated_tokens_total",
                "Tokens generated.",
                &self.generated_tokens,
            ),
            (
                "ferrox_prefix_cache_hit_tokens_total",
                "Prompt tokens reused from a slot's cached prefix instead of prefilled.",
                &self.prefix_hit_tokens,
            ),
            (
                "ferrox_requests_deferred_total",
                "Requests refused because the queue was full (429).",
                &self.rejected_queue_full,
            ),
            (
                "ferrox_requests_cancelled_total",
                "Sequences cancelled because the client went away.",
                &self.cancelled,
            ),
            (
                "ferrox_scheduler_steps_total",
                "Batched forward steps run by the scheduler.",
                &self.steps,
            ),
            (
                "ferrox_spec_decode_drafts_total",
                "Speculative drafts checked (one per sequence and step that proposed tokens).",
                &self.spec_drafts,
            ),
            (
                "ferrox_spec_decode_draft_tokens_total",
                "Tokens proposed by speculative drafts and checked.",
                &self.spec_draft_tokens,
            ),
            (
                "ferrox_spec_decode_accepted_tokens_total",
                "Drafted tokens the model's own choice confirmed.",
                &self.spec_accepted_tokens,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                get(v)
            );
        }
        let used = get(&self.kv_blocks_used);
        let cached = get(&self.kv_blocks_cached);
        let total = get(&self.kv_blocks_total);
        let gauges = [
            (
                "ferrox_requests_waiting",
                "Requests queued for a sequence slot or KV memory.",
                get(&self.queue_depth) as f64,
            ),
            (
                "ferrox_active_sequences",
                "Sequences being prefilled or decoded.",
                get(&self.active_sequences) as f64,
            ),
            (
                "ferrox_kv_blocks_used",
                "KV blocks held by active sequences.",
                used as f64,
            ),
            (
                "ferrox_kv_blocks_cached",
                "KV blocks held by nobody, kept for prefix reuse (evictable).",
                cached as f64,
            ),
            (
                "ferrox_kv_blocks_free",
                "KV blocks never filled or dropped.",
                total.saturating_sub(used + cached) as f64,
            ),
            (
                "ferrox_kv_blocks_total",
                "KV blocks in the pool.",
                total as f64,
            ),
            (
                "ferrox_kv_block_tokens",
                "Positions per KV block.",
                get(&self.kv_block_tokens) as f64,
            ),
            (
                "ferrox_kv_cache_usage_ratio",
                "KV blocks held by active sequences over all blocks.",
                self.kv_usage_ratio(),
            ),
            (
                "ferrox_kv_cache_bytes",
                "Bytes reserved for the KV block pool.",
                get(&self.kv_bytes) as f64,
            ),
            (
                "ferrox_kv_bytes_per_position",
                "Bytes of sequence memory one position takes (every layer and store of the engine).",
                f64::from_bits(get(&self.kv_bytes_per_position)),
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        self.render_weights(&mut out);
        lock(&self.ttft).render(
            &mut out,
            "ferrox_time_to_first_token_seconds",
            "From request admission to the first generated token.",
            "",
        );
        lock(&self.itl).render(
            &mut out,
            "ferrox_inter_token_latency_seconds",
            "Between consecutive generated tokens of one sequence.",
            "",
        );
        if let Some(served) = self.served.get() {
            self.render_vllm(&mut out, served);
        }
        out
    }

    /// vLLM's names, types and labels (vllm/v1/metrics/loggers.py), one engine (`engine="0"`).
    fn render_vllm(&self, out: &mut String, served: &ServedModel) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let labels = format!("model_name=\"{}\",engine=\"0\"", escape_label(&served.name));
        let gauges = [
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                get(&self.active_sequences),
            ),
            (
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                get(&self.queue_depth),
            ),
            (
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                self.kv_usage_ratio(),
            ),
            // The name before vLLM 0.10, which older endpoint pickers scrape.
            (
                "vllm:gpu_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage. DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
                self.kv_usage_ratio(),
            ),
        ];
        for (name, help, value) in gauges {
            family(out, "gauge", name, help, &labels, value);
        }
        // An info metric: a gauge fixed at 1 whose labels carry the cache's configuration.
        // The endpoint picker's prefix-cache scorer reads block_size and num_gpu_blocks.
        let cache_labels = format!(
            "block_size=\"{}\",cache_dtype=\"{}\",enable_prefix_caching=\"True\",num_gpu_blocks=\"{}\",{labels}",
            self.kv_block_tokens.load(Ordering::Relaxed),
            served.cache_dtype,
            self.kv_blocks_total.load(Ordering::Relaxed),
        );
        family(
            out,
            "gauge",
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            &cache_labels,
            1.0,
        );
        let counters = [
            (
                "vllm:num_preemptions_total",
                "Cumulative number of preemption from the engine.",
                // Admission reserves a sequence's memory up front: nothing is ever preempted.
                0.0,
            ),
            (
                "vllm:prompt_tokens_total",
                "Number of prefill tokens processed.",
                get(&self.prompt_tokens),
            ),
            (
                "vllm:generation_tokens_total",
                "Number of generation tokens processed.",
                get(&self.generated_tokens),
            ),
            (
                "vllm:spec_decode_num_drafts_total",
                "Number of spec decoding drafts.",
                get(&self.spec_drafts),
            ),
            (
                "vllm:spec_decode_num_draft_tokens_total",
                "Number of draft tokens.",
                get(&self.spec_draft_tokens),
            ),
            (
                "vllm:spec_decode_num_accepted_tokens_total",
                "Number of accepted tokens.",
                get(&self.spec_accepted_tokens),
            ),
        ];
        for (name, help, value) in counters {
            family(out, "counter", name, help, &labels, value);
        }
        let name = "vllm:request_success_total";
        let _ = writeln!(
            out,
            "# HELP {name} Count of successfully processed requests.\n# TYPE {name} counter"
        );
        for (how, n) in Finished::ALL.iter().zip(&self.finished) {
            let _ = writeln!(
                out,
                "{name}{{{labels},finished_reason=\"{}\"}} {}",
                how.label(),
                n.load(Ordering::Relaxed)
            );
        }
        let histograms = [
            (
                &self.vllm_ttft,
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
            ),
            (
                &self.vllm_itl,
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
            ),
            // vLLM's older name for the same measurement.
            (
                &self.vllm_itl,
                "vllm:time_per_output_token_seconds",
                "Histogram of time per output token in seconds. DEPRECATED: Use vllm:inter_token_latency_seconds instead.",
            ),
            (
                &self.e2e,
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
            ),
            (
                &self.queue_time,
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
            ),
        ];
        for (histogram, name, help) in histograms {
            lock(histogram).render(out, name, help, &labels);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample: its metric name, labels and value.
    type Sample = (String, Vec<(String, String)>, f64);

    /// One sample line of the text format, its label values unescaped. Panics on anything
    /// the format does not allow.
    fn parse_sample(line: &str) -> Sample {
        let c: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < c.len() && c[i] != '{' && c[i] != ' ' {
            i += 1;
        }
        let name: String = c[..i].iter().collect();
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "{line}"
        );
        let mut labels = Vec::new();
        if c.get(i) == Some(&'{') {
            i += 1;
            while c[i] != '}' {
                let start = i;
                while c[i] != '=' {
                    i += 1;
                }
                let key: String = c[start..i].iter().collect();
                assert_eq!(c[i + 1], '"', "{line}");
                i += 2;
                let mut value = String::new();
                while c[i] != '"' {
                    if c[i] == '\\' {
                        i += 1;
                        value.push(match c[i] {
                            '\\' => '\\',
                            '"' => '"',
                            'n' => '\n',
                            e => panic!("bad escape \\{e} in {line}"),
                        });
                    } else {
                        assert_ne!(c[i], '\n', "{line}");
                        value.push(c[i]);
                    }
                    i += 1;
                }
                labels.push((key, value));
                i += 1;
                if c[i] == ',' {
                    i += 1;
                }
            }
            i += 1;
        }
        let rest: String = c[i..].iter().collect();
        let value = rest
            .strip_prefix(' ')
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no value in {line}"));
        (name, labels, value)
    }

    fn samples(text: &str) -> Vec<Sample> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .map(parse_sample)
            .collect()
    }

    fn label<'a>(labels: &'a [(String, String)], key: &str) -> Option<&'a str> {
        labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn value(samples: &[Sample], name: &str) -> f64 {
        samples
            .iter()
            .find(|(n, _, _)| n == name)
            .unwrap_or_else(|| panic!("{name} missing"))
            .2
    }

    #[test]
    fn vllm_names_appear_once_the_model_is_named() {
        let m = Metrics::default();
        let before = m.render(false);
        assert!(!before.contains("vllm:"), "{before}");
        samples(&before);
        m.set_served(ServedModel {
            name: "gemma".into(),
            cache_dtype: "float16".into(),
        });
        let after = m.render(true);
        assert!(after.starts_with(&before.replace("ferrox_ready 0", "ferrox_ready 1")));
        for name in [
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:gpu_cache_usage_perc",
            "vllm:cache_config_info",
            "vllm:num_preemptions_total",
            "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total",
            "vllm:spec_decode_num_drafts_total",
            "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total",
            "vllm:request_success_total",
            "vllm:time_to_first_token_seconds",
            "vllm:inter_token_latency_seconds",
            "vllm:time_per_output_token_seconds",
            "vllm:e2e_request_latency_seconds",
            "vllm:request_queue_time_seconds",
        ] {
            assert_eq!(
                after.matches(&format!("# TYPE {name} ")).count(),
                1,
                "{name}"
            );
        }
    }

    #[test]
    fn vllm_series_carry_the_model_and_the_measurements() {
        let m = Metrics::default();
        m.set_served(ServedModel {
            name: "gemma-3-270m-q4_k_m.gguf".into(),
            cache_dtype: "float16".into(),
        });
        m.kv_blocks_total.store(40, Ordering::Relaxed);
        m.kv_block_tokens.store(16, Ordering::Relaxed);
        m.kv_blocks_used.store(10, Ordering::Relaxed);
        m.active_sequences.store(2, Ordering::Relaxed);
        m.queue_depth.store(3, Ordering::Relaxed);
        m.prompt_tokens.store(100, Ordering::Relaxed);
        m.generated_tokens.store(7, Ordering::Relaxed);
        m.observe_ttft(Duration::from_millis(30));
        m.observe_itl(Duration::from_millis(20));
        m.observe_itl(Duration::from_millis(200));
        m.observe_queue_time(Duration::from_millis(400));
        m.observe_finished(Finished::Stop, Duration::from_millis(700));
        m.observe_finished(Finished::Length, Duration::from_secs(3));
        m.observe_finished(Finished::Length, Duration::from_secs(9000));
        let text = m.render(true);
        let all = samples(&text);
        for (name, labels, _) in all.iter().filter(|(n, _, _)| n.starts_with("vllm:")) {
            assert_eq!(
                label(labels, "model_name"),
                Some("gemma-3-270m-q4_k_m.gguf"),
                "{name}"
            );
            assert_eq!(label(labels, "engine"), Some("0"), "{name}");
        }
        assert_eq!(value(&all, "vllm:num_requests_running"), 2.0);
        assert_eq!(value(&all, "vllm:num_requests_waiting"), 3.0);
        assert_eq!(value(&all, "vllm:kv_cache_usage_perc"), 0.25);
        assert_eq!(value(&all, "vllm:gpu_cache_usage_perc"), 0.25);
        assert_eq!(value(&all, "vllm:prompt_tokens_total"), 100.0);
        assert_eq!(value(&all, "vllm:generation_tokens_total"), 7.0);
        assert_eq!(value(&all, "vllm:num_preemptions_total"), 0.0);
        let info = all
            .iter()
            .find(|(n, _, _)| n == "vllm:cache_config_info")
            .unwrap();
        assert_eq!(info.2, 1.0);
        assert_eq!(label(&info.1, "block_size"), Some("16"));
        assert_eq!(label(&info.1, "num_gpu_blocks"), Some("40"));
        assert_eq!(label(&info.1, "cache_dtype"), Some("float16"));
        let success: Vec<(&str, f64)> = all
            .iter()
            .filter(|(n, _, _)| n == "vllm:request_success_total")
            .map(|(_, l, v)| (label(l, "finished_reason").unwrap(), *v))
            .collect();
        assert_eq!(success, [("stop", 1.0), ("length", 2.0), ("abort", 0.0)]);

        // Histograms: cumulative buckets, +Inf equal to _count, vLLM's bounds.
        let buckets = |name: &str| -> Vec<(String, f64)> {
            all.iter()
                .filter(|(n, _, _)| *n == format!("{name}_bucket"))
                .map(|(_, l, v)| (label(l, "le").unwrap().to_string(), *v))
                .collect()
        };
        let e2e = buckets("vllm:e2e_request_latency_seconds");
        assert_eq!(e2e.len(), VLLM_REQUEST_LATENCY_BOUNDS.len() + 1);
        assert!(e2e.windows(2).all(|w| w[0].1 <= w[1].1));
        assert_eq!(e2e.iter().find(|(le, _)| le == "0.8").unwrap().1, 1.0);
        assert_eq!(e2e.iter().find(|(le, _)| le == "5").unwrap().1, 2.0);
        assert_eq!(e2e.iter().find(|(le, _)| le == "7680").unwrap().1, 2.0);
        assert_eq!(e2e.last().unwrap(), &("+Inf".to_string(), 3.0));
        assert_eq!(value(&all, "vllm:e2e_request_latency_seconds_count"), 3.0);
        assert!((value(&all, "vllm:e2e_request_latency_seconds_sum") - 9003.7).abs() < 1e-6);
        assert_eq!(value(&all, "vllm:request_queue_time_seconds_count"), 1.0);
        let ttft = buckets("vllm:time_to_first_token_seconds");
        assert_eq!(ttft.len(), VLLM_TTFT_BOUNDS.len() + 1);
        assert_eq!(ttft.iter().find(|(le, _)| le == "0.02").unwrap().1, 0.0);
        assert_eq!(ttft.iter().find(|(le, _)| le == "0.04").unwrap().1, 1.0);
        // The two inter-token names report the same observations.
        let itl = buckets("vllm:inter_token_latency_seconds");
        assert_eq!(itl, buckets("vllm:time_per_output_token_seconds"));
        assert_eq!(itl.iter().find(|(le, _)| le == "0.025").unwrap().1, 1.0);
        assert_eq!(itl.last().unwrap().1, 2.0);
        // ferrox's own histograms keep their bounds and see the same observations.
        assert_eq!(value(&all, "ferrox_inter_token_latency_seconds_count"), 2.0);
        assert!(text.contains("ferrox_time_to_first_token_seconds_bucket{le=\"0.05\"} 1\n"));
    }

    #[test]
    fn model_names_are_escaped_in_labels() {
        assert_eq!(escape_label(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape_label("x\ny"), r"x\ny");
        let m = Metrics::default();
        let name = "my \"best\" model\\v2\nnew";
        m.set_served(ServedModel {
            name: name.into(),
            cache_dtype: "float32".into(),
        });
        m.observe_finished(Finished::Abort, Duration::from_secs(1));
        let text = m.render(true);
        assert!(
            text.contains(
                r#"vllm:num_requests_running{model_name="my \"best\" model\\v2\nnew",engine="0"} 0"#
            ),
            "{text}"
        );
        let vllm: Vec<_> = samples(&text)
            .into_iter()
            .filter(|(n, _, _)| n.starts_with("vllm:"))
            .collect();
        assert!(vllm.len() > 100);
        for (n, labels, _) in &vllm {
            assert_eq!(label(labels, "model_name"), Some(name), "{n}");
        }
    }
}
