#!/usr/bin/env python3
"""Generate dot-product fixtures from ggml's own CPU kernels, for ferrox-core's
tests/dot_fixtures.rs.

For each weight type, random weight rows and activations are run through
libggml-cpu.so's `type_traits_cpu`: the activation through `from_float` of the weight
type's `vec_dot_type`, then `vec_dot`. The fixture keeps the f32 activation, the weight
bytes, ggml's quantized activation bytes and ggml's result, so the Rust test can check
that our activation quantizer is bit-exact and that our SIMD kernels reproduce ggml's
result bits. (The reference build is `-march=native`; its quantized kernels take the
same AVX2 code paths as on any AVX2 machine, its F32/F16/BF16 dots use AVX-512 and are
only compared within a tolerance.)

Fixture layout (little endian), one file per weight type, dot-<TYPE>.bin:
    magic   4 bytes  b"FXDT"
    version u32      1
    type    u32      ggml weight type id
    dot     u32      ggml vec_dot_type id
    cases   u32
    then per case:
        cols     u32
        x        cols x f32           the activation
        w        row bytes             one weight row
        xq       activation row bytes  ggml's quantized activation
        result   f32                   ggml's vec_dot

Usage: gen-dot-fixtures.py [--lib-dir DIR] [--out DIR]
(default DIR: /work/ref/build/bin; output: crates/ferrox-core/tests/fixtures/dot).
Deterministic: rerunning rewrites the same bytes.
"""

from __future__ import annotations

import argparse
import ctypes
import struct
from pathlib import Path

import numpy as np

CRATE = Path(__file__).resolve().parent.parent
DEFAULT_OUT = CRATE / "tests/fixtures/dot"

# name: (ggml id, block values, block bytes, byte offsets of f16 scales, of E8M0 scales)
# (NVFP4's four E4M3 scales are drawn in weight_row.)
TYPES = {
    "F32": (0, 1, 4, [], []),
    "F16": (1, 1, 2, [], []),
    "Q4_0": (2, 32, 18, [0], []),
    "Q4_1": (3, 32, 20, [0, 2], []),
    "Q5_0": (6, 32, 22, [0], []),
    "Q5_1": (7, 32, 24, [0, 2], []),
    "Q8_0": (8, 32, 34, [0], []),
    "Q2_K": (10, 256, 84, [80, 82], []),
    "Q3_K": (11, 256, 110, [108], []),
    "Q4_K": (12, 256, 144, [0, 2], []),
    "Q5_K": (13, 256, 176, [0, 2], []),
    "Q6_K": (14, 256, 210, [208], []),
    "IQ4_NL": (20, 32, 18, [0], []),
    "IQ4_XS": (23, 256, 136, [0], []),
    "BF16": (30, 1, 2, [], []),
    "TQ2_0": (35, 256, 66, [64], []),
    "MXFP4": (39, 32, 17, [], [0]),
    "TQ1_0": (34, 256, 54, [52], []),
    "NVFP4": (40, 64, 36, [], []),
    "Q1_0": (41, 128, 18, [0], []),
    "Q2_0": (42, 64, 18, [0], []),
    "IQ3_XXS": (18, 256, 98, [0], []),
    "IQ3_S": (21, 256, 110, [0], []),
    "IQ1_S": (19, 256, 50, [0], []),
    "IQ1_M": (29, 256, 56, [], []),  # its f16 d is spread, see weight_row
    "IQ2_XXS": (16, 256, 66, [0], []),
    "IQ2_XS": (17, 256, 74, [0], []),
    "IQ2_S": (22, 256, 82, [0], []),
}
IQ1_M = 29
# ggml's IQ1 and IQ2_XXS/IQ2_XS quantizers insist on an importance matrix; a flat one
# (every column equally important) stands in for llama-imatrix's.
NEEDS_IMATRIX = {16, 17, 19, 29}
ROW_BYTES = {0: (1, 4), 1: (1, 2), 8: (32, 34), 9: (32, 36), 15: (256, 292), 30: (1, 2)}


class TraitsCpu(ctypes.Structure):
    _fields_ = [
        ("from_float", ctypes.c_void_p),
        ("vec_dot", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),
        ("nrows", ctypes.c_int64),
    ]


FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
VEC_DOT = ctypes.CFUNCTYPE(
    None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
    ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
)


