#!/usr/bin/env bash
# Regenerates crates/ferrox-models/tests/fixtures/synthetic/: llama.cpp's logits for the tiny
# synthetic models of crates/ferrox-models/tests/synthetic/mod.rs (one per family, several for deepseek2).
#
#   1. builds and runs the `write_synthetic` example, which writes each family's GGUF and its
#      64-token reference sequence (BOS first, ids from a seeded generator);
#   2. runs `llama-ref logits` on each (one batch, every position, CTX=128, THREADS=2,
#      llama.cpp's default context settings: flash attention AUTO -> enabled, f16 K/V), and
#      once more with flash attention off, only to record llama.cpp's own spread;
#   3. for the Multi-head Latent Attention models, also writes every matrix as F32 and runs
#      llama.cpp with flash attention off and an f32 K/V cache: no rounding in the activations
#      or the cache, so the logits pin down the arithmetic itself (<arch>.f32.logits.bin);
#   4. stores <arch>.logits.bin (raw little-endian f32, [64][n_vocab]) and manifest.json
#      (token ids, the GGUF's sha256 and size, n_vocab, the settings, llama.cpp's build, the
#      smallest top-2 gap, and how far llama.cpp with flash attention off is from its default).
#
# The GGUFs themselves are not stored: the parity test rebuilds them in memory and checks
# their sha256 against the manifest. Takes well under a minute after the build.
#
# ONLY="exaone ..." runs just those families and replaces (or adds) their entries in the
# existing manifest, keeping the others'; an entry run with other llama.cpp settings than
# the manifest's (another host's CPU features) records its own under "settings".
set -euo pipefail
MODEL=/dev/null # common.sh would otherwise fetch the default model; it is not used here
source "$(dirname "$0")/common.sh"
CTX="${CTX:-128}"
OUT_DIR="$REPO_ROOT/crates/ferrox-models/tests/fixtures/synthetic"
BIN="$("$REF_DIR/build.sh")"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT_DIR"

(cd "$REPO_ROOT" && cargo run --release --quiet -p ferrox-models --example write_synthetic -- "$WORK/models") \
    > "$WORK/models.txt"
ALL_FAMILIES="$(cut -d' ' -f1 "$WORK/models.txt" | tr '\n' ' ')"
FAMILIES="$(cut -d' ' -f1 "$WORK/models.txt")"
EXACT="$(awk '$4 == "mla" { print $1 }' "$WORK/models.txt")"
if [ -n "${ONLY:-}" ]; then
    keep() { for f in $1; do case " $ONLY " in *" $f "*) echo "$f" ;; esac; done; }
    FAMILIES="$(keep "$FAMILIES")"
    EXACT="$(keep "$EXACT")"
    [ -n "$FAMILIES" ] || { echo "error: ONLY=$ONLY names no family" >&2; exit 2; }
fi
(cd "$REPO_ROOT" && cargo run --release --quiet -p ferrox-models --example write_synthetic -- \
    "$WORK/f32" --all F32) > /dev/null

for arch in $FAMILIES; do
    echo "logits: $arch" >&2
    "$BIN" logits "$WORK/models/$arch.gguf" "$CTX" "$THREADS" "$WORK/models/$arch.tokens" \
        "$WORK/$arch.default.bin" > "$WORK/$arch.default.json"
    LLAMA_REF_FLASH_ATTN=0 \
        "$BIN" logits "$WORK/models/$arch.gguf" "$CTX" "$THREADS" "$WORK/models/$arch.tokens" \
        "$WORK/$arch.fa_off.bin" > "$WORK/$arch.fa_off.json"
done
for arch in $EXACT; do
    echo "logits (F32 model, flash attention off, f32 cache): $arch" >&2
    LLAMA_REF_FLASH_ATTN=0 LLAMA_REF_KV_TYPE=f32 \
        "$BIN" logits "$WORK/f32/$arch.gguf" "$CTX" "$THREADS" "$WORK/f32/$arch.tokens" \
        "$WORK/$arch.f32.bin" > "$WORK/$arch.f32.json"
done
llama_cpp_meta > "$WORK/meta.json"

CTX="$CTX" REF_DIR="$REF_DIR" EXACT="$EXACT" ONLY="${ONLY:-}" ALL_FAMILIES="$ALL_FAMILIES" \
    "$PYTHON" - "$WORK" "$OUT_DIR" $FAMILIES <<'PY'
import array, hashlib, json, os, sys
sys.path.insert(0, os.environ["REF_DIR"])
import refjson
work, out_dir, families = sys.argv[1], sys.argv[2], sys.argv[3:]
exact = os.environ["EXACT"].split()

def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()

def rows(path, n, n_vocab):
    raw = array.array("f")
    with open(path, "rb") as f:
        raw.frombytes(f.read())
    if sys.byteorder != "little":
        raw.byteswap()
    assert len(raw) == n * n_vocab, (path, len(raw), n, n_vocab)
    return [raw[i * n_vocab:(i + 1) * n_vocab] for i in range(n)]

def argmax(row):
    return max(range(len(row)), key=lambda t: (row[t], -t))

def top2_gap(row):
    a, b = sorted(row, reverse=True)[:2]
    return a - b

