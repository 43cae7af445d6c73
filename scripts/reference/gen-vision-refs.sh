#!/usr/bin/env bash
# Regenerates fixtures/vision/ref/: llama.cpp's outputs for the synthetic Gemma 3 with image
# input (crates/ferrox-models/tests/synthetic/vision.rs).
#
#   1. `write_synthetic fixtures/vision --vision` (re)writes the inputs: gemma3.gguf (text
#      model), gemma3.mmproj.gguf (F32 projector), gemma3.f16.mmproj.gguf (F16 projector) and
#      the test images <image>.png (the generator is deterministic: unchanged inputs are
#      rewritten with the same bytes);
#   2. `mtmd-ref embed` (scripts/reference/mtmd-ref.c, built by build.sh) writes every image's
#      projector output with each projector: ref/<image>.f32.embd and ref/<image>.f16.embd, raw
#      little-endian f32 [16][128], the projector's flash attention off; and with llama.cpp's
#      defaults (flash attention auto: on, f16 keys and values) for the F32 projector:
#      ref/<image>.default.embd;
#   3. `mtmd-ref greedy` runs PROMPT (below) with every image and the F32 projector, 16 tokens
#      greedily: ref/<image>.greedy.json (f32 K/V cache, flash attention off);
#   4. `mtmd-ref greedy` on each SWEEP prompt (below: images at the very start, after a long
#      prefix, before a long suffix, two and three images, adjacent images, spanning many
#      sliding windows), 16 tokens with the F32 projector: ref/sweep-<name>.greedy.json;
#   5. ref/manifest.json: llama.cpp's build, the inputs' sha256, the prompt, and the settings
#      and shape line `embed` printed for each .embd file.
#   THREADS (default 2) threads.
set -euo pipefail
MODEL=/dev/null # common.sh would otherwise fetch the default model; it is not used here
source "$(dirname "$0")/common.sh"
cd "$REPO_ROOT"
DIR=fixtures/vision
OUT="$DIR/ref"
N_PREDICT=16
PROMPT=$'<start_of_turn>user\n<__media__>Describe this image.<end_of_turn>\n<start_of_turn>model\n'
IMAGES="rgb64 rgb100x60 rgb37x51 rgba80 gray48"

BIN="$("$REF_DIR/build.sh" mtmd-ref)"
cargo run -q -p ferrox-models --example write_synthetic -- "$DIR" --vision >&2
mkdir -p "$OUT"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
printf '%s' "$PROMPT" > "$WORK/prompt.txt"

: > "$WORK/embed.jsonl"
for img in $IMAGES; do
    for kind in f32 f16; do
        mmproj="$DIR/gemma3.mmproj.gguf"
        [ "$kind" = f16 ] && mmproj="$DIR/gemma3.f16.mmproj.gguf"
        "$BIN" embed "$DIR/gemma3.gguf" "$mmproj" "$DIR/$img.png" "$THREADS" "$OUT/$img.$kind.embd" >> "$WORK/embed.jsonl"
        echo "$img.$kind.embd" >&2
    done
    MTMD_REF_DEFAULTS=1 "$BIN" embed "$DIR/gemma3.gguf" "$DIR/gemma3.mmproj.gguf" "$DIR/$img.png" "$THREADS" "$OUT/$img.default.embd" >> "$WORK/embed.jsonl"
    echo "$img.default.embd" >&2
    "$BIN" greedy "$DIR/gemma3.gguf" "$DIR/gemma3.mmproj.gguf" "$DIR/$img.png" "$THREADS" "$N_PREDICT" \
        "$WORK/prompt.txt" "$OUT/$img.greedy.json"
    echo "$img.greedy.json" >&2
done

# The sweep: NAME|IMAGES (comma-separated)|PROMPT, positions kept under mtmd-ref's 512.
FOX="The quick brown fox jumps over the lazy dog. "
ASK="Tell me about the colours and the shapes you see, in detail please. "
SWEEP=(
    "start|rgb64|<__media__>Describe this image."
    "long-prefix|rgb100x60|<start_of_turn>user
$FOX$FOX$FOX$FOX<__media__>What is it?<end_of_turn>
<start_of_turn>model
"
    "long-suffix|rgb37x51|<start_of_turn>user
<__media__>$ASK$ASK$ASK<end_of_turn>
<start_of_turn>model
"
    "two-images|rgb64,gray48|<start_of_turn>user
First: <__media__> and second: <__media__> compare them.<end_of_turn>
<start_of_turn>model
"
    "adjacent|rgba80,rgb37x51|<__media__><__media__>"
    "three-images|gray48,rgb100x60,rgb64|<start_of_turn>user
$FOX<__media__>$FOX<__media__>$ASK<__media__> which is brightest?<end_of_turn>
<start_of_turn>model
"
)
for entry in "${SWEEP[@]}"; do
    name="${entry%%|*}"
    rest="${entry#*|}"
    images="${rest%%|*}"
    printf '%s' "${rest#*|}" > "$WORK/sweep.txt"
    paths=""
    for img in ${images//,/ }; do
        paths="$paths${paths:+,}$DIR/$img.png"
    done
    "$BIN" greedy "$DIR/gemma3.gguf" "$DIR/gemma3.mmproj.gguf" "$paths" "$THREADS" "$N_PREDICT" \
        "$WORK/sweep.txt" "$OUT/sweep-$name.greedy.json"
    echo "sweep-$name.greedy.json" >&2
done
llama_cpp_meta > "$WORK/meta.json"
vision_manifest "$WORK/meta.json" "$WORK/embed.jsonl" "$WORK/prompt.txt" "$DIR" "$OUT/manifest.json" '.*\.(gguf|png)'
echo "$OUT/manifest.json" >&2
