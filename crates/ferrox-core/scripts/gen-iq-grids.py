#!/usr/bin/env python3
"""Read the IQ formats' codebooks out of ggml's own dequantizers.

The i-quant formats (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) store, per
group of 8 (or 4) values, an index into a fixed table of grid points. The tables are part
of the file format: any reader needs them, and they cannot be derived from a rule. This
script measures them from libggml-base's `to_float`: it builds blocks whose scale makes
each decoded value an exact small multiple of one grid coordinate, with every sign bit
clear, asks ggml to decode them, and recovers every table entry from the floats.

Output, under crates/ferrox-core/src/quant/grids/ (little endian, one file per table):
    iq2xxs.bin  256 x 8 bytes (unsigned coordinates)
    iq2xs.bin   512 x 8 bytes
    iq2s.bin   1024 x 8 bytes
    iq3xxs.bin  256 x 4 bytes
    iq3s.bin    512 x 4 bytes
    iq1s.bin   2048 x 8 bytes (signed coordinates -1, 0, 1 as i8)

Usage: gen-iq-grids.py [--lib PATH/libggml-base.so] [--out DIR]
Deterministic: rerunning rewrites the same bytes.
"""

from __future__ import annotations

import argparse
import ctypes
import struct
from pathlib import Path

CRATE = Path(__file__).resolve().parent.parent
DEFAULT_OUT = CRATE / "src/quant/grids"
DEFAULT_LIB = Path("/work/ref/build/bin/libggml-base.so")

QK_K = 256
F16_ONE = 0x3C00


class TypeTraits(ctypes.Structure):
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


class Ggml:
    def __init__(self, lib: Path):
        self.lib = ctypes.CDLL(str(lib))
        self.lib.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
        self.lib.ggml_get_type_traits.argtypes = [ctypes.c_int]

    def decode(self, type_id: int, name: str, size: int, blocks: list[bytes]) -> list[float]:
        traits = self.lib.ggml_get_type_traits(type_id).contents
        assert traits.type_name.decode() == name, traits.type_name
        assert traits.blck_size == QK_K and traits.type_size == size, (name, traits.type_size)
        raw = b"".join(blocks)
        assert all(len(b) == size for b in blocks)
        src = ctypes.create_string_buffer(raw, len(raw))
        out = (ctypes.c_float * (QK_K * len(blocks)))()
        TO_FLOAT(traits.to_float)(src, out, QK_K * len(blocks))
        return list(out)


def exact(values: list[float], scale: float, offset: float = 0.0) -> list[int]:
    """Grid coordinates from decoded values `scale * (coordinate + offset)`."""
    coords = []
    for v in values:
        c = v / scale - offset
        assert c == round(c), (v, scale, offset)
        coords.append(int(round(c)))
    return coords


def chunk(values: list, n: int) -> list[list]:
    return [values[i : i + n] for i in range(0, len(values), n)]


def iq2xxs(ggml: Ggml) -> list[list[int]]:
    # Per group of 32: four 8-bit grid indices, then 4 x 7 sign bits and a 4-bit scale,
    # all zero: db = d * 0.5 * 0.25.
    blocks = []
    for first in range(0, 256, 32):
        qs = b"".join(bytes([first + 4 * g + l for l in range(4)]) + bytes(4) for g in range(8))
        blocks.append(struct.pack("<H", F16_ONE) + qs)
    return chunk(exact(ggml.decode(16, "iq2_xxs", 66, blocks), 0.125), 8)


def iq2xs(ggml: Ggml) -> list[list[int]]:
    # 32 u16 per block: a 9-bit index and 7 sign bits; scales zero: db = 0.125.
    blocks = []
    for first in range(0, 512, 32):
        qs = struct.pack("<32H", *range(first, first + 32))
        blocks.append(struct.pack("<H", F16_ONE) + qs + bytes(8))
    return chunk(exact(ggml.decode(17, "iq2_xs", 74, blocks), 0.125), 8)


