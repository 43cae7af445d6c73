#!/usr/bin/env bash
# Rebuilds the chat page ferrox serve embeds (crates/ferrox-server/web/dist/index.html) from
# its sources in crates/ferrox-server/web/ with the locked npm packages (Vite, marked,
# DOMPurify). Run it after changing the page, and commit dist/index.html with the sources;
# the web_chat test fails while the committed page differs from a fresh build.
set -euo pipefail
cd "$(dirname "$0")/../crates/ferrox-server/web"
[ -d node_modules ] || npm ci --no-audit --no-fund >&2
npx tsc -p . >&2
npx vite build >&2
echo "crates/ferrox-server/web/dist/index.html"
