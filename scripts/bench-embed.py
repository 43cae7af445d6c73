#!/usr/bin/env python3
"""Embedding throughput of `ferrox serve --embeddings` beside `llama-server --embeddings`
on the same file, and the time to swap models under `--models-max 1`.

    scripts/bench-embed.py --llama-server /work/ref/build/bin/llama-server \\
        --markdown docs/BENCHMARKS-EMBED.md

Throughput: --texts texts of about --words words each (distinct, deterministic), sent as
/v1/embeddings requests of --batch inputs by --concurrency clients at once; the two servers
run alternately within each of --reps repetitions (the median is reported) with mean
pooling, the same threads, --parallel sequences and context per sequence. The embeddings
of both are compared (the smallest cosine similarity over the texts): each server's batched
answers against its answers for each text alone, and the two servers' answers alone.

Swap: both servers (llama-server too, where its router mode runs) serve a directory holding
Gemma-3-270M and Qwen2.5-Coder-0.5B with --models-max 1; one-token completions alternate
between them, so every request loads its model; the mean time per request is reported.

Only the Python standard library is used. A benchmark, not a test: it asserts nothing.
"""

import argparse
import http.client
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("FERROX_MODELS_DIR", Path.home() / ".cache/ferrox/models"))
QWEN = MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
GEMMA = MODELS / "gemma-3-270m-q4_k_m.gguf"
WORDS = ("river stone garden window market letter engine silver morning harbor lantern forest "
         "winter paper orbit signal valley copper thunder meadow bridge compass glacier velvet").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None, timeout=600):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, json.dumps(body) if body is not None else None,
              {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    return r.status, data


def wait_healthy(port, proc, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server on port {port} exited ({proc.returncode})")
        try:
            if request(port, "GET", "/health", timeout=5)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"port {port} did not become healthy in {timeout} s")


def start(cmd, port):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_healthy(port, proc)
    return proc


def texts(n, words):
    out = []
    for i in range(n):
        out.append(" ".join(WORDS[(i * 7 + j * (i % 5 + 1)) % len(WORDS)] for j in range(words)) + f" #{i}")
    return out


def embed_all(port, inputs, batch, concurrency):
    """Embeds every input (requests of `batch` inputs, `concurrency` at once): (seconds,
    prompt tokens, the vectors in order)."""
    chunks = [(i, inputs[i:i + batch]) for i in range(0, len(inputs), batch)]
    vectors = [None] * len(inputs)
    tokens = [0]
    lock = threading.Lock()
    errors = []

    def worker():
        while True:
            with lock:
                if not chunks:
                    return
                start, chunk = chunks.pop(0)
            status, data = request(port, "POST", "/v1/embeddings", {"input": chunk, "encoding_format": "float"})
            if status != 200:
                errors.append(data[:300])
                return
            reply = json.loads(data)
            with lock:
                tokens[0] += reply["usage"]["prompt_tokens"]
                for item in reply["data"]:
                    vectors[start + item["index"]] = item["embedding"]

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"embedding failed: {errors[0]!r}")
    return time.monotonic() - started, tokens[0], vectors


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def throughput(args):
    inputs = texts(args.texts, args.words)
    servers = []
    port = free_port()
    servers.append(("ferrox", port, [args.ferrox, "serve", "-m", str(args.model), "--embeddings", "--pooling", "mean",
                                     "-t", str(args.threads), "-c", str(args.ctx), "--parallel", str(args.parallel),
                                     "--port", str(port)]))
    if args.llama_server:
        port = free_port()
        servers.append(("llama-server", port, [args.llama_server, "-m", str(args.model), "--embeddings", "--pooling", "mean",
                                               "-t", str(args.threads), "-c", str(args.ctx * args.parallel), "-np", str(args.parallel),
                                               "--port", str(port)]))
    procs = {name: start(cmd, port) for name, port, cmd in servers}
    results = {name: [] for name, _, _ in servers}
    vectors = {}
    solo = {}
    try:
        for name, port, _ in servers:  # warm-up
            embed_all(port, inputs[: args.batch], args.batch, 1)
        for rep in range(args.reps):
            for name, port, _ in servers:
                seconds, tokens, vecs = embed_all(port, inputs, args.batch, args.concurrency)
                results[name].append((seconds, tokens))
                vectors[name] = vecs
                print(f"rep {rep + 1} {name}: {len(inputs) / seconds:.1f} texts/s, {tokens / seconds:.0f} tokens/s", file=sys.stderr)
        # Each text alone, one request at a time: what the batched answers should equal.
        for name, port, _ in servers:
            solo[name] = embed_all(port, inputs, 1, 1)[2]
    finally:
        for p in procs.values():
            p.terminate()
            p.wait()
    rows = []
    for name, runs in results.items():
        seconds = statistics.median(s for s, _ in runs)
        tokens = runs[0][1]
        rows.append((name, len(inputs) / seconds, tokens / seconds, tokens))
    # The smallest cosine similarity of each server's batched answers to its answers one text
    # at a time, and of the two servers' answers one text at a time.
    agreement = {name: min(cosine(a, b) for a, b in zip(vectors[name], solo[name])) for name in vectors}
    if "llama-server" in solo:
        agreement["ferrox alone vs llama-server alone"] = min(
            cosine(a, b) for a, b in zip(solo["ferrox"], solo["llama-server"]))
    return rows, agreement


