#!/usr/bin/env bash
# The i-quant kernels of ik_llama.cpp timed as crates/ferrox-core/examples/iq_kernels.rs times
# ferrox's (one thread, one token, Qwen2.5-1.5B's 1536 x 1536 and 8960 x 1536 shapes, fastest of
# many runs), for a side-by-side kernel figure: run both in the same sitting.
#
#   IK_BUILD=/path/to/ik_llama.cpp/build scripts/ik-kernel-time.sh [TYPE_ID...]
#
# TYPE_IDs as in scripts/reference/ik-kernel-time.c (default: IQ2_XXS, its _R4 form, IQ2_XS,
# its _R4 form). Needs a C compiler and IK_BUILD with ggml/src/libggml.so.
set -euo pipefail
cd "$(dirname "$0")/.."
LIB="${IK_BUILD:?set IK_BUILD to an ik_llama.cpp build directory}/ggml/src"
[ -f "$LIB/libggml.so" ] || { echo "error: $LIB/libggml.so not found" >&2; exit 1; }
BIN="$(mktemp -d)/ik-kernel-time"
cc -O2 scripts/reference/ik-kernel-time.c -o "$BIN" -L"$LIB" -lggml -Wl,-rpath,"$LIB"
TYPES=("$@")
[ ${#TYPES[@]} -gt 0 ] || TYPES=(16 216 17 217)
for type in "${TYPES[@]}"; do
    for shape in "1536 1536" "8960 1536"; do
        # shellcheck disable=SC2086
        "$BIN" "$type" $shape 1
    done
done
