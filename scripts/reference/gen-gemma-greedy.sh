#!/usr/bin/env bash
# Regenerates crates/ferrox-models/tests/fixtures/reference/gemma3-270m-greedy.json:
# llama.cpp's greedy continuations (N_PREDICT=64 tokens, CTX=512, THREADS=2) of the 20 prompts in
# scripts/reference/gemma-prompts.json on the default model (scripts/fetch-model.sh).
# Env: MODEL, THREADS, CTX, N_PREDICT, LLAMA_CPP_SRC, LLAMA_CPP_BUILD, PYTHON.
# CROSSCHECK=1 also runs llama-completion (--temp 0) on each prompt and checks that its output
# is the same text up to the first end-of-generation token (prompts ending in "\n" are skipped:
# llama-completion -f drops one trailing newline from the prompt file).
set -euo pipefail
source "$(dirname "$0")/common.sh"
CTX="${CTX:-512}"
N_PREDICT="${N_PREDICT:-64}"
BIN="$("$REF_DIR/build.sh")"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
OUT="$FIXTURES/gemma3-270m-greedy.json"
mkdir -p "$FIXTURES"

llama_cpp_meta > "$WORK/meta.json"
"$PYTHON" - "$REF_DIR/gemma-prompts.json" "$WORK" <<'PY'
import json, sys
prompts = json.load(open(sys.argv[1], encoding="utf-8"))["prompts"]
for i, p in enumerate(prompts):
    with open(f"{sys.argv[2]}/prompt{i:02d}.txt", "wb") as f:
        f.write(p["text"].encode("utf-8"))
PY
for pf in "$WORK"/prompt*.txt; do
    i="$(basename "$pf" .txt)"; i="${i#prompt}"
    echo "greedy: prompt $i" >&2
    "$BIN" greedy "$MODEL" "$CTX" "$THREADS" "$N_PREDICT" "$pf" "$WORK/out$i.json"
    # the same with flash attention forced off (only its ids are kept, see "fa_off" below)
    LLAMA_REF_FLASH_ATTN=0 "$BIN" greedy "$MODEL" "$CTX" "$THREADS" "$N_PREDICT" "$pf" "$WORK/nofa$i.json"
    # and with the weights kept in the file's layout (ids and top-5 logits, see "repack_off")
    LLAMA_REF_NO_REPACK=1 "$BIN" greedy "$MODEL" "$CTX" "$THREADS" "$N_PREDICT" "$pf" "$WORK/norepack$i.json"
    if [ "${CROSSCHECK:-0}" = 1 ] && [ "$(tail -c 1 "$pf" | od -An -c | tr -d ' ')" != '\n' ]; then
        "$LLAMA_CPP_BUILD/bin/llama-completion" -m "$MODEL" -f "$pf" -n "$N_PREDICT" -c "$CTX" -t "$THREADS" \
            --temp 0 -no-cnv --no-display-prompt --no-warmup < /dev/null > "$WORK/cc$i.txt" 2> "$WORK/cc$i.err"
    fi
done