def swap_time(args, binary, router_cmd):
    with tempfile.TemporaryDirectory() as d:
        os.symlink(GEMMA, Path(d) / "gemma.gguf")
        os.symlink(QWEN, Path(d) / "qwen.gguf")
        port = free_port()
        proc = start(router_cmd(binary, d, port), port)
        times = []
        try:
            for i in range(args.swaps):
                model = "gemma" if i % 2 == 0 else "qwen"
                started = time.monotonic()
                status, data = request(port, "POST", "/v1/completions",
                                       {"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0})
                if status != 200:
                    return None
                times.append(time.monotonic() - started)
        finally:
            proc.terminate()
            proc.wait()
        return statistics.mean(times[1:])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=QWEN)
    p.add_argument("--ferrox", default=str(ROOT / "target/release/ferrox"))
    p.add_argument("--llama-server")
    p.add_argument("--texts", type=int, default=64)
    p.add_argument("--words", type=int, default=80)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--swaps", type=int, default=7)
    p.add_argument("--markdown", type=Path)
    args = p.parse_args()

    rows, agreement = throughput(args)
    ferrox_swap = swap_time(args, args.ferrox, lambda b, d, port: [
        b, "serve", "--models-dir", d, "--models-max", "1", "-t", str(args.threads), "-c", "512", "--port", str(port)])
    llama_swap = None
    if args.llama_server:
        llama_swap = swap_time(args, args.llama_server, lambda b, d, port: [
            b, "--models-dir", d, "--models-max", "1", "-t", str(args.threads), "-c", "512", "--port", str(port)])

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    lines = [
        "# Embeddings and model swaps",
        "",
        f"Made by `scripts/bench-embed.py` on {cpu}, {args.threads} threads, {time.strftime('%Y-%m-%d')}.",
        "",
        f"## Throughput: {args.model.name}, mean pooling",
        "",
        f"{args.texts} texts of {args.words} words, /v1/embeddings requests of {args.batch} inputs, "
        f"{args.concurrency} clients at once, --parallel {args.parallel}, {args.ctx} positions per sequence; "
        f"the servers alternate within each of {args.reps} repetitions (medians).",
        "",
        "| server | texts/s | tokens/s | prompt tokens |",
        "|---|---|---|---|",
    ]
    base = next((r for r in rows if r[0] == "llama-server"), None)
    for name, tps, toks, n in rows:
        ratio = f" ({toks / base[2]:.2f}x)" if base and name != "llama-server" else ""
        lines.append(f"| {name} | {tps:.1f} | {toks:.0f}{ratio} | {n} |")
    lines += ["", "Smallest cosine similarity over the texts:", "", "| compared | cosine |", "|---|---|"]
    for name, c in agreement.items():
        label = name if " vs " in name else f"{name} batched vs the same text alone"
        lines.append(f"| {label} | {c:.6f} |")
    lines += ["", "## Model swap under --models-max 1", "",
              f"Gemma-3-270M and Qwen2.5-Coder-0.5B in one directory, one-token completions alternating "
              f"between them ({args.swaps} requests, the first left out): each request loads its model.", "",
              "| server | mean time per request (s) |", "|---|---|",
              f"| ferrox | {ferrox_swap:.2f} |"]
    if args.llama_server:
        lines.append(f"| llama-server | {llama_swap:.2f} |" if llama_swap else "| llama-server | (its router mode did not run) |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
