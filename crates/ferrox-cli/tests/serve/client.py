#!/usr/bin/env python3
"""End-to-end checks of `ferrox serve` through the official `openai` Python client (and
httpx, which it ships with, for what the client cannot send). Driven by tests/serve.rs, which
starts the server with the default model, --parallel 8, --ctx-size 2048, an API key and the
Gemma 3 chat template file next to this script.

Prints one line per check and exits non-zero if any failed."""

import argparse
import json
import random
import re
import sys
import threading
import time
import traceback

try:
    import httpx
    import openai
except ImportError as e:  # pragma: no cover
    print(f"the `openai` Python package is not installed ({e}): run `python3 -m pip install openai` "
          "(scripts/test.sh does)", file=sys.stderr)
    sys.exit(3)

p = argparse.ArgumentParser()
p.add_argument("--base-url", required=True)
p.add_argument("--api-key", required=True)
p.add_argument("--n-ctx", type=int, default=2048)
p.add_argument("--only", nargs="*")
args = p.parse_args()

BASE = args.base_url
N_CTX = args.n_ctx
client = openai.OpenAI(base_url=f"{BASE}/v1", api_key=args.api_key, max_retries=0, timeout=180)
raw = httpx.Client(base_url=BASE, headers={"Authorization": f"Bearer {args.api_key}"}, timeout=180)
MODEL = None


def user(text):
    return [{"role": "user", "content": text}]


def tokenize(text, add_special=False):
    r = raw.post("/tokenize", json={"content": text, "add_special": add_special, "parse_special": True})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def expect_error(response, status, param=None, contains=()):
    assert response.status_code == status, f"expected {status}, got {response.status_code}: {response.text}"
    assert response.headers.get("x-request-id"), f"no X-Request-Id on a {status}: {response.headers}"
    body = response.json()
    err = body["error"]
    for key in ("message", "type", "param", "code"):
        assert key in err, f"error without '{key}': {body}"
    assert isinstance(err["message"], str) and err["message"], body
    if param is not None:
        assert err["param"] == param, f"param {err['param']!r} != {param!r}: {body}"
    for c in contains:
        assert str(c) in err["message"], f"{c!r} not in {err['message']!r}"
    return err


def still_serving():
    r = client.completions.create(model=MODEL, prompt="One, two,", max_tokens=2, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens >= 1


def stream_chat(messages, **kw):
    """Streams a chat completion; returns (chunks, content, first-content time, start time)."""
    start = time.monotonic()
    first = None
    chunks = []
    content = ""
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, stream=True, **kw):
        chunks.append(chunk)
        for c in chunk.choices:
            if c.delta.content and first is None:
                first = time.monotonic()
            content += c.delta.content or ""
    return chunks, content, first, start


CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


@check
def models():
    global MODEL
    data = client.models.list().data
    assert len(data) == 1 and data[0].id and data[0].owned_by, data
    MODEL = data[0].id
    assert client.models.retrieve(MODEL).id == MODEL


@check
def chat_non_streaming_and_usage():
    r = client.chat.completions.create(model=MODEL, messages=user("Write one sentence about the sea."), max_tokens=8, temperature=0)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == MODEL and r.created > 0
    c = r.choices[0]
    assert c.message.role == "assistant" and isinstance(c.message.content, str) and c.message.content
    assert c.finish_reason == "length", c.finish_reason
    # The rendered prompt (Gemma template: it prints <bos> itself) has exactly one BOS.
    expected = tokenize("<bos><start_of_turn>user\nWrite one sentence about the sea.<end_of_turn>\n<start_of_turn>model\n")
    assert expected[0] == 2 and expected[1] != 2
    u = r.usage
    assert u.prompt_tokens == len(expected), (u.prompt_tokens, len(expected))
    assert u.completion_tokens == 8 and u.total_tokens == u.prompt_tokens + 8
    assert u.prompt_tokens_details is not None and u.prompt_tokens_details.cached_tokens >= 0
    # An end-of-generation token ends with "stop" and is not part of the content (forced
    # here with logit_bias on <eos>, id 1: the default model is a base model).
    r = client.chat.completions.create(model=MODEL, messages=user("Hi"), temperature=0, logit_bias={"1": 100})
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content == "", r.choices[0]
    assert r.usage.completion_tokens == 1


