#!/usr/bin/env bash
# Regenerates docs/BENCHMARKS-LOWBIT.md: the low-bit types on a real model, made as users make
# them, against llama.cpp on the same files.
#
#   1. Qwen2.5-Coder-1.5B-Instruct Q4_K_M (scripts/fetch-model.sh qwen-1.5b) requantized to
#      Q8_0 (llama-quantize --allow-requantize): the base of the comparison;
#   2. an importance matrix from llama-imatrix on that Q8_0 (IMATRIX_CHUNKS chunks of 512 of
#      the perplexity text, scripts/reference/fetch-ppl-text.sh);
#   3. each of TYPES made from the Q8_0 with that matrix (llama-quantize's mixes: the IQ
#      ftypes keep some tensors in K-quants, as the files people download do);
#   4. per type: perplexity on CHUNKS chunks of 512 from `ferrox perplexity` and
#      `llama-perplexity` (the same text, tokens and chunks); KL divergence against the
#      Q8_0's log-probabilities (llama-perplexity's --kl-divergence-base) from each engine;
#      decode and prefill speed from `ferrox bench --compare llama-bench` (tg TG, pp PP).
#
# The 1.5B, not the 0.5B: the 0.5B is 896 wide, not a multiple of the i-quants' 256-value
# blocks, so llama-quantize leaves all but its ffn_down matrices in fallback types.
#
# Needs a llama.cpp build: LLAMA_CPP_BUILD (default /work/ref/build) with llama-quantize,
# llama-imatrix, llama-perplexity, llama-bench. WORK (default ~/.cache/ferrox/lowbit) keeps the
# made files between runs. THREADS (2), CHUNKS (8), IMATRIX_CHUNKS (16), REPS (3), TG (64),
# PP (256), TYPES and OUT (docs/BENCHMARKS-LOWBIT.md) can be set; SKIP_SPEED=1 only scores (no
# table is written then), FRESH=1 scores again what earlier runs scored. IK_LLAMA_BENCH, the
# path of an ik_llama.cpp llama-bench, adds its speed beside (scripts/ik-llama-bench.sh: with
# its run-time repacking and flash attention), each type's pair alternated as llama.cpp's.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD="${LLAMA_CPP_BUILD:-/work/ref/build}/bin"
THREADS="${THREADS:-2}"
CHUNKS="${CHUNKS:-8}"
IMATRIX_CHUNKS="${IMATRIX_CHUNKS:-16}"
REPS="${REPS:-3}"
TG="${TG:-64}"
PP="${PP:-256}"
TYPES="${TYPES:-IQ1_S IQ1_M IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S IQ4_NL IQ4_XS Q2_K Q3_K_M TQ1_0}"
OUT="${OUT:-docs/BENCHMARKS-LOWBIT.md}"
WORK="${WORK:-$HOME/.cache/ferrox/lowbit}"
for tool in llama-quantize llama-imatrix llama-perplexity llama-bench; do
    [ -x "$BUILD/$tool" ] || { echo "error: $BUILD/$tool not found (set LLAMA_CPP_BUILD)" >&2; exit 1; }
done
mkdir -p "$WORK"
IK="${IK_LLAMA_BENCH:-}"
if [ -n "$IK" ]; then
    [ -x "$IK" ] || { echo "error: IK_LLAMA_BENCH=$IK is not executable" >&2; exit 1; }
    export IK_LLAMA_BENCH="$IK"
fi

SOURCE="$(scripts/fetch-model.sh qwen-1.5b)"
TEXT="$(scripts/reference/fetch-ppl-text.sh)"
cargo build --release -p ferrox-cli >&2
FERROX=target/release/ferrox

BASE="$WORK/qwen1.5b-q8_0.gguf"
# made under a temporary name, so that a failed run leaves nothing that looks finished
[ -f "$BASE" ] || { "$BUILD/llama-quantize" --allow-requantize "$SOURCE" "$BASE.tmp" Q8_0 "$THREADS" >&2 \
    && mv "$BASE.tmp" "$BASE"; }
IMATRIX="$WORK/qwen1.5b.imatrix.gguf"
[ -f "$IMATRIX" ] || "$BUILD/llama-imatrix" -m "$BASE" -f "$TEXT" -o "$IMATRIX" -c 512 \
    --chunks "$IMATRIX_CHUNKS" -t "$THREADS" >&2
KLBASE="$WORK/qwen1.5b-q8_0.kl-c512-n$CHUNKS.bin"
[ -f "$KLBASE" ] || "$BUILD/llama-perplexity" -m "$BASE" -f "$TEXT" -c 512 --chunks "$CHUNKS" \
    -t "$THREADS" --kl-divergence-base "$KLBASE" > /dev/null 2>&1

# final PPL, mean KLD, same-top share from a llama-perplexity-style log (ferrox prints the same).
summary() {
    python3 - "$1" <<'PY'
import re, sys
t = open(sys.argv[1], errors="replace").read()
def grab(pat):
    m = re.search(pat, t, re.M)
    return m.group(1) if m else "?"
print(grab(r"Final estimate: PPL = ([0-9.]+)"), grab(r"^Mean\s+KLD:\s+([0-9.eE+-]+)"),
      grab(r"^Same top p:\s+([0-9.]+)"))
PY
}

