# syntax=docker/dockerfile:1
#
# Ferrox's container image: `ferrox serve` on 0.0.0.0:8080, the model from a volume at
# /models. See docs/DEPLOY.md.
#
#   docker build -t ferrox .
#   docker run --rm -p 8080:8080 -v "$HOME/.cache/ferrox/models:/models:ro" \
#       -e FERROX_MODEL=gemma-3-270m-q4_k_m.gguf -e FERROX_API_KEY=change-me ferrox

# The toolchain: at least the workspace's rust-version (Cargo.toml), Debian bookworm like the
# runtime image so that the binary's glibc matches.
ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
WORKDIR /src
COPY . .
# The same release build as the tests use; the kernels pick AVX2 / AVX-512 at run time, so the
# binary runs on any x86-64 host. The caches keep crates.io downloads and artifacts between
# builds (BuildKit).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release -p ferrox-cli --locked \
    && install -D -m 0755 target/release/ferrox /out/ferrox

FROM debian:${DEBIAN_RELEASE}-slim
# The binary needs only glibc, libm and libgcc_s (all in the base image); curl is for the
# health check, ca-certificates for curl.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 ferrox \
    && useradd --system --uid 10001 --gid ferrox --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin ferrox \
    && mkdir -p /models \
    && chown ferrox:ferrox /models

COPY --from=build /out/ferrox /usr/local/bin/ferrox
COPY --chmod=0755 deploy/docker/entrypoint.sh /usr/local/bin/ferrox-entrypoint

ENV FERROX_HOST=0.0.0.0 \
    FERROX_PORT=8080 \
    FERROX_MODELS_DIR=/models \
    HF_HOME=/models/huggingface
VOLUME ["/models"]
EXPOSE 8080
USER 10001:10001

# /health answers 503 while the model loads and 200 once it serves; large models take a while
# to load, hence the long start period.
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 \
    CMD ["sh", "-c", "curl -fsS -o /dev/null http://127.0.0.1:${FERROX_PORT}/health || exit 1"]

ENTRYPOINT ["/usr/local/bin/ferrox-entrypoint"]
