"""Compact, diff-friendly JSON writer for the reference fixtures: objects are spread over lines,
lists without objects that nest at most two deep stay on one line (so a top-k row or an id list
is one line)."""
import json


def _depth(x):
    if isinstance(x, list):
        return 1 + max((_depth(v) for v in x), default=0)
    return 0


def _has_dict(x):
    if isinstance(x, dict):
        return True
    if isinstance(x, list):
        return any(_has_dict(v) for v in x)
    return False


def _fmt(x, ind):
    pad = " " * ind
    if isinstance(x, dict):
        if not x:
            return "{}"
        items = [f'{pad} {json.dumps(k, ensure_ascii=False)}: {_fmt(v, ind + 1)}' for k, v in x.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(x, list):
        if not _has_dict(x) and _depth(x) <= 2:
            return json.dumps(x, ensure_ascii=False, separators=(", ", ": "))
        items = [pad + " " + _fmt(v, ind + 1) for v in x]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(x, ensure_ascii=False)


def dump(obj, path):
    with open(path, "w", encoding="utf-8") as f:
        f.write(_fmt(obj, 0))
        f.write("\n")
