#!/usr/bin/env bash
# Regenerates the unigram (t5) tokenizer fixtures in crates/ferrox-tokenizer/tests/fixtures/
# from llama.cpp: llama-tokenize's ids for the `unigram` corpus of
# gen-llama-tokenize-fixtures.py on the vocab-only ggml-vocab-nomic-bert-moe.gguf of
# llama.cpp's vocab suite (see scripts/fetch-vocab-suite.sh).
#
#   LLAMA_TOKENIZE=/path/to/llama-tokenize scripts/gen-unigram-fixtures.sh
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE="${FERROX_VOCAB_SUITE_DIR:-$HOME/.cache/ferrox/vocab-suite}"
"${PYTHON:-python3}" scripts/gen-llama-tokenize-fixtures.py unigram \
    "$SUITE/ggml-vocab-nomic-bert-moe.gguf" \
    crates/ferrox-tokenizer/tests/fixtures/unigram-nomic-bert-moe
