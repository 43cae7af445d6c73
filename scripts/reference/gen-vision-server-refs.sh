#!/usr/bin/env bash
# llama-server's answers for the image fixtures: starts llama-server on the synthetic Gemma 3
# pair of fixtures/vision (f32 K and V cache, flash attention off, as the f32 comparisons
# need), sends each image through /v1/chat/completions (an `image_url` data URL, then the
# text "Describe this image.", temperature 0, 16 tokens), then a few conversations (two
# images in a message, long text around an image, images in two turns) and writes
# fixtures/vision/ref/server.json: {"settings", "answers": {image: content},
# "conversations": {name: {messages, content, prompt_tokens}}}.
#   PAIR=qwen25vl    the synthetic Qwen2.5-VL pair instead (qwen2vl.gguf, qwen25vl.mmproj.gguf,
#                    the Qwen images too): fixtures/vision/ref/qwen25vl-server.json;
#   PAIR=qwen3vl     the Qwen3-VL pair (qwen3vl.gguf, qwen3vl.mmproj.gguf): qwen3vl-server.json
#   PAIR=kimivl      the Kimi-VL pair (kimi.gguf, kimivl.mmproj.gguf): kimivl-server.json
#   PAIR=kimik25     the Kimi-K2.5 pair (kimi.gguf, kimik25.mmproj.gguf): kimik25-server.json
#   LLAMA_CPP_BUILD  the llama.cpp build dir with bin/llama-server (default /work/ref/build)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BUILD="${LLAMA_CPP_BUILD:-/work/ref/build}"
DIR="$ROOT/fixtures/vision"
PORT="${PORT:-18111}"
PAIR="${PAIR:-gemma3}"
case "$PAIR" in
    gemma3) MODEL=gemma3.gguf; MMPROJ=gemma3.mmproj.gguf; OUT=server.json
            IMAGES="rgb64 rgb100x60 rgb37x51 rgba80 gray48" ;;
    qwen25vl) MODEL=qwen2vl.gguf; MMPROJ=qwen25vl.mmproj.gguf; OUT=qwen25vl-server.json
              IMAGES="rgb64 rgb100x60 rgb37x51 rgba80 gray48 rgb200x150 rgb160x130 rgb90x240" ;;
    qwen3vl) MODEL=qwen3vl.gguf; MMPROJ=qwen3vl.mmproj.gguf; OUT=qwen3vl-server.json
             IMAGES="rgb64 rgb100x60 rgb37x51 rgba80 gray48 rgb200x150 rgb160x130 rgb90x240" ;;
    kimivl|kimik25) MODEL=kimi.gguf; MMPROJ=$PAIR.mmproj.gguf; OUT=$PAIR-server.json
             IMAGES="rgb64 rgb100x60 rgb37x51 rgba80 gray48 rgb200x150 rgb160x130 rgb90x240" ;;
    *) echo "PAIR must be gemma3, qwen25vl, qwen3vl, kimivl or kimik25" >&2; exit 2 ;;
esac
"$BUILD/bin/llama-server" -m "$DIR/$MODEL" --mmproj "$DIR/$MMPROJ" \
    -ctk f32 -ctv f32 -fa off -t 2 -np 1 -c 512 --port "$PORT" --no-webui >/tmp/llama-server-vision.log 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    sleep 0.5
done
python3 - "$PORT" "$DIR" "$OUT" "$IMAGES" <<'PY'
import base64, json, sys, urllib.request
port, d, out_name, images = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split()
answers = {}
for name in images:
    data = base64.b64encode(open(f"{d}/{name}.png", "rb").read()).decode()
    body = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + data}},
        {"type": "text", "text": "Describe this image."}]}],
        "max_tokens": 16, "temperature": 0}
    r = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                               data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    out = json.load(urllib.request.urlopen(r))
    answers[name] = {"content": out["choices"][0]["message"]["content"],
                     "prompt_tokens": out["usage"]["prompt_tokens"]}

def image(name):
    data = base64.b64encode(open(f"{d}/{name}.png", "rb").read()).decode()
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + data}}


def text(t):
    return {"type": "text", "text": t}


# Several images, long text around them, an image in an earlier turn.
FOX = "The quick brown fox jumps over the lazy dog. "
ASK = "Tell me about the colours and the shapes you see, in detail please. "
conversations = {
    "two-images": [{"role": "user", "content": [
        text("First:"), image("rgb64"), text(" and second:"), image("gray48"), text(" compare them.")]}],
    "long-text": [{"role": "user", "content": [text(FOX * 4), image("rgb100x60"), text(ASK * 3)]}],
    "two-turns": [
        {"role": "user", "content": [image("rgb37x51"), text("What is it?")]},
        {"role": "assistant", "content": "A small picture."},
        {"role": "user", "content": [image("rgba80"), text("And this one?")]}],
}
conversation_answers = {}
for name, messages in conversations.items():
    body = {"messages": messages, "max_tokens": 16, "temperature": 0}
    r = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                               data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    out = json.load(urllib.request.urlopen(r))
    conversation_answers[name] = {"messages": messages,
                                  "content": out["choices"][0]["message"]["content"],
                                  "prompt_tokens": out["usage"]["prompt_tokens"]}
json.dump({"settings": {"server": "llama-server", "cache": "f32", "flash_attn": "off",
                        "max_tokens": 16, "temperature": 0},
           "answers": answers, "conversations": conversation_answers},
          open(f"{d}/ref/{out_name}", "w"), indent=1, ensure_ascii=False)
print(json.dumps(answers, ensure_ascii=False))
PY
