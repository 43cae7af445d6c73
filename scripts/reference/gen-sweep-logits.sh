#!/usr/bin/env bash
# Regenerates crates/ferrox-models/tests/fixtures/sweep/: llama.cpp's log-probabilities at every
# context length of the sweep models (crates/ferrox-models/tests/synthetic/mod.rs:
# every synthetic family with F32 matrices, and the small all-F32 MLA models SWEEP_MODELS).
#
#   1. `write_synthetic DIR --sweep` writes each model and its 160-token sequence;
#   2. `llama-ref sweep` runs it with flash attention off and an f32 K/V cache (CTX=256,
#      THREADS=2): the whole sequence as one batch, every prefix as a fresh prompt, and a greedy
#      continuation after each prompt (N_GREEDY_MLA=16 tokens for SWEEP_MODELS, N_GREEDY=4 for
#      the others), recording the five most likely tokens' log-probabilities at every step;
#   3. stores <name>.json: the GGUF's sha256 beside llama-ref's output and llama.cpp's build.
# The GGUFs are not stored: tests/length_sweep.rs rebuilds them and checks the sha256.
#
#   gen-sweep-logits.sh kimi   does the same for the `kimi-linear` model of
#                              tests/synthetic/kimi.rs (16 greedy tokens after every prompt) into
#                              crates/ferrox-models/tests/fixtures/kimi/.
#   gen-sweep-logits.sh kimi-k3  likewise for the `kimi-k3` models of tests/synthetic/kimi.rs
#                              into crates/ferrox-models/tests/fixtures/kimi-k3/.
#   gen-sweep-logits.sh kimi-blocks  likewise for the Kimi models with whole-block latent rows
#                              (tests/synthetic/kimi.rs BLOCK_MODELS) into .../fixtures/kimi-blocks/.
#   gen-sweep-logits.sh dsa    likewise for the DeepSeek Sparse Attention models of
#                              tests/synthetic/dsa.rs (deepseek32, glm-dsa) into
#                              crates/ferrox-models/tests/fixtures/dsa/.
#   gen-sweep-logits.sh deepseek4  likewise for the DeepSeek-V4 model of
#                              tests/synthetic/deepseek4.rs into
#                              crates/ferrox-models/tests/fixtures/deepseek4/.
#   gen-sweep-logits.sh dsa-default  the DSA models at llama.cpp's defaults (f16 cache, flash
#                              attention as it chooses) into .../fixtures/dsa-default/, with
#                              `self_band`: how far llama.cpp with flash attention off lands
#                              from that run (its own noise at these settings).
#   gen-sweep-logits.sh deepseek4-default  likewise for the DeepSeek-V4 model, into
#                              .../fixtures/deepseek4-default/.
#
#   gen-sweep-logits.sh kv-q8_0  the grouped-query sweep models KV_MODELS with a q8_0 K and V
#   gen-sweep-logits.sh kv-q4_0  cache (or q4_0; kv-q4_1, kv-q5_0, kv-q5_1, kv-iq4_nl, kv-bf16
#                              likewise, made with KV_MODELS=llama.f32), flash attention on as
#                              llama.cpp requires for a quantized V, into .../fixtures/kv-q8_0/ (kv-q4_0/ ...), with
#                              `quantization_effect`: how far that run lands from llama.cpp's
#                              own f32-cache run of the same file (fixtures/sweep/).
#   gen-sweep-logits.sh dsa-kv-q8_0  the DSA model with whole-block latent rows
#                              (deepseek32-blocks) with a q8_0 cache (dsa-kv-q4_0: q4_0) for the
#                              latent rows and the indexer's keys, flash attention on, into
#                              .../fixtures/dsa-kv-q8_0/, its `quantization_effect` against
#                              fixtures/dsa/.
#   gen-sweep-logits.sh kimi-kv-q8_0  likewise for the Kimi models with whole-block latent rows
#                              (kimi-kv-q4_0: q4_0) against fixtures/kimi-blocks/, into
#                              .../fixtures/kimi-kv-q8_0/.
#   gen-sweep-logits.sh deepseek4-kv-q8_0  the DeepSeek-V4 model with a q8_0 cache
#                              (deepseek4-kv-q4_0: q4_0) for every cache it keeps (raw rows,
#                              compressed rows, indexer keys), against fixtures/deepseek4/, into
#                              .../fixtures/deepseek4-kv-q8_0/.
#   gen-sweep-logits.sh kv-q8_0-f16v  a q8_0 K with the default f16 V (what `-ctk q8_0` alone
#                              gives; kv-q4_0-f16v likewise), the same models, into
#                              .../fixtures/kv-q8_0-f16v/: llama.cpp accumulates an f16 V in f16.
#
#   ONLY="exaone.f32 ..." regenerates just those models' files.
set -euo pipefail
SET="${1:-sweep}"
MODEL=/dev/null # common.sh would otherwise fetch the default model; it is not used here
source "$(dirname "$0")/common.sh"
CTX="${CTX:-256}"
N_GREEDY="${N_GREEDY:-4}"
N_GREEDY_MLA="${N_GREEDY_MLA:-16}"
OUT_DIR="$REPO_ROOT/crates/ferrox-models/tests/fixtures/$SET"
case "$SET" in
    sweep) WRITE_FLAG=--sweep ;;
    kimi) WRITE_FLAG=--kimi; N_GREEDY="$N_GREEDY_MLA" ;;
    kimi-k3) WRITE_FLAG=--kimi-k3; N_GREEDY="$N_GREEDY_MLA" ;;
    kimi-blocks) WRITE_FLAG=--kimi-blocks; N_GREEDY="$N_GREEDY_MLA" ;;
    dsa) WRITE_FLAG=--dsa; N_GREEDY="$N_GREEDY_MLA" ;;
    deepseek4) WRITE_FLAG=--deepseek4; N_GREEDY="$N_GREEDY_MLA" ;;
    dsa-default) WRITE_FLAG=--dsa; N_GREEDY="$N_GREEDY_MLA"; DEFAULTS=1 ;;
    deepseek4-default) WRITE_FLAG=--deepseek4; N_GREEDY="$N_GREEDY_MLA"; DEFAULTS=1 ;;
    kv-q8_0|kv-q4_0|kv-q4_1|kv-q5_0|kv-q5_1|kv-iq4_nl|kv-bf16) WRITE_FLAG=--sweep; KV_TYPE="${SET#kv-}"
        ONLY="${ONLY:-${KV_MODELS:-llama.f32 qwen2.f32 gemma3.f32 phi3.f32 qwen3moe.f32}}" ;;
    dsa-kv-q8_0|dsa-kv-q4_0) WRITE_FLAG=--dsa; KV_TYPE="${SET#dsa-kv-}"; N_GREEDY="$N_GREEDY_MLA"
        F32_SET=dsa; ONLY="${ONLY:-deepseek32-blocks}" ;;
    kimi-kv-q8_0|kimi-kv-q4_0) WRITE_FLAG=--kimi-blocks; KV_TYPE="${SET#kimi-kv-}"
        N_GREEDY="$N_GREEDY_MLA"; F32_SET=kimi-blocks ;;
    deepseek4-kv-q8_0|deepseek4-kv-q4_0) WRITE_FLAG=--deepseek4; KV_TYPE="${SET#deepseek4-kv-}"
        N_GREEDY="$N_GREEDY_MLA"; F32_SET=deepseek4 ;;
    kv-q8_0-f16v|kv-q4_0-f16v) WRITE_FLAG=--sweep; KV_TYPE="${SET#kv-}"; KV_TYPE="${KV_TYPE%-f16v}"
        KV_TYPE_V=f16
        ONLY="${ONLY:-${KV_MODELS:-llama.f32 qwen2.f32 gemma3.f32 phi3.f32 qwen3moe.f32}}" ;;
    *) echo "usage: $0 [sweep|kimi|kimi-k3|kimi-blocks|dsa|deepseek4|dsa-default|deepseek4-default|kv-TYPE|dsa-kv-TYPE|kimi-kv-TYPE|deepseek4-kv-TYPE]" >&2
       exit 2 ;;
