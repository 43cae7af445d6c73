#!/usr/bin/env python3
"""Generate bit-exactness fixtures for ferrox-core's quantized block formats.

Writes crates/ferrox-core/tests/fixtures/quant/{dequant,quant}-<TYPE>.bin and a
manifest.json saying where each expected value came from. Everything is deterministic
(one seeded generator per fixture), so rerunning reproduces the files byte for byte.

Expected values come from gguf-py's numpy implementation (`gguf.quants`) where it has
the conversion, and otherwise from llama.cpp's own reference C code, called through
ctypes on libggml-base.so. Where both exist they must agree bit for bit, or the script
stops. ggml is the truth on layouts: gguf-py's size table says Q8_1 blocks are 40 bytes,
ggml's block_q8_1 is 36 (f16 d, f16 s, 32 x i8), and that is what we use.

Fixture file layout (little endian):
    magic   4 bytes  b"FXQF"
    version u32      1
    kind    u32      0 = dequantize (payload: block bytes, then expected f32 values)
                     1 = quantize   (payload: f32 input values, then expected block bytes)
    type    u32      ggml type id
    n_elems u32      number of values
    n_bytes u32      number of encoded bytes
    payload

Usage:
    scripts/gen-quant-fixtures.py [--lib PATH/libggml-base.so] [--out DIR]
The library may also be given as $FERROX_GGML_LIB; by default it is searched for under
/work/ref/build. Without it, only the numpy-sourced fixtures are rewritten and the
C-sourced ones already on disk (and their manifest entries) are left as they are.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import struct
import sys
import zlib
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q
from gguf import quants

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "crates/ferrox-core/tests/fixtures/quant"
DEFAULT_LIB_SEARCH = Path("/work/ref/build")

MAGIC = b"FXQF"
VERSION = 1
KIND_DEQUANT = 0
KIND_QUANT = 1

BLOCKS_PER_FIXTURE = 8  # default; --blocks overrides it for one-off stress runs
AWKWARD_KINDS = 8


class Fmt:
    """ggml's geometry for one type (ggml-common.h), and where its scales live."""

    def __init__(self, name, qtype, elems, nbytes, f16_fields=(), f32_fields=(), c_name=None,
                 e8m0_fields=(), ue4m3_fields=()):
        self.name = name
        self.e8m0_fields = e8m0_fields  # byte offsets of E8M0 (power-of-two) scales
        self.ue4m3_fields = ue4m3_fields  # byte offsets of unsigned E4M3 scales (NVFP4)
        self.qtype = qtype
        self.elems = elems
        self.nbytes = nbytes
        self.f16_fields = f16_fields  # byte offsets of f16 scales within a block
        self.f32_fields = f32_fields  # byte offsets of f32 scales within a block
        self.c_name = c_name  # suffix of ggml's dequantize_row_* / quantize_row_*_ref