def iq2s(ggml: Ggml) -> list[list[int]]:
    # qs: low 8 bits of each index; qh: two high bits per group of 8; signs zero.
    blocks = []
    for first in range(0, 1024, 32):
        idx = list(range(first, first + 32))
        qs = bytes(i & 255 for i in idx) + bytes(32)
        qh = bytes(
            sum(((idx[4 * g + l] >> 8) & 3) << (2 * l) for l in range(4)) for g in range(8)
        )
        blocks.append(struct.pack("<H", F16_ONE) + qs + qh + bytes(8))
    return chunk(exact(ggml.decode(22, "iq2_s", 82, blocks), 0.125), 8)


def iq3xxs(ggml: Ggml) -> list[list[int]]:
    # 64 one-byte indices of 4 values each; scales and signs zero: db = 0.25.
    blocks = []
    for first in range(0, 256, 64):
        qs = bytes(range(first, first + 64))
        blocks.append(struct.pack("<H", F16_ONE) + qs + bytes(32))
    return chunk(exact(ggml.decode(18, "iq3_xxs", 98, blocks), 0.25), 4)


def iq3s(ggml: Ggml) -> list[list[int]]:
    # 64 indices of 9 bits (qs low byte, one qh bit each); scales zero: db = 1.
    blocks = []
    for first in range(0, 512, 64):
        idx = list(range(first, first + 64))
        qs = bytes(i & 255 for i in idx)
        qh = bytes(sum(((idx[8 * h + b] >> 8) & 1) << b for b in range(8)) for h in range(8))
        blocks.append(struct.pack("<H", F16_ONE) + qs + qh + bytes(32) + bytes(4))
    return chunk(exact(ggml.decode(21, "iq3_s", 110, blocks), 1.0), 4)


def iq1s(ggml: Ggml) -> list[list[int]]:
    # 11-bit indices (qs low byte, 3 bits each in qh); scale 0: dl = 1; delta +0.125.
    blocks = []
    for first in range(0, 2048, 32):
        idx = list(range(first, first + 32))
        qs = bytes(i & 255 for i in idx)
        qh = [sum(((idx[4 * g + l] >> 8) & 7) << (3 * l) for l in range(4)) for g in range(8)]
        blocks.append(struct.pack("<H", F16_ONE) + qs + struct.pack("<8H", *qh))
    return chunk(exact(ggml.decode(19, "iq1_s", 50, blocks), 1.0, 0.125), 8)


def check_iq1m_shares_iq1s(ggml: Ggml, grid: list[list[int]]) -> None:
    # IQ1_M indexes the same table: decode every entry through it once and compare.
    blocks = []
    # The f16 scale (1.0) is spread over the top nibbles of the four u16 scale words.
    scale = struct.pack(
        "<4H",
        (0x3C00 & 0x000F) << 12,
        (0x3C00 & 0x00F0) << 8,
        (0x3C00 & 0x0F00) << 4,
        0x3C00 & 0xF000,
    )
    for first in range(0, 2048, 32):
        idx = list(range(first, first + 32))
        qs = bytes(i & 255 for i in idx)
        qh = bytes(
            ((idx[2 * h] >> 8) & 7) | (((idx[2 * h + 1] >> 8) & 7) << 4) for h in range(16)
        )
        blocks.append(qs + qh + scale)
    got = chunk(exact(ggml.decode(29, "iq1_m", 56, blocks), 1.0, 0.125), 8)
    assert got == grid, "IQ1_M decodes through a table other than IQ1_S's"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", type=Path, default=DEFAULT_LIB)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    ggml = Ggml(args.lib)
    args.out.mkdir(parents=True, exist_ok=True)

    tables = {
        "iq2xxs": (iq2xxs(ggml), "B"),
        "iq2xs": (iq2xs(ggml), "B"),
        "iq2s": (iq2s(ggml), "B"),
        "iq3xxs": (iq3xxs(ggml), "B"),
        "iq3s": (iq3s(ggml), "B"),
        "iq1s": (iq1s(ggml), "b"),
    }
    check_iq1m_shares_iq1s(ggml, tables["iq1s"][0])
    for name, (grid, fmt) in tables.items():
        data = b"".join(struct.pack(f"<{len(p)}{fmt}", *p) for p in grid)
        (args.out / f"{name}.bin").write_bytes(data)
        print(f"{name}: {len(grid)} points, {len(data)} bytes")


if __name__ == "__main__":
    main()
