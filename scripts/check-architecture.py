#!/usr/bin/env python3
"""Checks the import rules ARCHITECTURE.md states, so the document stays true.

1. Each crate's [dependencies] name only the ferrox crates its row of the `crate-deps` block
   allows (dev-dependencies are free: tests may load real engines).
2. In ferrox-models, an engine folder names no other engine (`crate::<engine>`), and the
   shared modules (layers/, scaffold.rs, hparams.rs, names.rs, tensors.rs) name no engine.
Exits 1 listing every breach.
"""
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "ARCHITECTURE.md"


def fenced(name):
    text = DOC.read_text()
    m = re.search(rf"```{name}\n(.*?)```", text, re.S)
    if not m:
        sys.exit(f"error: ARCHITECTURE.md has no ```{name} block")
    rows = {}
    for line in m.group(1).splitlines():
        if line.strip():
            key, _, rest = line.partition(":")
            rows[key.strip()] = rest.split()
    return rows


def main():
    breaches = []
    allowed = fenced("crate-deps")
    for manifest in sorted(ROOT.glob("crates/*/Cargo.toml")):
        crate = manifest.parent.name
        deps = tomllib.loads(manifest.read_text()).get("dependencies", {})
        used = sorted(d for d in deps if d.startswith("ferrox-"))
        if crate not in allowed:
            breaches.append(f"{crate}: not in ARCHITECTURE.md's crate-deps block")
            continue
        for dep in used:
            if dep not in allowed[crate]:
                breaches.append(f"{crate} depends on {dep}, which ARCHITECTURE.md does not allow")
    engines = fenced("engine-folders")["engines"]
    src = ROOT / "crates/ferrox-models/src"
    pattern = re.compile(r"crate::(" + "|".join(engines) + r")\b")
    shared = [src / "layers", src / "scaffold.rs", src / "hparams.rs", src / "names.rs", src / "tensors.rs"]
    for path in sorted(src.rglob("*.rs")):
        rel = path.relative_to(src)
        own = rel.parts[0] if len(rel.parts) > 1 and rel.parts[0] in engines else None
        is_shared = any(path == s or s in path.parents for s in shared)
        if own is None and not is_shared:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in pattern.finditer(line):
                if m.group(1) != own:
                    where = f"the engine folder {own}/" if own else "a shared module"
                    breaches.append(f"{path.relative_to(ROOT)}:{n}: {where} names crate::{m.group(1)}")
    for b in breaches:
        print(b, file=sys.stderr)
    if breaches:
        sys.exit(1)
    print(f"architecture: {len(allowed)} crates' dependencies and {len(engines)} engine folders as ARCHITECTURE.md says")


if __name__ == "__main__":
    main()
