"""Checks `ferrox serve --embeddings --pooling mean` on the synthetic llama.f32 sweep model
through the official `openai` client and raw HTTP, against llama.cpp's embeddings of the same
file (crates/ferrox-models/tests/fixtures/embeddings/llama.f32.json): the client's default
(base64) and float encodings, `dimensions`, llama-server's `/embedding` and
`embd_normalize`, embedding and greedy generation requests running together equal to their
solo runs, and bad requests answered 400.
Usage: embeddings_client.py --base-url URL --fixture FILE --n-ctx N"""
import argparse
import json
import math
import sys
import threading
import traceback

import httpx
import openai

p = argparse.ArgumentParser()
p.add_argument("--base-url", required=True)
p.add_argument("--fixture", required=True)
p.add_argument("--n-ctx", type=int, required=True)
args = p.parse_args()
client = openai.OpenAI(base_url=f"{args.base_url}/v1", api_key="none", max_retries=0, timeout=120)
raw = httpx.Client(base_url=args.base_url, timeout=120)
MODEL = client.models.list().data[0].id
FIXTURE = json.load(open(args.fixture))
SEQS = FIXTURE["sequences"]
MEAN = [v[0] for v in FIXTURE["pooled"]["mean"]]
TOL = 1e-4
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def unit(v):
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v]


def close(ours, ref, what, tol=TOL):
    assert len(ours) == len(ref), f"{what}: {len(ours)} values, expected {len(ref)}"
    scale = max(abs(x) for x in ref)
    worst = max(abs(a - b) for a, b in zip(ours, ref)) / scale
    assert worst <= tol, f"{what}: relative difference {worst:.2e} > {tol:.0e}"
    return worst


@check
def openai_client_default_encoding():
    # The client asks for base64 and decodes it.
    r = client.embeddings.create(model=MODEL, input=SEQS)
    assert [d.index for d in r.data] == list(range(len(SEQS))), r.data
    worst = max(close(d.embedding, unit(m), f"input {i}") for i, (d, m) in enumerate(zip(r.data, MEAN)))
    assert r.usage.prompt_tokens == sum(map(len, SEQS)) == r.usage.total_tokens, r.usage
    assert r.model == MODEL
    floats = client.embeddings.create(model=MODEL, input=SEQS, encoding_format="float")
    assert [d.embedding for d in floats.data] == [d.embedding for d in r.data], "float != base64"
    return f"{len(SEQS)} inputs, largest relative difference from llama.cpp {worst:.1e}"


@check
def dimensions_truncate_then_normalize():
    r = client.embeddings.create(model=MODEL, input=SEQS[1], dimensions=8)
    v = r.data[0].embedding
    assert len(v) == 8, len(v)
    close(v, unit(MEAN[1][:8]), "dimensions=8")
    assert abs(sum(x * x for x in v) - 1) < 1e-5


@check
def llama_server_shapes():
    r = raw.post("/embedding", json={"content": SEQS[1]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body) == 1 and body[0]["index"] == 0 and len(body[0]["embedding"]) == 1, body
    close(body[0]["embedding"][0], unit(MEAN[1]), "/embedding")
    r = raw.post("/v1/embeddings", json={"input": [SEQS[2]], "embd_normalize": -1})
    assert r.status_code == 200, r.text
    close(r.json()["data"][0]["embedding"], MEAN[2], "embd_normalize -1")


def complete(prompt):
    r = raw.post("/v1/completions", json={"prompt": prompt, "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


@check
def embeddings_and_generation_together():
    prompts = [s for s in SEQS if len(s) > 1]
    solo_text = [complete(s) for s in prompts]
    solo_embd = [client.embeddings.create(model=MODEL, input=s, encoding_format="float").data[0].embedding for s in SEQS]
    results = {}

    def run(key, fn):
        try:
            results[key] = fn()
        except Exception as e:  # reported below
            results[key] = e

    threads = [threading.Thread(target=run, args=(("text", i), lambda s=s: complete(s))) for i, s in enumerate(prompts)]
    threads += [
        threading.Thread(
            target=run,
            args=(("embd", i), lambda s=s: client.embeddings.create(model=MODEL, input=s, encoding_format="float").data[0].embedding),
        )
        for i, s in enumerate(SEQS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for key, value in results.items():
        if isinstance(value, Exception):
            raise value
    assert [results[("text", i)] for i in range(len(prompts))] == solo_text
    assert [results[("embd", i)] for i in range(len(SEQS))] == solo_embd
    return f"{len(threads)} concurrent requests equal their solo runs"


@check
def bad_requests_are_400():
    n_vocab = max(max(s) for s in SEQS) + 1
    for body, what in [
        ({"input": []}, "empty list"),
        ({"input": [[1, 10**9]]}, "token id outside the vocabulary"),
        ({"input": "x", "dimensions": 100000}, "dimensions above the width"),
        ({"input": "x", "encoding_format": "hex"}, "unknown encoding"),
        ({"input": [[1] * (args.n_ctx + 1)]}, "longer than the context"),
        ({"nothing": 1}, "no input"),
    ]:
        r = raw.post("/v1/embeddings", json=body)
        assert r.status_code == 400, f"{what}: {r.status_code} {r.text}"
        assert "error" in r.json(), r.text
    assert n_vocab > 0
    r = raw.post("/v1/embeddings", json={"input": "x", "model": "no-such-model"})
    assert r.status_code == 404, r.text


failed = 0
for fn in CHECKS:
    try:
        note = fn()
        print(f"ok   {fn.__name__}" + (f": {note}" if note else ""))
    except Exception:
        failed += 1
        print(f"FAIL {fn.__name__}")
        traceback.print_exc(file=sys.stdout)
sys.exit(1 if failed else 0)
