#!/usr/bin/env bash
# Regenerates docs/BENCHMARKS.md: one table of `ferrox bench --compare` against llama-bench
# and (with IK_LLAMA_BENCH set) ik_llama.cpp's llama-bench, side by side on the same files and
# threads in one run per file, the engines taking turns repetition by repetition. The files:
# the default model (Q4_K_M) and its Q8_0 and Q4_0 requantizations (made with llama-quantize
# --allow-requantize when missing), and the files people run: Qwen2.5-Coder-0.5B and 1.5B
# Instruct Q4_K_M (Q4_K/Q6_K matrices; fetched by scripts/fetch-model.sh) with the 1.5B's Q8_0
# and Q4_0 requantizations; QWEN=0 leaves them out.
#
# Needs a llama.cpp build: LLAMA_CPP_BUILD (default /work/ref/build) with bin/llama-bench and
# bin/llama-quantize. Run it on a quiet machine: the figures are only as good as the machine's
# idleness. THREADS (default 2) and REPS (default 5) can be set. IK_LLAMA_BENCH, the path of
# an ik_llama.cpp llama-bench, adds its columns (scripts/ik-llama-bench.sh: with its run-time
# repacking and flash attention); IK_VERSION names its build where its llama-bench has no
# --version. OUT (default docs/BENCHMARKS.md) names the document; NOTE (one more line about
# the builds, e.g. how llama.cpp was configured) goes into its header.
#
# LOWBIT=1 adds the low-bit files the frontier models ship in: Qwen2.5-Coder-1.5B at IQ2_XXS,
# IQ3_XXS and IQ1_S (made with an importance matrix by scripts/bench-lowbit.sh into LOWBIT_DIR,
# default ~/.cache/ferrox/lowbit; run it first) and at TQ2_0 (made here from that Q8_0), and a
# synthetic MoE with MXFP4 experts (two layers of Qwen3-235B's expert shapes by
# examples/write_large_moe.rs, then llama-quantize MXFP4_MOE; in FERROX_BENCH_DIR, default
# ~/.cache/ferrox/bench-frontier). ik_llama.cpp cannot read TQ2_0 files (its llama-bench
# stops on a floating-point exception), so their rows leave it out.
#
# ISAS (default "native") lists the kernel sets ferrox runs with: `native`, or `avx2`
# (FERROX_ISA=avx2 on a host with more) against peers built for AVX2 alone, named by
# LLAMA_CPP_BUILD_AVX2 and IK_LLAMA_BENCH_AVX2 (cmake -DGGML_NATIVE=OFF -DGGML_AVX2=ON
# -DGGML_FMA=ON -DGGML_F16C=ON): each file gets a row per kernel set.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD="${LLAMA_CPP_BUILD:-/work/ref/build}"
THREADS="${THREADS:-2}"
REPS="${REPS:-5}"
BENCH="$BUILD/bin/llama-bench"
QUANTIZE="$BUILD/bin/llama-quantize"
[ -x "$BENCH" ] || { echo "error: $BENCH not found (set LLAMA_CPP_BUILD)" >&2; exit 1; }

DEFAULT="$(scripts/fetch-model.sh)"
DIR="$(dirname "$DEFAULT")"
files=("$DEFAULT")
# requantized SOURCE NAME TYPE: the path of SOURCE requantized to TYPE (made when missing).
requantized() {
    local out
    out="$DIR/$2-$(echo "$3" | tr '[:upper:]' '[:lower:]').gguf"
    [ -f "$out" ] || "$QUANTIZE" --allow-requantize "$1" "$out" "$3" >&2
    echo "$out"
}
for q in Q8_0 Q4_0; do
    files+=("$(requantized "$DEFAULT" gemma-3-270m "$q")")
done
if [ "${QWEN:-1}" != 0 ]; then
    QWEN15="$(scripts/fetch-model.sh qwen-1.5b)"
    files+=("$(scripts/fetch-model.sh qwen-0.5b)" "$QWEN15")
    for q in Q8_0 Q4_0; do
        files+=("$(requantized "$QWEN15" qwen2.5-coder-1.5b-instruct "$q")")
    done
fi

# Files ik_llama.cpp cannot read: no ik column for them.
no_ik=()
if [ "${LOWBIT:-0}" != 0 ]; then
    LOWBIT_DIR="${LOWBIT_DIR:-$HOME/.cache/ferrox/lowbit}"
    for t in iq2_xxs iq3_xxs iq1_s; do
        f="$LOWBIT_DIR/qwen1.5b-$t.gguf"
        [ -f "$f" ] || { echo "error: $f not found (run scripts/bench-lowbit.sh first)" >&2; exit 1; }
        files+=("$f")
    done
    tq2="$LOWBIT_DIR/qwen1.5b-tq2_0.gguf"
    [ -f "$tq2" ] || "$QUANTIZE" --allow-requantize "$LOWBIT_DIR/qwen1.5b-q8_0.gguf" "$tq2.tmp" TQ2_0 >&2 \
        && { [ -f "$tq2" ] || mv "$tq2.tmp" "$tq2"; }
    files+=("$tq2")
    no_ik+=("$tq2")
    MOE_DIR="${FERROX_BENCH_DIR:-$HOME/.cache/ferrox/bench-frontier}"
    moe="$MOE_DIR/qwen3moe-l2-mxfp4_moe.gguf"
    if [ ! -f "$moe" ]; then
        mkdir -p "$MOE_DIR"
        cargo build --release -p ferrox-models --example write_large_moe >&2
        target/release/examples/write_large_moe "$moe.q4_0" 2 qwen3moe q4_0 >&2
        "$QUANTIZE" --allow-requantize "$moe.q4_0" "$moe.tmp" MXFP4_MOE >&2
        rm -f "$moe.q4_0"
        mv "$moe.tmp" "$moe"
    fi
    files+=("$moe")