FORMATS = {
    f.name: f
    for f in [
        Fmt("F32", Q.F32, 1, 4),
        Fmt("F16", Q.F16, 1, 2),
        Fmt("BF16", Q.BF16, 1, 2),
        Fmt("Q4_0", Q.Q4_0, 32, 18, (0,), c_name="q4_0"),
        Fmt("Q4_1", Q.Q4_1, 32, 20, (0, 2), c_name="q4_1"),
        Fmt("Q5_0", Q.Q5_0, 32, 22, (0,), c_name="q5_0"),
        Fmt("Q5_1", Q.Q5_1, 32, 24, (0, 2), c_name="q5_1"),
        Fmt("Q8_0", Q.Q8_0, 32, 34, (0,), c_name="q8_0"),
        Fmt("Q8_1", Q.Q8_1, 32, 36, (0, 2), c_name="q8_1"),
        Fmt("Q2_K", Q.Q2_K, 256, 84, (80, 82), c_name="q2_K"),
        Fmt("Q3_K", Q.Q3_K, 256, 110, (108,), c_name="q3_K"),
        Fmt("Q4_K", Q.Q4_K, 256, 144, (0, 2), c_name="q4_K"),
        Fmt("Q5_K", Q.Q5_K, 256, 176, (0, 2), c_name="q5_K"),
        Fmt("Q6_K", Q.Q6_K, 256, 210, (208,), c_name="q6_K"),
        Fmt("Q8_K", Q.Q8_K, 256, 292, f32_fields=(0,), c_name="q8_K"),
        Fmt("IQ4_NL", Q.IQ4_NL, 32, 18, (0,), c_name="iq4_nl"),
        Fmt("IQ4_XS", Q.IQ4_XS, 256, 136, (0,), c_name="iq4_xs"),
        Fmt("MXFP4", Q.MXFP4, 32, 17, c_name="mxfp4", e8m0_fields=(0,)),
        Fmt("TQ2_0", Q.TQ2_0, 256, 66, (64,), c_name="tq2_0"),
        Fmt("TQ1_0", Q.TQ1_0, 256, 54, (52,), c_name="tq1_0"),
        Fmt("NVFP4", Q.NVFP4, 64, 36, c_name="nvfp4", ue4m3_fields=(0, 1, 2, 3)),
        Fmt("Q1_0", Q.Q1_0, 128, 18, (0,), c_name="q1_0"),
        Fmt("Q2_0", 42, 64, 18, (0,), c_name="q2_0"),
        Fmt("IQ3_XXS", Q.IQ3_XXS, 256, 98, (0,), c_name="iq3_xxs"),
        Fmt("IQ3_S", Q.IQ3_S, 256, 110, (0,), c_name="iq3_s"),
        Fmt("IQ1_S", Q.IQ1_S, 256, 50, (0,), c_name="iq1_s"),
        Fmt("IQ1_M", Q.IQ1_M, 256, 56, c_name="iq1_m"),  # f16 d spread, see spread_iq1_m_scale
        Fmt("IQ2_XXS", Q.IQ2_XXS, 256, 66, (0,), c_name="iq2_xxs"),
        Fmt("IQ2_XS", Q.IQ2_XS, 256, 74, (0,), c_name="iq2_xs"),
        Fmt("IQ2_S", Q.IQ2_S, 256, 82, (0,), c_name="iq2_s"),
    ]
}

DEQUANT_TYPES = list(FORMATS)
QUANT_TYPES = [
    "F32", "F16", "BF16",
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K",
    "IQ4_NL", "IQ4_XS", "MXFP4", "TQ2_0",
    "TQ1_0", "NVFP4", "Q1_0", "Q2_0",
]  # fmt: skip

# Conversions gguf-py implements in numpy (its Q8_1 would also have the wrong size).
NUMPY_DEQUANT = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                 "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4", "TQ2_0",
                 "TQ1_0", "NVFP4"}  # fmt: skip
NUMPY_QUANT = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}


SEED_SALT = ""  # --salt changes every stream, for stress runs outside the committed fixtures


def rng_for(kind: str, name: str) -> np.random.Generator:
    # One stream per fixture, so regenerating a subset leaves the others unchanged.
    return np.random.default_rng(zlib.crc32(f"ferrox-quant/{kind}/{name}{SEED_SALT}".encode()))


# ---------------------------------------------------------------------------------------
# The C reference


