#!/usr/bin/env bash
# ik_llama.cpp's llama-bench as `ferrox bench --compare` calls llama-bench: the same
# arguments, plus the options that make ik_llama.cpp fast on the CPU (run-time repacking,
# flash attention). IK_LLAMA_BENCH names its binary. A depth of 0 is left out, for builds
# whose llama-bench has no `-d`.
set -euo pipefail
BIN="${IK_LLAMA_BENCH:?set IK_LLAMA_BENCH to the llama-bench of ik_llama.cpp}"
args=()
while [ $# -gt 0 ]; do
    if [ "$1" = "-d" ] && [ "${2:-}" = 0 ]; then
        shift 2
        continue
    fi
    args+=("$1")
    shift
done
exec "$BIN" "${args[@]}" -rtr 1 -fa 1