esac
BIN="$("$REF_DIR/build.sh")"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT_DIR"

(cd "$REPO_ROOT" && cargo run --release --quiet -p ferrox-models --example write_synthetic -- \
    "$WORK/models" "$WRITE_FLAG") > "$WORK/models.txt"
llama_cpp_meta > "$WORK/meta.json"
while read -r name path _; do
    if [ -n "${ONLY:-}" ]; then case " $ONLY " in *" $name "*) ;; *) continue ;; esac; fi
    case "$name" in *.f32) greedy="$N_GREEDY" ;; *) greedy="$N_GREEDY_MLA" ;; esac
    echo "sweep: $name" >&2
    if [ -n "${KV_TYPE:-}" ]; then
        LLAMA_REF_FLASH_ATTN=1 LLAMA_REF_KV_TYPE="$KV_TYPE" LLAMA_REF_KV_TYPE_V="${KV_TYPE_V:-$KV_TYPE}" \
            "$BIN" sweep "$path" "$CTX" "$THREADS" "$WORK/models/$name.tokens" "$greedy" "$WORK/$name.json"
    elif [ -n "${DEFAULTS:-}" ]; then
        "$BIN" sweep "$path" "$CTX" "$THREADS" "$WORK/models/$name.tokens" "$greedy" "$WORK/$name.json"
        LLAMA_REF_FLASH_ATTN=0 \
            "$BIN" sweep "$path" "$CTX" "$THREADS" "$WORK/models/$name.tokens" "$greedy" "$WORK/$name.fa_off.json"
    else
        LLAMA_REF_FLASH_ATTN=0 LLAMA_REF_KV_TYPE=f32 \
            "$BIN" sweep "$path" "$CTX" "$THREADS" "$WORK/models/$name.tokens" "$greedy" "$WORK/$name.json"
    fi
    F32_RUN="$REPO_ROOT/crates/ferrox-models/tests/fixtures/${F32_SET:-sweep}/$name.json"
    [ -n "${KV_TYPE:-}" ] || F32_RUN=/nonexistent
    F32_SET="${F32_SET:-sweep}" REF_DIR="$REF_DIR" "$PYTHON" - "$WORK/$name.json" "$path" "$WORK/meta.json" "$OUT_DIR/$name.json" \
        "$WORK/$name.fa_off.json" "$F32_RUN" <<'PY'
