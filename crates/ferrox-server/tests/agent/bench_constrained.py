"""Decode-step cost with and without a constraint, at batch 1 and 8: the mean time between
streamed tokens (after the first) of N concurrent requests generating MAX tokens each,
unconstrained and under a JSON schema. Not part of the tests (timings vary by machine).

Usage: bench_constrained.py BASE_URL [API_KEY]
"""

import statistics
import sys
import threading
import time

import openai

BASE = sys.argv[1]
client = openai.OpenAI(base_url=BASE + "/v1", api_key=sys.argv[2] if len(sys.argv) > 2 else "x", max_retries=0)
MODEL = client.models.list().data[0].id
MAX = 96
SCHEMA = {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9999},
          "name": {"type": "string", "maxLength": 12}}, "required": ["id", "name"], "additionalProperties": False}, "minItems": 60}


def one(kw, gaps, counts):
    last = None
    n = 0
    for chunk in client.chat.completions.create(model=MODEL, stream=True, max_tokens=MAX, temperature=0.7, seed=len(gaps), **kw):
        if not chunk.choices or not chunk.choices[0].delta.content:
            continue
        now = time.perf_counter()
        if last is not None:
            gaps.append(now - last)
        last = now
        n += 1
    counts.append(n)


def run(batch, constrained):
    kw = {"messages": [{"role": "user", "content": "List 100 users as JSON: id and name."}]}
    if constrained:
        kw["response_format"] = {"type": "json_schema", "json_schema": {"name": "users", "schema": SCHEMA}}
    gaps, counts = [], []
    threads = [threading.Thread(target=one, args=(kw, gaps, counts)) for _ in range(batch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statistics.mean(gaps) * 1e3, sum(counts)


for batch in (1, 8):
    run(batch, False)  # warm up
    # Interleaved pairs, so that load from elsewhere hits both sides alike.
    free, bound = [], []
    for _ in range(5):
        free.append(run(batch, False)[0])
        bound.append(run(batch, True)[0])
    f, b = statistics.median(free), statistics.median(bound)
    ratio = statistics.median(y / x for x, y in zip(free, bound))
    print(f"batch {batch}: unconstrained {f:.2f} ms/token step, constrained {b:.2f} ms "
          f"(median pair ratio {(ratio - 1) * 100:+.1f}%)")
