#!/usr/bin/env python3
"""One markdown table from `ferrox bench --compare ... --json` results, one row per result.

    bench-table.py LABEL=RESULT.json [LABEL=RESULT.json ...]

Each result holds a prefill and/or a decode test with every `--compare` peer's figures
beside ferrox's (its `peers`, all from one run, the engines taking turns repetition by
repetition). Columns: the file's size, the weights a decoded token reads, then per test
ferrox's t/s and each peer's t/s with ferrox's ratio to it, and each engine's decode speed
as a share of the bound the read bandwidth measured beside its runs sets. The peers (their
names and order) must be the same in every result.
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
    first = results[0][1][0]
    names = peers_of(first)
    tests = [(t["n_prompt"], t["n_gen"]) for t in results[0][1]]
    test_names = [f"pp{p}" if p else f"tg{g}" for p, g in tests]
    for label, rows in results:
        if [peers_of(r) for r in rows] != [names] * len(rows):
            sys.exit(f"error: {label} was compared with other peers than {names}")
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
            for peer in row["peers"]:
                cells += [f"{peer['avg_ts']:.2f}", f"{peer['ratio']:.2f}"]
        if decode is not None:
            shares = [decode.get("bound_share")]
            shares += [p.get("bound_share") for p in decode["peers"]]
            cells.append(
                " / ".join("—" if s is None else f"{100 * s:.0f}%" for s in shares)
            )
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
