#!/usr/bin/env bash
# Regenerates docs/BENCHMARKS-VISION.md: image encode time (ms per image at 224, 448 and 896
# pixels) and time to first token with one image, Ferrox against llama.cpp on the same files.
#
# The files are synthetic (`write_synthetic --vision-bench`), written to a temporary directory
# and deleted afterwards: Gemma 3 F16 projectors of SigLIP-so400m's layer shapes (width 1152,
# FFN 4304, 16 heads, 14-pixel patches, 4x4 pooling) with LAYERS layers instead of the real 27
# at each image size, a Gemma 3 4B-wide text model of 4 layers (Q8_0), and PNG test images.
#
#   encode  `encode_image` (ferrox-models example) against `mtmd-ref embed` with
#           MTMD_REF_REPEAT (llama.cpp's mtmd_encode_chunk); both load the projector, encode
#           once to warm up and time RUNS encodes of the preprocessed image. Attention as each
#           engine defaults (llama.cpp: flash attention AUTO, f16 K/V; ferrox: f16 K/V) and
#           with f32 K/V on both sides (llama.cpp: flash attention off).
#   depth   the same at 224 pixels with DEEP_LAYERS layers (default 27, the real depth; 0
#           skips), to check that the time per layer carries over.
#   ttft    `ferrox serve --mmproj` against `llama-server --mmproj` on the 896-pixel pair:
#           streamed chat requests (one 896x896 PNG as a data URL plus a short text,
#           max_tokens 1), time from sending the request to the first chunk that carries the
#           generated token; a different image each request (no cached image reused).
#
# The engines alternate within each of REPS repetitions (default 3; TTFT_REPS, default 5, for
# time to first token); medians are reported. SIZES (default "224 448 896") chooses the image
# sizes timed, TTFT_SIZE (default 896) the projector the servers run. THREADS (default 2) threads both sides.
# LLAMA_CPP_BUILD (default /work/ref/build) has bin/llama-server and libmtmd.so; the
# reference program is built with scripts/reference/build.sh. OUT (default
# docs/BENCHMARKS-VISION.md) is the report; the raw measurements go to $OUT.json.
set -euo pipefail
cd "$(dirname "$0")/.."

export LLAMA_CPP_BUILD="${LLAMA_CPP_BUILD:-/work/ref/build}"
export THREADS="${THREADS:-2}" REPS="${REPS:-3}" RUNS="${RUNS:-3}" TTFT_REPS="${TTFT_REPS:-5}"
export LAYERS="${LAYERS:-4}" DEEP_LAYERS="${DEEP_LAYERS:-27}"
export OUT="${OUT:-docs/BENCHMARKS-VISION.md}"
[ -x "$LLAMA_CPP_BUILD/bin/llama-server" ] || {
    echo "error: no bin/llama-server under LLAMA_CPP_BUILD=$LLAMA_CPP_BUILD" >&2
    exit 1
}

# The server binary, then the examples (naming examples builds only those).
cargo build --release -p ferrox-cli >&2
cargo build --release -p ferrox-models --example write_synthetic --example encode_image >&2
export MTMD_REF="$(scripts/reference/build.sh mtmd-ref)"
export FERROX=target/release/ferrox ENCODE=target/release/examples/encode_image

export WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
target/release/examples/write_synthetic "$WORK" --vision-bench "$LAYERS" >&2
if [ "$DEEP_LAYERS" -gt 0 ]; then
    target/release/examples/write_synthetic "$WORK" --vision-bench "$DEEP_LAYERS" 224 >&2
fi
python3 scripts/bench-vision.py
