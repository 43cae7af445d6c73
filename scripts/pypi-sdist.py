#!/usr/bin/env python3
"""Downloads one source distribution from PyPI as a file, without building anything.

Usage: pypi-sdist.py NAME VERSION DEST_DIR  ->  prints the path of the .tar.gz

`pip download` prepares an sdist's metadata, which installs (and with --no-binary, builds)
its build dependencies: minutes of work, or a hang, for a file we only unpack. This reads the
package's file list from the simple index (PEP 691 JSON), downloads the sdist and checks it
against the sha256 the index lists. The index is PIP_INDEX_URL when set, else PyPI's.
"""
import hashlib
import json
import os
import re
import sys
import time
import urllib.request

TIMEOUT_S = 60
ATTEMPTS = 3


def fetch(url, accept=None):
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    for attempt in range(ATTEMPTS):
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                return response.read()
        except OSError as error:  # URLError and timeouts are OSErrors
            if attempt + 1 == ATTEMPTS:
                raise SystemExit(f"error: {url}: {error}")
            time.sleep(2 * (attempt + 1))


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__.strip().splitlines()[2])
    name, version, dest = sys.argv[1:]
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    project = re.sub(r"[-_.]+", "-", name).lower()
    listing = json.loads(fetch(f"{index}/{project}/", "application/vnd.pypi.simple.v1+json"))
    # sdist file names normalise the name with underscores (PEP 625), older ones keep it as is.
    wanted = {f"{n}-{version}.tar.gz" for n in (name, project, project.replace("-", "_"))}
    files = [f for f in listing.get("files", []) if f.get("filename") in wanted]
    if not files:
        raise SystemExit(f"error: {index} lists no sdist of {name} {version}")
    entry = files[0]
    data = fetch(entry["url"])
    expected = entry.get("hashes", {}).get("sha256")
    actual = hashlib.sha256(data).hexdigest()
    if expected and actual != expected:
        raise SystemExit(f"error: sha256 of {entry['filename']} is {actual}, the index says {expected}")
    os.makedirs(dest, exist_ok=True)
    path = os.path.join(dest, entry["filename"])
    with open(path, "wb") as out:
        out.write(data)
    print(path)


if __name__ == "__main__":
    main()
