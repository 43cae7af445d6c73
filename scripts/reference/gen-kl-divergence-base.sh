#!/usr/bin/env bash
# Regenerates crates/ferrox-cli/tests/fixtures/kl/: a llama-perplexity KL-divergence base file
# (`--kl-divergence-base`) for the synthetic `llama` model with every matrix F32
# (crates/ferrox-models/tests/synthetic/mod.rs, written by the write_synthetic example), on
# tests/fixtures/kl/text.txt, with CTX=64 and CHUNKS=4, flash attention off, an f32 K/V cache.
# Beside it, llama-f32.json records the GGUF's sha256 (the test rebuilds the model and checks
# it), the run's settings and llama.cpp's build.
set -euo pipefail
MODEL=/dev/null # common.sh would otherwise fetch the default model; it is not used here
source "$(dirname "$0")/common.sh"
CTX="${CTX:-64}"
CHUNKS="${CHUNKS:-4}"
OUT_DIR="$REPO_ROOT/crates/ferrox-cli/tests/fixtures/kl"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

(cd "$REPO_ROOT" && cargo run --release --quiet -p ferrox-models --example write_synthetic -- \
    "$WORK/models" --all F32) > /dev/null
"$LLAMA_CPP_BUILD/bin/llama-perplexity" -m "$WORK/models/llama.gguf" -f "$OUT_DIR/text.txt" \
    -c "$CTX" -b "$CTX" --chunks "$CHUNKS" -t "$THREADS" -fa off -ctk f32 -ctv f32 \
    --kl-divergence-base "$OUT_DIR/llama-f32.base.bin" > "$WORK/ppl.out" 2> "$WORK/ppl.err" \
    || { cat "$WORK/ppl.err" >&2; exit 1; }
llama_cpp_meta > "$WORK/meta.json"
"$PYTHON" - "$WORK/models/llama.gguf" "$WORK/meta.json" "$WORK/ppl.err" "$CTX" "$CHUNKS" \
    "$OUT_DIR/llama-f32.json" <<'PY'
import hashlib, json, re, sys
model, meta, err, ctx, chunks, out = sys.argv[1:7]
with open(model, "rb") as f:
    sha = hashlib.sha256(f.read()).hexdigest()
final = re.search(r"Final estimate: PPL = ([0-9.]+)", open(err).read())
fixture = {
    "gguf_sha256": sha,
    "n_ctx": int(ctx),
    "n_chunks": int(chunks),
    "ppl": float(final.group(1)) if final else None,
    "llama_cpp": json.load(open(meta)),
}
json.dump(fixture, open(out, "w"), indent=1)
open(out, "a").write("\n")
PY
echo "wrote $OUT_DIR/llama-f32.base.bin and llama-f32.json" >&2