fi

cargo build --release -p ferrox-cli >&2
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
FERROX=target/release/ferrox
ISAS="${ISAS:-native}"
IK="${IK_LLAMA_BENCH:-}"
results=()
for f in "${files[@]}"; do
    for isa in $ISAS; do
        # The peers built for this kernel set.
        case "$isa" in
            native) bench="$BENCH" ik="$IK" ;;
            avx2)
                bench="${LLAMA_CPP_BUILD_AVX2:?ISAS has avx2: set LLAMA_CPP_BUILD_AVX2}/bin/llama-bench"
                ik=""
                [ -z "$IK" ] || ik="${IK_LLAMA_BENCH_AVX2:?ISAS has avx2: set IK_LLAMA_BENCH_AVX2}"
                ;;
            *) echo "error: ISAS holds $isa (native or avx2)" >&2; exit 1 ;;
        esac
        [ -x "$bench" ] || { echo "error: $bench is not executable" >&2; exit 1; }
        compare=(--compare "$bench")
        for skip in "${no_ik[@]}"; do
            [ "$skip" != "$f" ] || ik=""
        done
        if [ -n "$ik" ]; then
            [ -x "$ik" ] || { echo "error: $ik is not executable" >&2; exit 1; }
            compare+=(--compare ik_llama.cpp=scripts/ik-llama-bench.sh)
        fi
        out="$WORK/$(basename "$f" .gguf)-$isa.json"
        echo "bench: $f ($isa)" >&2
        if [ "$isa" = avx2 ]; then isa_env=(FERROX_ISA=avx2); else isa_env=(); fi
        env "${isa_env[@]}" IK_LLAMA_BENCH="$ik" "$FERROX" bench -m "$f" -t "$THREADS" \
            -r "$REPS" "${compare[@]}" --json > "$out"
        results+=("$(basename "$f" .gguf) ($isa)=$out")
    done
done
LLAMA_VERSION="$("$BENCH" --version 2>&1 | head -n1)" || true
if [ -n "$IK" ] && [ -z "${IK_VERSION:-}" ]; then
    # Its llama-bench may have no --version: IK_VERSION can name the build instead.
    IK_VERSION="$("$IK" --version 2>&1 | head -n1 | grep -iv '^error')" || true
fi

{
    echo "# Benchmarks"
    echo
    echo "Generated by \`scripts/bench.sh\` on $(date -u +%Y-%m-%d); do not edit by hand."
    echo "Each row is one \`ferrox bench -t $THREADS -r $REPS --compare llama-bench"
    echo "[--compare ik_llama.cpp] --json\` run: llama-bench's tests (pp512 = one batched prefill of"
    echo "512 tokens, tg128 = 128 single-token decode steps), mean t/s of $REPS repetitions, each"
    echo "repetition running ferrox and then each peer once, so that all three see the same"
    echo "machine; ratios are ferrox over the engine named left of them. The last column is each"
    echo "engine's decode speed as a share of the bound that the machine's read bandwidth sets"
    echo "(weights read per token over bytes per second), the bandwidth measured just before each"
    echo "ferrox repetition and just before and after each peer's: on a shared host it drifts by"
    echo "tens of percent within a minute."
    echo
    echo "- CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores;" \
        "vector extensions: $(grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512f|avx512_vnni|avx_vnni)$' | tr '\n' ' ')"
    echo "- ferrox: $(git rev-parse --short HEAD), $(rustc --version); kernel sets: $ISAS"
    echo "- llama.cpp: ${LLAMA_VERSION:-unknown} ($BENCH${LLAMA_CPP_BUILD_AVX2:+; AVX2 build $LLAMA_CPP_BUILD_AVX2})"
    if [ -n "$IK" ]; then
        echo "- ik_llama.cpp: ${IK_VERSION:-unknown} ($IK${IK_LLAMA_BENCH_AVX2:+; AVX2 build $IK_LLAMA_BENCH_AVX2}, with \`-rtr 1 -fa 1\`)"
    fi
    if [ -n "${NOTE:-}" ]; then
        echo "- $NOTE"
    fi
    echo
    python3 scripts/bench-table.py "${results[@]}"
} > "$WORK/doc.md"
OUT="${OUT:-docs/BENCHMARKS.md}"
mv "$WORK/doc.md" "$OUT"
echo "wrote $OUT" >&2