meta = json.load(open(f"{work}/meta.json"))
only = os.environ.get("ONLY", "").split()
previous = json.load(open(f"{out_dir}/manifest.json", encoding="utf-8")) if only else None
settings = previous["settings"] if only else None
exact_settings = previous["settings_f32_exact"] if only else None
entries = []
for arch in families:
    gguf = f"{work}/models/{arch}.gguf"
    ids = [int(t) for t in open(f"{work}/models/{arch}.tokens").read().split()]
    s = json.load(open(f"{work}/{arch}.default.json"))
    n_vocab = s["n_vocab"]
    common = {k: v for k, v in s.items() if k not in ("n_vocab", "model_desc")}
    if settings is None:
        settings = common
    own_settings = None
    if common != settings:
        assert only, f"{arch}: llama.cpp settings differ from the other families'"
        own_settings = common
    assert json.load(open(f"{work}/{arch}.fa_off.json"))["flash_attn_resolved"] == "disabled"
    ref = rows(f"{work}/{arch}.default.bin", len(ids), n_vocab)
    off = rows(f"{work}/{arch}.fa_off.bin", len(ids), n_vocab)
    gaps = [top2_gap(r) for r in ref]
    flips = [[p, float(f"{gaps[p]:.6g}")] for p in range(len(ids)) if argmax(ref[p]) != argmax(off[p])]
    spread = max(abs(a - b) for r, o in zip(ref, off) for a, b in zip(r, o))
    logits_name = f"{arch}.logits.bin"
    with open(f"{work}/{arch}.default.bin", "rb") as src, open(f"{out_dir}/{logits_name}", "wb") as dst:
        dst.write(src.read())
    entries.append({
        "arch": arch,
        "model_desc": s["model_desc"],
        "gguf_sha256": sha256(gguf),
        "gguf_size": os.path.getsize(gguf),
        "n_vocab": n_vocab,
        "n_tokens": len(ids),
        "token_ids": ids,
        "logits": logits_name,
        "logits_sha256": sha256(f"{out_dir}/{logits_name}"),
        "top2_gap_min": float(f"{min(gaps):.6g}"),
        "llama_cpp_fa_off": {"max_abs_diff": float(f"{spread:.6g}"), "argmax_flips": flips},
    })
    if own_settings is not None:
        entries[-1]["settings"] = own_settings
        entries[-1]["llama_cpp"] = meta["llama_cpp"]
    if arch in exact:
        e = json.load(open(f"{work}/{arch}.f32.json"))
        assert e["n_vocab"] == n_vocab
        common = {k: v for k, v in e.items() if k not in ("n_vocab", "model_desc")}
        assert common["flash_attn_resolved"] == "disabled" and common["type_k"] == "f32", common
        if exact_settings is None:
            exact_settings = common
        if common != exact_settings:
            assert only, f"{arch}: exact-run settings differ"
            entries[-1]["settings_f32_exact"] = common
        name = f"{arch}.f32.logits.bin"
        with open(f"{work}/{arch}.f32.bin", "rb") as src, open(f"{out_dir}/{name}", "wb") as dst:
            dst.write(src.read())
        entries[-1]["f32_exact"] = {
            "gguf_sha256": sha256(f"{work}/f32/{arch}.gguf"),
            "logits": name,
            "logits_sha256": sha256(f"{out_dir}/{name}"),
        }

if only:
    # The other families' entries stay as they were, every family in the generator's order.
    kept = {e["arch"]: e for e in previous["families"]}
    kept.update({e["arch"]: e for e in entries})
    order = os.environ["ALL_FAMILIES"].split()
    missing = [a for a in order if a not in kept]
    assert not missing, f"no entry for {missing}: run without ONLY"
    entries = [kept[a] for a in order]
manifest = {
    "description": (
        "llama.cpp's logits for Ferrox's synthetic models (crates/ferrox-models/tests/synthetic/mod.rs): "
        "each family's token_ids were evaluated as ONE batch (positions 0..n-1, logits for every position) "
        "with llama.cpp's default context parameters except n_ctx/n_threads/n_batch (see settings); "
        "<logits> holds them as raw little-endian f32, n_tokens rows of n_vocab. gguf_sha256 identifies the "
        "model file they came from (the test rebuilds it in memory). top2_gap_min: the smallest "
        "largest-minus-second-largest logit over the rows. llama_cpp_fa_off: the same run with flash "
        "attention disabled (f16 K/V still), compared with the stored logits: llama.cpp's own spread "
        "between two legitimate configurations ([position, top-2 gap of the stored row] where the argmax "
        "differs). f32_exact (the Multi-head Latent Attention models): the same model with every matrix "
        "stored as F32, run with flash attention off and an f32 K/V cache (settings_f32_exact), so that "
        "no activation or cache rounding blurs the comparison. A family's own settings (and llama_cpp), "
        "where present, replace the manifest's for it: it was run later, on another host. "
        "Made by scripts/reference/gen-synthetic-logits.sh."),
    "generator": "scripts/reference/gen-synthetic-logits.sh (scripts/reference/llama-ref.c logits)",
    "llama_cpp": previous["llama_cpp"] if only else meta["llama_cpp"],
    "n_ctx_requested": int(os.environ["CTX"]),
    "settings": settings,
    "settings_f32_exact": exact_settings,
    "families": entries,
}
out = f"{out_dir}/manifest.json"
refjson.dump(manifest, out)
assert json.load(open(out, encoding="utf-8")) == manifest
total = sum(os.path.getsize(f"{out_dir}/{e['logits']}") for e in entries) + os.path.getsize(out)
total += sum(os.path.getsize(f"{out_dir}/{e['f32_exact']['logits']}") for e in entries if "f32_exact" in e)
for e in entries:
    print(f"{e['arch']}: n_vocab {e['n_vocab']}, top-2 gap min {e['top2_gap_min']}, "
          f"llama.cpp fa-off spread {e['llama_cpp_fa_off']['max_abs_diff']} "
          f"({len(e['llama_cpp_fa_off']['argmax_flips'])} argmax flips)", file=sys.stderr)
print(f"wrote {out_dir} ({total} bytes)", file=sys.stderr)
PY
