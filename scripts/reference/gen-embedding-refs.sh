#!/usr/bin/env bash
# Regenerates crates/ferrox-models/tests/fixtures/embeddings/: llama.cpp's embeddings of
# sweep models (tests/synthetic/mod.rs, every matrix F32) with every pooling type.
#
#   1. `write_synthetic DIR --sweep` writes each model and its 160-token sequence;
#   2. the sequences embedded are that sequence's first LENGTHS tokens (one line each; with
#      pooling none, every token's vector of the first NONE_LINES lines is kept);
#   3. `llama-ref embed` runs them with pooling none, mean, cls and last, flash attention off
#      and an f32 K/V cache (CTX=256, THREADS=2), each line alone, every token an output;
#   4. stores <name>.json: the GGUF's sha256, the token lines, and per pooling the vectors
#      (not normalized) beside llama.cpp's build.
# The GGUFs are not stored: tests/embeddings.rs rebuilds them and checks the sha256.
#
#   gen-embedding-refs.sh encoders  does the same for the encoder models of
#                   tests/synthetic/bert.rs (bert, nomic-bert: F32, f32 cache, flash
#                   attention off), and for their Q8_0 twins (bert.q8_0, nomic-bert.q8_0) at
#                   llama.cpp's defaults (f16 K/V, flash attention as it chooses), with
#                   `self_band`: how far llama.cpp with flash attention off lands from that;
#                   bert-reranker (bert with a classification head) also with rank pooling, and
#                   the scores of a query against four documents as llama-server pairs them;
#                   qwen3-reranker (the qwen3 sweep model with a two-label head) likewise.
#   MODELS="llama.f32 ..." picks the models (defaults below).
set -euo pipefail
SET="${1:-sweep}"
case "$SET" in
    sweep) WRITE_FLAG=--sweep; DEFAULT_MODELS="llama.f32 qwen2.f32 gemma3.f32 deepseek2-sweep" ;;
    encoders) WRITE_FLAG=--encoders
        DEFAULT_MODELS="bert nomic-bert bert-reranker jina-bert-v2 nomic-bert-moe qwen3-reranker bert.q8_0 nomic-bert.q8_0 bert-reranker.q8_0 jina-bert-v2.q8_0 nomic-bert-moe.q8_0" ;;
    *) echo "usage: $0 [sweep|encoders]" >&2; exit 2 ;;
esac
MODEL=/dev/null # common.sh would otherwise fetch the default model; it is not used here
source "$(dirname "$0")/common.sh"
CTX="${CTX:-256}"
LENGTHS="${LENGTHS:-1 17 61}"
NONE_LINES="${NONE_LINES:-2}"
RERANK_QUERY="ba ce"
MODELS="${MODELS:-$DEFAULT_MODELS}"
OUT_DIR="$REPO_ROOT/crates/ferrox-models/tests/fixtures/embeddings"
BIN="$("$REF_DIR/build.sh")"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT_DIR"

(cd "$REPO_ROOT" && cargo run --release --quiet -p ferrox-models --example write_synthetic -- \
    "$WORK/models" "$WRITE_FLAG") > "$WORK/models.txt"
llama_cpp_meta > "$WORK/meta.json"
while read -r name path _; do
    case " $MODELS " in *" $name "*) ;; *) continue ;; esac
    "$PYTHON" - "$WORK/models/$name.tokens" "$LENGTHS" > "$WORK/$name.lines" <<'PY'
import re, sys
ids = [int(t) for t in re.findall(r"\d+", open(sys.argv[1]).read())]
for n in sys.argv[2].split():
    print(" ".join(map(str, ids[: int(n)])))
