#!/usr/bin/env python3
"""Dumps a GGUF file as llama.cpp's reference reader (the PyPI `gguf` package) sees it.

Output: one JSON object {"metadata": {key: value}, "tensors": [{name, type, shape, offset,
bytes[, data_hex]}]} in the same shape as `ferrox inspect --json --full-arrays`, so the two
can be compared. `--data` adds each tensor's bytes as hex (for small files only).

Usage: python3 scripts/gguf-py-dump.py FILE [--data]
"""
import json
import math
import sys

from gguf import GGUFReader


def jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, list):
        return [jsonable(x) for x in v]
    return v


def main():
    path = sys.argv[1]
    with_data = "--data" in sys.argv[2:]
    reader = GGUFReader(path)
    metadata = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue  # the reader's own pseudo-fields (version, counts)
        metadata[name] = jsonable(field.contents())
    tensors = []
    for t in reader.tensors:
        entry = {
            "name": t.name,
            "type": t.tensor_type.name,
            "shape": [int(d) for d in t.shape],
            "offset": int(t.data_offset - reader.data_offset),
            "bytes": int(t.n_bytes),
        }
        if with_data:
            entry["data_hex"] = bytes(t.data.tobytes()).hex()
        tensors.append(entry)
    json.dump({"metadata": metadata, "tensors": tensors}, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
