#!/usr/bin/env bash
# The test command: installs what the tests need (llama.cpp's Python GGUF reader, the default
# model, Qwen2.5-Coder-0.5B-Instruct, llama.cpp's tokenizer suite, the perplexity text; all
# cached after the first run),
# then runs the whole workspace's tests in release mode.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import gguf, numpy' 2>/dev/null; then
    echo "installing the Python reference reader (pip: gguf, numpy) ..." >&2
    "$PYTHON" -m pip install --quiet gguf numpy >&2
fi
"$PYTHON" -c 'import openai, httpx' 2>/dev/null || "$PYTHON" -m pip install --quiet openai httpx >&2  # ferrox serve's tests
"$PYTHON" -c 'import sglang_router' 2>/dev/null || "$PYTHON" -m pip install --quiet sglang-router >&2  # replicas behind a router
# The chat page's browser test: its npm packages and Debian's chromium.
[ -d crates/ferrox-server/web/node_modules ] || npm ci --prefix crates/ferrox-server/web --no-audit --no-fund >&2
if ! command -v chromium >/dev/null && [ ! -x "${CHROMIUM:-/usr/bin/chromium}" ]; then
    echo "installing chromium (the chat page's browser test) ..." >&2
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >&2
fi
# The agent API's tests (ferrox-server/tests/agent.rs): the Anthropic client and schema validation.
"$PYTHON" -c 'import anthropic, jsonschema' 2>/dev/null || "$PYTHON" -m pip install --quiet anthropic jsonschema >&2
scripts/fetch-model.sh >/dev/null
scripts/fetch-model.sh qwen-0.5b >/dev/null  # a tool-calling instruct model (the agent API's tests)
scripts/fetch-vocab-suite.sh >/dev/null
scripts/reference/fetch-ppl-text.sh >/dev/null

cargo test --workspace --release "$@"
