#!/usr/bin/env python3
"""Records llama.cpp's token ids for Gemma-3-270M on a mixed corpus.

Runs llama.cpp's `llama-tokenize` on every corpus text, with and without BOS and with and
without special-token parsing, and writes the inputs and ids to
crates/ferrox-tokenizer/tests/fixtures/gemma3-tokenizer.json, which tests/gemma_tokenizer.rs
checks ferrox against. Only needed when the corpus changes; the fixture is committed.

Usage: scripts/gen-gemma-tokenizer-fixtures.py [--llama-tokenize PATH] [--model PATH]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = Path.home() / ".cache/ferrox/models/gemma-3-270m-q4_k_m.gguf"
DEFAULT_TOOL = Path("/work/ref/build/bin/llama-tokenize")
OUT = ROOT / "crates/ferrox-tokenizer/tests/fixtures/gemma3-tokenizer.json"

CORPUS = [
    # English
    "Hello world",
    " Hello world",
    "The quick brown fox jumps over the lazy dog. It's 3:45 p.m., isn't it?",
    "Don't stop—we're \"almost\" there; 100% sure (really!).",
    "UPPER lower MiXeD CamelCaseWord snake_case_word kebab-case-word",
    "3.14159 2,718 1e-10 0x1F 007 12345678901234567890",
    # code
    'fn main() {\n    println!("Hello, {}!", name);\n}\n',
    "def f(x):\n\treturn x ** 2  # square\n\nprint(f(3))\n",
    "if (a && b || !c) { x += y >> 2; } else { y -= *p++; }",
    '<div class="box"><span>text</span></div>',
    "<table><tr><td>1</td></tr></table> <code>let x = 1;</code>",
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%bob%';",
    # CJK and other scripts
    "我想在苹果公司工作。今天天气很好！",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 텍스트입니다.",
    "Привет, мир! Ελληνικά. العربية עברית हिन्दी ภาษาไทย",
    "Äpfel über Öl, façade, naïve, coöperate",
    # emoji and rare characters (byte fallback)
    "🦙 llamas 🚀 rockets 😶‍🌫️ fog 👍🏽 thumbs ✅ done",
    "👨‍👩‍👧‍👦 family, 🇫🇷 flag, ❤️ heart",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝒷𝑜𝓁𝒹 𓀀 𐍈 \U0010fffd",
    "e\u0301 a\u0308 combining, zero\u200bwidth, bidi\u202eoverride",
    "\u2581 the SentencePiece marker ▁▁ itself",
    # whitespace runs
    " ",
    "  ",
    "   leading",
    "trailing   ",
    "a" + " " * 40 + "b",
    "\t",
    "\t\tindented\n\t\t\tmore",
    "\n",
    "\n\n\n\n\n",
    "x" + "\n" * 35 + "y",
    "\r\n windows \r\n line \r\n",
    " \t \n \t\n\n  \t",
    "\t" * 33 + "tabs",
    "mixed \t\n  \n\n\t\t  end",
    # special-token strings
    "<start_of_turn>user\nHi there!<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn>user\n",
    "<bos><eos><pad><unk><mask>",
    "text<end_of_turn>",
    " <start_of_turn> spaced <end_of_turn> ",
    "<start_of_turn",
    "<<start_of_turn>>",
    "<unused0><unused99>",
    "<start_of_image> an image <end_of_image>",
    "[multimodal]",
    # edge cases
    "",
    "a",
    "\x00nul\x00",
    "\x7f\x01control\x1b[0m",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "hello" * 20,
]


def tokenize(tool, model, text, add_bos, parse_special):
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        path = f.name
    try:
        cmd = [str(tool), "-m", str(model), "-f", path, "--ids", "--no-escape", "--log-disable"]
        if not add_bos:
            cmd.append("--no-bos")
        if not parse_special:
            cmd.append("--no-parse-special")
        out = subprocess.run(cmd, check=True, capture_output=True).stdout.decode()
    finally:
        os.unlink(path)
    line = out.strip().splitlines()[-1]
    return json.loads(line)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-tokenize", type=Path, default=DEFAULT_TOOL)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    args = parser.parse_args()
    for path, what in [(args.llama_tokenize, "llama-tokenize"), (args.model, "model")]:
        if not path.exists():
            sys.exit(f"{what} not found at {path}")

    cases = []
    for text in CORPUS:
        for add_bos in (True, False):
            for parse_special in (True, False):
                ids = tokenize(args.llama_tokenize, args.model, text, add_bos, parse_special)
                cases.append(
                    {"text": text, "add_bos": add_bos, "parse_special": parse_special, "ids": ids}
                )
    fixture = {
        "model": args.model.name,
        "tool": "llama.cpp llama-tokenize -f FILE --ids --no-escape [--no-bos] [--no-parse-special]",
        "cases": cases,
    }
    write_fixture(fixture)
    print(f"wrote {len(cases)} cases to {OUT.relative_to(ROOT)}")


def write_fixture(fixture):
    """JSON with one case per line, so that diffs show which cases changed."""
    head = {k: v for k, v in fixture.items() if k != "cases"}
    lines = [json.dumps(head, ensure_ascii=False)[:-1] + ', "cases": [']
    cases = [json.dumps(c, ensure_ascii=False) for c in fixture["cases"]]
    lines.append(",\n".join(cases))
    lines.append("]}")
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
