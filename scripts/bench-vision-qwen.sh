#!/usr/bin/env bash
# Regenerates docs/BENCHMARKS-VISION-QWEN.md: Qwen2.5-VL image encode time (ms per image at
# 224, 448 and 896 pixels), Ferrox against llama.cpp on the same files.
#
# The files are synthetic (`write_synthetic --vision-bench-qwen`), written to a temporary
# directory and deleted afterwards: a Qwen2.5-VL F16 projector of Qwen2.5-VL-7B's vision
# tower shapes (width 1280, FFN 3420 with gated SiLU, 16 heads of 80, 14-pixel patches,
# window attention with full attention every 8th layer, the 2x2 merger to 2048) with LAYERS
# layers (default 8: seven windowed, one full) instead of 32, a 2048-wide text model (for the
# width) and PNG test images. Each image is square at its size, which Qwen's resizing keeps:
# 224 px is 16x16 patches (64 tokens), 448 px 32x32 (256), 896 px 64x64 (1024).
#
# `encode_image` (ferrox-models example) against `mtmd-ref embed` with MTMD_REF_REPEAT
# (llama.cpp's mtmd_encode_chunk): both load the projector, encode once to warm up and time
# RUNS encodes of the preprocessed image; attention as each engine defaults (f16 K/V) and
# with f32 K/V (llama.cpp: flash attention off). Time to first token: `ferrox serve --mmproj`
# against `llama-server --mmproj` (each with its default attention), streamed chat requests
# holding one 896x896 PNG (a different one each time) and a short text, max_tokens 1, TTFT_REPS
# (default 4) alternated requests after a warm-up each. The text model is 2048 wide and one
# layer deep: the time is the image's (decode, encode, 1024 image tokens prefilled).
# The engines alternate within each of REPS
# repetitions (default 3); medians are reported. THREADS (default 2) both sides. OUT
# (default docs/BENCHMARKS-VISION-QWEN.md) is the report, the raw measurements $OUT.json.
set -euo pipefail
cd "$(dirname "$0")/.."
export THREADS="${THREADS:-2}" REPS="${REPS:-3}" RUNS="${RUNS:-2}" LAYERS="${LAYERS:-8}"
export SIZES="${SIZES:-224 448 896}" OUT="${OUT:-docs/BENCHMARKS-VISION-QWEN.md}"
export TTFT_REPS="${TTFT_REPS:-4}" LLAMA_CPP_BUILD="${LLAMA_CPP_BUILD:-/work/ref/build}"
cargo build --release -p ferrox-cli >&2
cargo build --release -p ferrox-models --example write_synthetic --example encode_image >&2
export MTMD_REF="$(scripts/reference/build.sh mtmd-ref)"
export WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# shellcheck disable=SC2086
target/release/examples/write_synthetic "$WORK" --vision-bench-qwen "$LAYERS" $SIZES >&2
export REV="$(git rev-parse --short HEAD)"
python3 - <<'PY'
import datetime, importlib.util, json, os, statistics, subprocess, sys
import numpy as np

# The time-to-first-token request and health wait of the Gemma benchmark.
_spec = importlib.util.spec_from_file_location("bench_vision", "scripts/bench-vision.py")
bench_vision = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_vision)

E = os.environ
WORK, OUT, THREADS = E["WORK"], E["OUT"], E["THREADS"]
REPS, RUNS, LAYERS = int(E["REPS"]), int(E["RUNS"]), int(E["LAYERS"])
SIZES = [int(s) for s in E["SIZES"].split()]
MM, TEXT = f"{WORK}/qwen25vl-bench-l{LAYERS}.mmproj.gguf", f"{WORK}/qwen25vl-bench.gguf"
MODES = [("default", "defaults (f16 K/V; llama.cpp flash attention auto)", [], {"MTMD_REF_DEFAULTS": "1"}),
         ("f32", "f32 K/V (llama.cpp flash attention off)", ["--f32-attention"], {})]


def run(cmd, env=None):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


res = {}
for size in SIZES:
    image = f"{WORK}/bench{size}.png"
    for key, _, flags, env in MODES:
        r = {"ferrox": [], "llama": []}
        for rep in range(REPS):
            for engine in (["ferrox", "llama"] if rep % 2 == 0 else ["llama", "ferrox"]):
                if engine == "ferrox":
                    j = run([E.get("ENCODE", "target/release/examples/encode_image"), MM, image, "--threads",
                             THREADS, "--runs", str(RUNS), "--out", f"{WORK}/f.bin"] + flags)
                    r["ferrox"] += j["runs_ms"]
                    r["tokens"] = j["n_tokens"]
                else:
                    e = {k: v for k, v in E.items() if k != "MTMD_REF_DEFAULTS"}
                    e.update(env, MTMD_REF_REPEAT=str(RUNS))
                    j = run([E["MTMD_REF"], "embed", TEXT, MM, image, THREADS, f"{WORK}/l.bin"], env=e)
                    r["llama"] += j["encode_ms"]
                    r["llama_version"] = j["llama_version"]
                print(f"{size}px {key} rep {rep} {engine}", file=sys.stderr, flush=True)
        a, b = np.fromfile(f"{WORK}/f.bin", "<f4"), np.fromfile(f"{WORK}/l.bin", "<f4")
        r["max_diff"], r["max_abs"] = float(np.abs(a - b).max()), float(np.abs(b).max())
        res[f"{size}/{key}"] = r