class GgmlRef:
    """ctypes bindings to llama.cpp's reference conversions in libggml-base."""

    def __init__(self, path: Path):
        self.path = path
        self.lib = ctypes.CDLL(str(path))
        version = getattr(self.lib, "ggml_version", None)
        if version is not None:
            version.restype = ctypes.c_char_p
            self.version = version().decode()
        else:
            self.version = "unknown"

    def describe(self) -> str:
        return f"{Path(os.path.realpath(self.path)).name} (ggml {self.version})"

    def dequant_symbol(self, name: str) -> str | None:
        if name == "F16":
            return "ggml_fp16_to_fp32_row"
        if name == "BF16":
            return "ggml_bf16_to_fp32_row"
        fmt = FORMATS[name]
        if fmt.c_name is None or name == "Q8_1":  # ggml has no Q8_1 dequantizer
            return None
        return f"dequantize_row_{fmt.c_name}"

    def quant_symbol(self, name: str) -> str | None:
        if name == "F16":
            return "ggml_fp32_to_fp16_row"
        if name == "BF16":
            return "ggml_fp32_to_bf16_row_ref"
        if name == "IQ4_NL":
            # What llama-quantize writes; quantize_row_iq4_nl_ref is a cheaper variant.
            return "quantize_iq4_nl"
        fmt = FORMATS[name]
        if fmt.c_name is None:
            return None
        return f"quantize_row_{fmt.c_name}_ref"

    def dequantize(self, name: str, data: np.ndarray, n: int) -> np.ndarray:
        fn = getattr(self.lib, self.dequant_symbol(name))
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        src = np.ascontiguousarray(data, dtype=np.uint8)
        out = np.zeros(n, dtype=np.float32)
        fn(src.ctypes.data, out.ctypes.data, n)
        return out

    def quantize(self, name: str, values: np.ndarray) -> np.ndarray:
        symbol = self.quant_symbol(name)
        fn = getattr(self.lib, symbol)
        fmt = FORMATS[name]
        src = np.ascontiguousarray(values, dtype=np.float32)
        n = src.size
        out = np.zeros(n // fmt.elems * fmt.nbytes, dtype=np.uint8)
        if symbol == "quantize_iq4_nl":
            fn.restype = ctypes.c_size_t
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                           ctypes.c_void_p]  # fmt: skip
            written = fn(src.ctypes.data, out.ctypes.data, 1, n, None)
            assert written == out.size, (written, out.size)
        else:
            fn.restype = None
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
            fn(src.ctypes.data, out.ctypes.data, n)
        return out


def find_library(arg: str | None) -> Path | None:
    if arg:
        return Path(arg)
    env = os.environ.get("FERROX_GGML_LIB")
    if env:
        return Path(env)
    if DEFAULT_LIB_SEARCH.is_dir():
        hits = sorted(DEFAULT_LIB_SEARCH.rglob("libggml-base.so"))
        if hits:
            return hits[0]
    return None


# ---------------------------------------------------------------------------------------
# Inputs


def f16_bits(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).astype(np.float16).view(np.uint16)


def random_scale_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    """f16 scales: moderate finite magnitudes of either sign, plus a subnormal and a zero."""
    mags = 10.0 ** rng.uniform(-4.0, 0.5, size=n)
    signs = rng.choice([-1.0, 1.0], size=n)
    bits = f16_bits(mags * signs)
    if n > 2:
        bits[1] = rng.integers(1, 0x400)  # subnormal
        bits[2] = 0
    return bits


def random_float_bits(rng: np.random.Generator, kind: str, n: int) -> np.ndarray:
    """Raw F32/F16/BF16 element bits: random finite patterns plus the special values."""
    if kind == "F32":
        bits = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32)
        finite = (bits & 0x7F800000) != 0x7F800000
        bits = np.where(finite, bits, bits & 0x807FFFFF)
        specials = [0x7F800000, 0xFF800000, 0x7FC00000, 0x80000000, 0x00000001, 0x7F7FFFFF]
        dtype = np.uint32
    else:
        bits = rng.integers(0, 2**16, size=n, dtype=np.uint32)
        exp_mask = 0x7C00 if kind == "F16" else 0x7F80
        finite = (bits & exp_mask) != exp_mask
        bits = np.where(finite, bits, bits & (0xFFFF ^ exp_mask))
        if kind == "F16":
            specials = [0x7C00, 0xFC00, 0x7E00, 0x8000, 0x0001, 0x7BFF, 0x03FF]
        else:
            specials = [0x7F80, 0xFF80, 0x7FC0, 0x8000, 0x0001, 0x7F7F, 0x007F]
        dtype = np.uint16
    bits = bits.astype(dtype)
    bits[: len(specials)] = specials
    return bits