@check
def chat_streaming_matches_non_streaming():
    msgs = user("Name three colors.")
    full = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, temperature=0)
    chunks, content, _, _ = stream_chat(msgs, max_tokens=10, temperature=0, stream_options={"include_usage": True})
    assert content == full.choices[0].message.content, (content, full.choices[0].message.content)
    ids = {c.id for c in chunks}
    assert len(ids) == 1 and chunks[0].id.startswith("chatcmpl-"), ids
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [i for i, c in enumerate(chunks) if c.choices and c.choices[0].finish_reason is not None]
    assert finals == [len(chunks) - 2], finals
    assert chunks[-2].choices[0].finish_reason == full.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])
    # Without include_usage: no usage chunk.
    chunks, content2, _, _ = stream_chat(msgs, max_tokens=10, temperature=0)
    assert content2 == content and all(c.usage is None for c in chunks) and chunks[-1].choices


@check
def completions_streaming_and_not():
    prompt = "The three primary colors are"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    assert r.id.startswith("cmpl-") and r.object == "text_completion"
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens == len(tokenize(prompt, add_special=True))
    text = ""
    finish = None
    ids = set()
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    for ch in chunks:
        ids.add(ch.id)
        for c in ch.choices:
            text += c.text
            if c.finish_reason is not None:
                assert finish is None
                finish = c.finish_reason
    assert text == r.choices[0].text and finish == "length" and len(ids) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == r.usage.total_tokens
    # Token ids as the prompt give the same result.
    ids_prompt = tokenize(prompt, add_special=True)
    r2 = client.completions.create(model=MODEL, prompt=ids_prompt, max_tokens=12, temperature=0)
    assert r2.choices[0].text == r.choices[0].text


@check
def several_choices_share_the_prompt():
    prompt = "Write one sentence about the sea. " * 8
    n_prompt = len(tokenize(prompt, add_special=True))
    hits = metric("ferrox_prefix_cache_hit_tokens_total")
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=1.0, seed=11, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2], r.choices
    assert all(c.finish_reason == "length" for c in r.choices)
    assert r.usage.prompt_tokens == n_prompt and r.usage.completion_tokens == 30, r.usage
    assert len({c.text for c in r.choices}) > 1, "three samples with different seeds were all equal"
    # The second and third choices waited for the first one's prefill and reused its blocks.
    assert metric("ferrox_prefix_cache_hit_tokens_total") - hits >= 2 * (n_prompt - 17)
    # Reproducible with the seed; greedy choices are all the same.
    again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=1.0, seed=11, n=3)
    assert [c.text for c in again.choices] == [c.text for c in r.choices]
    greedy = client.chat.completions.create(model=MODEL, messages=user("Name a fruit."), max_tokens=8,
                                            temperature=0, n=2)
    assert greedy.choices[0].message.content == greedy.choices[1].message.content
    # Streaming: every choice gets its role, its text and its finish; usage counts both.
    texts, finishes, roles = ["", ""], [None, None], [0, 0]
    usage = None
    for ch in client.chat.completions.create(model=MODEL, messages=user("Name a fruit."), max_tokens=8,
                                             temperature=0, n=2, stream=True, stream_options={"include_usage": True}):
        if ch.usage:
            usage = ch.usage
        for c in ch.choices:
            if c.delta.role:
                roles[c.index] += 1
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                assert finishes[c.index] is None
                finishes[c.index] = c.finish_reason
    assert roles == [1, 1] and finishes == ["length", "length"], (roles, finishes)
    assert texts == [greedy.choices[0].message.content] * 2, texts
    assert usage.completion_tokens == 16, usage
    expect_error(raw.post("/v1/completions", json={"prompt": "x", "n": 17}), 400, param="n")