ports = {"ferrox": 18441, "llama": 18442}
cmds = {
    "ferrox": ["target/release/ferrox", "serve", "-m", TEXT, "--mmproj", MM, "-t", THREADS, "-c", "4096",
               "--parallel", "1", "--port", str(ports["ferrox"]), "--no-auth", "--body-limit", "16"],
    "llama": [os.path.join(E["LLAMA_CPP_BUILD"], "bin", "llama-server"), "-m", TEXT, "--mmproj", MM, "-t", THREADS,
              "-c", "4096", "-np", "1", "--port", str(ports["llama"]), "--no-webui"],
}
procs, ttft = {}, {"ferrox": [], "llama": []}
try:
    for name, cmd in cmds.items():
        procs[name] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(f"{WORK}/{name}.log", "w"))
        bench_vision.wait_health(ports[name], procs[name], name)
        bench_vision.ttft(ports[name], f"{WORK}/ttft0.png")  # warm-up, not counted
    for rep in range(int(E["TTFT_REPS"])):
        for name in (["ferrox", "llama"] if rep % 2 == 0 else ["llama", "ferrox"]):
            ms, _ = bench_vision.ttft(ports[name], f"{WORK}/ttft{1 + rep % 7}.png")
            ttft[name].append(ms)
            print(f"ttft rep {rep} {name}: {ms:.0f} ms", file=sys.stderr, flush=True)
finally:
    for p in procs.values():
        p.terminate()
        p.wait(timeout=30)
res["ttft"] = ttft

json.dump(res, open(OUT + ".json", "w"), indent=1)
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
lines = [
    "# Qwen2.5-VL image input: encode time",
    "",
    f"Made by `scripts/bench-vision-qwen.sh` on {cpu}, {THREADS} threads both sides, "
    f"{datetime.date.today()}; ferrox {E['REV']}, llama.cpp {res[next(iter(res))]['llama_version']}.",
    "",
    f"The files are synthetic (`write_synthetic --vision-bench-qwen`): a Qwen2.5-VL projector of "
    f"Qwen2.5-VL-7B's vision tower shapes (width 1280, feed-forward 3420 with gated SiLU, 16 heads of 80, "
    f"14-pixel patches, RMS norms, attention within 112-pixel windows in every layer but each 8th, the 2x2 "
    f"merger to 2048; F16 matrices) with **{LAYERS} layers instead of 32** (seven windowed, one full, the real "
    f"ratio). Random weights: the times are what matters.",
    "",
    f"One square image at each size (Qwen's resizing keeps it), preprocessed (not timed on either side); each "
    f"engine loads the projector, encodes once to warm up, then {RUNS} timed encodes; {REPS} repetitions, the "
    f"engines alternating; the median of the times. Ferrox: the `encode_image` example; llama.cpp: "
    f"`scripts/reference/mtmd-ref.c embed` with `MTMD_REF_REPEAT` (`mtmd_encode_chunk`). Ratio: llama.cpp's "
    f"time over ferrox's (above 1: ferrox is faster). \"x32/{LAYERS}\": scaled to the real depth.",
    "",
    f"| image | tokens | attention | ferrox ms | llama.cpp ms | ratio | ferrox ms x32/{LAYERS} | largest difference |",
    "|---|---|---|---|---|---|---|---|",
]
for size in SIZES:
    for key, label, _, _ in MODES:
        r = res[f"{size}/{key}"]
        f, l = statistics.median(r["ferrox"]), statistics.median(r["llama"])
        lines.append(f"| {size} px | {r['tokens']} | {label} | {f:.0f} | {l:.0f} | {l / f:.2f}x | "
                     f"{f * 32 / LAYERS:.0f} | {r['max_diff']:.1e} (values up to {r['max_abs']:.1f}) |")
lines += ["", "The largest difference is between the two engines' embeddings of the last timed encode, "
          "same settings.", "", "## Time to first token", "",
          f"`ferrox serve --mmproj` against `llama-server --mmproj`, each with its default attention: streamed "
          f"chat requests holding one 896x896 PNG (1024 image tokens; a different image each time) and a short "
          f"text, max_tokens 1; {len(ttft['ferrox'])} requests each after a warm-up, alternated. The text model "
          f"is 2048 wide and one layer deep, so the time is the image's: decoding, encoding, its tokens prefilled.",
          "", "| ferrox ms | llama-server ms | ratio |", "|---|---|---|",
          f"| {statistics.median(ttft['ferrox']):.0f} | {statistics.median(ttft['llama']):.0f} | "
          f"{statistics.median(ttft['llama']) / statistics.median(ttft['ferrox']):.2f}x |"]
open(OUT, "w").write("\n".join(lines) + "\n")
print(OUT, file=sys.stderr)
PY
