#!/usr/bin/env bash
# Regenerates crates/ferrox-models/tests/fixtures/reference/gemma3-270m-perplexity.json: llama.cpp's
# llama-perplexity on the default model over the text from fetch-ppl-text.sh (Botchan, Project
# Gutenberg #8868), with -c 512 -b 512 -t 2 --chunks CHUNKS (default 40, about 3-4 minutes on 2 busy
# cores; the text has 124 chunks of 512 tokens). Other options are llama-perplexity's defaults
# (flash attention auto -> enabled, f16 K/V cache).
# Env: MODEL, THREADS, CHUNKS, LLAMA_CPP_SRC, LLAMA_CPP_BUILD, PYTHON.
set -euo pipefail
source "$(dirname "$0")/common.sh"
CHUNKS="${CHUNKS:-40}"
CTX=512
BATCH=512
TEXT="$("$REF_DIR/fetch-ppl-text.sh")"
BIN="$("$REF_DIR/build.sh")"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
OUT="$FIXTURES/gemma3-270m-perplexity.json"
mkdir -p "$FIXTURES"

llama_cpp_meta > "$WORK/meta.json"
# the token count, tokenized as llama-perplexity does (add_special: BOS first; the text holds no
# special-token strings, so parse_special does not matter)
"$BIN" tokenize "$MODEL" "$TEXT" > "$WORK/ids.json"
ARGS=(-m "$MODEL" -f "$TEXT" -c "$CTX" -b "$BATCH" -t "$THREADS" --chunks "$CHUNKS")
echo "running llama-perplexity ${ARGS[*]} ..." >&2
start=$(date +%s)
"$LLAMA_CPP_BUILD/bin/llama-perplexity" "${ARGS[@]}" -lv 4 --no-log-timestamps --no-log-prefix \
    > "$WORK/stdout.txt" 2> "$WORK/stderr.txt" < /dev/null
end=$(date +%s)
echo "llama-perplexity took $((end - start)) s" >&2

REF_DIR="$REF_DIR" "$PYTHON" - "$WORK" "$OUT" "$TEXT" "$CHUNKS" "$((end - start))" "${ARGS[*]}" <<'PY'
import hashlib, json, os, re, sys
sys.path.insert(0, os.environ["REF_DIR"])
import refjson
work, out, text, chunks, secs, args = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
log = open(f"{work}/stdout.txt", encoding="utf-8", errors="replace").read() + "\n" + \
      open(f"{work}/stderr.txt", encoding="utf-8", errors="replace").read()
meta = json.load(open(f"{work}/meta.json"))
m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
if not m:
    sys.exit("no 'Final estimate' in llama-perplexity's output:\n" + log[-3000:])
final_line = m.group(0)
ppl, err = float(m.group(1)), float(m.group(2))
mc = re.search(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+), batch_size=(\d+), n_seq=(\d+)", log)
per_chunk_line = re.search(r"(\[1\][0-9.]+,(?:\[\d+\][0-9.]+,)*)", log).group(1)
per_chunk = [float(x) for x in re.findall(r"\[\d+\]([0-9.]+),", per_chunk_line)]
n_chunks = int(mc.group(1))
assert len(per_chunk) == n_chunks, (len(per_chunk), n_chunks)
assert abs(per_chunk[-1] - ppl) < 1e-3
fa = re.search(r"Flash Attention (enabled|not supported, set to disabled)", log)
kv = re.findall(r"llama_kv_cache: size = .*", log)
ids = json.load(open(f"{work}/ids.json"))
text_sha = hashlib.sha256(open(text, "rb").read()).hexdigest()
n_ctx = int(mc.group(2))
fixture = {
    "description": ("llama.cpp llama-perplexity reference for Ferrox: the text is tokenized once (BOS first); "
                    "chunk k (0-based) = tokens[k*n_ctx:(k+1)*n_ctx] with its first token replaced by BOS, evaluated "
                    "from an empty KV cache; the logits at positions n_ctx/2 .. n_ctx-2 score the next tokens "
                    f"(n_ctx/2 - 1 = {n_ctx // 2 - 1} per chunk); per_chunk[k] is the running PPL = exp(mean NLL) "
                    "over chunks 0..k, as llama-perplexity prints it ([1]...,[2]...,). "
                    "Made by scripts/reference/gen-gemma-perplexity.sh."),
    "metadata": {
        "generator": "scripts/reference/gen-gemma-perplexity.sh",
        "model": meta["model"],
        "llama_cpp": meta["llama_cpp"],
        "command": "llama-perplexity " + args.replace(os.environ.get("HOME", "~"), "~"),
        "threads": int(re.search(r"-t (\d+)", args).group(1)),
        "n_ctx": n_ctx,
        "batch_size": int(mc.group(3)),
        "n_seq": int(mc.group(4)),
        "chunks_flag": chunks,
        "flash_attn": "auto -> " + (fa.group(1) if fa else "unknown"),
        "kv_cache": kv,
        "runtime_seconds": secs,
        "text": {
            "title": "Botchan (Master Darling), by Kin-nosuke (Soseki) Natsume, translated by Yasotaro Morri, revised by J. R. Kennedy (1919)",
            "source": "Project Gutenberg eBook #8868, as bundled in the PyPI sdist sentencepiece==0.2.3 (test/botchan.txt)",
            "license": "public domain in the USA (published 1919); Project Gutenberg header/footer stripped",
            "fetch": "scripts/reference/fetch-ppl-text.sh",
            "sha256": text_sha,
            "bytes": os.path.getsize(text),
            "n_tokens": len(ids),
            "n_chunks_available": len(ids) // n_ctx,
        },
    },
    "final_estimate_line": final_line,
    "ppl": ppl,
    "ppl_stderr": err,
    "n_chunks": n_chunks,
    "n_scored_tokens": n_chunks * (n_ctx - n_ctx // 2 - 1),
    "per_chunk_line": per_chunk_line,
    "per_chunk": per_chunk,
}
refjson.dump(fixture, out)
assert json.load(open(out, encoding="utf-8")) == fixture
print(f"wrote {out}: {final_line} over {n_chunks} chunks", file=sys.stderr)
PY