PY
    poolings="none mean cls last"
    case "$name" in *reranker*) poolings="$poolings rank" ;; esac
    for pooling in $poolings; do
        echo "embed: $name $pooling" >&2
        case "$name" in
            *.q8_0)
                "$BIN" embed "$path" "$CTX" "$THREADS" "$pooling" "$WORK/$name.lines" "$WORK/$name.$pooling.json"
                LLAMA_REF_FLASH_ATTN=0 \
                    "$BIN" embed "$path" "$CTX" "$THREADS" "$pooling" "$WORK/$name.lines" "$WORK/$name.$pooling.fa_off.json" ;;
            *)
                LLAMA_REF_FLASH_ATTN=0 LLAMA_REF_KV_TYPE=f32 \
                    "$BIN" embed "$path" "$CTX" "$THREADS" "$pooling" "$WORK/$name.lines" "$WORK/$name.$pooling.json" ;;
        esac
    done
    if [ "$name" = bert-reranker ]; then
        # llama-server's pairs for a query and documents: [CLS] query [SEP] document (the
        # tokenizer's own [CLS] ... [SEP] of the query, then the document's pieces).
        printf '%s\n' "$RERANK_QUERY" $'ce di fo\nbaba ce di\nzu zu lo\nce' > "$WORK/rerank.texts"
        while IFS= read -r text; do
            printf '%s' "$text" > "$WORK/text"
            "$BIN" tokenize "$path" "$WORK/text" | tr -d '[],'
        done < "$WORK/rerank.texts" > "$WORK/rerank.tokens"
        "$PYTHON" - "$WORK/rerank.tokens" > "$WORK/rerank.lines" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
query = rows[0]
for doc in rows[1:]:
    print(" ".join(query + doc[1:-1]))
PY
        LLAMA_REF_FLASH_ATTN=0 LLAMA_REF_KV_TYPE=f32 \
            "$BIN" embed "$path" "$CTX" "$THREADS" rank "$WORK/rerank.lines" "$WORK/rerank.json"
    fi
    REF_DIR="$REF_DIR" "$PYTHON" - "$WORK" "$name" "$path" "$OUT_DIR/$name.json" "$NONE_LINES" <<'PY'
import hashlib, json, os, sys
sys.path.insert(0, os.environ["REF_DIR"])
import refjson
work, name, model, out, none_lines = sys.argv[1:6]
with open(model, "rb") as f:
    sha = hashlib.sha256(f.read()).hexdigest()
lines = [[int(t) for t in l.split()] for l in open(f"{work}/{name}.lines") if l.strip()]
poolings = [p for p in ["none", "mean", "cls", "last", "rank"] if os.path.exists(f"{work}/{name}.{p}.json")]
runs = {p: json.load(open(f"{work}/{name}.{p}.json")) for p in poolings}
runs["none"]["embeddings"] = runs["none"]["embeddings"][: int(none_lines)]
fixture = {
    "gguf_sha256": sha,
    "llama_cpp": json.load(open(f"{work}/meta.json"))["llama_cpp"],
    "settings": runs["mean"]["settings"],
    "n_embd": runs["mean"]["n_embd"],
    "sequences": lines,
    "pooled": {p: r["embeddings"] for p, r in runs.items()},
}
if name == "bert-reranker":
    texts = open(f"{work}/rerank.texts").read().splitlines()
    fixture["rerank"] = {
        "query": texts[0],
        "documents": texts[1:],
        "pairs": [[int(t) for t in l.split()] for l in open(f"{work}/rerank.lines")],
        "scores": [v[0][0] for v in json.load(open(f"{work}/rerank.json"))["embeddings"]],
    }
if os.path.exists(f"{work}/{name}.mean.fa_off.json"):
    # llama.cpp's own spread at its defaults: the largest difference between its flash
    # attention on and off runs, relative to the vector's largest magnitude.
    def rel(a, b):
        return max(abs(x - y) for x, y in zip(a, b)) / max(abs(y) for y in b)
    band = 0.0
    for p in poolings:
        off = json.load(open(f"{work}/{name}.{p}.fa_off.json"))["embeddings"]
        for seq_a, seq_b in zip(runs[p]["embeddings"], off):
            band = max([band] + [rel(a, b) for a, b in zip(seq_a, seq_b)])
    fixture["self_band"] = {"against": "flash attention off", "max_relative": band}
refjson.dump(fixture, out)
PY
done < "$WORK/models.txt"
