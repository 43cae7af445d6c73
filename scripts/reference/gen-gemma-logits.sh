#!/usr/bin/env bash
# Regenerates crates/ferrox-models/tests/fixtures/reference/gemma3-270m-logits.json: llama.cpp's
# logits for two prompts of gemma-prompts.json (LOGIT_PROMPTS, default long_paragraph and
# chat_gemma), evaluated as ONE batch (llama-ref logits: all positions requested, CTX=512,
# THREADS=2), keeping for each of the last LAST=4 positions the TOPK=64 best (id, logit) pairs and
# the logsumexp of the whole row (so log-softmax of any kept id = logit - logsumexp).
# Three llama.cpp configurations are stored: "default" (defaults: flash attention AUTO, which
# resolves to enabled on CPU, f16 K/V cache), "fa_off" (flash attention disabled, f16 K/V) and
# "fa_off_kv_f32" (flash attention disabled, f32 K/V: the closest llama.cpp gets to f32 math).
set -euo pipefail
source "$(dirname "$0")/common.sh"
CTX="${CTX:-512}"
LAST="${LAST:-4}"
TOPK="${TOPK:-64}"
LOGIT_PROMPTS="${LOGIT_PROMPTS:-long_paragraph chat_gemma}"
BIN="$("$REF_DIR/build.sh")"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
OUT="$FIXTURES/gemma3-270m-logits.json"
mkdir -p "$FIXTURES"

llama_cpp_meta > "$WORK/meta.json"
for name in $LOGIT_PROMPTS; do
    "$PYTHON" - "$REF_DIR/gemma-prompts.json" "$name" "$WORK/$name.txt" <<'PY'
import json, sys
p = [p for p in json.load(open(sys.argv[1], encoding="utf-8"))["prompts"] if p["name"] == sys.argv[2]]
if not p:
    sys.exit(f"no prompt named {sys.argv[2]}")
open(sys.argv[3], "wb").write(p[0]["text"].encode("utf-8"))
PY
    "$BIN" tokenize "$MODEL" "$WORK/$name.txt" > "$WORK/$name.ids"
    for variant in default fa_off fa_off_kv_f32; do
        case "$variant" in
            default) fa=""; kv="" ;;
            fa_off) fa=0; kv="" ;;
            fa_off_kv_f32) fa=0; kv=f32 ;;
        esac
        echo "logits: $name ($variant)" >&2
        LLAMA_REF_FLASH_ATTN="$fa" LLAMA_REF_KV_TYPE="$kv" \
            "$BIN" logits "$MODEL" "$CTX" "$THREADS" "$WORK/$name.ids" "$WORK/$name.$variant.bin" \
            > "$WORK/$name.$variant.settings.json"
    done
done

CTX="$CTX" REF_DIR="$REF_DIR" "$PYTHON" - "$REF_DIR/gemma-prompts.json" "$WORK" "$OUT" "$LAST" "$TOPK" $LOGIT_PROMPTS <<'PY'
import array, json, math, os, sys
sys.path.insert(0, os.environ["REF_DIR"])
import refjson
prompts_file, work, out, last, topk = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
names = sys.argv[6:]
texts = {p["name"]: p["text"] for p in json.load(open(prompts_file, encoding="utf-8"))["prompts"]}
meta = json.load(open(f"{work}/meta.json"))
variants = ["default", "fa_off", "fa_off_kv_f32"]
settings = {}
cases = []
for name in names:
    ids = json.load(open(f"{work}/{name}.ids"))
    n = len(ids)
    case = {"name": name, "prompt": texts[name], "token_ids": ids, "positions": list(range(n - last, n)), "variants": {}}
    for v in variants:
        s = json.load(open(f"{work}/{name}.{v}.settings.json"))
        n_vocab = s["n_vocab"]
        s = {k: val for k, val in s.items() if k not in ("n_ctx", "n_batch", "n_ubatch")}  # these follow the prompt length
        assert settings.setdefault(v, s) == s
        raw = array.array("f")
        with open(f"{work}/{name}.{v}.bin", "rb") as f:
            raw.frombytes(f.read())
        if sys.byteorder != "little":
            raw.byteswap()
        assert len(raw) == n * n_vocab
        rows = []
        for pos in case["positions"]:
            row = raw[pos * n_vocab:(pos + 1) * n_vocab]
            m = max(row)
            lse = m + math.log(math.fsum(math.exp(x - m) for x in row))
            best = sorted(range(n_vocab), key=lambda t: (-row[t], t))[:topk]
            rows.append({"pos": pos, "logsumexp": float(f"{lse:.9g}"),
                         "top": [[t, float(f"{row[t]:.9g}")] for t in best]})
        case["variants"][v] = rows
    cases.append(case)
fixture = {
    "description": ("llama.cpp reference logits for Ferrox: each case's token_ids were evaluated as one batch "
                    "(positions 0..n-1, logits for every position); for each of the last positions, 'top' holds the "
                    f"{topk} largest [id, logit] (descending, lowest id first on ties) and 'logsumexp' the log-sum-exp "
                    "of the full f32 row computed in f64 (log-softmax(id) = logit - logsumexp). Variants: 'default' = "
                    "llama.cpp's default context params (flash attention AUTO -> enabled, f16 K/V cache); 'fa_off' = "
                    "flash attention disabled; 'fa_off_kv_f32' = flash attention disabled and f32 K/V cache. "
                    "Made by scripts/reference/gen-gemma-logits.sh."),
    "metadata": {
        "generator": "scripts/reference/gen-gemma-logits.sh (scripts/reference/llama-ref.c logits)",
        "model": meta["model"],
        "llama_cpp": meta["llama_cpp"],
        "n_ctx_requested": int(os.environ.get("CTX", "512")),
        "n_batch_n_ubatch": "= number of prompt tokens (one ubatch)",
        "settings": settings,
    },
    "cases": cases,
}
refjson.dump(fixture, out)
assert json.load(open(out, encoding="utf-8")) == fixture
print(f"wrote {out} ({os.path.getsize(out)} bytes)", file=sys.stderr)
PY
