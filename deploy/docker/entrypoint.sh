#!/usr/bin/env bash
# The container's entry point: turns FERROX_* environment variables into `ferrox serve`
# flags, then replaces itself with ferrox (which so runs as PID 1 and gets SIGTERM).
#
#   FERROX_MODEL        GGUF file to serve: an absolute path, or a name under
#                       $FERROX_MODELS_DIR (default /models). Split checkpoints: the first file.
#   FERROX_HF_REPO      instead of FERROX_MODEL: ORG/NAME[:QUANT] from the Hugging Face Hub,
#                       downloaded into $HF_HOME (the image sets /models/huggingface) on the first
#                       start; HF_TOKEN for gated repositories, HF_ENDPOINT for a mirror.
#   FERROX_NO_AUTH      1: serve 0.0.0.0 without an API key (behind a gateway that authenticates).
#   FERROX_API_KEY      the key clients send as `Authorization: Bearer KEY` (required on any
#                       address but loopback). ferrox reads it from the environment itself, so
#                       it never appears on a command line.
#   FERROX_API_KEY_FILE a file holding the key instead (Docker and Kubernetes secrets).
#   FERROX_HOST         address to listen on (default 0.0.0.0)
#   FERROX_PORT         port (default 8080)
#   FERROX_CTX_SIZE     --ctx-size      FERROX_PARALLEL  --parallel
#   FERROX_THREADS      --threads       FERROX_KV_MEMORY --kv-memory (MiB)
#   FERROX_ALIAS        --alias         FERROX_LOG_FORMAT --log-format (text|json)
#   FERROX_EXTRA_ARGS   more `ferrox serve` flags, split on whitespace
#   FERROX_BIN          the ferrox binary (default: ferrox on PATH)
#
# Arguments given to the container are appended to the flags. If the first argument is not a
# flag (`inspect /models/x.gguf`, `bench -m ...`), it runs that ferrox command instead.
set -euo pipefail

FERROX_BIN="${FERROX_BIN:-ferrox}"

if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    exec "$FERROX_BIN" "$@"
fi

die() {
    echo "error: $*" >&2
    exit 2
}

model="${FERROX_MODEL:-}"
hf_repo="${FERROX_HF_REPO:-}"
if [ -n "$model" ] && [ -n "$hf_repo" ]; then
    die "FERROX_MODEL and FERROX_HF_REPO are both set: choose one"
fi
if [ -n "$model" ]; then
    case "$model" in
        /*) ;;
        *) model="${FERROX_MODELS_DIR:-/models}/$model" ;;
    esac
    [ -f "$model" ] && [ -r "$model" ] || die "FERROX_MODEL: cannot read $model"
    source_args=(-m "$model")
elif [ -n "$hf_repo" ]; then
    source_args=(--hf-repo "$hf_repo")
else
    die "FERROX_MODEL is not set: mount the model's folder at ${FERROX_MODELS_DIR:-/models} and set FERROX_MODEL to the GGUF file's name or path (or set FERROX_HF_REPO to ORG/NAME[:QUANT])"
fi

if [ -n "${FERROX_API_KEY_FILE:-}" ]; then
    [ -r "$FERROX_API_KEY_FILE" ] || die "FERROX_API_KEY_FILE: cannot read $FERROX_API_KEY_FILE"
    FERROX_API_KEY="$(tr -d '\r\n' <"$FERROX_API_KEY_FILE")"
    export FERROX_API_KEY
fi

args=(serve "${source_args[@]}" --host "${FERROX_HOST:-0.0.0.0}" --port "${FERROX_PORT:-8080}")
[ -z "${FERROX_CTX_SIZE:-}" ] || args+=(--ctx-size "$FERROX_CTX_SIZE")
[ -z "${FERROX_PARALLEL:-}" ] || args+=(--parallel "$FERROX_PARALLEL")
[ -z "${FERROX_THREADS:-}" ] || args+=(--threads "$FERROX_THREADS")
[ -z "${FERROX_KV_MEMORY:-}" ] || args+=(--kv-memory "$FERROX_KV_MEMORY")
[ -z "${FERROX_ALIAS:-}" ] || args+=(--alias "$FERROX_ALIAS")
[ -z "${FERROX_LOG_FORMAT:-}" ] || args+=(--log-format "$FERROX_LOG_FORMAT")

extra=()
if [ -n "${FERROX_EXTRA_ARGS:-}" ]; then
    read -r -a extra <<<"$FERROX_EXTRA_ARGS"
fi

exec "$FERROX_BIN" "${args[@]}" "${extra[@]}" "$@"
