#!/usr/bin/env python3
"""The measurements of scripts/bench-vision.sh (which builds the programs, writes the files
and sets the environment this reads); writes $OUT and $OUT.json.

`bench-vision.py --render JSON OUT` writes the report again from the measurements in JSON."""
import base64
import datetime
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request

import numpy as np

ENV = os.environ
WORK, OUT = ENV.get("WORK", ""), ENV.get("OUT", "")
FERROX, ENCODE, MTMD_REF = ENV.get("FERROX"), ENV.get("ENCODE"), ENV.get("MTMD_REF")
LLAMA_SERVER = os.path.join(ENV.get("LLAMA_CPP_BUILD", "/work/ref/build"), "bin", "llama-server")
THREADS, REPS, RUNS = ENV.get("THREADS", "2"), int(ENV.get("REPS", 3)), int(ENV.get("RUNS", 3))
TTFT_REPS, LAYERS = int(ENV.get("TTFT_REPS", 5)), int(ENV.get("LAYERS", 4))
DEEP = int(ENV.get("DEEP_LAYERS", 27))
SIZES = [int(x) for x in ENV.get("SIZES", "224 448 896").split()]
TTFT_SIZE = int(ENV.get("TTFT_SIZE", "896"))
REAL_LAYERS = 27
TEXT = f"{WORK}/gemma3-bench.gguf"
CTX = 4096
PROMPT = "Describe this image."
# attention settings: (key, label, ferrox flags, mtmd-ref environment)
MODES = [
    ("default", "defaults (f16 K/V; llama.cpp flash attention auto)", [], {"MTMD_REF_DEFAULTS": "1"}),
    ("f32", "f32 K/V (llama.cpp flash attention off)", ["--f32-attention"], {}),
]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def mmproj(size, layers):
    return f"{WORK}/gemma3-bench-{size}-l{layers}.mmproj.gguf"


def last_json(text):
    return json.loads(text.strip().splitlines()[-1])


def run(cmd, env=None):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout


def ferrox_encode(mm, image, flags, out):
    j = last_json(run([ENCODE, mm, image, "--threads", THREADS, "--runs", str(RUNS), "--out", out] + flags))
    return j["runs_ms"], j


def llama_encode(mm, image, env, out):
    e = {k: v for k, v in ENV.items() if k != "MTMD_REF_DEFAULTS"}
    e.update(env, MTMD_REF_REPEAT=str(RUNS))
    j = last_json(run([MTMD_REF, "embed", TEXT, mm, image, THREADS, out], env=e))
    return j["encode_ms"], j


def max_diff(a, b):
    x = np.fromfile(a, dtype="<f4")
    y = np.fromfile(b, dtype="<f4")
    assert x.shape == y.shape, (x.shape, y.shape)
    return float(np.abs(x - y).max()), float(np.abs(y).max())


def encode_bench(size, layers, modes):
    """{mode: {"ferrox": [ms...], "llama": [ms...], "max_diff", "max_abs"}}"""
    mm, image = mmproj(size, layers), f"{WORK}/bench{size}.png"
    res = {}
    for key, _, flags, env in modes:
        r = {"ferrox": [], "llama": []}
        fo, lo = f"{WORK}/ferrox.bin", f"{WORK}/llama.bin"
        for rep in range(REPS):
            order = ["ferrox", "llama"] if rep % 2 == 0 else ["llama", "ferrox"]
            for engine in order:
                if engine == "ferrox":
                    ms, j = ferrox_encode(mm, image, flags, fo)
                else:
                    ms, j = llama_encode(mm, image, env, lo)
                    r["llama_info"] = {k: j[k] for k in ("llama_version", "ggml_version", "ggml_commit", "n_tokens")}
                r[engine] += ms
                log(f"encode {size}px L{layers} {key} rep {rep} {engine}: {[round(m) for m in ms]}")
        r["max_diff"], r["max_abs"] = max_diff(fo, lo)
        res[key] = r
    return res


def wait_health(port, proc, name):
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"{name} exited ({proc.returncode})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    sys.exit(f"{name} did not become healthy")


def ttft(port, png):
    data = base64.b64encode(open(png, "rb").read()).decode()
    body = json.dumps({
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + data}},
            {"type": "text", "text": PROMPT}]}],
        "max_tokens": 1, "temperature": 0, "stream": True}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        sys.exit(f"port {port}: HTTP {resp.status}: {resp.read()[:500]!r}")
    first, text = None, ""
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        choices = json.loads(payload).get("choices") or []
        if not choices:
            continue
        delta = choices[0].get("delta") or {}
        if first is None and (delta.get("content") or choices[0].get("finish_reason")):
            first = time.perf_counter() - start
        text += delta.get("content") or ""
    conn.close()
    if first is None:
        sys.exit(f"port {port}: no generated token in the stream")
    return first * 1e3, text


