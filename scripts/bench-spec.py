#!/usr/bin/env python3
"""Speculative decoding, ferrox against llama.cpp, on one machine.

Two workloads, greedy, -n tokens each (default 256):
  edit   prompts holding a source file and asking for it back with one small change (the
         answer repeats most of the prompt: prompt lookup's best case);
  free   free writing (little to look up: what speculation costs when it cannot help).

Engines, measured alternately prompt by prompt (each repetition runs every engine once on
each prompt, so slow and fast moments of a shared machine fall on all of them):
  default model (Gemma-3-270M Q4_K_M): ferrox plain, ferrox --spec-type ngram,
      llama-server plain, llama-server --spec-type ngram-simple (and ngram-map-k);
  Qwen2.5-Coder-1.5B-Instruct with the 0.5B as draft (edit workload): ferrox plain,
      ferrox -md, llama-server plain, llama-server -md (the same --draft-max/--draft-p-min).

Decode speed is each engine's own figure for the generated tokens after the prompt (ferrox
run --json's timings.predicted_per_second, llama-server's timings.predicted_per_second),
with the drafted and accepted token counts both report. Results go to stdout as Markdown
(--out FILE writes them there too).

usage: scripts/bench-spec.py [--threads 2] [--reps 2] [-n 256] [--no-qwen] [--out FILE]
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("FERROX_MODELS_DIR", Path.home() / ".cache/ferrox/models"))
LLAMA_BIN = Path(os.environ.get("LLAMA_BIN", "/work/ref/build/bin"))

PY_FILE = '''import json
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
'''

RS_FILE = '''use std::collections::HashMap;

/// Counts the words of a text.
pub fn word_counts(text: &str) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for word in text.split_whitespace() {
        let word = word.trim_matches(|c: char| !c.is_alphanumeric()).to_lowercase();
        if word.is_empty() {
            continue;
        }
        *counts.entry(word).or_insert(0) += 1;
    }
    counts
}

/// The `n` most frequent words, most frequent first.
pub fn top_words(counts: &HashMap<String, usize>, n: usize) -> Vec<(String, usize)> {
    let mut pairs: Vec<(String, usize)> = counts.iter().map(|(w, c)| (w.clone(), *c)).collect();
    pairs.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    pairs.truncate(n);
    pairs
}

fn main() {
    let text = std::fs::read_to_string("input.txt").expect("read input.txt");
    let counts = word_counts(&text);
    for (word, count) in top_words(&counts, 10) {
        println!("{word}: {count}");
    }
}
'''

JS_FILE = '''const express = require("express");
const app = express();
app.use(express.json());

const todos = [];
let nextId = 1;

app.get("/todos", (req, res) => {
  res.json(todos);
});

app.post("/todos", (req, res) => {
  const todo = { id: nextId++, title: req.body.title, done: false };
  todos.push(todo);
  res.status(201).json(todo);
});

app.put("/todos/:id", (req, res) => {
  const todo = todos.find((t) => t.id === Number(req.params.id));
  if (!todo) {
    return res.status(404).json({ error: "not found" });
  }
  todo.done = Boolean(req.body.done);
  res.json(todo);
});

app.listen(3000, () => {
  console.log("listening on port 3000");
});
'''


def edit_prompt(lang, source, change):
    return (
        f"Here is a file:\n\n```{lang}\n{source}```\n\n"
        f"The same file, complete, with {change}:\n\n```{lang}\n"
    )


EDIT = [
    edit_prompt("python", PY_FILE, "the function `total` renamed to `order_total`"),
    edit_prompt("rust", RS_FILE, "`top_words` taking `n: u32` instead of `n: usize`"),
    edit_prompt("javascript", JS_FILE, "the port changed from 3000 to 8080"),
]
FREE = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.\n\n",
    "Explain, in a few paragraphs, why the sky is blue and why sunsets are red.\n\n",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    def __init__(self, name, args, threads):
        self.name = name
        self.port = free_port()
        cmd = [str(LLAMA_BIN / "llama-server"), "--host", "127.0.0.1", "--port", str(self.port),
               "-t", str(threads), "-c", "4096", "-np", "1", "--no-webui"] + args
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 180
        while time.time() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"{name}: llama-server exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                pass
            time.sleep(0.5)
        sys.exit(f"{name}: llama-server did not become ready")

    def generate(self, prompt, n):
        body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0,
                           "cache_prompt": False}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=900) as r:
            out = json.load(r)
        t = out["timings"]
        return {"tps": t["predicted_per_second"], "n": t["predicted_n"],
                "drafted": t.get("draft_n", 0), "accepted": t.get("draft_n_accepted", 0),
                "text": out["content"]}

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


class FerroxRun:
    def __init__(self, name, binary, model, args, threads):
        self.name, self.binary, self.model, self.args, self.threads = name, binary, model, args, threads

    def generate(self, prompt, n):
        path = Path("/tmp/ferrox-bench-spec-prompt.txt")
        path.write_text(prompt)
        cmd = [str(self.binary), "run", "-m", str(self.model), "-f", str(path), "-n", str(n),
               "--temp", "0", "-t", str(self.threads), "--json"] + self.args
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"{self.name}: {out.stderr[-2000:]}")
        d = json.loads(out.stdout)
        t = d["timings"]
        return {"tps": t["predicted_per_second"], "n": t["predicted_n"],
                "drafted": t["draft_n"], "accepted": t["draft_n_accepted"], "text": d["text"]}

    def stop(self):
        pass


def measure(engines, workloads, n, reps):
    """results[workload][engine] = list of runs; engines alternate prompt by prompt."""
    results = {w: {e.name: [] for e in engines} for w in workloads}
    for rep in range(reps):
        for w, prompts in workloads.items():
            for i, prompt in enumerate(prompts):
                for e in engines:
                    r = e.generate(prompt, n)
                    r["prompt"] = i
                    results[w][e.name].append(r)
                    print(f"  rep {rep + 1} {w}[{i}] {e.name}: {r['tps']:.2f} t/s, {r['n']} tokens, "
                          f"drafted {r['drafted']}, accepted {r['accepted']}", file=sys.stderr)
    return results


def identical(results, plain, other):
    """How many of `other`'s runs gave the same text as `plain` on the same prompt."""
    same = total = 0
    for by_engine in results.values():
        texts = {r["prompt"]: r["text"] for r in by_engine[plain]}
        for r in by_engine[other]:
            total += 1
            same += r["text"] == texts[r["prompt"]]
    return f"{other}: the same text as {plain} in {same} of {total} runs"