@check
def stop_strings():
    prompt = "Here is a short story about a dragon who lived in a castle:"
    base = client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, temperature=0).choices[0].text
    assert len(base) > 20, base
    # A stop string from the middle of the text, which may span tokens.
    i = len(base) // 2
    stop = base[i:i + 4]
    cut = base.find(stop)
    assert cut > 0
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, temperature=0, stop=stop)
    assert r.choices[0].text == base[:cut] and r.choices[0].finish_reason == "stop", (r.choices[0].text, base[:cut])
    text = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=32, temperature=0, stop=[stop], stream=True) if c.choices)
    assert text == base[:cut], (text, base[:cut])
    # The earliest of several stops wins.
    j = len(base) * 3 // 4
    later = base[j:j + 3]
    if base.find(later) > cut:
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, temperature=0, stop=[later, stop])
        assert r.choices[0].text == base[:cut]
    # Chat too, streaming.
    msgs = user("Count from one to ten in words, separated by commas.")
    full = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=24, temperature=0).choices[0].message.content
    word = full.split(",")[2].strip() if full.count(",") >= 3 else full[len(full) // 2:][:3]
    cut = full.find(word)
    _, content, _, _ = stream_chat(msgs, max_tokens=24, temperature=0, stop=word)
    assert content == full[:cut], (content, full[:cut])


@check
def seed_reproducibility():
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=1.0, top_p=1.0,
              extra_body={"top_k": 0, "min_p": 0.0})
    a = client.completions.create(seed=1234, **kw).choices[0].text
    b = client.completions.create(seed=1234, **kw).choices[0].text
    assert a == b, (a, b)
    others = {client.completions.create(seed=s, **kw).choices[0].text for s in (1, 2, 3)}
    assert len(others | {a}) >= 2, others


