"""A stand-in for the Hugging Face Hub's model routes, serving the repositories under a
directory: ROOT/ORG/NAME/FILE. Enough of the API for `ferrox pull` and `-hf`:

  GET /api/models/ORG/NAME/revision/main?blobs=true   model info: sha, siblings with LFS sha256
  HEAD|GET /ORG/NAME/resolve/main/FILE                 302 to /cdn/... with x-repo-commit and
                                                       x-linked-etag / x-linked-size, as the Hub
  HEAD|GET /cdn/ORG/NAME/FILE                          the bytes, honouring Range

A second listener (another origin: the same address, another port) serves the same routes,
as a CDN on another host would.

ROOT/_config.json tunes repositories: {"ORG/NAME": {"gated": true}} wants the bearer token
"secret"; {"corrupt": [FILE]} gives a sha256 the bytes do not have (listing and ETag); {"interrupt": [FILE]}
cuts the first full transfer of FILE in the middle. Hostile behaviour, for the checks a
client must make:
  "etag": S           sends S as x-linked-etag and ETag (a path such as ../../x, say)
  "nolfs": true       lists the GGUFs without their LFS sha256
  "commit": S         sends S as x-repo-commit
  "other_host": true  redirects to the second listener (an absolute Location)
  "redirect_loop": true  redirects the file to itself, forever
  "ignore_range": true   answers a Range request with 200 and the whole file
  "bad_range": true      answers a Range request with 206 from another offset than asked
  "extra": [NAME]     lists NAME as a file too (a name such as ../x.gguf)
Every request is appended to ROOT/_log as "METHOD PATH RANGE auth=yes|no port=PORT".
Prints the port it listens on, then the other listener's, then serves until killed.
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


def listed_sha256(repo, name, path):
    """The sha256 the Hub gives for a file (listing and ETag): a wrong one for "corrupt"."""
    if name in config(repo).get("corrupt", []):
        return hashlib.sha256(b"other bytes").hexdigest()
    return sha256(path)


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
        self.body(data)

    def authorized(self, repo):
        if not config(repo).get("gated"):
            return True
        return self.headers.get("Authorization") == "Bearer secret"

    def do_HEAD(self):
        self.route("HEAD")

    def do_GET(self):
        self.route("GET")

    def route(self, method):
        self.head = method == "HEAD"
        path = unquote(urlsplit(self.path).path)
        auth = "yes" if self.headers.get("Authorization") else "no"
        port = self.server.server_address[1]
        with LOCK, open(os.path.join(ROOT, "_log"), "a") as log:
            log.write(f"{method} {path} {self.headers.get('Range', '-')} auth={auth} port={port}\n")
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and parts[-2:] == ["revision", "main"]:
            return self.info("/".join(parts[2:-2]))
        if len(parts) >= 5 and parts[2:4] == ["resolve", "main"]:
            return self.resolve("/".join(parts[:2]), "/".join(parts[4:]))
        if parts[0] == "cdn" and len(parts) >= 4:
            return self.content("/".join(parts[1:3]), "/".join(parts[3:]))
        self.send_json(404, {"error": "no such route"})

    def body(self, data):
        if not self.head:
            self.wfile.write(data)

    def repo_dir(self, repo):
        d = os.path.join(ROOT, repo)
        return d if os.path.isdir(d) and not repo.startswith("_") else None

    def info(self, repo):
        d = self.repo_dir(repo)
        if d is None:
            return self.send_json(404, {"error": "Repository not found"})
        if not self.authorized(repo):
            return self.send_json(401, {"error": "Access to this repository is restricted"})
        siblings = []
        for name in sorted(os.listdir(d)):
            p = os.path.join(d, name)
            sha = listed_sha256(repo, name, p)
            entry = {"rfilename": name, "size": os.path.getsize(p)}
            if name.endswith(".gguf") and not config(repo).get("nolfs"):
                entry["lfs"] = {"sha256": sha, "size": os.path.getsize(p), "pointerSize": 134}
            siblings.append(entry)
        for name in config(repo).get("extra", []):
            siblings.append({"rfilename": name, "size": 4})
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
        conf = config(repo)
        host = self.headers.get("Host")
        if conf.get("other_host"):
            host = f"127.0.0.1:{OTHER.server_address[1]}"
        location = f"http://{host}/cdn/{repo}/{name}"
        if conf.get("redirect_loop"):
            location = f"/{repo}/resolve/main/{name}"
        etag = conf.get("etag", listed_sha256(repo, name, p))
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("x-repo-commit", conf.get("commit", COMMIT))
        self.send_header("x-linked-etag", f'"{etag}"')
        self.send_header("x-linked-size", str(os.path.getsize(p)))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def content(self, repo, name):
        d = self.repo_dir(repo)
        p = os.path.join(d, name) if d else None
        if p is None or not os.path.isfile(p):
            return self.send_json(404, {"error": "Entry not found"})
        data = open(p, "rb").read()
        conf = config(repo)
        start, end = 0, len(data) - 1
        ranged = self.headers.get("Range")
        if ranged and conf.get("ignore_range"):
            ranged = None
        if ranged and ranged.startswith("bytes="):
            a, _, b = ranged[6:].partition("-")
            start = int(a)
            end = int(b) if b else len(data) - 1
            if conf.get("bad_range"):
                start = start // 2
        body = data[start:end + 1]
        self.send_response(206 if ranged else 200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("ETag", f'"{conf.get("etag", listed_sha256(repo, name, p))}"')
        self.end_headers()
        if self.head:
            return
        key = (repo, name)
        cut = name in conf.get("interrupt", []) and len(body) > 1
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
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            # The client stopped reading (an answer it refused): nothing to report.
            self.close_connection = True


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
OTHER = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=OTHER.serve_forever, daemon=True).start()
print(server.server_address[1], flush=True)
print(OTHER.server_address[1], flush=True)
server.serve_forever()