rows=()
for type in $TYPES; do
    file="$WORK/qwen1.5b-$(echo "$type" | tr 'A-Z' 'a-z').gguf"
    [ -f "$file" ] || { "$BUILD/llama-quantize" --allow-requantize --imatrix "$IMATRIX" "$BASE" \
        "$file.tmp" "$type" "$THREADS" >&2 && mv "$file.tmp" "$file"; }
    # Scores are kept between runs (FRESH=1 redoes them); speed is measured every run.
    run_once() { local out="$1"; shift; [ -z "${FRESH:-}" ] && [ -s "$out" ] || "$@" > "$out" 2>&1; }
    run_once "$WORK/$type.llama.ppl" "$BUILD/llama-perplexity" -m "$file" -f "$TEXT" -c 512 \
        --chunks "$CHUNKS" -t "$THREADS"
    run_once "$WORK/$type.ferrox.ppl" "$FERROX" perplexity -m "$file" -f "$TEXT" -c 512 \
        --chunks "$CHUNKS" -t "$THREADS"
    run_once "$WORK/$type.llama.kl" "$BUILD/llama-perplexity" -m "$file" -c 512 --chunks "$CHUNKS" \
        -t "$THREADS" --kl-divergence-base "$KLBASE" --kl-divergence
    run_once "$WORK/$type.ferrox.kl" "$FERROX" perplexity -m "$file" -c 512 --chunks "$CHUNKS" \
        -t "$THREADS" --kl-divergence-base "$KLBASE" --kl-divergence
    [ -n "${SKIP_SPEED:-}" ] && continue
    "$FERROX" bench -m "$file" -p "$PP" -n "$TG" -r "$REPS" -t "$THREADS" \
        --compare "$BUILD/llama-bench" --json > "$WORK/$type.bench.json" 2> "$WORK/$type.bench.err"
    rm -f "$WORK/$type.ik.json"
    [ -z "$IK" ] || "$FERROX" bench -m "$file" -p "$PP" -n "$TG" -r "$REPS" -t "$THREADS" \
        --compare scripts/ik-llama-bench.sh --json > "$WORK/$type.ik.json" 2> "$WORK/$type.ik.err"
    read -r lppl _ _ < <(summary "$WORK/$type.llama.ppl")
    read -r fppl _ _ < <(summary "$WORK/$type.ferrox.ppl")
    read -r _ lkld ltop < <(summary "$WORK/$type.llama.kl")
    read -r _ fkld ftop < <(summary "$WORK/$type.ferrox.kl")
    size=$(du -m "$file" | cut -f1)
    rows+=("$(python3 - "$type" "$size" "$fppl" "$lppl" "$fkld" "$lkld" "$ftop" "$ltop" \
        "$WORK/$type.bench.json" "$WORK/$type.ik.json" <<'PY'
import json, os, sys
ty, size, fppl, lppl, fkld, lkld, ftop, ltop, bench, ik = sys.argv[1:11]
def ratio(a, b):
    try: return f"{float(a) / float(b):.3f}"
    except (ValueError, ZeroDivisionError): return "?"
def cell(path, kind, other_only=False):
    # ferrox's and the other engine's t/s and their ratio, from one alternated pair.
    if not os.path.exists(path):
        return "— | —" if other_only else "? | ? | ?"
    rows = json.load(open(path))
    row = next((r for r in rows if (r["n_gen"] > 0) == (kind == "tg")), None)
    if row is None or "llama_cpp_avg_ts" not in row:
        return "? | ?" if other_only else "? | ? | ?"
    f, l = row["avg_ts"], row["llama_cpp_avg_ts"]
    return f"{l:.1f} | {f / l:.2f}" if other_only else f"{f:.1f} | {l:.1f} | {f / l:.2f}"
print(f"| {ty} | {size} | {fppl} | {lppl} | {ratio(fppl, lppl)} | {fkld} | {lkld} | {ftop} | {ltop} | "
      f"{cell(bench, 'tg')} | {cell(bench, 'pp')} | {cell(ik, 'tg', True)} | {cell(ik, 'pp', True)} |")
PY
)")
    echo "${rows[-1]}" >&2
done
[ -n "${SKIP_SPEED:-}" ] && exit 0

{
    echo "# Low-bit types on a real model"
    echo
    echo "Generated by \`scripts/bench-lowbit.sh\` on $(date -u +%Y-%m-%d): Qwen2.5-Coder-1.5B-Instruct,"
    echo "requantized from its Q4_K_M to Q8_0, an importance matrix from \`llama-imatrix\` on the Q8_0"
    echo "($IMATRIX_CHUNKS chunks of 512), each type made from the Q8_0 with it by \`llama-quantize\`."
    echo "Perplexity and KL divergence (against the Q8_0) on $CHUNKS chunks of 512 of the text of"
    echo "\`scripts/reference/fetch-ppl-text.sh\`, each engine on the same file; speed from"
    echo "\`ferrox bench --compare llama-bench\` (tg$TG, pp$PP, $REPS repetitions), $THREADS threads,"
    [ -z "$IK" ] || echo "and against ik_llama.cpp's llama-bench (\`scripts/ik-llama-bench.sh\`, its own pair per type),"
    echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')."
    echo
    echo "| type | MiB | ferrox PPL | llama.cpp PPL | ratio | ferrox KLD | llama.cpp KLD | ferrox same top % | llama.cpp same top % | ferrox tg t/s | llama.cpp tg t/s | tg ratio | ferrox pp t/s | llama.cpp pp t/s | pp ratio | ik_llama.cpp tg t/s | tg / ik | ik_llama.cpp pp t/s | pp / ik |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    echo "For a prompt, both engines unpack i-quant rows to int8 once per tile and run an int8 product"
    echo "over every token (llama.cpp's \"tiled\" path; ours expands panels of rows to their exact"
    echo "integer form, so that prompt and single-token products give the same bits). IQ4_NL and"
    echo "IQ4_XS are repacked at load. TQ1_0 is not in the table: requantizing a model that is not"
    echo "ternary to it gives noise (perplexity in the millions on both engines)."
} > "$OUT"
echo "wrote $OUT" >&2
