#!/usr/bin/env python3
"""Images through `ferrox serve --mmproj` with the official `openai` client, on a synthetic
pair of fixtures/vision (driven by tests/serve.rs; the Gemma 3 pair by default, `--reference
qwen25vl-server.json --model qwen2vl.gguf` the Qwen-VL one): each image's answer equals
llama-server's on the same pair (fixtures/vision/ref/<reference>), 8 concurrent requests with
different images equal their solo answers, and bad images are 400s naming the problem while
the server goes on serving. Prints one line per check; exits non-zero if any failed."""

import argparse
import base64
import concurrent.futures as cf
import json
import sys

import openai

p = argparse.ArgumentParser()
p.add_argument("--base-url", required=True)
p.add_argument("--api-key", required=True)
p.add_argument("--fixtures", required=True)
p.add_argument("--reference", default="server.json")
p.add_argument("--model", default="gemma3.gguf")
args = p.parse_args()
MODEL = args.model

client = openai.OpenAI(base_url=args.base_url + "/v1", api_key=args.api_key, max_retries=0)
reference = json.load(open(f"{args.fixtures}/ref/{args.reference}", encoding="utf-8"))["answers"]
IMAGES = list(reference)
failed = 0


def check(name, ok, detail=""):
    global failed
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else f": {detail}"))
    failed += not ok


def data_url(name):
    data = base64.b64encode(open(f"{args.fixtures}/{name}.png", "rb").read()).decode()
    return "data:image/png;base64," + data


def ask(url, text="Describe this image."):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": text}]}],
        max_tokens=16, temperature=0)
    return r.choices[0].message.content, r.usage.prompt_tokens


def same_text(ours, theirs):
    # Both leave out a trailing incomplete UTF-8 sequence at a length cutoff.
    return ours == theirs


solo = {}
for name in IMAGES:
    content, prompt_tokens = ask(data_url(name))
    solo[name] = content
    want = reference[name]
    check(f"{name}: llama-server's answer", same_text(content, want["content"]),
          f"{content!r} vs {want['content']!r}")
    check(f"{name}: {want['prompt_tokens']} prompt positions", prompt_tokens == want["prompt_tokens"],
          prompt_tokens)

# Two images in a message, long text around an image, images in two turns.
conversations = json.load(open(f"{args.fixtures}/ref/{args.reference}", encoding="utf-8"))["conversations"]
for name, want in conversations.items():
    r = client.chat.completions.create(model=MODEL, messages=want["messages"], max_tokens=16,
                                       temperature=0)
    content = r.choices[0].message.content
    check(f"{name}: llama-server's answer", same_text(content, want["content"]),
          f"{content!r} vs {want['content']!r}")
    check(f"{name}: {want['prompt_tokens']} prompt positions", r.usage.prompt_tokens == want["prompt_tokens"],
          r.usage.prompt_tokens)

names = (IMAGES * 2)[:8]
with cf.ThreadPoolExecutor(8) as ex:
    answers = list(ex.map(lambda n: ask(data_url(n))[0], names))
same = sum(a == solo[n] for a, n in zip(answers, names))
check("8 concurrent requests with different images equal their solo answers", same == 8, f"{same}/8")


# The same image through the Anthropic Messages and the Responses APIs: the same answer.
import httpx
headers = {"Authorization": f"Bearer {args.api_key}", "x-api-key": args.api_key}
png = base64.b64encode(open(f"{args.fixtures}/gray48.png", "rb").read()).decode()
m = httpx.post(args.base_url + "/v1/messages", headers=headers, timeout=60, json={
    "model": MODEL, "max_tokens": 16, "temperature": 0,
    "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}},
        {"type": "text", "text": "Describe this image."}]}]}).json()
text = "".join(b.get("text", "") for b in m.get("content", []))
check("an Anthropic image block gives the chat answer", text == solo["gray48"], f"{m}")
r = httpx.post(args.base_url + "/v1/responses", headers=headers, timeout=60, json={
    "model": MODEL, "max_output_tokens": 16, "temperature": 0,
    "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": data_url("gray48")},
        {"type": "input_text", "text": "Describe this image."}]}]}).json()
text = "".join(c.get("text", "") for o in r.get("output", []) for c in o.get("content", []))
check("a Responses input_image gives the chat answer", text == solo["gray48"], f"{r}")


def bad(label, url, needle):
    try:
        ask(url)
        check(label, False, "accepted")
    except openai.BadRequestError as e:
        check(label, needle in str(e), str(e))


bad("a remote URL is refused without --allow-remote-images", "https://example.com/cat.png", "--allow-remote-images")
bad("a file URL is refused", "file:///etc/passwd", "http:// or https://")
bad("invalid base64 is refused", "data:image/png;base64,@@@@", "base64")
bad("bytes that are no image are refused", "data:image/png;base64," + base64.b64encode(b"not an image").decode(),
    "could not be decoded")
r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}],
                                   max_tokens=4, temperature=0)
check("text requests go on after bad images", r.choices[0].finish_reason in ("length", "stop"))
sys.exit(1 if failed else 0)