def load(lib_dir: Path):
    base = ctypes.CDLL(str(lib_dir / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(lib_dir / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    cpu.ggml_cpu_init()
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TraitsCpu)
    cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
    base.ggml_quantize_chunk.restype = ctypes.c_size_t
    base.ggml_quantize_chunk.argtypes = [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
    ]
    return base, cpu


def random_values(rng: np.random.Generator, n: int) -> np.ndarray:
    magnitude = 10.0 ** rng.uniform(-3, 3)
    x = rng.standard_normal(n) * magnitude
    x[rng.random(n) < 0.02] *= 30.0
    return x.astype(np.float32)


def weight_row(rng, base, type_id, block, block_bytes, f16_at, e8m0_at, cols, raw: bool) -> bytes:
    n_bytes = cols // block * block_bytes
    if raw and block > 1:
        data = bytearray(rng.integers(0, 256, n_bytes, dtype=np.uint8).tobytes())
        for b in range(cols // block):
            for at in f16_at:
                scale = np.float16(rng.uniform(-2, 2) * 1e-2)
                data[b * block_bytes + at : b * block_bytes + at + 2] = scale.tobytes()
            if type_id == IQ1_M:
                # d's four nibbles sit in the top of the four u16 scale words (bytes 48..56).
                bits = int(np.float16(rng.uniform(-2, 2) * 1e-2).view(np.uint16))
                for k in range(4):
                    at = b * block_bytes + 48 + 2 * k + 1
                    data[at] = (data[at] & 0x0F) | (((bits >> (4 * k)) & 0xF) << 4)
            for at in e8m0_at:
                # A power-of-two scale between 2^-12 and 2^0 (halved, as ggml reads it).
                data[b * block_bytes + at] = int(rng.integers(116, 129))
            if type_id == 40:
                # NVFP4's E4M3 sub-block scales: from 2^-9 (subnormal) to 2^0, exponents 0..7.
                for at in range(4):
                    data[b * block_bytes + at] = int(rng.integers(0, 0x40))
        return bytes(data)
    src = random_values(rng, cols)
    dst = ctypes.create_string_buffer(n_bytes)
    imatrix = np.ones(cols, dtype=np.float32) if type_id in NEEDS_IMATRIX else None
    weights = imatrix.ctypes.data if imatrix is not None else None
    written = base.ggml_quantize_chunk(type_id, src.ctypes.data, dst, 0, 1, cols, weights)
    assert written == n_bytes, (type_id, written, n_bytes)
    return dst.raw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lib-dir", type=Path, default=Path("/work/ref/build/bin"))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--types", help="comma-separated names: regenerate only these")
    args = parser.parse_args()
    base, cpu = load(args.lib_dir)
    args.out.mkdir(parents=True, exist_ok=True)

    only = set(args.types.split(",")) if args.types else None
    for name, (type_id, block, block_bytes, f16_at, e8m0_at) in TYPES.items():
        if only is not None and name not in only:
            continue
        rng = np.random.default_rng(sum(map(ord, name)) * 7919)
        traits = cpu.ggml_get_type_traits_cpu(type_id).contents
        dot_id = traits.vec_dot_type
        act_traits = cpu.ggml_get_type_traits_cpu(dot_id).contents
        from_float = FROM_FLOAT(act_traits.from_float)
        vec_dot = VEC_DOT(traits.vec_dot)
        dot_block, dot_block_bytes = ROW_BYTES[dot_id]
        widths = [1, 7, 32, 33, 100, 256] if block == 1 else [block * k for k in (1, 2, 3)]
        if block == 32:
            widths = [32, 96, 256]
        cases = []
        for cols in widths:
            for raw in (False, True):
                w = weight_row(rng, base, type_id, block, block_bytes, f16_at, e8m0_at, cols, raw)
                x = random_values(rng, cols)
                xq = ctypes.create_string_buffer(cols // dot_block * dot_block_bytes)
                from_float(x.ctypes.data, xq, cols)
                result = ctypes.c_float(0.0)
                wbuf = ctypes.create_string_buffer(w, len(w))
                vec_dot(cols, ctypes.byref(result), 0, wbuf, 0, xq, 0, 1)
                cases.append(
                    struct.pack("<I", cols) + x.tobytes() + w + xq.raw + struct.pack("<f", result.value)
                )
        header = b"FXDT" + struct.pack("<IIII", 1, type_id, dot_id, len(cases))
        (args.out / f"dot-{name}.bin").write_bytes(header + b"".join(cases))
        print(f"dot-{name}.bin: {len(cases)} cases")


if __name__ == "__main__":
    main()