def ttft_bench():
    mm = mmproj(TTFT_SIZE, LAYERS)
    ports = {"ferrox": 18431, "llama": 18432}
    cmds = {
        "ferrox": [FERROX, "serve", "-m", TEXT, "--mmproj", mm, "-t", THREADS, "-c", str(CTX),
                   "--parallel", "1", "--port", str(ports["ferrox"]), "--no-auth", "--body-limit", "16"],
        "llama": [LLAMA_SERVER, "-m", TEXT, "--mmproj", mm, "-t", THREADS, "-c", str(CTX), "-np", "1",
                  "--port", str(ports["llama"]), "--no-webui"],
    }
    procs = {}
    try:
        # one server at a time while loading, so that neither loads under the other's warm-up
        for name, cmd in cmds.items():
            procs[name] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(f"{WORK}/{name}-server.log", "w"))
            wait_health(ports[name], procs[name], name)
        res = {"ferrox": [], "llama": [], "answers": {"ferrox": [], "llama": []}}
        for name in cmds:  # warm-up request, not counted
            ms, _ = ttft(ports[name], f"{WORK}/ttft0.png")
            log(f"ttft warm-up {name}: {ms:.0f} ms")
        for rep in range(TTFT_REPS):
            png = f"{WORK}/ttft{1 + rep % 7}.png"
            order = ["ferrox", "llama"] if rep % 2 == 0 else ["llama", "ferrox"]
            for name in order:
                ms, text = ttft(ports[name], png)
                res[name].append(ms)
                res["answers"][name].append(text)
                log(f"ttft rep {rep} {name}: {ms:.0f} ms {text!r}")
        return res
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def host():
    model = re.search(r"model name\s*:\s*(.*)", open("/proc/cpuinfo").read()).group(1).strip()
    flags = set(re.search(r"^flags\s*:\s*(.*)$", open("/proc/cpuinfo").read(), re.M).group(1).split())
    isa = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile") if f in flags]
    return {"cpu": model, "cores": os.cpu_count(), "isa": isa}


def main():
    started = time.time()
    results = {"encode": {}, "depth": None, "ttft": None}
    for size in SIZES:
        results["encode"][size] = encode_bench(size, LAYERS, MODES)
    if DEEP > 0:
        results["depth"] = {layers: encode_bench(224, layers, MODES[:1]) for layers in (LAYERS, DEEP)}
    results["ttft"] = ttft_bench()
    results["host"] = host()
    results["ferrox_commit"] = run(["git", "rev-parse", "--short", "HEAD"]).strip()
    results["llama_server_version"] = subprocess.run([LLAMA_SERVER, "--version"], capture_output=True, text=True).stderr.strip().splitlines()[-2:]
    results["elapsed_s"] = time.time() - started
    results["settings"] = {"sizes": SIZES, "ttft_size": TTFT_SIZE, "threads": THREADS, "reps": REPS,
                           "runs": RUNS, "ttft_reps": TTFT_REPS, "layers": LAYERS, "date": datetime.date.today().isoformat()}
    json.dump(results, open(OUT + ".json", "w"), indent=1, default=str)
    open(OUT, "w").write(report(results))
    log(f"wrote {OUT} ({results['elapsed_s']:.0f} s)")


def med(v):
    return statistics.median(v)


