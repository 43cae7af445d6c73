//! Server metrics in Prometheus' text exposition format (`GET /metrics`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

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

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

const TTFT_BOUNDS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0];
const ITL_BOUNDS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];

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
    pub kv_bytes_per_position: AtomicU64,
    pub steps: AtomicU64,
    ttft: Mutex<Histogram>,
    itl: Mutex<Histogram>,
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
            ttft: Mutex::new(Histogram::new(TTFT_BOUNDS)),
            itl: Mutex::new(Histogram::new(ITL_BOUNDS)),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Metrics {
    pub fn set_kv_usage(&self, usage: ferrox_core::BlockUsage) {
        self.kv_blocks_used
            .store(usage.used as u64, Ordering::Relaxed);
        self.kv_blocks_cached
            .store(usage.cached as u64, Ordering::Relaxed);
    }

    pub fn count_request(&self, route: &str, status: u16) {
        *lock(&self.requests)
            .entry((route.to_string(), status))
            .or_default() += 1;
    }

    pub fn observe_ttft(&self, d: Duration) {
        lock(&self.ttft).observe(d.as_secs_f64());
    }

    pub fn observe_itl(&self, d: Duration) {
        lock(&self.itl).observe(d.as_secs_f64());
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
                if total == 0 {
                    0.0
                } else {
                    used as f64 / total as f64
                },
            ),
            (
                "ferrox_kv_cache_bytes",
                "Bytes reserved for the KV block pool.",
                get(&self.kv_bytes) as f64,
            ),
            (
                "ferrox_kv_bytes_per_position",
                "Bytes of sequence memory one position takes (every layer and store of the engine).",
                get(&self.kv_bytes_per_position) as f64,
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        lock(&self.ttft).render(
            &mut out,
            "ferrox_time_to_first_token_seconds",
            "From request admission to the first generated token.",
        );
        lock(&self.itl).render(
            &mut out,
            "ferrox_inter_token_latency_seconds",
            "Between consecutive generated tokens of one sequence.",
        );
        out
    }
}