def table(title, results, baseline_of):
    lines = [f"### {title}", "",
             "| workload | engine | decode t/s (mean over prompts) | vs its plain | drafted | accepted | acceptance |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for w, by_engine in results.items():
        means = {e: statistics.mean(r["tps"] for r in runs) for e, runs in by_engine.items()}
        for e, runs in by_engine.items():
            drafted = sum(r["drafted"] for r in runs)
            accepted = sum(r["accepted"] for r in runs)
            base = baseline_of.get(e)
            ratio = f"{means[e] / means[base]:.2f}x" if base else "1.00x"
            acc = f"{100 * accepted / drafted:.0f}%" if drafted else "-"
            lines.append(f"| {w} | {e} | {means[e]:.2f} | {ratio} | {drafted} | {accepted} | {acc} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--no-qwen", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    binary = Path(os.environ.get("FERROX_BIN", ROOT / "target/release/ferrox"))
    if not binary.exists():
        sys.exit(f"{binary} is missing: cargo build --release (or set FERROX_BIN)")
    t = args.threads
    gemma = MODELS / "gemma-3-270m-q4_k_m.gguf"
    out = [f"Machine: {os.cpu_count()} cores, {t} threads per engine; -n {args.n}, greedy; "
           f"{args.reps} repetitions, engines alternated prompt by prompt.", ""]

    print("default model ...", file=sys.stderr)
    engines = [
        FerroxRun("ferrox plain", binary, gemma, [], t),
        FerroxRun("ferrox ngram", binary, gemma, ["--spec-type", "ngram"], t),
        LlamaServer("llama.cpp plain", ["-m", str(gemma)], t),
        LlamaServer("llama.cpp ngram-simple", ["-m", str(gemma), "--spec-type", "ngram-simple"], t),
        LlamaServer("llama.cpp ngram-map-k", ["-m", str(gemma), "--spec-type", "ngram-map-k"], t),
    ]
    try:
        res = measure(engines, {"edit": EDIT, "free": FREE}, args.n, args.reps)
    finally:
        for e in engines:
            e.stop()
    base = {"ferrox ngram": "ferrox plain", "llama.cpp ngram-simple": "llama.cpp plain",
            "llama.cpp ngram-map-k": "llama.cpp plain"}
    out.append(table("Prompt lookup, Gemma-3-270M Q4_K_M", res, base))
    out.append("\n" + identical(res, "ferrox plain", "ferrox ngram"))
    for w in res:
        f, l = res[w]["ferrox ngram"], res[w]["llama.cpp ngram-simple"]
        lk = res[w]["llama.cpp ngram-map-k"]
        ratio = statistics.mean(r["tps"] for r in f) / max(
            statistics.mean(r["tps"] for r in l), statistics.mean(r["tps"] for r in lk))
        out.append(f"\n{w}: ferrox ngram / best llama.cpp n-gram speculation = {ratio:.2f}")
    out.append("")

    qwen15 = MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    qwen05 = MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    if not args.no_qwen and qwen15.exists() and qwen05.exists():
        print("Qwen2.5-Coder 1.5B with the 0.5B as draft ...", file=sys.stderr)
        draft = ["--draft-max", "16", "--draft-p-min", "0.75"]
        engines = [
            FerroxRun("ferrox plain", binary, qwen15, [], t),
            FerroxRun("ferrox -md", binary, qwen15, ["-md", str(qwen05)] + draft, t),
            LlamaServer("llama.cpp plain", ["-m", str(qwen15)], t),
            LlamaServer("llama.cpp -md", ["-m", str(qwen15), "-md", str(qwen05), "--spec-type",
                                          "draft-simple", "--spec-draft-n-max", "16",
                                          "--spec-draft-p-min", "0.75"], t),
        ]
        try:
            res = measure(engines, {"edit": EDIT[:2], "free": FREE[:1]}, args.n, 1)
        finally:
            for e in engines:
                e.stop()
        base = {"ferrox -md": "ferrox plain", "llama.cpp -md": "llama.cpp plain"}
        same = identical(res, "ferrox plain", "ferrox -md")
        out.append(table("Draft model, Qwen2.5-Coder-1.5B-Instruct Q4_K_M with 0.5B Q4_K_M "
                         "(--draft-max 16, --draft-p-min 0.75)", res, base))
        out.append("\n" + same)
        for w in res:
            ratio = statistics.mean(r["tps"] for r in res[w]["ferrox -md"]) / statistics.mean(
                r["tps"] for r in res[w]["llama.cpp -md"])
            out.append(f"\n{w}: ferrox -md / llama.cpp -md = {ratio:.2f}")
    text = "\n".join(out) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