def report(r):
    h = r["host"]
    info = next(iter(r["encode"][SIZES[0]].values()))["llama_info"]
    lines = []
    w = lines.append
    w("# Image input: encode time and time to first token")
    w("")
    w(f"Made by `scripts/bench-vision.sh` on {h['cpu']}, {h['cores']} cores "
      f"({', '.join(h['isa'])}), {THREADS} threads both sides, {r['settings']['date']}; "
      f"ferrox {r['ferrox_commit']}, llama.cpp {info['llama_version']} (ggml {info['ggml_version']}, "
      f"commit {info['ggml_commit']}).")
    w("")
    w("The files are synthetic (`write_synthetic --vision-bench`): Gemma 3 projectors of "
      "SigLIP-so400m's layer shapes as real `mmproj-*-F16.gguf` files have them (width 1152, "
      "feed-forward 4304 with GELU, 16 heads of 72, 14-pixel patches, 4x4 average pooling, "
      "`mm.input_projection` to 2560; F16 matrices, F32 patch and position embeddings, norms and "
      f"biases) with **{LAYERS} layers instead of 27**, and a Gemma 3 4B-wide text model "
      "(2560 wide, feed-forward 10240, 8 query and 4 KV heads of 256) of 4 layers, Q8_0, with a "
      "320-token vocabulary. Random weights: the times are what matters, not the outputs.")
    w("")
    w("## Encode time")
    w("")
    if 896 not in SIZES:
        w(f"This run times {', '.join(f'{x} px' for x in SIZES)} only (`SIZES`), and the servers "
          f"run the {TTFT_SIZE}-px projector (`TTFT_SIZE`): with its default f16 attention ferrox "
          f"takes minutes per 896-px image (4096 patches; see where the time goes, below), too "
          f"long for repetitions on this shared 2-core machine. The machine is noisy: the same "
          f"measurement varies up to 2-3x between repetitions, most for llama.cpp's short runs; "
          f"the ratios are rough, the order of magnitude is not.")
        w("")
    w(f"One image at the projector's own size, preprocessed (resize and normalization are "
      f"not timed on either side); each engine loads the projector, encodes once to warm up, "
      f"then {RUNS} timed encodes; {REPS} repetitions, the engines alternating; the median "
      f"of the {REPS * RUNS} times. Ferrox: the `encode_image` example "
      f"(`VisionEncoder::encode_planar`); llama.cpp: `scripts/reference/mtmd-ref.c embed` "
      f"with `MTMD_REF_REPEAT` (`mtmd_encode_chunk`). Ratio: llama.cpp's time over ferrox's "
      f"(above 1: ferrox is faster). \"x27/{LAYERS}\": the time scaled to the real depth.")
    w("")
    for size in SIZES:
        e = r["encode"][size]
        side = size // 14
        w(f"### {size} px ({side}x{side} = {side * side} patches, {(side // 4) ** 2} image tokens)")
        w("")
        w(f"| attention | ferrox ms | llama.cpp ms | ratio | ferrox ms x27/{LAYERS} | llama.cpp ms x27/{LAYERS} |")
        w("|---|---|---|---|---|---|")
        for key, label, _, _ in MODES:
            f, l = med(e[key]["ferrox"]), med(e[key]["llama"])
            k = REAL_LAYERS / LAYERS
            w(f"| {label} | {f:.0f} | {l:.0f} | {l / f:.2f}x | {f * k:.0f} | {l * k:.0f} |")
        w("")
    if r["depth"]:
        d = r["depth"]
        lo, hi = sorted(d)
        w(f"### Depth: 224 px with {lo} and {hi} layers (defaults)")
        w("")
        w(f"| layers | ferrox ms | llama.cpp ms | ratio |")
        w("|---|---|---|---|")
        per = {}
        for n in (lo, hi):
            f, l = med(d[n]["default"]["ferrox"]), med(d[n]["default"]["llama"])
            per[n] = (f, l)
            w(f"| {n} | {f:.0f} | {l:.0f} | {l / f:.2f}x |")
        pf = (per[hi][0] - per[lo][0]) / (hi - lo)
        pl = (per[hi][1] - per[lo][1]) / (hi - lo)
        w("")
        w(f"Per layer (the difference over {hi - lo} layers): ferrox {pf:.1f} ms, llama.cpp "
          f"{pl:.1f} ms; the rest (patch embedding, projector, setup): ferrox "
          f"{per[lo][0] - lo * pf:.1f} ms, llama.cpp {per[lo][1] - lo * pl:.1f} ms. Scaling the "
          f"{lo}-layer time by {hi}/{lo} gives ferrox {per[lo][0] * hi / lo:.0f} ms and llama.cpp "
          f"{per[lo][1] * hi / lo:.0f} ms against the measured {per[hi][0]:.0f} and {per[hi][1]:.0f}.")
        w("")
    t = r["ttft"]
    f, l = med(t["ferrox"]), med(t["llama"])
    w("## Time to first token with one image")
    w("")
    w(f"`ferrox serve --mmproj` against `llama-server --mmproj` on the {TTFT_SIZE}-pixel pair ({LAYERS}-layer "
      f"projector, 4-layer text model; the servers resize the 896-pixel image to {TTFT_SIZE}), `-t {THREADS} -c {CTX}`, one sequence (`--parallel 1`, "
      f"`-np 1`), every other setting as each server defaults (flash attention: llama.cpp auto, "
      f"ferrox f16 K/V in the projector). Streamed `/v1/chat/completions` requests: a "
      f"896x896 PNG as a data URL and \"{PROMPT}\", `max_tokens: 1`, temperature 0; the time from "
      f"sending the request to the first chunk that carries the generated token (decoding the "
      f"PNG, encoding the image, prefilling the prompt, one token). A different image every "
      f"request, so that nothing cached is reused; one warm-up request each first; "
      f"{TTFT_REPS} repetitions, the servers alternating.")
    w("")
    w("| server | TTFT ms (median) | all (ms) |")
    w("|---|---|---|")
    w(f"| ferrox | {f:.0f} | {', '.join(f'{x:.0f}' for x in t['ferrox'])} |")
    w(f"| llama-server | {l:.0f} | {', '.join(f'{x:.0f}' for x in t['llama'])} |")
    w("")
    w(f"Ratio: {l / f:.2f}x (llama-server's time over ferrox's).")
    w("")
    w("## Agreement")
    w("")
    w("Largest absolute difference between the two engines' embeddings of the last encode "
      "(for scale: the largest absolute value llama.cpp writes):")
    w("")
    w("| image | attention | max abs diff | max abs value |")
    w("|---|---|---|---|")
    for size in SIZES:
        for key, label, _, _ in MODES:
            e = r["encode"][size][key]
            w(f"| {size} px | {label} | {e['max_diff']:.3g} | {e['max_abs']:.3g} |")
    w("")
    w(DISCUSSION)
    return "\n".join(lines) + "\n"


