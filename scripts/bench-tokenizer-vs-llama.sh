#!/usr/bin/env bash
# Times `ferrox tokenize -f` against llama.cpp's `llama-tokenize -f` on the same ~1 MB of
# mixed English and code, checks that both give the same ids, and prints the time ratio.
#
# Usage: scripts/bench-tokenizer-vs-llama.sh [MODEL.gguf ...]
#   default models: the vocab suite's llama-spm and llama-bpe (scripts/fetch-vocab-suite.sh)
#   LLAMA_TOKENIZE: llama-tokenize binary (default: on PATH, else /work/ref/build/bin)
#   RUNS: timed runs per tool without hyperfine (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_TOKENIZE="${LLAMA_TOKENIZE:-$(command -v llama-tokenize || echo /work/ref/build/bin/llama-tokenize)}"
[ -x "$LLAMA_TOKENIZE" ] || { echo "error: llama-tokenize not found (set LLAMA_TOKENIZE)" >&2; exit 1; }
RUNS="${RUNS:-5}"
PYTHON="${PYTHON:-python3}"

if [ $# -gt 0 ]; then
    models=("$@")
else
    suite="$(scripts/fetch-vocab-suite.sh)"
    models=("$suite/ggml-vocab-llama-spm.gguf" "$suite/ggml-vocab-llama-bpe.gguf")
fi

cargo build --quiet --release -p ferrox-cli
FERROX="$PWD/target/release/ferrox"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
TEXT="$WORK/mixed.txt"
# English prose and Rust code from this repository, repeated to ~1 MB, cut after a line.
"$PYTHON" - "$TEXT" README.md crates/ferrox-gguf/src/parse.rs crates/ferrox-gguf/README.md \
    crates/ferrox-gguf/src/value.rs crates/ferrox-tokenizer/src/tokenizer/vocab.rs <<'EOF'
import sys
out, parts = sys.argv[1], [open(p, encoding="utf-8").read() for p in sys.argv[2:]]
text = ""
while len(text.encode()) < 1 << 20:
    for p in parts:
        text += p + "\n"
open(out, "w", encoding="utf-8").write(text)
EOF
echo "input: $(wc -c < "$TEXT") bytes of mixed English and code"

ferrox_cmd() { echo "$FERROX tokenize -m $1 -f $TEXT --ids"; }
llama_cmd() { echo "$LLAMA_TOKENIZE -m $1 -f $TEXT --ids --no-escape --no-parse-special --log-disable"; }

# Mean wall and CPU (user + system) seconds of a command over $RUNS runs after a warm-up,
# as "WALL CPU". CPU time is the steadier figure on a busy machine.
time_loop() {
    local cmd="$1" t wall=0 cpu=0
    $cmd >/dev/null 2>&1
    for _ in $(seq "$RUNS"); do
        t=$( { TIMEFORMAT='%R %U %S'; time $cmd >/dev/null 2>&1; } 2>&1 )
        read -r r u s <<<"$t"
        wall=$(echo "$wall + $r" | bc -l)
        cpu=$(echo "$cpu + $u + $s" | bc -l)
    done
    echo "$(echo "$wall / $RUNS" | bc -l) $(echo "$cpu / $RUNS" | bc -l)"
}

for model in "${models[@]}"; do
    echo
    echo "== $(basename "$model")"
    if ! $(ferrox_cmd "$model") > "$WORK/ferrox.ids" 2> "$WORK/ferrox.err"; then
        echo "ferrox cannot tokenize with it: $(cat "$WORK/ferrox.err")"
        continue
    fi
    $(llama_cmd "$model") 2>/dev/null > "$WORK/llama.ids"
    if cmp -s "$WORK/ferrox.ids" "$WORK/llama.ids"; then
        echo "ids: identical ($(tr -cd ',' < "$WORK/ferrox.ids" | wc -c) + 1 tokens)"
    else
        echo "ids: DIFFERENT from llama.cpp's"
    fi
    if command -v hyperfine >/dev/null; then
        hyperfine --warmup 1 --runs "$RUNS" --export-json "$WORK/h.json" \
            -n ferrox "$(ferrox_cmd "$model")" -n llama-tokenize "$(llama_cmd "$model")" >&2
        "$PYTHON" - "$WORK/h.json" <<'EOF'
import json, sys
r = {x["command"]: x["mean"] for x in json.load(open(sys.argv[1]))["results"]}
print(f"ferrox {r['ferrox']:.3f} s, llama-tokenize {r['llama-tokenize']:.3f} s, "
      f"ratio ferrox/llama = {r['ferrox'] / r['llama-tokenize']:.2f}")
EOF
    else
        read -r fw fc <<<"$(time_loop "$(ferrox_cmd "$model")")"
        read -r lw lc <<<"$(time_loop "$(llama_cmd "$model")")"
        printf 'wall: ferrox %.3f s, llama-tokenize %.3f s, ratio ferrox/llama = %.2f\n' \
            "$fw" "$lw" "$(echo "$fw / $lw" | bc -l)"
        printf 'cpu:  ferrox %.3f s, llama-tokenize %.3f s, ratio ferrox/llama = %.2f (mean of %d runs)\n' \
            "$fc" "$lc" "$(echo "$fc / $lc" | bc -l)" "$RUNS"
    fi
done
