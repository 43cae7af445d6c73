#!/usr/bin/env python3
"""Load benchmark for `ferrox serve` (and optionally llama-server on the same file).

For each concurrency level (default 1, 4, 8, 16) it runs that many clients at once, each
sending --requests streaming /v1/completions requests one after another (distinct prompts,
greedy, --max-tokens tokens with the end-of-generation tokens banned so every request
generates the same number), and reports the aggregate generated tokens per second (all
tokens over the wall time of the level) and the time to first token (mean, p50, p90).

    scripts/serve-load.py                                   # ferrox only, default model
    scripts/serve-load.py --llama-server /work/ref/build/bin/llama-server
    scripts/serve-load.py --url http://127.0.0.1:8080       # an already running server
    scripts/serve-load.py --llama-server PATH --markdown docs/BENCHMARKS-SERVE.md

Servers are started on free loopback ports with --parallel equal to the highest
concurrency and --ctx-size per sequence (llama-server gets ctx-size x parallel, which it
splits across its slots). Only the Python standard library is used. This is a benchmark,
not a test: it asserts nothing.
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = Path(os.environ.get("FERROX_MODELS_DIR", Path.home() / ".cache/ferrox/models")) / "gemma-3-270m-q4_k_m.gguf"
TOPICS = ["a lighthouse keeper", "a lost robot", "the first rain on Mars", "a chess tournament", "an old bridge",
          "a bakery at dawn", "a migrating whale", "a broken clock", "a desert caravan", "a quiet library",
          "a mountain rescue", "a paper boat", "a city in fog", "a garden of glass", "a violin maker", "a comet"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url, timeout=300):
    u = urllib.parse.urlparse(url)
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not become healthy in {timeout} s")


def one_request(url, prompt, max_tokens, ban, api_key, model=None):
    """Streams one completion; returns (ttft seconds, generated tokens, total seconds).
    `model` names the model in the request (routers need it to pick workers)."""
    u = urllib.parse.urlparse(url)
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "logit_bias": {str(t): -100 for t in ban}}
    if model:
        body["model"] = model
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    start = time.monotonic()
    conn.request("POST", "/v1/completions", json.dumps(body), headers)
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    first = None
    tokens = 0
    chunks = 0
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            break
        msg = json.loads(data)
        if "error" in msg:
            raise RuntimeError(f"stream error: {msg['error']}")
        for c in msg.get("choices") or []:
            if c.get("text"):
                chunks += 1
                if first is None:
                    first = time.monotonic()
        if msg.get("usage"):
            tokens = msg["usage"]["completion_tokens"]
    end = time.monotonic()
    conn.close()
    return (first or end) - start, tokens or chunks, end - start


def run_level(url, concurrency, requests, max_tokens, ban, api_key, prompt_words, level_tag, model=None):
    results = []
    errors = []
    lock = threading.Lock()
    barrier = threading.Barrier(concurrency)

    def client(i):
        barrier.wait()
        for r in range(requests):
            topic = TOPICS[(i + r) % len(TOPICS)]
            filler = " ".join(f"detail{k}" for k in range(prompt_words))
            prompt = f"[{level_tag}-{i}-{r}] Write a long story about {topic}. Background notes: {filler}.\n\nStory:"
            try:
                res = one_request(url, prompt, max_tokens, ban, api_key, model)
                with lock:
                    results.append(res)
            except Exception as e:  # noqa: BLE001
                with lock:
                    errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    ttfts = sorted(r[0] for r in results)
    total = sum(r[1] for r in results)

    def pct(p):
        return ttfts[min(len(ttfts) - 1, int(p * len(ttfts)))] if ttfts else float("nan")

    return {
        "concurrency": concurrency,
        "requests": len(results),
        "errors": errors,
        "generated_tokens": total,
        "wall_s": wall,
        "tokens_per_s": total / wall if wall > 0 else 0.0,
        "ttft_mean_s": statistics.fmean(ttfts) if ttfts else float("nan"),
        "ttft_p50_s": pct(0.5),
        "ttft_p90_s": pct(0.9),
    }


def bench(name, url, args, api_key, model=None):
    print(f"\n== {name} ({url})", flush=True)
    one_request(url, "Warm-up:", 4, args.ban, api_key, model)
    rows = []
    print(f"{'conc':>5} {'reqs':>5} {'tokens':>7} {'wall s':>8} {'tok/s':>8} {'TTFT mean':>10} {'p50':>7} {'p90':>7}")
    for c in args.concurrency:
        row = run_level(url, c, args.requests, args.max_tokens, args.ban, api_key, args.prompt_words, f"{name}-{c}",
                        model)
        rows.append(row)
        print(f"{c:>5} {row['requests']:>5} {row['generated_tokens']:>7} {row['wall_s']:>8.2f} {row['tokens_per_s']:>8.1f} "
              f"{row['ttft_mean_s']:>10.3f} {row['ttft_p50_s']:>7.3f} {row['ttft_p90_s']:>7.3f}", flush=True)
        for e in row["errors"][:3]:
            print(f"      error: {e}")
    return rows


def start(cmd, log_path):
    log = open(log_path, "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def stop(proc):
    if proc and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default=str(DEFAULT_MODEL))
    p.add_argument("--ferrox", default=str(ROOT / "target/release/ferrox"), help="the ferrox binary (cargo build --release)")
    p.add_argument("--llama-server", help="also run this llama-server binary on the same file")
    p.add_argument("--url", help="benchmark an already running server instead of starting ferrox")
    p.add_argument("--api-key", default=os.environ.get("FERROX_API_KEY"))
    p.add_argument("--concurrency", default="1,4,8,16", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--requests", type=int, default=2, help="requests per client at each level")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-words", type=int, default=40, help="filler words per prompt (about 3 tokens each)")
    p.add_argument("--ctx-size", type=int, default=1024, help="positions per sequence")
    p.add_argument("-t", "--threads", type=int, default=0, help="threads (0: the servers' default)")
    p.add_argument("--ban", default="1,106", type=lambda s: [int(x) for x in s.split(",") if x],
                   help="token ids banned with logit_bias so requests run to max_tokens (Gemma: <eos>, <end_of_turn>)")
    p.add_argument("--json", help="also write the results to this JSON file")
    p.add_argument("--markdown", help="also write the results as a generated Markdown page to this file")
    args = p.parse_args()

    parallel = max(args.concurrency)
    results = {}
    if args.url:
        results["server"] = bench("server", args.url, args, args.api_key)
    else:
        port = free_port()
        cmd = [args.ferrox, "serve", "-m", args.model, "--port", str(port), "--parallel", str(parallel),
               "--ctx-size", str(args.ctx_size)]
        if args.threads:
            cmd += ["-t", str(args.threads)]
        proc = start(cmd, "/tmp/serve-load-ferrox.log")
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url)
            results["ferrox"] = bench("ferrox", url, args, None)
        finally:
            stop(proc)
    if args.llama_server:
        port = free_port()
        cmd = [args.llama_server, "-m", args.model, "--port", str(port), "--host", "127.0.0.1", "--parallel", str(parallel),
               "-c", str(args.ctx_size * parallel), "--no-webui"]
        if args.threads:
            cmd += ["-t", str(args.threads)]
        env_lib = str(Path(args.llama_server).resolve().parent)
        os.environ["LD_LIBRARY_PATH"] = env_lib + ":" + os.environ.get("LD_LIBRARY_PATH", "")
        proc = start(cmd, "/tmp/serve-load-llama.log")
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url)
            results["llama-server"] = bench("llama-server", url, args, None)
        finally:
            stop(proc)
    if "ferrox" in results and "llama-server" in results:
        print("\nferrox / llama-server aggregate tokens/s:")
        for a, b in zip(results["ferrox"], results["llama-server"]):
            print(f"  concurrency {a['concurrency']:>2}: {a['tokens_per_s']:.1f} / {b['tokens_per_s']:.1f} = "
                  f"{a['tokens_per_s'] / max(b['tokens_per_s'], 1e-9):.2f}x;  TTFT p50 {a['ttft_p50_s']:.3f} / {b['ttft_p50_s']:.3f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if args.markdown:
        Path(args.markdown).write_text(markdown(results, args))


def markdown(results, args):
    """The results as a page that says how it was made (regenerated, never edited)."""
    def sh(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
        except OSError:
            return "unknown"
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), "unknown")
    lines = [
        "# Serving benchmark",
        "",
        f"Generated by `scripts/serve-load.py --markdown` on {time.strftime('%Y-%m-%d')}; do not edit by hand.",
        f"Model `{Path(args.model).name}`; each level runs that many concurrent clients, each sending "
        f"{args.requests} streaming `/v1/completions` requests in turn (distinct prompts of about "
        f"{args.prompt_words * 3} tokens, greedy, {args.max_tokens} generated tokens with end-of-generation banned). "
        "Throughput is all generated tokens over the level's wall time; TTFT is per request.",
        "",
        f"- CPU: {cpu}, {os.cpu_count()} cores; servers at their default thread count, "
        f"`--parallel {max(args.concurrency)}`, {args.ctx_size} positions per sequence",
        f"- ferrox: {sh(['git', '-C', str(ROOT), 'rev-parse', '--short', 'HEAD'])}",
        "",
    ]
    for name, rows in results.items():
        lines += [f"## {name}", "", "| concurrency | requests | tokens | wall s | tokens/s | TTFT mean s | p50 | p90 |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in rows:
            lines.append(f"| {r['concurrency']} | {r['requests']} | {r['generated_tokens']} | {r['wall_s']:.2f} | "
                         f"{r['tokens_per_s']:.1f} | {r['ttft_mean_s']:.3f} | {r['ttft_p50_s']:.3f} | {r['ttft_p90_s']:.3f} |")
        base = rows[0]["tokens_per_s"] if rows else 0
        lines += ["", "Throughput over concurrency 1: " + ", ".join(
            f"{r['concurrency']}: {r['tokens_per_s'] / max(base, 1e-9):.2f}x" for r in rows), ""]
    if "ferrox" in results and "llama-server" in results:
        lines += ["## ferrox / llama-server", "", "| concurrency | tokens/s | TTFT p50 s |", "| ---: | ---: | ---: |"]
        for a, b in zip(results["ferrox"], results["llama-server"]):
            lines.append(f"| {a['concurrency']} | {a['tokens_per_s'] / max(b['tokens_per_s'], 1e-9):.2f}x | "
                         f"{a['ttft_p50_s']:.3f} / {b['ttft_p50_s']:.3f} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
