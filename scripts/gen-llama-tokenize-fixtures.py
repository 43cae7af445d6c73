#!/usr/bin/env python3
"""Records llama.cpp's token ids for a corpus of tricky inputs as a tokenizer fixture.

    gen-llama-tokenize-fixtures.py CORPUS GGUF OUT_PREFIX

CORPUS is one of the corpora below (`unigram`, `wpm`). For each input the script runs
llama.cpp's `llama-tokenize` ($LLAMA_TOKENIZE, default `llama-tokenize` on PATH) on the
vocab-only GGUF and writes, in the layout of llama.cpp's vocab suite
(tests/test-tokenizer-0.cpp):

- OUT_PREFIX.inp / .out: every input, each followed by a line `__ggml_vocab_test__`, and
  one line of space-separated ids per input, tokenized with add_special = false and
  parse_special = false (`--no-bos --no-parse-special`);
- OUT_PREFIX-special.inp / .out: the corpus's special cases, tokenized with
  add_special = true and parse_special = true (llama-tokenize's defaults).

Each input is passed as the exact bytes of a file (`-f`, `--no-escape`), so whitespace,
newlines and control characters reach the tokenizer unchanged.
"""

import os
import subprocess
import sys
import tempfile

SEPARATOR = "\n__ggml_vocab_test__\n"

# Shared by both corpora: whitespace, scripts, emoji, controls, long runs.
COMMON = [
    "",
    " ",
    "  ",
    "\t",
    "\n",
    "\n\n\n",
    " \t \n  \r\n ",
    "Hello world",
    " Hello world",
    "Hello  world",
    "   leading and trailing   ",
    "Hello\tworld\nnew line\r\nwindows",
    "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～",
    "café naïve résumé Crème brûlée",
    "cafe\u0301 decomposed, e\u0301\u0302 stacked",
    "Straße İstanbul ıi ǅemal ﬁnance",
    "Привет мир, Γειά σου Κόσμε ΣΑΣ",
    "مرحبا بالعالم שלום עולם",
    "नमस्ते दुनिया สวัสดีชาวโลก",
    "こんにちは世界 ｶﾀｶﾅ カタカナ",
    "안녕하세요 세계",
    "我想在apple工作",
    "𠀀𠀁 𪜀 \U0002B820\U0002B920",
    "ＡＢＣ　ｘｙｚ　１２３！？",
    "①②③ ㍻ ™ ½ x² ℃ Ⅻ",
    "🦙 llama 😀👍🏽 👨‍👩‍👧 🇫🇷",
    "a\u200bb zero\u200dwidth soft\u00adhyphen \ufeffbom",
    "a\u00a0b\u2009c\u3000d\u2028e\u0085f",
    "a\u0001b\u007fc\u0000d\u001be",
    "\ue000 private \U0010fffd",
    "3.14159 1,000,000 2024-01-01 0x1F",
    "!!!!!!???...,,,;;;::: --- ___ ***",
    "(parens) [brackets] {braces} <angles>",
    "$100 + 5% = ^_^ `code` |pipe| ~tilde @at #hash &amp",
    "© ® € £ ¥ → ∑ ∞ ≠ ♥ ☃",
    "fn main() { println!(\"hi\"); }\n    return x;",
    "HeLLo WoRLD iPhone McDonald's O'NEIL",
    "▁ literal ▁▁escape▁",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "supercalifragilisticexpialidocious" * 5,
    "a" + " " * 50 + "b" + "\n" * 10 + "c",
    "word" + "\u0301" * 20,
    "x" * 1000,
    # Codepoints assigned after Unicode 15.1 (llama.cpp's tables): a capital with a
    # lowercase (U+1C89), one with a canonical decomposition (U+105C9), punctuation
    # (U+10D6E).
    "\u1c89\u1c8a \U000105c9 a\U00010d6eb",
]

CORPORA = {
    # A t5/unigram vocab with a precompiled charsmap (NFKC-style folding).
    "unigram": {
        "plain": COMMON + [
            "<s> </s> <unk> <pad> <mask> as text",
            "[PAD250001][PAD250002] unused tokens",
            "𓀀𓀁𓀂 unknown 𓀃 runs",
            "ﾊﾟﾋﾟﾌﾟ ｶﾞｷﾞ",
            "Ｈｅｌｌｏ，　Ｗｏｒｌｄ！",
            "ℌ𝔢𝔩𝔩𝔬 𝐁𝐨𝐥𝐝 ⅷ ㈱ ㌔",
            "\u2581\u2581",
            " " * 40,
        ],
        "special": [
            "",
            "Hello world",
            "<s>Hello</s> world<mask>",
            "  <unk>  spaced  </s>",
        ],
    },
    # A bert/WordPiece vocab (lowercasing, accent stripping).
    "wpm": {
        "plain": COMMON + [
            "[CLS] [SEP] [UNK] [MASK] as text",
            "Ångström ÅNGSTRÖM ÀÉÎÕÜ",
            "abc🦙def is one unknown word",
            "pneumonoultramicroscopicsilicovolcanoconiosis" * 3,
            "a▁b ▁hello",
            "don't can't won't",
            "e-mail e.g. i.e. U.S.A.",
        ],
        "special": [
            "",
            "Hello world",
            "[CLS]Hello[SEP] world[MASK]",
            "  [UNK]  spaced  [SEP]",
        ],
    },
}


def tokenize(llama_tokenize, gguf, text, special):
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(text.encode("utf-8"))
        path = f.name
    try:
        cmd = [llama_tokenize, "-m", gguf, "-f", path, "--ids", "--log-disable", "--no-escape"]
        if not special:
            cmd += ["--no-bos", "--no-parse-special"]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    ids = out.strip().splitlines()[-1].strip()
    if not (ids.startswith("[") and ids.endswith("]")):
        sys.exit(f"unexpected llama-tokenize output for {text!r}: {out!r}")
    return [int(t) for t in ids[1:-1].split(",") if t.strip()]


def write(prefix, inputs, outputs):
    with open(prefix + ".inp", "w", encoding="utf-8", newline="") as f:
        for text in inputs:
            if SEPARATOR in text:
                sys.exit(f"input contains the separator: {text!r}")
            f.write(text + SEPARATOR)
    with open(prefix + ".out", "w", encoding="utf-8", newline="") as f:
        for ids in outputs:
            f.write(" ".join(str(i) for i in ids) + "\n")


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in CORPORA:
        sys.exit(__doc__)
    corpus, gguf, prefix = CORPORA[sys.argv[1]], sys.argv[2], sys.argv[3]
    llama_tokenize = os.environ.get("LLAMA_TOKENIZE", "llama-tokenize")
    for suffix, special in (("", False), ("-special", True)):
        inputs = corpus["special" if special else "plain"]
        outputs = [tokenize(llama_tokenize, gguf, text, special) for text in inputs]
        write(prefix + suffix, inputs, outputs)
        print(f"{prefix + suffix}: {len(inputs)} inputs")


if __name__ == "__main__":
    main()