def random_blocks(name: str) -> np.ndarray:
    """Random encoded blocks, with every scale field made a finite, moderate value."""
    fmt = FORMATS[name]
    rng = rng_for("dequant", name)
    if fmt.elems == 1:
        n = 32 * BLOCKS_PER_FIXTURE
        return random_float_bits(rng, name, n).view(np.uint8)
    blocks = rng.integers(0, 256, size=(BLOCKS_PER_FIXTURE, fmt.nbytes), dtype=np.uint8)
    for off in fmt.f16_fields:
        blocks[:, off : off + 2] = random_scale_bits(rng, BLOCKS_PER_FIXTURE).view(np.uint8).reshape(-1, 2)
    for off in fmt.e8m0_fields:
        # Exponents around 1 in both directions, and the two whose half is subnormal.
        e = rng.integers(100, 150, size=BLOCKS_PER_FIXTURE)
        e[1], e[2] = 0, 1
        blocks[:, off] = e
    for off in fmt.ue4m3_fields:
        # Every finite E4M3 scale, plus 0x7F (NaN in E4M3, zero to ggml) and one with the
        # unused sign bit set.
        e = rng.integers(0, 0x7F, size=BLOCKS_PER_FIXTURE)
        e[1], e[2] = 0x7F, 0xB8
        blocks[:, off] = e
    if name == "IQ1_M":
        spread_iq1_m_scale(blocks, random_scale_bits(rng, BLOCKS_PER_FIXTURE))
    for off in fmt.f32_fields:
        mags = 10.0 ** rng.uniform(-4.0, 0.0, size=BLOCKS_PER_FIXTURE)
        vals = (mags * rng.choice([-1.0, 1.0], size=BLOCKS_PER_FIXTURE)).astype(np.float32)
        vals[2] = 0.0
        blocks[:, off : off + 4] = vals.view(np.uint8).reshape(-1, 4)
    return blocks.reshape(-1)


def spread_iq1_m_scale(blocks: np.ndarray, bits: np.ndarray) -> None:
    """IQ1_M keeps its f16 d in the top nibbles of the four u16 scale words at bytes 48..56,
    least significant nibble first."""
    for b, h in zip(blocks, bits):
        for k in range(4):
            at = 48 + 2 * k + 1  # high byte of word k
            b[at] = (b[at] & 0x0F) | (((int(h) >> (4 * k)) & 0xF) << 4)


