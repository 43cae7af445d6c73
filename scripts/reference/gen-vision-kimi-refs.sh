#!/usr/bin/env bash
# Regenerates the Kimi part of fixtures/vision/ref/: llama.cpp's outputs for the synthetic
# Kimi pair (crates/ferrox-models/tests/synthetic/vision.rs: kimi.gguf, a deepseek2 text
# model, with the kimivl.mmproj.gguf and kimik25.mmproj.gguf projectors), and the GLM-5.2-V
# pair (glm5v.gguf, a glm-dsa text model, with kimik25.mmproj.gguf).
#
#   1. `write_synthetic fixtures/vision --vision` (re)writes the inputs (deterministic);
#   2. `mtmd-ref embed` writes each image's projector output with each projector, flash
#      attention off (ref/<image>.<projector>.f32.embd) and with llama.cpp's defaults (flash
#      attention on: f16 keys and values; ref/<image>.<projector>.default.embd), raw
#      little-endian f32 [n_tokens][128], the tokens in raster order of the merged grid;
#   3. `mtmd-ref greedy` runs PROMPT (below) with each image through both pairs, 16 tokens
#      greedily (f32 K/V cache, flash attention off): ref/<image>.<projector>.greedy.json;
#      and GLM_PROMPT through the GLM-5.2-V pair: ref/<image>.glm5v.greedy.json (llama.cpp
#      marks the images with GLM's tokens, which the vocabulary has);
#   4. with llama.cpp's --image-max-tokens 12 on rgb200x150, flash attention off:
#      ref/rgb200x150.kimivl.max12.embd (Kimi-VL scales the image down) and
#      ref/rgb200x150.kimik25.max12.embd (llama.cpp ignores the flag for a Kimi-K2.5 file
#      that states its own pixel limits);
#   5. ref/kimi-manifest.json: llama.cpp's build, the inputs' sha256, the prompt, and the
#      settings and shape line `embed` printed for each .embd file.
#   THREADS (default 2) threads.
set -euo pipefail
MODEL=/dev/null # common.sh would otherwise fetch the default model; it is not used here
source "$(dirname "$0")/common.sh"
cd "$REPO_ROOT"
DIR=fixtures/vision
OUT="$DIR/ref"
N_PREDICT=16
PROMPT=$'<|im_user|>user<|im_middle|><__media__>Describe this image.<|im_end|><|im_assistant|>assistant<|im_middle|>'
IMAGES="rgb64 rgb100x60 rgb37x51 rgba80 gray48 rgb200x150 rgb160x130 rgb90x240"
PROJECTORS="kimivl kimik25"
GLM_PROMPT=$'<|user|><__media__>Describe this image.<|assistant|>'
MODEL_FILE="$DIR/kimi.gguf"

BIN="$("$REF_DIR/build.sh" mtmd-ref)"
cargo run -q -p ferrox-models --example write_synthetic -- "$DIR" --vision >&2
mkdir -p "$OUT"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
printf '%s' "$PROMPT" > "$WORK/prompt.txt"
printf '%s' "$GLM_PROMPT" > "$WORK/glm-prompt.txt"

: > "$WORK/embed.jsonl"
for img in $IMAGES; do
    for proj in $PROJECTORS; do
        "$BIN" embed "$MODEL_FILE" "$DIR/$proj.mmproj.gguf" "$DIR/$img.png" "$THREADS" \
            "$OUT/$img.$proj.f32.embd" >> "$WORK/embed.jsonl"
        MTMD_REF_DEFAULTS=1 "$BIN" embed "$MODEL_FILE" "$DIR/$proj.mmproj.gguf" "$DIR/$img.png" \
            "$THREADS" "$OUT/$img.$proj.default.embd" >> "$WORK/embed.jsonl"
        "$BIN" greedy "$MODEL_FILE" "$DIR/$proj.mmproj.gguf" "$DIR/$img.png" \
            "$THREADS" "$N_PREDICT" "$WORK/prompt.txt" "$OUT/$img.$proj.greedy.json"
        echo "$img.$proj" >&2
    done
    "$BIN" greedy "$DIR/glm5v.gguf" "$DIR/kimik25.mmproj.gguf" "$DIR/$img.png" \
        "$THREADS" "$N_PREDICT" "$WORK/glm-prompt.txt" "$OUT/$img.glm5v.greedy.json"
done
for proj in $PROJECTORS; do
    MTMD_REF_IMAGE_MAX_TOKENS=12 "$BIN" embed "$MODEL_FILE" "$DIR/$proj.mmproj.gguf" \
        "$DIR/rgb200x150.png" "$THREADS" "$OUT/rgb200x150.$proj.max12.embd" >> "$WORK/embed.jsonl"
done
llama_cpp_meta > "$WORK/meta.json"
vision_manifest "$WORK/meta.json" "$WORK/embed.jsonl" "$WORK/prompt.txt" "$DIR" "$OUT/kimi-manifest.json" '(kimi.*|glm5v.*|.*\.png)'
echo "$OUT/kimi-manifest.json" >&2