import hashlib, json, os, sys
sys.path.insert(0, os.environ["REF_DIR"])
import refjson
run, model, meta, out, other, f32_run = sys.argv[1:7]
data = json.load(open(run))
with open(model, "rb") as f:
    sha = hashlib.sha256(f.read()).hexdigest()
fixture = {"gguf_sha256": sha, "llama_cpp": json.load(open(meta)), **data}
def diff(x, y):
    # the largest |log p| difference over the tokens both top-5 lists name
    ly = dict((t, l) for t, l in y)
    return max([0.0] + [abs(l - ly[t]) for t, l in x if t in ly])
if os.path.exists(other):
    # llama.cpp's own noise at these settings. Over the sequence's positions: the largest
    # |log p| difference between the runs (flash attention on and off), and between one run's
    # batch and prompts. Over greedy continuations (step k follows token k, so only while both
    # runs picked the same tokens): how many steps differ by more than twice that.
    off = json.load(open(other))
    sequence = max(diff(x, y) for d, e, k1, k2 in [
        (data, off, "all", "all"), (data, off, "prompt", "prompt"), (data, data, "all", "prompt")]
        for x, y in zip(d[k1], e[k2]))
    steps = []
    for g, h in zip(data["greedy"], off["greedy"]):
        for k, (x, y) in enumerate(zip(g["top5"], h["top5"])):
            if g["ids"][k] != h["ids"][k]:
                break
            steps.append(diff(x, y))
    fixture["self_band"] = {
        "against": "flash attention off",
        "sequence_max_abs_logprob": sequence,
        "greedy_steps": len(steps),
        "greedy_steps_past_twice_that": sum(d > 2 * sequence for d in steps),
    }
if os.path.exists(f32_run):
    # What rounding the cache to its type costs in llama.cpp: the largest |log p| difference
    # between this run and its f32-cache run, over the sequence's positions (both runs' "all"
    # and "prompt"), and the median of those per-position differences.
    ref = json.load(open(f32_run))
    per_position = [max(diff(x, y), diff(a, b)) for x, y, a, b in
                    zip(data["all"], ref["all"], data["prompt"], ref["prompt"])]
    fixture["quantization_effect"] = {
        "against": f"the f32-cache run of fixtures/{os.environ['F32_SET']}/",
        "sequence_max_abs_logprob": max(per_position),
        "sequence_median_abs_logprob": sorted(per_position)[len(per_position) // 2],
    }
refjson.dump(fixture, out)
PY
done < "$WORK/models.txt"