REF_DIR="$REF_DIR" "$PYTHON" - "$REF_DIR/gemma-prompts.json" "$WORK" "$OUT" "$N_PREDICT" <<'PY'
import json, os, sys
prompts = json.load(open(sys.argv[1], encoding="utf-8"))["prompts"]
work, out, n_predict = sys.argv[2], sys.argv[3], int(sys.argv[4])
meta = json.load(open(f"{work}/meta.json"))
cases, settings = [], None
bad = 0
for i, p in enumerate(prompts):
    r = json.load(open(f"{work}/out{i:02d}.json", encoding="utf-8"))
    s = r.pop("settings")
    if settings is None:
        settings = s
    assert s == settings, "settings differ between runs"
    case = {"name": p["name"], "prompt": p["text"]}
    case.update(r)
    nofa = json.load(open(f"{work}/nofa{i:02d}.json", encoding="utf-8"))
    nofa_settings = nofa.pop("settings")
    assert nofa["prompt_ids"] == r["prompt_ids"]
    div = next((k for k, (a, b) in enumerate(zip(r["generated"], nofa["generated"])) if a != b), None)
    case["fa_off"] = {"generated": nofa["generated"], "first_divergence": div}
    norepack = json.load(open(f"{work}/norepack{i:02d}.json", encoding="utf-8"))
    norepack_settings = norepack.pop("settings")
    assert norepack["prompt_ids"] == r["prompt_ids"]
    div = next((k for k, (a, b) in enumerate(zip(r["generated"], norepack["generated"])) if a != b), None)
    # top-5 logits up to and including the divergence: the steps with the same context
    shared = len(r["generated"]) if div is None else div + 1
    case["repack_off"] = {"generated": norepack["generated"], "first_divergence": div,
                          "top5": norepack["top5"][:shared]}
    cases.append(case)
    cc = f"{work}/cc{i:02d}.txt"
    if os.path.exists(cc):
        got = open(cc, "rb").read().decode("utf-8", "replace")
        ids = r["generated"]
        k = r["first_eog_index"]
        # llama-completion prints the pieces up to (not including) the EOG token, and maybe a
        # trailing " [end of text]"; compare our detokenized text, cut at the same place
        ours = r["generated_text"]
        if k is not None:
            ours_cut = "".join(r["pieces"][:k])
        else:
            ours_cut = ours
        got = got.replace(" [end of text]", "")
        ok = got == ours_cut or (got.rstrip("\n") == ours_cut.rstrip("\n") and ours_cut != "")
        print(f"crosscheck {p['name']}: {'ok' if ok else 'MISMATCH'}", file=sys.stderr)
        if not ok:
            bad += 1
            print(f"  llama-completion: {got!r}\n  llama-ref:        {ours_cut!r}", file=sys.stderr)
fixture = {
    "description": ("llama.cpp reference greedy continuations for Ferrox. Each case: the prompt text, the ids "
                    "llama.cpp tokenized it to (llama_tokenize add_special=true -> BOS prepended, parse_special=true), "
                    f"{n_predict} greedy (argmax of raw logits, lowest id on ties) token ids decoded one per llama_decode "
                    "call after one batch for the prompt; EOG tokens do not stop generation (first_eog_index marks the first); "
                    "top2_gap[i] = best minus second-best logit at step i; top5[i] = [[id, logit] x5]. "
                    "pieces/generated_text are informational. Made by scripts/reference/gen-gemma-greedy.sh."),
    "metadata": {
        "generator": "scripts/reference/gen-gemma-greedy.sh (scripts/reference/llama-ref.c greedy)",
        "model": meta["model"],
        "llama_cpp": meta["llama_cpp"],
        "n_predict": n_predict,
        "settings": settings,
        "fa_off_settings": nofa_settings,
        "fa_off_note": ("cases[].fa_off = the same greedy run with flash attention forced off "
                        "(LLAMA_REF_FLASH_ATTN=0), ids only; first_divergence = first step whose id differs "
                        "from 'generated' (null: identical). It measures llama.cpp's own numerical spread."),
        "repack_off_settings": norepack_settings,
        "repack_off_note": ("cases[].repack_off = the same greedy run with llama.cpp's weight repacking off "
                            "(LLAMA_REF_NO_REPACK=1, as --no-repack): ids, first_divergence as for fa_off, and "
                            "top5 for the steps up to the divergence (same context as the default run). It "
                            "measures llama.cpp's own numerical spread in logits."),
        "thread_note": ("with flash attention on, single-token decode steps whose KV length exceeds 256 "
                        "depend on the thread count (split KV reduction); with it off, results are identical "
                        "for 1 and 2 threads. These fixtures use THREADS as recorded in settings."),
    },
    "cases": cases,
}
sys.path.insert(0, os.environ["REF_DIR"])
import refjson
refjson.dump(fixture, out)
assert json.load(open(out, encoding="utf-8")) == fixture
print(f"wrote {out} ({os.path.getsize(out)} bytes, {len(cases)} cases)", file=sys.stderr)
if bad:
    sys.exit(f"{bad} crosscheck mismatches")
PY
