#!/usr/bin/env bash
# Regenerates the Qwen-VL part of fixtures/vision/ref/: llama.cpp's outputs for the synthetic
# Qwen-VL pairs (crates/ferrox-models/tests/synthetic/vision.rs: qwen2vl.gguf with the
# qwen25vl.mmproj.gguf and qwen2vl.mmproj.gguf projectors, qwen3vl.gguf with
# qwen3vl.mmproj.gguf).
#
#   1. `write_synthetic fixtures/vision --vision` (re)writes the inputs (deterministic);
#   2. `mtmd-ref embed` writes each image's projector output with each projector, flash
#      attention off (ref/<image>.<projector>.f32.embd) and with llama.cpp's defaults (flash
#      attention on: f16 keys and values; ref/<image>.<projector>.default.embd), raw
#      little-endian f32 [n_tokens][128] ([n_tokens][384] for Qwen3-VL: the main projection,
#      then its two deepstack mergers'), the tokens in raster order of the merged grid;
#   3. `mtmd-ref greedy` runs PROMPT (below) with each image through the Qwen2.5-VL and the
#      Qwen3-VL pairs, 16 tokens greedily (f32 K/V cache, flash attention off):
#      ref/<image>.<qwen25vl|qwen3vl>.greedy.json (the image chunk's M-RoPE positions: t, then
#      row and column offsets from it);
#   4. with llama.cpp's token limits (--image-min-tokens 40 on rgb100x60, --image-max-tokens 12
#      on rgb200x150), Qwen2.5-VL, flash attention off: ref/rgb100x60.qwen25vl.min40.embd and
#      ref/rgb200x150.qwen25vl.max12.embd;
#   5. ref/qwen-manifest.json: llama.cpp's build, the inputs' sha256, the prompt, and the
#      settings and shape line `embed` printed for each .embd file.
#   THREADS (default 2) threads.
set -euo pipefail
MODEL=/dev/null # common.sh would otherwise fetch the default model; it is not used here
source "$(dirname "$0")/common.sh"
cd "$REPO_ROOT"
DIR=fixtures/vision
OUT="$DIR/ref"
N_PREDICT=16
PROMPT=$'<|im_start|>user\n<__media__>Describe this image.<|im_end|>\n<|im_start|>assistant\n'
IMAGES="rgb64 rgb100x60 rgb37x51 rgba80 gray48 rgb200x150 rgb160x130 rgb90x240"
PROJECTORS="qwen25vl qwen2vl qwen3vl"
GREEDY="qwen25vl qwen3vl"
text_model() { if [ "$1" = qwen3vl ]; then echo qwen3vl.gguf; else echo qwen2vl.gguf; fi; }

BIN="$("$REF_DIR/build.sh" mtmd-ref)"
cargo run -q -p ferrox-models --example write_synthetic -- "$DIR" --vision >&2
mkdir -p "$OUT"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
printf '%s' "$PROMPT" > "$WORK/prompt.txt"

: > "$WORK/embed.jsonl"
for img in $IMAGES; do
    for proj in $PROJECTORS; do
        model="$DIR/$(text_model "$proj")"
        "$BIN" embed "$model" "$DIR/$proj.mmproj.gguf" "$DIR/$img.png" "$THREADS" \
            "$OUT/$img.$proj.f32.embd" >> "$WORK/embed.jsonl"
        MTMD_REF_DEFAULTS=1 "$BIN" embed "$model" "$DIR/$proj.mmproj.gguf" "$DIR/$img.png" \
            "$THREADS" "$OUT/$img.$proj.default.embd" >> "$WORK/embed.jsonl"
        echo "$img.$proj" >&2
    done
    for proj in $GREEDY; do
        "$BIN" greedy "$DIR/$(text_model "$proj")" "$DIR/$proj.mmproj.gguf" "$DIR/$img.png" \
            "$THREADS" "$N_PREDICT" "$WORK/prompt.txt" "$OUT/$img.$proj.greedy.json"
        echo "$img.$proj.greedy.json" >&2
    done
done
# Token limits (llama.cpp's --image-min-tokens / --image-max-tokens), Qwen2.5-VL, f32.
MTMD_REF_IMAGE_MIN_TOKENS=40 "$BIN" embed "$DIR/qwen2vl.gguf" "$DIR/qwen25vl.mmproj.gguf" \
    "$DIR/rgb100x60.png" "$THREADS" "$OUT/rgb100x60.qwen25vl.min40.embd" >> "$WORK/embed.jsonl"
MTMD_REF_IMAGE_MAX_TOKENS=12 "$BIN" embed "$DIR/qwen2vl.gguf" "$DIR/qwen25vl.mmproj.gguf" \
    "$DIR/rgb200x150.png" "$THREADS" "$OUT/rgb200x150.qwen25vl.max12.embd" >> "$WORK/embed.jsonl"
llama_cpp_meta > "$WORK/meta.json"
vision_manifest "$WORK/meta.json" "$WORK/embed.jsonl" "$WORK/prompt.txt" "$DIR" "$OUT/qwen-manifest.json" '(qwen.*|.*\.png)'
echo "$OUT/qwen-manifest.json" >&2
