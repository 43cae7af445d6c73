"""Three `ferrox serve` replicas behind SGLang's router (`sglang-router` from PyPI, its
cache-aware policy), all on loopback:

1. requests that share a long prefix land on the replica that already holds it: that
   replica's prefix-hit counter rises, the others' do not;
2. requests with different prefixes arriving together spread over the replicas;
3. a replica killed in the middle of a load: the router routes around it, and no request is
   lost beyond those the killed replica was serving at that moment.

    python3 replicas.py FERROX_BIN MODEL

Prints one JSON line of findings; exits 1 with the reason when a check fails.
"""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

FERROX, MODEL = sys.argv[1], sys.argv[2]
ALIAS = "replica-test"
PREFIXES = [
    "The harbour master kept a ledger of every ship that entered the bay, noting its flag, "
    "its cargo, the name of its captain and the weather on the morning it arrived. ",
    "In the mountain village the baker rose before dawn, lit the wood oven, and shaped the "
    "loaves while the rest of the valley slept under a thin layer of early snow. ",
    "The observatory on the hill had a brass telescope older than the town itself, and the "
    "astronomer who tended it wrote down the position of each comet she could find. ",
]


def fail(msg):
    print(json.dumps({"ok": False, "reason": msg}))
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, path, timeout=5):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.read().decode()


def wait_for(port, path, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if get(port, path)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.25)
    fail(f"port {port}{path} did not answer 200 in {timeout} s")


def metric(port, name):
    """The sum of a metric's samples on one replica."""
    _, text = get(port, "/metrics")
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (len(line) == len(name) or line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def complete(port, prompt, max_tokens=4, timeout=120):
    body = json.dumps({"model": ALIAS, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {data[:200]!r}")
    return json.loads(data)


work = tempfile.mkdtemp()
replicas = {}
for i in range(3):
    port = free_port()
    log = open(os.path.join(work, f"replica{i}.log"), "w")
    replicas[port] = subprocess.Popen(
        [FERROX, "serve", "-m", MODEL, "--port", str(port), "--alias", ALIAS, "-t", "1",
         "-c", "1024", "--parallel", "2"], stdout=log, stderr=subprocess.STDOUT)
router_port = free_port()
router = None
try:
    for port in replicas:
        wait_for(port, "/health")
    router = subprocess.Popen(
        [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
         "--port", str(router_port), "--policy", "cache_aware", "--log-level", "warn",
         "--prometheus-port", str(free_port()),
         # Fail over quickly: a worker is out after one failed health check or request.
         "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
         "--cb-failure-threshold", "1",
         "--worker-urls", *[f"http://127.0.0.1:{p}" for p in replicas]],
        stdout=open(os.path.join(work, "router.log"), "w"), stderr=subprocess.STDOUT)
    # Ready when it forwards a request.
    deadline = time.time() + 120
    while True:
        try:
            complete(router_port, "Hello", max_tokens=1, timeout=10)
            break
        except (OSError, RuntimeError) as e:
            if time.time() > deadline:
                fail(f"the router did not forward a request in 120 s: {e}")
            time.sleep(0.5)

    def served():
        return {p: metric(p, "vllm:request_success_total") for p in replicas}

    def hits():
        return {p: metric(p, "ferrox_prefix_cache_hit_tokens_total") for p in replicas}

    # 2: the first request of each prefix, all at once: with nothing cached anywhere the
    # router balances them by load.
    firsts = [threading.Thread(target=complete, args=(router_port, prefix + "Entry number 0:", 16))
              for prefix in PREFIXES]
    for t in firsts:
        t.start()
    for t in firsts:
        t.join()
    # 1: then three more per prefix, one at a time: who served each, and whose prefix cache
    # answered.
    homes = []
    for k, prefix in enumerate(PREFIXES):
        chosen = set()
        hits_before = hits()
        for v in range(1, 4):
            before = served()
            complete(router_port, prefix + f"Entry number {v}:")
            after = served()
            moved = [p for p in replicas if after[p] > before[p]]
            if len(moved) != 1:
                fail(f"prefix {k}, request {v}: served by {moved}")
            chosen.add(moved[0])
        if len(chosen) != 1:
            fail(f"prefix {k}: its requests went to several replicas {sorted(chosen)}")
        home = chosen.pop()
        homes.append(home)
        gained = {p: hits()[p] - hits_before[p] for p in replicas}
        if gained[home] <= 0:
            fail(f"prefix {k}: the replica holding it reused nothing ({gained})")
        others = [p for p in replicas if p != home and gained[p] > 0]
        if others:
            fail(f"prefix {k}: other replicas reused its prefix too ({gained})")
    if len(set(homes)) < 2:
        fail(f"three prefixes sent at once all went to one replica {homes}")

    # 3: a concurrent load, and the busiest replica killed in its middle.
    results = []
    lock = threading.Lock()

    def client(i):
        try:
            complete(router_port, PREFIXES[i % 3] + f"Request {i} asks for more:", max_tokens=160)
            ok = True
        except Exception as e:  # noqa: BLE001 - any failure counts as lost
            ok = False
        with lock:
            results.append(ok)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    # Once the replicas are busy, the busiest one goes.
    deadline = time.time() + 20
    while True:
        busy = {p: metric(p, "vllm:num_requests_running") + metric(p, "vllm:num_requests_waiting")
                for p in replicas}
        victim = max(busy, key=busy.get)
        in_flight = busy[victim]
        if in_flight >= 2:
            break
        if time.time() > deadline:
            fail(f"no replica was serving two requests at once: {busy}")
        time.sleep(0.05)
    replicas[victim].send_signal(signal.SIGKILL)
    replicas[victim].wait()
    for t in threads:
        t.join(timeout=300)
    lost = results.count(False)
    if len(results) != len(threads):
        fail(f"{len(threads) - len(results)} clients never finished")
    if lost > in_flight:
        fail(f"{lost} requests lost, but the killed replica was serving only {in_flight:.0f}")
    # After the kill, everything goes to the living.
    after_kill = []
    for i in range(6):
        try:
            complete(router_port, f"After the outage, message {i}:", max_tokens=2)
            after_kill.append(True)
        except Exception:  # noqa: BLE001
            after_kill.append(False)
    if not all(after_kill):
        fail(f"after the kill, {after_kill.count(False)} of 6 requests failed")
    print(json.dumps({"ok": True, "homes": homes, "killed": victim, "in_flight": in_flight,
                      "lost": lost, "completed": results.count(True)}))
finally:
    for p in replicas.values():
        if p.poll() is None:
            p.terminate()
    if router is not None:
        router.terminate()
    for p in list(replicas.values()) + ([router] if router else []):
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
