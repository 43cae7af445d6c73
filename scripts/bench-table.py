#!/usr/bin/env python3
"""One markdown table from `ferrox bench --compare ... --json` results, one row per result.

    bench-table.py LABEL=RESULT.json [LABEL=RESULT.json ...]

Each result holds a prefill and/or a decode test with every `--compare` peer's figures
beside ferrox's (its `peers`, all from one run, the engines taking turns repetition by
repetition). Columns: the file's size, the weights a decoded token reads, then per test
ferrox's t/s and each peer's t/s with ferrox's ratio to it, and each engine's decode speed
as a share of the bound the read bandwidth measured beside its runs sets. A result may
leave out a peer that cannot read its file (ik_llama.cpp and TQ2_0): its cells read "—".
"""
import json
import sys


def load(arg):
    label, _, path = arg.partition("=")
    if not path:
        sys.exit(f"error: {arg!r} is not LABEL=RESULT.json")
    with open(path) as f:
        rows = json.load(f)
    return label, rows


def peers_of(row):
    return [p["name"] for p in row.get("peers", [])]


def main():
    results = [load(a) for a in sys.argv[1:]]
    if not results:
        sys.exit(__doc__)
    # Every peer of any result, in the order they first appear.
    names = []
    for _, rows in results:
        for row in rows:
            names += [n for n in peers_of(row) if n not in names]
    tests = [(t["n_prompt"], t["n_gen"]) for t in results[0][1]]
    test_names = [f"pp{p}" if p else f"tg{g}" for p, g in tests]
    for label, rows in results:
        if len({tuple(peers_of(r)) for r in rows}) > 1:
            sys.exit(f"error: {label}'s tests were compared with different peers")
        if [(r["n_prompt"], r["n_gen"]) for r in rows] != tests:
            sys.exit(f"error: {label} ran other tests than {test_names}")

    head = ["file", "MiB", "weights read per decoded token"]
    for name in test_names:
        head.append(f"{name} ferrox")
        for peer in names:
            head += [f"{name} {peer}", "ratio"]
    if any(t[1] for t in tests):
        head.append("decode's share of the read bound: " + " / ".join(["ferrox", *names]))
    print("| " + " | ".join(head) + " |")
    print("| --- |" + " ---: |" * (len(head) - 1))

    for label, rows in results:
        decode = next((r for r in rows if r["n_gen"] > 0), None)
        per_token = decode.get("weight_bytes_per_token") if decode else None
        cells = [
            label,
            f"{rows[0]['model_size'] / 2**20:.0f}",
            "—" if per_token is None else f"{per_token / 1e6:.0f} MB",
        ]
        for row in rows:
            cells.append(f"{row['avg_ts']:.2f}")
            by_name = {p["name"]: p for p in row.get("peers", [])}
            for name in names:
                peer = by_name.get(name)
                if peer is None:
                    cells += ["—", "—"]
                else:
                    cells += [f"{peer['avg_ts']:.2f}", f"{peer['ratio']:.2f}"]
        if decode is not None:
            by_name = {p["name"]: p for p in decode.get("peers", [])}
            shares = [decode.get("bound_share")]
            shares += [by_name.get(n, {}).get("bound_share") for n in names]
            cells.append(
                " / ".join("—" if s is None else f"{100 * s:.0f}%" for s in shares)
            )
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
