"""A stand-in for the Hugging Face Hub's model routes, serving the repositories under a
directory: ROOT/ORG/NAME/FILE. Enough of the API for `ferrox pull` and `-hf`:

  GET /api/models/ORG/NAME/revision/main?blobs=true   model info: sha, siblings with LFS sha256
  GET /ORG/NAME/resolve/main/FILE                      302 to /cdn/... with x-repo-commit and
                                                       x-linked-etag / x-linked-size, as the Hub
  GET /cdn/ORG/NAME/FILE                               the bytes, honouring Range

ROOT/_config.json tunes repositories: {"ORG/NAME": {"gated": true}} wants the bearer token
"secret"; {"corrupt": [FILE]} lists a sha256 the bytes do not have; {"interrupt": [FILE]}
cuts the first full transfer of FILE in the middle. Every request is appended to ROOT/_log
as "METHOD PATH RANGE". Prints the port it listens on, then serves until killed.
"""
import hashlib
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

ROOT = sys.argv[1]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
LOCK = threading.Lock()
INTERRUPTED = set()


def config(repo):
    try:
        with open(os.path.join(ROOT, "_config.json")) as f:
            return json.load(f).get(repo, {})
    except FileNotFoundError:
        return {}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_json(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authorized(self, repo):
        if not config(repo).get("gated"):
            return True
        return self.headers.get("Authorization") == "Bearer secret"

    def do_GET(self):
        path = unquote(urlsplit(self.path).path)
        with LOCK, open(os.path.join(ROOT, "_log"), "a") as log:
            log.write(f"GET {path} {self.headers.get('Range', '-')}\n")
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and parts[-2:] == ["revision", "main"]:
            return self.info("/".join(parts[2:-2]))
        if len(parts) >= 5 and parts[2:4] == ["resolve", "main"]:
            return self.resolve("/".join(parts[:2]), "/".join(parts[4:]))
        if parts[0] == "cdn" and len(parts) >= 4:
            return self.content("/".join(parts[1:3]), "/".join(parts[3:]))
        self.send_json(404, {"error": "no such route"})

    def repo_dir(self, repo):
        d = os.path.join(ROOT, repo)
        return d if os.path.isdir(d) and not repo.startswith("_") else None

    def info(self, repo):
        d = self.repo_dir(repo)
        if d is None:
            return self.send_json(404, {"error": "Repository not found"})
        if not self.authorized(repo):
            return self.send_json(401, {"error": "Access to this repository is restricted"})
        corrupt = config(repo).get("corrupt", [])
        siblings = []
        for name in sorted(os.listdir(d)):
            p = os.path.join(d, name)
            sha = sha256(p)
            if name in corrupt:
                sha = hashlib.sha256(b"other bytes").hexdigest()
            entry = {"rfilename": name, "size": os.path.getsize(p)}
            if name.endswith(".gguf"):
                entry["lfs"] = {"sha256": sha, "size": os.path.getsize(p), "pointerSize": 134}
            siblings.append(entry)
        self.send_json(200, {"id": repo, "modelId": repo, "sha": COMMIT, "siblings": siblings})

    def resolve(self, repo, name):
        d = self.repo_dir(repo)
        if d is None:
            return self.send_json(404, {"error": "Repository not found"})
        if not self.authorized(repo):
            return self.send_json(401, {"error": "Access to this repository is restricted"})
        p = os.path.join(d, name)
        if not os.path.isfile(p):
            return self.send_json(404, {"error": "Entry not found"})
        host = self.headers.get("Host")
        self.send_response(302)
        self.send_header("Location", f"http://{host}/cdn/{repo}/{name}")
        self.send_header("x-repo-commit", COMMIT)
        self.send_header("x-linked-etag", f'"{sha256(p)}"')
        self.send_header("x-linked-size", str(os.path.getsize(p)))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def content(self, repo, name):
        d = self.repo_dir(repo)
        p = os.path.join(d, name) if d else None
        if p is None or not os.path.isfile(p):
            return self.send_json(404, {"error": "Entry not found"})
        data = open(p, "rb").read()
        start, end = 0, len(data) - 1
        ranged = self.headers.get("Range")
        if ranged and ranged.startswith("bytes="):
            a, _, b = ranged[6:].partition("-")
            start = int(a)
            end = int(b) if b else len(data) - 1
        body = data[start:end + 1]
        self.send_response(206 if ranged else 200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("ETag", f'"{sha256(p)}"')
        self.end_headers()
        key = (repo, name)
        cut = name in config(repo).get("interrupt", []) and len(body) > 1
        with LOCK:
            cut = cut and key not in INTERRUPTED
            if cut:
                INTERRUPTED.add(key)
        if cut:
            # Half the promised bytes, then the connection drops.
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.wfile.write(body)


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