@check
def logprobs():
    r = client.chat.completions.create(model=MODEL, messages=user("What is two plus two?"), max_tokens=6, temperature=0,
                                       logprobs=True, top_logprobs=3)
    c = r.choices[0]
    content = c.logprobs.content
    assert c.finish_reason == "length" and len(content) == r.usage.completion_tokens == 6
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        tops = [x.logprob for x in t.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert abs(t.logprob - tops[0]) < 1e-6 and t.token == t.top_logprobs[0].token  # greedy
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token
    assert "".join(t.token for t in content) == c.message.content
    r = client.completions.create(model=MODEL, prompt="Two plus two is", max_tokens=5, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert all(x <= 0 for x in lp.token_logprobs) and all(len(t) <= 2 for t in lp.top_logprobs)
    assert r.choices[0].logprobs.text_offset[0] == 0


PROMPTS = [
    "Explain why the sky is blue.",
    "Write a haiku about autumn leaves falling on a quiet pond.",
    "List four animals that live in the ocean.",
    "What is the capital of Japan? Answer and then describe the city in two sentences, "
    "mentioning its history, its food and its transport.",
]


def greedy_stream(prompt):
    chunks, content, _, _ = stream_chat(user(prompt), max_tokens=12, temperature=0, logprobs=True)
    lps = [t.logprob for c in chunks for ch in c.choices if ch.logprobs and ch.logprobs.content for t in ch.logprobs.content]
    finish = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    return content, lps, finish


@check
def sixteen_concurrent_streams_equal_single_requests():
    single = {p: greedy_stream(p) for p in PROMPTS}
    results = [None] * 16
    barrier = threading.Barrier(16)

    def worker(i):
        barrier.wait()
        try:
            results[i] = greedy_stream(PROMPTS[i % len(PROMPTS)])
        except Exception as e:  # noqa: BLE001
            results[i] = e

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, res in enumerate(results):
        assert not isinstance(res, Exception), f"client {i}: {res!r}"
        want = single[PROMPTS[i % len(PROMPTS)]]
        assert res == want, f"client {i}: {res} != {want}"
    print(f"    16 streams in {time.monotonic() - t0:.1f} s", flush=True)


@check
def bad_input_gets_its_status_and_the_server_goes_on():
    url = "/v1/chat/completions"
    ok = {"model": MODEL, "messages": user("hi"), "max_tokens": 2}
    cases = [
        ("malformed JSON", lambda: raw.post(url, content=b'{"messages": [', headers={"content-type": "application/json"}), 400, None),
        ("not an object", lambda: raw.post(url, json=[1, 2]), 400, None),
        ("messages wrong type", lambda: raw.post(url, json={**ok, "messages": "hi"}), 400, "messages"),
        ("temperature wrong type", lambda: raw.post(url, json={**ok, "temperature": "hot"}), 400, "temperature"),
        ("max_tokens wrong type", lambda: raw.post(url, json={**ok, "max_tokens": "many"}), 400, "max_tokens"),
        ("stop wrong type", lambda: raw.post(url, json={**ok, "stop": 5}), 400, "stop"),
        ("top_p out of range", lambda: raw.post(url, json={**ok, "top_p": 1.5}), 400, "top_p"),
        ("empty messages", lambda: raw.post(url, json={**ok, "messages": []}), 400, "messages"),
        ("n out of range", lambda: raw.post(url, json={**ok, "n": 0}), 400, "n"),
        ("best_of", lambda: raw.post(url, json={**ok, "best_of": 2}), 400, "best_of"),
        ("unknown tool", lambda: raw.post(url, json={**ok, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}), 400, "tool_choice"),
        ("invalid schema", lambda: raw.post(url, json={**ok, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}}), 400, "response_format"),
        ("invalid grammar", lambda: raw.post(url, json={**ok, "grammar": "root ::= undefined-rule"}), 400, "grammar"),
        ("roles do not alternate", lambda: raw.post(url, json={**ok, "messages": [{"role": "assistant", "content": "x"}]}), 400, "messages"),
        ("unknown model", lambda: raw.post(url, json={**ok, "model": "gpt-4"}), 404, "model"),
        ("unknown route", lambda: raw.post("/v1/nothing", json=ok), 404, None),
        ("wrong method", lambda: raw.get(url), 405, None),
        ("10 MB body", lambda: raw.post(url, content=b'{"messages": "' + b"a" * (10 << 20) + b'"}', headers={"content-type": "application/json"}), 413, None),
        ("missing API key", lambda: httpx.post(BASE + url, json=ok, timeout=60), 401, None),
        ("wrong API key", lambda: httpx.post(BASE + url, json=ok, headers={"Authorization": "Bearer nope"}, timeout=60), 401, None),
    ]
    for name, send, status, param in cases:
        try:
            expect_error(send(), status, param)
            still_serving()
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from e
    # Unknown extra fields are ignored.
    r = raw.post(url, json={**ok, "some_future_field": {"x": 1}})
    assert r.status_code == 200, r.text
    # /health needs no key.
    assert httpx.get(BASE + "/health", timeout=30).status_code == 200
    # Huge max_tokens and an over-long prompt: 400 giving both numbers.
    err = expect_error(raw.post(url, json={**ok, "max_tokens": 1_000_000}), 400, "max_tokens", contains=("1000000", str(N_CTX)))
    long_prompt = "word " * (N_CTX + 200)
    n_long = len(tokenize(long_prompt, add_special=True))
    err = expect_error(raw.post("/v1/completions", json={"model": MODEL, "prompt": long_prompt, "max_tokens": 4}), 400,
                       "prompt", contains=(str(n_long), str(N_CTX)))
    still_serving()
    # The SDK maps the statuses to its exception types.
    try:
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=2)
        raise AssertionError("empty messages accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body["param"] == "messages", e.body
    try:
        openai.OpenAI(base_url=f"{BASE}/v1", api_key="wrong", max_retries=0).models.list()
        raise AssertionError("wrong key accepted")
    except openai.AuthenticationError:
        pass
    try:
        client.chat.completions.create(model="nope", messages=user("x"), max_tokens=2)
        raise AssertionError("unknown model accepted")
    except openai.NotFoundError:
        pass
    still_serving()


def metric(name):
    text = raw.get("/metrics").text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


@check
def disconnect_mid_stream_frees_the_slot():
    cancelled = metric("ferrox_requests_cancelled_total")
    body = {"model": MODEL, "prompt": "Write a very long essay about the history of mathematics.", "max_tokens": 1500,
            "temperature": 0, "stream": True}
    with raw.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen += 1
                if seen >= 3:
                    break
    # The response is closed: the server cancels the sequence at its next step.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if metric("ferrox_active_sequences") == 0 and metric("ferrox_requests_cancelled_total") > cancelled:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the disconnected stream's sequence is still running")
    still_serving()


@check
def prefix_reuse_cuts_ttft():
    rng = random.Random(time.time())
    words = ["river", "stone", "lantern", "harbor", "meadow", "copper", "violet", "thunder", "orchard", "glacier"]
    tag = rng.randrange(10**9)
    sentences = [f"Record {tag}-{i}: the {rng.choice(words)} and the {rng.choice(words)} met near marker {i * 37 % 101}."
                 for i in range(40)]
    prefix = "Read these records carefully.\n" + "\n".join(sentences)
    n_prefix = len(tokenize(prefix, add_special=True))
    assert n_prefix >= 1000, n_prefix

    def ttft_raw(suffix):
        # Raw SSE, to see the comment pings (the server runs with --sse-ping 1) that keep
        # the connection alive while the long prompt is prefilled.
        body = {"model": MODEL, "prompt": prefix + suffix, "max_tokens": 1, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        start = time.monotonic()
        first = None
        pings_before_first = 0
        usage = None
        with raw.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith(":"):
                    if first is None:
                        pings_before_first += 1
                elif line.startswith("data: ") and line != "data: [DONE]":
                    msg = json.loads(line[6:])
                    if first is None and msg["choices"] and (msg["choices"][0]["text"] or msg["choices"][0]["finish_reason"]):
                        first = time.monotonic()
                    if msg.get("usage"):
                        usage = openai.types.CompletionUsage(**msg["usage"])
        return first - start, usage, pings_before_first

    def ttft(suffix):
        start = time.monotonic()
        first = None
        usage = None
        for ch in client.completions.create(model=MODEL, prompt=prefix + suffix, max_tokens=1, temperature=0, stream=True,
                                            stream_options={"include_usage": True}):
            if first is None and ch.choices and (ch.choices[0].text or ch.choices[0].finish_reason):
                first = time.monotonic()
            if ch.usage:
                usage = ch.usage
        return first - start, usage

    t1, u1, pings = ttft_raw("\nQuestion: which record mentions the harbor first?")
    t2, u2 = ttft("\nQuestion: how many records are there?")
    cached = u2.prompt_tokens_details.cached_tokens
    print(f"    prefix {n_prefix} tokens: TTFT {t1:.3f} s cold, {t2:.3f} s reused ({cached} cached), ratio {t2 / t1:.3f}", flush=True)
    assert u1.prompt_tokens_details.cached_tokens < 50, u1
    assert pings >= 1 or t1 < 1.5, f"no SSE ping during a {t1:.1f} s prefill"
    # The cache shares whole blocks of 16 positions.
    assert n_prefix - 16 <= cached < n_prefix and cached % 16 == 0, (cached, n_prefix)
    assert t2 <= 0.25 * t1, (t1, t2)

    # Without max_tokens, generation goes on until the context is full ("length"), and
    # prompt + completion never exceed it. The prompt reuses the cached prefix.
    filler = ""
    while len(tokenize(prefix + filler, add_special=True)) < N_CTX - 6:
        filler += "\nAnd more." * max(1, (N_CTX - 6 - len(tokenize(prefix + filler, add_special=True))) // 4)
    ids = tokenize(prefix + filler, add_special=True)[:N_CTX - 6]
    r = client.completions.create(model=MODEL, prompt=ids, temperature=0, logit_bias={"1": -100, "106": -100})
    assert r.choices[0].finish_reason == "length", r.choices[0]
    assert r.usage.prompt_tokens == N_CTX - 6 and r.usage.total_tokens == N_CTX, r.usage


@check
def tokenize_detokenize_metrics():
    r = raw.post("/tokenize", json={"content": "Hello world", "with_pieces": True}).json()
    ids = [t["id"] for t in r["tokens"]]
    assert "".join(t["piece"] for t in r["tokens"]) == "Hello world"
    assert raw.post("/detokenize", json={"tokens": ids}).json()["content"] == "Hello world"
    text = raw.get("/metrics").text
    for name in ("ferrox_requests_total", "ferrox_prompt_tokens_total", "ferrox_generated_tokens_total",
                 "ferrox_time_to_first_token_seconds_bucket", "ferrox_inter_token_latency_seconds_bucket",
                 "ferrox_requests_waiting", "ferrox_active_sequences", "ferrox_kv_cache_usage_ratio",
                 "ferrox_kv_blocks_used", "ferrox_kv_blocks_cached", "ferrox_kv_blocks_free",
                 "ferrox_prefix_cache_hit_tokens_total"):
        assert name in text, name
    assert metric("ferrox_generated_tokens_total") > 0
    # Finished requests leave their full blocks in the prefix cache.
    assert metric("ferrox_kv_blocks_cached") > 0


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')


def scrape():
    """Every sample of /metrics as (name, labels, value); fails on a line that is not valid
    Prometheus text."""
    r = raw.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r
    out = []
    for line in r.text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample: {line!r}"
        labels = {}
        if m.group(2):
            pos = 0
            while pos < len(m.group(2)):
                lm = LABEL.match(m.group(2), pos)
                assert lm, f"bad labels: {line!r}"
                labels[lm.group(1)] = re.sub(r'\\(.)', lambda e: "\n" if e.group(1) == "n" else e.group(1), lm.group(2))
                pos = lm.end()
        out.append((m.group(1), labels, float(m.group(3))))
    return out


def sample(samples, name, **labels):
    found = [v for n, l, v in samples if n == name and all(l.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return found[0]


VLLM_NAMES = {
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_requests_running": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:gpu_cache_usage_perc": "gauge",
    "vllm:cache_config_info": "gauge",
    "vllm:prompt_tokens_total": "counter",
    "vllm:generation_tokens_total": "counter",
    "vllm:request_success_total": "counter",
    "vllm:num_preemptions_total": "counter",
    "vllm:spec_decode_num_drafts_total": "counter",
    "vllm:spec_decode_num_draft_tokens_total": "counter",
    "vllm:spec_decode_num_accepted_tokens_total": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
}


def wait_idle():
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        s = scrape()
        if sample(s, "vllm:num_requests_running") == 0 and sample(s, "vllm:num_requests_waiting") == 0:
            return s
        time.sleep(0.1)
    raise AssertionError("the server is not idle")


@check
def vllm_metrics_for_routers():
    """The names, types and labels vLLM exports, which the inference gateway's endpoint picker
    and vLLM-compatible routers scrape."""
    # Scraped without the key, as the endpoint picker does; the API still needs it.
    bare = httpx.Client(base_url=BASE, timeout=30)
    assert bare.get("/metrics").status_code == 200
    assert bare.get("/v1/models").status_code == 401
    text = raw.get("/metrics").text
    for name, kind in VLLM_NAMES.items():
        assert f"# TYPE {name} {kind}\n" in text, f"{name} ({kind}) not in /metrics"
    before = wait_idle()
    for name, labels, _ in before:
        if name.startswith("vllm:"):
            assert labels.get("model_name") == MODEL, (name, labels)
            assert any(name == n or name.startswith(n + "_") for n in VLLM_NAMES), name
    assert sample(before, "vllm:num_requests_running", model_name=MODEL) == 0
    assert sample(before, "vllm:num_requests_running") == sample(before, "ferrox_active_sequences")
    usage = sample(before, "vllm:kv_cache_usage_perc", model_name=MODEL)
    assert 0 <= usage <= 1 and usage == sample(before, "vllm:gpu_cache_usage_perc"), usage
    assert sample(before, "vllm:num_preemptions_total") == 0
    info = [l for n, l, v in before if n == "vllm:cache_config_info" and v == 1]
    assert len(info) == 1, info
    assert info[0]["block_size"] == "16", info
    assert int(info[0]["num_gpu_blocks"]) == sample(before, "ferrox_kv_blocks_total") > 0, info
    assert info[0]["cache_dtype"] in ("float16", "float32"), info

    def count(s, name):
        return sample(s, name + "_count", model_name=MODEL)

    def finished(s):
        return sum(sample(s, "vllm:request_success_total", finished_reason=r) for r in ("stop", "length", "abort"))

    # Three requests, one sequence each: every per-request histogram and counter moves by
    # exactly what they did. End-of-turn tokens are banned so that each runs to max_tokens.
    no_eos = {"1": -100, "106": -100}
    prompt_tokens = completion_tokens = 0
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5, temperature=0,
                                  logit_bias=no_eos)
    prompt_tokens += r.usage.prompt_tokens
    completion_tokens += r.usage.completion_tokens
    r = client.chat.completions.create(model=MODEL, messages=user("Say hi."), max_tokens=6, temperature=0,
                                       logit_bias=no_eos)
    prompt_tokens += r.usage.prompt_tokens
    completion_tokens += r.usage.completion_tokens
    for ch in client.completions.create(model=MODEL, prompt="The sky is", max_tokens=4, temperature=0, stream=True,
                                        stream_options={"include_usage": True}, logit_bias=no_eos):
        if ch.usage:
            prompt_tokens += ch.usage.prompt_tokens
            completion_tokens += ch.usage.completion_tokens
    after = wait_idle()
    for name in ("vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                 "vllm:time_to_first_token_seconds"):
        assert count(after, name) == count(before, name) + 3, (name, count(before, name), count(after, name))
        assert sample(after, name + "_bucket", le="+Inf") == count(after, name)
    assert finished(after) == finished(before) + 3
    assert sample(after, "vllm:request_success_total", finished_reason="length") == \
        sample(before, "vllm:request_success_total", finished_reason="length") + 3
    assert sample(after, "vllm:request_success_total", finished_reason="abort") == \
        sample(before, "vllm:request_success_total", finished_reason="abort")
    assert sample(after, "vllm:prompt_tokens_total") == sample(before, "vllm:prompt_tokens_total") + prompt_tokens
    assert sample(after, "vllm:generation_tokens_total") == \
        sample(before, "vllm:generation_tokens_total") + completion_tokens
    itl = count(after, "vllm:inter_token_latency_seconds") - count(before, "vllm:inter_token_latency_seconds")
    assert itl == completion_tokens - 3, (itl, completion_tokens)
    assert count(after, "vllm:time_per_output_token_seconds") == count(after, "vllm:inter_token_latency_seconds")
    e2e = sample(after, "vllm:e2e_request_latency_seconds_sum") - sample(before, "vllm:e2e_request_latency_seconds_sum")
    ttft = sample(after, "vllm:time_to_first_token_seconds_sum") - sample(before, "vllm:time_to_first_token_seconds_sum")
    assert 0 < ttft <= e2e, (ttft, e2e)


@check
def request_ids_are_echoed():
    body = {"model": MODEL, "prompt": "One, two,", "max_tokens": 2, "temperature": 0}
    r = raw.post("/v1/completions", json=body, headers={"X-Request-Id": "client-id-123"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "client-id-123", r.headers
    generated = {raw.post("/v1/completions", json=body).headers.get("x-request-id") for _ in range(2)}
    assert len(generated) == 2 and all(generated), generated
    longest = "a" * 128
    assert raw.get("/v1/models", headers={"X-Request-Id": longest}).headers["x-request-id"] == longest
    # Ids that cannot go into a log line or are too long are replaced.
    for bad in ["a" * 129, b"caf\xc3\xa9"]:
        got = raw.get("/v1/models", headers={"X-Request-Id": bad}).headers.get("x-request-id")
        assert got and got != bad and len(got) <= 128, (bad, got)
    # Errors, streams and the open routes carry it too.
    r = raw.get("/v1/nothing", headers={"X-Request-Id": "err-404"})
    assert r.status_code == 404 and r.headers["x-request-id"] == "err-404", r
    r = raw.post("/v1/completions", json={**body, "max_tokens": "many"}, headers={"X-Request-Id": "err-400"})
    assert r.status_code == 400 and r.headers["x-request-id"] == "err-400", r
    r = httpx.get(BASE + "/v1/models", headers={"X-Request-Id": "err-401"}, timeout=30)
    assert r.status_code == 401 and r.headers["x-request-id"] == "err-401", r
    r = httpx.get(BASE + "/health", timeout=30)
    assert r.status_code == 200 and r.headers.get("x-request-id"), r.headers
    with raw.stream("POST", "/v1/completions", json={**body, "stream": True}, headers={"X-Request-Id": "stream-7"}) as r:
        assert r.status_code == 200 and r.headers["x-request-id"] == "stream-7", r.headers
        assert any(line == "data: [DONE]" for line in r.iter_lines())
    # Through the SDK.
    r = client.chat.completions.with_raw_response.create(model=MODEL, messages=user("hi"), max_tokens=2,
                                                         extra_headers={"X-Request-Id": "sdk-1"})
    assert r.headers["x-request-id"] == "sdk-1" and r.parse().choices[0].message.content is not None


@check
def sglang_info_endpoints():
    info = raw.get("/get_model_info").json()
    assert info["model_path"].endswith(".gguf") and info["is_generation"] is True, info
    assert info["tokenizer_path"] == info["model_path"], info
    server = raw.get("/get_server_info").json()
    assert server["model_path"] == info["model_path"] and server["served_model_name"] == MODEL, server
    assert server["context_length"] == N_CTX and server["max_req_input_len"] == N_CTX - 1, server
    assert server["version"] and server["page_size"] == 16, server
    blocks = sample(scrape(), "ferrox_kv_blocks_total")
    assert server["max_total_num_tokens"] == server["max_total_tokens"] == blocks * 16, (server, blocks)
    # Behind the API key like the rest.
    assert httpx.get(BASE + "/get_server_info", timeout=30).status_code == 401


def main():
    failed = []
    selected = [c for c in CHECKS if not args.only or c.__name__ in args.only or c.__name__ == "models"]
    for fn in selected:
        t0 = time.monotonic()
        try:
            fn()
            print(f"ok   {fn.__name__} ({time.monotonic() - t0:.1f} s)", flush=True)
        except Exception:  # noqa: BLE001
            failed.append(fn.__name__)
            print(f"FAIL {fn.__name__} ({time.monotonic() - t0:.1f} s)", flush=True)
            traceback.print_exc(file=sys.stdout)
            sys.stdout.flush()
    print(f"{len(selected) - len(failed)} checks passed, {len(failed)} failed" + (f": {', '.join(failed)}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
