#!/usr/bin/env bash
# Fetches the perplexity text: "Botchan (Master Darling)" by Natsume Soseki ("Kin-nosuke Natsume"),
# English translation by Yasotaro Morri, revised by J. R. Kennedy, published 1919 - Project
# Gutenberg eBook #8868, public domain in the USA (published before 1929; the file's own Gutenberg
# header says "no one owns a United States copyright in these works"). The copy comes from the
# PyPI source distribution of sentencepiece 0.2.3 (test/botchan.txt, Google's test corpus).
# Keeps only the book body (between the Gutenberg START marker and "End of Project Gutenberg"),
# writes it to $FERROX_DATA_DIR/ppl/botchan.txt (default ~/.cache/ferrox) and prints its path.
# Idempotent: does nothing when a copy with the right sha256 is already there.
set -euo pipefail
PKG=sentencepiece
VERSION=0.2.3
SDIST_SHA256=21618ad31f0453a1ebf5ec58defed99758d54af0b670546ecac639ddd8b86fbd
TEXT_SHA256=bc06458c969e2644435ca155fbb6653f116346c20d67443221895124933333be
DIR="${FERROX_DATA_DIR:-$HOME/.cache/ferrox}/ppl"
DEST="$DIR/botchan.txt"
PYTHON="${PYTHON:-python3}"

sha_ok() { [ -f "$1" ] && echo "$2  $1" | sha256sum --check --status; }

mkdir -p "$DIR"
if sha_ok "$DEST" "$TEXT_SHA256"; then
    echo "$DEST"
    exit 0
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "fetching $PKG==$VERSION (sdist) from PyPI for test/botchan.txt ..." >&2
SDIST="$("$PYTHON" "$(dirname "$0")/../pypi-sdist.py" "$PKG" "$VERSION" "$WORK")"
sha_ok "$SDIST" "$SDIST_SHA256" || { echo "error: sha256 of $SDIST is not $SDIST_SHA256" >&2; exit 1; }
tar -xzf "$SDIST" -C "$WORK" "$PKG-$VERSION/test/botchan.txt"
"$PYTHON" - "$WORK/$PKG-$VERSION/test/botchan.txt" "$DEST.partial" <<'PY'
import sys
lines = open(sys.argv[1], encoding="utf-8-sig").read().split("\n")
start = next(i for i, l in enumerate(lines) if l.startswith("*** START OF THIS PROJECT GUTENBERG EBOOK"))
end = next(i for i, l in enumerate(lines) if l.startswith("End of Project Gutenberg") or l.startswith("*** END OF THIS PROJECT GUTENBERG"))
with open(sys.argv[2], "w", encoding="utf-8", newline="\n") as f:
    f.write("\n".join(lines[start + 1:end]).strip("\n") + "\n")
PY
if ! sha_ok "$DEST.partial" "$TEXT_SHA256"; then
    echo "error: sha256 of the extracted text is $(sha256sum "$DEST.partial" | cut -d' ' -f1), expected $TEXT_SHA256" >&2
    rm -f "$DEST.partial"
    exit 1
fi
mv "$DEST.partial" "$DEST"
echo "$DEST"