def awkward_block(rng: np.random.Generator, kind: int, n: int) -> np.ndarray:
    """One block of inputs; `kind` cycles through the shapes that stress the quantizers."""
    if kind == 0:  # plain Gaussian, at a random overall magnitude
        x = rng.normal(0.0, 1.0, n) * 10.0 ** rng.uniform(-3.0, 3.0)
    elif kind == 1:  # all zeros
        x = np.zeros(n)
    elif kind == 2:  # one huge value among small ones
        x = rng.normal(0.0, 0.1, n)
        x[rng.integers(n)] = 1.0e4
    elif kind == 3:  # negative-dominant: large negative values, a few small positive ones
        x = -np.abs(rng.normal(0.0, 2.0, n))
        x[rng.integers(n, size=max(1, n // 8))] = rng.uniform(0.0, 0.3, max(1, n // 8))
    elif kind == 4:  # strictly positive, offset from zero
        x = rng.uniform(0.5, 2.0, n)
    elif kind == 5:  # constant negative
        x = np.full(n, -0.7)
    elif kind == 6:  # tiny magnitudes (f16 scales underflow; K-quant zero-group paths)
        x = rng.normal(0.0, 1.0, n) * (1e-9 if rng.integers(2) else 1e-17)
    else:  # heavy tails, with the largest magnitude appearing with both signs
        x = np.clip(rng.standard_cauchy(n), -50.0, 50.0)
        x[3], x[n - 2] = 60.0, -60.0
    return x.astype(np.float32)


def float_inputs(rng: np.random.Generator, n: int) -> np.ndarray:
    """F16/BF16 inputs: ordinary values plus rounding ties, overflow and subnormals."""
    x = (rng.normal(0.0, 1.0, n) * 10.0 ** rng.uniform(-6, 4, n)).astype(np.float32)
    specials = np.array(
        [0.0, -0.0, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 65504.0, 65519.99, 65520.0, 1.0e6,
         2.0**-24, 2.0**-25, 3 * 2.0**-26, 1.0e-8, -1.0e-6, np.inf, -np.inf, np.nan,
         1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 3.4e38, 1.0e-40],
        dtype=np.float32,
    )  # fmt: skip
    x[: len(specials)] = specials
    x[len(specials)] = -np.float32(np.nan)
    return x


def quant_inputs(name: str) -> np.ndarray:
    fmt = FORMATS[name]
    rng = rng_for("quant", name)
    if fmt.elems == 1:
        return float_inputs(rng, 32 * BLOCKS_PER_FIXTURE)
    blocks = [awkward_block(rng, k % AWKWARD_KINDS, fmt.elems) for k in range(BLOCKS_PER_FIXTURE)]
    return np.concatenate(blocks)


# ---------------------------------------------------------------------------------------
# Expected values


class Mismatch(Exception):
    pass


def same_f32(a: np.ndarray, b: np.ndarray) -> bool:
    a_nan, b_nan = np.isnan(a), np.isnan(b)
    return bool(np.array_equal(a_nan, b_nan) and np.array_equal(a.view(np.uint32)[~a_nan], b.view(np.uint32)[~b_nan]))


def expected_dequant(name: str, data: np.ndarray, ref: GgmlRef | None):
    """(values, source, cross-check) for decoding `data`."""
    fmt = FORMATS[name]
    n = data.size // fmt.nbytes * fmt.elems
    c_symbol = ref.dequant_symbol(name) if ref else None
    c_values = ref.dequantize(name, data, n) if c_symbol else None

    if name == "Q8_1":
        # ggml has no Q8_1 dequantizer: a Q8_1 block decodes exactly like the Q8_0 block made
        # of its d and codes (s only serves integer dot products).
        as_q8_0 = data.reshape(-1, 36)[:, np.r_[0:2, 4:36]].reshape(-1)
        values = quants.dequantize(as_q8_0, Q.Q8_0).reshape(-1)
        source = "gguf.quants Q8_0 (numpy) on d|qs, dropping s (ggml has no Q8_1 dequantizer)"
        check = None
        if ref:
            c_values = ref.dequantize("Q8_0", as_q8_0, n)
            check = "libggml-base dequantize_row_q8_0 on d|qs"
            if not same_f32(values, c_values):
                raise Mismatch(f"{name}: numpy and C dequantization disagree")
        return values, source, check

    if name in NUMPY_DEQUANT:
        values = quants.dequantize(data, fmt.qtype).reshape(-1).astype(np.float32)
        source = f"gguf.quants {name} (numpy)" if name != "F32" else "identity (numpy view)"
        check = None
        if c_values is not None:
            check = f"libggml-base {c_symbol}"
            if not same_f32(values, c_values):
                bad = np.flatnonzero(values.view(np.uint32) != c_values.view(np.uint32))
                raise Mismatch(f"{name}: numpy and C dequantization disagree at {bad[:8]}")
        return values, source, check

    if c_values is None:
        return None, None, None
    check = None
    if name == "Q8_K":
        blocks = data.reshape(-1, fmt.nbytes)
        d = blocks[:, 0:4].copy().view(np.float32)
        codes = blocks[:, 4:260].copy().view(np.int8).astype(np.float32)
        if not same_f32((d * codes).reshape(-1), c_values):
            raise Mismatch("Q8_K: numpy d*q and C dequantization disagree")
        check = "numpy d*q"
    return c_values, f"libggml-base {c_symbol}", check


def expected_quant(name: str, values: np.ndarray, ref: GgmlRef | None):
    """(bytes, source, cross-check) for encoding `values`."""
    fmt = FORMATS[name]
    c_symbol = ref.quant_symbol(name) if ref else None
    c_bytes = ref.quantize(name, values) if c_symbol else None

    if name in NUMPY_QUANT:
        # The F16 inputs overflow on purpose; numpy warns about it.
        with np.errstate(over="ignore"):
            encoded = np.asarray(quants.quantize(values, fmt.qtype)).reshape(-1).view(np.uint8)
        source = f"gguf.quants {name} (numpy)" if name != "F32" else "identity (numpy view)"
        check = None
        if c_bytes is not None:
            check = f"libggml-base {c_symbol}"
            if not np.array_equal(encoded, c_bytes):
                bad = np.flatnonzero(encoded != c_bytes)
                raise Mismatch(f"{name}: numpy and C quantization disagree at bytes {bad[:8]}")
        return encoded, source, check

    if c_bytes is None:
        return None, None, None
    note = " (nrow=1, no importance matrix)" if c_symbol == "quantize_iq4_nl" else ""
    return c_bytes, f"libggml-base {c_symbol}{note}", None


# ---------------------------------------------------------------------------------------
# Output


def write_fixture(path: Path, kind: int, fmt: Fmt, n_elems: int, encoded: np.ndarray, values: np.ndarray):
    assert encoded.dtype == np.uint8 and values.dtype == np.float32
    assert encoded.size == n_elems // fmt.elems * fmt.nbytes and values.size == n_elems
    header = MAGIC + struct.pack("<5I", VERSION, kind, int(fmt.qtype), n_elems, encoded.size)
    if kind == KIND_DEQUANT:
        payload = encoded.tobytes() + values.astype("<f4").tobytes()
    else:
        payload = values.astype("<f4").tobytes() + encoded.tobytes()
    path.write_bytes(header + payload)


def main() -> int:
    global BLOCKS_PER_FIXTURE, SEED_SALT
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", help="path to libggml-base.so (default: $FERROX_GGML_LIB, then a search of /work/ref/build)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="fixture directory")
    parser.add_argument("--blocks", type=int, default=BLOCKS_PER_FIXTURE,
                        help="blocks per fixture (stress runs only; keep the default for committed fixtures)")
    parser.add_argument("--salt", default="", help="seed salt (stress runs only)")
    args = parser.parse_args()
    BLOCKS_PER_FIXTURE, SEED_SALT = args.blocks, args.salt

    lib_path = find_library(args.lib)
    ref = None
    if lib_path is not None:
        if not lib_path.exists():
            print(f"error: {lib_path} does not exist", file=sys.stderr)
            return 2
        ref = GgmlRef(lib_path)
        print(f"C reference: {lib_path} (ggml {ref.version})")
    else:
        print("warning: libggml-base.so not found; writing numpy-sourced fixtures only", file=sys.stderr)

    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = out_dir / "manifest.json"
    old_entries = {}
    if manifest_path.exists():
        old_entries = {e["file"]: e for e in json.loads(manifest_path.read_text())["fixtures"]}

    entries = []
    jobs = [("dequantize", t) for t in DEQUANT_TYPES] + [("quantize", t) for t in QUANT_TYPES]
    for kind, name in jobs:
        fmt = FORMATS[name]
        if kind == "dequantize":
            file = f"dequant-{name}.bin"
            encoded = random_blocks(name)
            n = encoded.size // fmt.nbytes * fmt.elems
            values, source, check = expected_dequant(name, encoded, ref)
        else:
            file = f"quant-{name}.bin"
            values = quant_inputs(name)
            n = values.size
            encoded, source, check = expected_quant(name, values, ref)
        if source is None:
            if file in old_entries and (out_dir / file).exists():
                print(f"  kept    {file} (needs the C reference)")
                entries.append(old_entries[file])
            else:
                print(f"  MISSING {file} (needs the C reference)", file=sys.stderr)
            continue
        write_fixture(out_dir / file, KIND_DEQUANT if kind == "dequantize" else KIND_QUANT, fmt, n, encoded, values)
        entry = {
            "file": file,
            "type": name,
            "kind": kind,
            "elements": int(n),
            "bytes": int(encoded.size),
            "expected_from": source,
        }
        if check:
            entry["cross_checked_with"] = check
        entries.append(entry)
        print(f"  wrote   {file}: {source}" + (f"; agrees with {check}" if check else ""))

    manifest = {
        "generator": "scripts/gen-quant-fixtures.py",
        "layout": "magic 'FXQF', then u32 LE: version=1, kind (0 dequantize: block bytes then "
        "expected f32; 1 quantize: f32 input then expected bytes), ggml type id, n_elements, "
        "n_bytes; then the payload",
        "gguf_py": getattr(gguf, "__version__", None) or _dist_version("gguf"),
        "numpy": np.__version__,
        "c_reference": ref.describe() if ref else None,
        "fixtures": entries,
    }
    if ref is None and old_entries:
        manifest["c_reference"] = json.loads(manifest_path.read_text()).get("c_reference")
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return 0


def _dist_version(dist: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return None


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Mismatch as e:
        print(f"error: reference implementations disagree: {e}", file=sys.stderr)
        sys.exit(1)
