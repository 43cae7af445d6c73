#!/usr/bin/env python3
"""Models larger than memory: tokens/s against the memory budget, bytes read from disk per
token, anonymous memory, and time to the first token against file size, with llama.cpp
beside it where it runs. Writes docs/BENCHMARKS-LARGE.md.

    scripts/bench-large.py [--dir DIR] [--layers 2,8,22] [--llama-dir /work/ref/build/bin]

The files are synthetic `qwen3moe` models of real widths (4096 wide, 128 experts of 1536,
Q4_0; `examples/write_large_moe.rs`), written into DIR (not the repository) unless there.
22 layers make about 30 GB. Cold runs drop the page cache first (root only; otherwise the
cold columns say so). Speed and memory figures depend on the host: the table says which.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = ("The history of the city goes back to a small settlement on the river, where "
          "traders met to exchange salt, grain and cloth; over the centuries it grew")


def write_file(path: Path, layers: int) -> None:
    if path.exists():
        return
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "ferrox-models",
                    "--example", "write_large_moe"], cwd=ROOT, check=True)
    subprocess.run([str(ROOT / "target/release/examples/write_large_moe"), str(path),
                    str(layers)], check=True)


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def measured(cmd: list[str]) -> dict:
    """Runs cmd; returns wall seconds, peak anonymous memory (MiB), bytes read from disk
    (MiB), exit code and stderr."""
    start = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, read = [0], [0]

    def sample():
        while p.poll() is None:
            try:
                for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                    if line.startswith("RssAnon:"):
                        peak[0] = max(peak[0], int(line.split()[1]) // 1024)
                for line in Path(f"/proc/{p.pid}/io").read_text().splitlines():
                    if line.startswith("read_bytes:"):
                        read[0] = int(line.split()[1]) // (1 << 20)
            except (OSError, ValueError):
                pass
            time.sleep(0.1)

    t = threading.Thread(target=sample)
    t.start()
    out, err = p.communicate()
    t.join()
    return {"wall": time.monotonic() - start, "anon": peak[0], "read": read[0],
            "rc": p.returncode, "out": out, "err": err}


def ferrox_run(bin_: str, model: Path, n: int, budget: str | None,
               extra: tuple[str, ...] = ()) -> dict:
    cmd = [bin_, "run", "-m", str(model), "-p", PROMPT, "-n", str(n), "--temp", "0",
           "-t", str(os.cpu_count()), "--json", *extra]
    if budget:
        cmd += ["--memory-budget", budget]
    r = measured(cmd)
    if r["rc"] == 0:
        out = json.loads(r["out"])
        r["tokens"] = out["tokens"]
        r["pp"] = out["timings"]["prompt_per_second"]
        r["tg"] = out["timings"]["predicted_per_second"]
    e = re.search(r"experts: (\d+) hits, (\d+) misses \(([\d.]+)% hits\), ([\d.]+) MiB read "
                  r"from the file \(([\d.]+) MiB per token\)", r["err"])
    if e:
        r["hit_pct"], r["expert_mib_per_token"] = float(e[3]), float(e[5])
    return r


def llama_run(llama_dir: Path, model: Path, n: int, extra: list[str]) -> dict:
    cmd = [str(llama_dir / "llama-completion"), "-m", str(model), "-p", PROMPT, "-n", str(n),
           "--temp", "0", "-t", str(os.cpu_count()), "-no-cnv", "--no-warmup"] + extra
    r = measured(cmd)
    pp = re.search(r"prompt eval time =\s+[\d.]+ ms /\s+(\d+) tokens .*?([\d.]+) tokens per "
                   r"second", r["err"])
    tg = re.search(r"\beval time =\s+[\d.]+ ms /\s+(\d+) runs .*?([\d.]+) tokens per second",
                   r["err"])
    if pp:
        r["pp"] = float(pp[2])
    if tg:
        r["tg"] = float(tg[2])
    return r


def gib(mib: float) -> str:
    return f"{mib / 1024:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/ferrox-large")
    ap.add_argument("--layers", default="2,8,22")
    ap.add_argument("--budget-layers", type=int, default=8,
                    help="the file (by layers) swept over budgets; it must fit in memory")
    ap.add_argument("--n", type=int, default=32, help="tokens generated per run")
    ap.add_argument("--llama-dir", default="/work/ref/build/bin")
    ap.add_argument("--real", action="append", default=[],
                    help="a real model file to time beside the synthetic ones (repeatable)")
    ap.add_argument("--out", default=str(ROOT / "docs/BENCHMARKS-LARGE.md"))
    args = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "ferrox-cli"], cwd=ROOT,
                   check=True)
    ferrox = str(ROOT / "target/release/ferrox")
    llama_dir = Path(args.llama_dir)
    have_llama = (llama_dir / "llama-completion").exists()
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    layers = [int(x) for x in args.layers.split(",")]
    files = {n: work / f"qwen3moe-large-{n}.gguf" for n in layers}
    for n, f in files.items():
        write_file(f, n)
    mem_total = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())[1])
    cpu = re.search(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text())[1]
    lines = [
        "# Models larger than memory",
        "",
        f"Generated by `scripts/bench-large.py` on {time.strftime('%Y-%m-%d')}: {cpu}, "
        f"{os.cpu_count()} threads, {mem_total / (1 << 20):.1f} GiB of memory. Synthetic "
        "`qwen3moe` files of real widths (4096 wide, 32/4 heads of 128, 128 experts of "
        "1536, 8 used, Q4_0; `examples/write_large_moe.rs`); "
        f"a {len(PROMPT.split())}-word prompt, {args.n} tokens generated greedily. "
        "`anon` is the process's peak anonymous memory (packed weights, the experts' cache, "
        "the KV cache, buffers), `read` what it read from disk, `expert MiB/token` the "
        "routed-expert bytes packed from the file per token.",
        "",
    ]
    # Budgets on a file that fits.
    fits = files[args.budget_layers]
    plan = subprocess.run([ferrox, "inspect", "--plan", "--json", str(fits)],
                          capture_output=True, text=True, check=True).stdout
    dense = int(re.search(r'"dense_bytes":(\d+)', plan)[1])
    experts = int(re.search(r'"expert_packed_bytes":(\d+)', plan)[1])
    lines += [
        f"## Tokens/s against the budget ({args.budget_layers} layers, "
        f"{fits.stat().st_size / (1 << 30):.1f} GiB)",
        "",
        "Budget as the share of the routed experts that fits besides the other weights; "
        "warm page cache.",
        "",
        "| experts resident | budget | pp t/s | tg t/s | expert hits | expert MiB/token "
        "| anon GiB | read GiB | tokens as at 100% |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    reference = None
    for share in [1.0, 0.5, 0.25]:
        budget = None if share == 1.0 else str(int(dense + experts * share))
        ferrox_run(ferrox, fits, 1, budget)  # warm the page cache
        r = ferrox_run(ferrox, fits, args.n, budget)
        reference = reference or r.get("tokens")
        same = "yes" if r.get("tokens") == reference else "**no**"
        label = "100% (default)" if share == 1.0 else f"{share:.0%}"
        hits = f"{r['hit_pct']:.1f}%" if "hit_pct" in r else "all packed"
        lines.append(
            f"| {label} | {gib(int(budget or 0) / (1 << 20)) + ' GiB' if budget else 'default'} "
            f"| {r.get('pp', 0):.2f} | {r.get('tg', 0):.2f} | {hits} "
            f"| {r.get('expert_mib_per_token', 0):.1f} | {gib(r['anon'])} | {gib(r['read'])} "
            f"| {same} |")
        print(lines[-1], file=sys.stderr)
    # Start-up and default runs against file size.
    lines += [
        "",
        "## Default flags against file size",
        "",
        "Time to the first token (`-n 1`, load included, wall time of the process) cold (page "
        "cache dropped) and warm, "
        f"then a {args.n}-token run, warm. llama.cpp: `llama-completion -n 1` with its "
        "defaults (weights repacked into memory) and with `--no-repack` (used in place from "
        "the mapping).",
        "",
        "| file | engine | first token cold s | first token warm s | pp t/s | tg t/s "
        "| anon GiB | read GiB | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rows = [(f"{n} layers, {f.stat().st_size / (1 << 30):.1f} GiB", f) for n, f in files.items()]
    rows += [(f"{Path(r).name}, {Path(r).stat().st_size / (1 << 30):.2f} GiB", Path(r))
             for r in args.real]
    for size, f in rows:
        engines = [
            ("ferrox", lambda k: ferrox_run(ferrox, f, k, None)),
            ("ferrox --direct-io", lambda k: ferrox_run(ferrox, f, k, None, ("--direct-io",))),
        ]
        if have_llama:
            engines += [
                ("llama.cpp", lambda k: llama_run(llama_dir, f, k, [])),
                ("llama.cpp --no-repack", lambda k: llama_run(llama_dir, f, k, ["--no-repack"])),
            ]
        for name, go in engines:
            cold_ok = drop_caches()
            cold = go(1)
            warm = go(1)
            run = go(args.n)
            note = ""
            if run["rc"] != 0:
                note = f"exit {run['rc']}" + (" (killed: out of memory)" if run["rc"] in (-9, 137)
                                              else "")
            cold_s = f"{cold['wall']:.1f}" if cold_ok else "n/a (no root)"
            lines.append(
                f"| {size} | {name} | {cold_s} | {warm['wall']:.1f} | {run.get('pp', 0):.2f} "
                f"| {run.get('tg', 0):.2f} | {gib(run['anon'])} | {gib(run['read'])} | {note} |")
            print(lines[-1], file=sys.stderr)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
