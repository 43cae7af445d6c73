#!/usr/bin/env bash
# Regenerates the WordPiece (bert) tokenizer fixtures in crates/ferrox-tokenizer/tests/fixtures/
# from llama.cpp: llama-tokenize's ids for the `wpm` corpus of
# gen-llama-tokenize-fixtures.py (cases beyond llama.cpp's own bert-bge suite) on the
# vocab-only ggml-vocab-bert-bge.gguf of llama.cpp's vocab suite.
#
#   LLAMA_TOKENIZE=/path/to/llama-tokenize scripts/gen-wpm-fixtures.sh
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE="${FERROX_VOCAB_SUITE_DIR:-$HOME/.cache/ferrox/vocab-suite}"
"${PYTHON:-python3}" scripts/gen-llama-tokenize-fixtures.py wpm \
    "$SUITE/ggml-vocab-bert-bge.gguf" \
    crates/ferrox-tokenizer/tests/fixtures/wpm-bert-bge
