#!/usr/bin/env python3
"""Generate ggml dot-product fixtures for ferrox-core's kernels.

Writes crates/ferrox-core/tests/fixtures/dot/dot-<TYPE>.bin for the types named on the
command line. Each case is one weight row against one activation row, computed by
libggml-cpu itself:

    x       f32 activations (random, at a random magnitude)
    w       a weight row of TYPE: random values through ggml's reference quantizer
    xq      x through ggml's `from_float` for TYPE's `vec_dot_type` (Q8_0, Q8_1, Q8_K, ...)
    result  ggml's `vec_dot(cols, w, xq)` on this machine (its AVX2 build: the kernels
            tests/dot_fixtures.rs holds bit for bit)

File layout (little endian):
    magic b"FXDT", version u32 1, type u32, dot type u32, count u32,
    then per case: cols u32, x (cols f32), w bytes, xq bytes, result f32.

Block counts of 1, 3 (odd: the paired kernels' scalar tail) and 8 at three magnitudes.
Deterministic: one seeded generator per type.

Usage:
    scripts/gen-dot-fixtures.py [--lib-dir DIR] TYPE [TYPE ...]
DIR holds libggml-base.so and libggml-cpu.so (default: $FERROX_GGML_LIB_DIR, then a search
of /work/ref/build).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import struct
import sys
import zlib
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "crates/ferrox-core/tests/fixtures/dot"
DEFAULT_LIB_SEARCH = Path("/work/ref/build")

# ggml type id, block values, block bytes, the reference quantizer's name.
TYPES = {
    "Q4_0": (2, 32, 18, "quantize_row_q4_0_ref"),
    "Q4_1": (3, 32, 20, "quantize_row_q4_1_ref"),
    "Q5_0": (6, 32, 22, "quantize_row_q5_0_ref"),
    "Q5_1": (7, 32, 24, "quantize_row_q5_1_ref"),
    "Q8_0": (8, 32, 34, "quantize_row_q8_0_ref"),
    "Q2_K": (10, 256, 84, "quantize_row_q2_K_ref"),
    "Q3_K": (11, 256, 110, "quantize_row_q3_K_ref"),
    "Q4_K": (12, 256, 144, "quantize_row_q4_K_ref"),
    "Q5_K": (13, 256, 176, "quantize_row_q5_K_ref"),
    "Q6_K": (14, 256, 210, "quantize_row_q6_K_ref"),
    "IQ4_NL": (20, 32, 18, "quantize_row_iq4_nl_ref"),
    "IQ4_XS": (23, 256, 136, "quantize_row_iq4_xs_ref"),
    "MXFP4": (39, 32, 17, "quantize_row_mxfp4_ref"),
    "TQ2_0": (35, 256, 66, "quantize_row_tq2_0_ref"),
}
# Activation types: id, block values, block bytes.
DOT_TYPES = {8: (32, 34), 9: (32, 36), 15: (256, 292)}


class TraitsCpu(ctypes.Structure):
    _fields_ = [
        ("from_float", ctypes.c_void_p),
        ("vec_dot", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),
        ("nrows", ctypes.c_int64),
    ]


FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
VEC_DOT = ctypes.CFUNCTYPE(
    None, ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t,
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
)  # fmt: skip


def find_lib_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    env = os.environ.get("FERROX_GGML_LIB_DIR")
    if env:
        return Path(env)
    hits = sorted(DEFAULT_LIB_SEARCH.rglob("libggml-cpu.so")) if DEFAULT_LIB_SEARCH.is_dir() else []
    if not hits:
        sys.exit("libggml-cpu.so not found: build llama.cpp (scripts/reference/README.md) or pass --lib-dir")
    return hits[0].parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib-dir")
    parser.add_argument("types", nargs="+", choices=sorted(TYPES))
    args = parser.parse_args()
    lib_dir = find_lib_dir(args.lib_dir)
    base = ctypes.CDLL(str(lib_dir / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(lib_dir / "libggml-cpu.so"))
    cpu.ggml_cpu_init.restype = None
    cpu.ggml_cpu_init()
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TraitsCpu)
    cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]

    for name in args.types:
        type_id, qk, block_bytes, quantizer = TYPES[name]
        traits = cpu.ggml_get_type_traits_cpu(type_id).contents
        dot_id = traits.vec_dot_type
        dot_qk, dot_bytes = DOT_TYPES[dot_id]
        act_traits = cpu.ggml_get_type_traits_cpu(dot_id).contents
        from_float = FROM_FLOAT(act_traits.from_float)
        vec_dot = VEC_DOT(traits.vec_dot)
        quantize = getattr(base, quantizer)
        quantize.restype = None
        quantize.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]

        rng = np.random.default_rng(zlib.crc32(f"ferrox-dot/{name}".encode()))
        cases = []
        for blocks in (1, 3, 8):
            # Largest activations near 1e3: Q8_1 keeps d·Σq as an f16 (at most 65504).
            for scale in (1e-2, 1.0, 1e2):
                cols = blocks * max(qk, dot_qk)
                x = (rng.normal(0.0, 1.0, cols) * scale * 10.0 ** rng.uniform(-1, 1)).astype(np.float32)
                wv = (rng.normal(0.0, 1.0, cols) * 10.0 ** rng.uniform(-2, 1)).astype(np.float32)
                w = np.zeros(cols // qk * block_bytes, dtype=np.uint8)
                quantize(wv.ctypes.data, w.ctypes.data, cols)
                xq = np.zeros(cols // dot_qk * dot_bytes, dtype=np.uint8)
                from_float(x.ctypes.data, xq.ctypes.data, cols)
                result = ctypes.c_float()
                vec_dot(cols, ctypes.byref(result), 0, w.ctypes.data, 0, xq.ctypes.data, 0, 1)
                cases.append((cols, x, w, xq, result.value))

        out = bytearray(b"FXDT" + struct.pack("<4I", 1, type_id, dot_id, len(cases)))
        for cols, x, w, xq, result in cases:
            out += struct.pack("<I", cols) + x.astype("<f4").tobytes() + w.tobytes() + xq.tobytes()
            out += struct.pack("<f", result)
        path = OUT / f"dot-{name}.bin"
        path.write_bytes(bytes(out))
        print(f"{path.relative_to(REPO)}: {len(cases)} cases", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