# Where the time goes: from `perf record` of `encode_image` on the 448-pixel, 4-layer projector
# (perf report --no-children --sort symbol), default attention.
DISCUSSION = """## Where the time goes

A `perf` profile of `encode_image` (448 px, 4 layers, default f16 keys and values): about 72% in
the F16 matrix products (`avx512_float_gemm::tile`), 12% in attention
(`dense_attn::attend_block_512`), under 2% each for the rest (widening rows to f32, rounding
activations to f16, GELU, layer norms, patch embedding, pooling, projector).

Matrix products: ggml runs them through llamafile's tiled sgemm (a 4x6 tile, one accumulator per
output). Ferrox widens the activations and each panel of weight rows from f16 to f32 once, then
runs 4-row by 3-token register tiles in which every output keeps the bits of the single-token row
kernel (two sixteen-lane accumulators per output, hence the narrower tile). On their own
(`cargo run --release -p ferrox-core --example float_gemm`) they reach 160-180 GFLOP/s on the
1152-wide products, but 110-140 on the 4304-wide down projection, whose rows of activations do
not stay cached; that, and fixed costs at 224 px (24 ms against llama.cpp's 9: patch embedding,
projector, setup), is what is left of the gap at 224 and 448 px.

Attention (`ferrox_core::dense_attn`): every patch attends to every patch, so the product is laid
out as a matrix product: keys repacked per head into blocks of sixteen stored dimension by
dimension, a block's scores sixteen lanes that each query fills with one multiply-add per
dimension, the online softmax on those lanes (a polynomial `exp` that the scalar reference
computes with the same operations), values added sixteen columns at a time. It serves f16 and
f32 keys and values alike, which is why the f32 setting is now as fast as the default, while
llama.cpp's f32 path (flash attention off) materializes the scores.

Before (0346344, the previous report, on a machine then about twice as slow for both engines):
llama.cpp / ferrox 0.51x at 224 px, 0.39x at 448, 0.23x at 896, time to first token 0.26x; the
products took one weight row against four activation rows at a time, widening both from f16 at
every load, and attention scored each key with horizontal sums.

The two engines' embeddings agree to about 1e-3 (values up to ~3.4) in both settings, the same
order as the f16 rounding of the weights and of the activations each F16 product makes.
"""

def render(path, out):
    """The report again from saved measurements (the settings are taken from them)."""
    global SIZES, TTFT_SIZE, THREADS, REPS, RUNS, TTFT_REPS, LAYERS
    r = json.load(open(path))
    s = r["settings"]
    SIZES, TTFT_SIZE, THREADS = s["sizes"], s["ttft_size"], s["threads"]
    REPS, RUNS, TTFT_REPS, LAYERS = s["reps"], s["runs"], s["ttft_reps"], s["layers"]
    r["encode"] = {int(k): v for k, v in r["encode"].items()}
    if r["depth"]:
        r["depth"] = {int(k): v for k, v in r["depth"].items()}
    open(out, "w").write(report(r))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--render"]:
        render(sys.argv[2], sys.argv[3])
    else:
        main()
