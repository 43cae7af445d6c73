#!/usr/bin/env bash
# Rebuilds the chat page ferrox serve embeds (crates/ferrox-server/web/dist/: index.html,
# assets/app.js, assets/app.css) from its sources in crates/ferrox-server/web/ with the
# locked npm packages (Vite, marked, DOMPurify). Run it after changing the page, and commit
# dist/ with the sources; the web_chat test fails while the committed page differs from a
# fresh build.
set -euo pipefail
cd "$(dirname "$0")/../crates/ferrox-server/web"
[ -d node_modules ] || npm ci --no-audit --no-fund >&2
npx tsc -p . >&2
npx vite build >&2
# The server embeds exactly these names (crates/ferrox-server/src/web.rs).
expected=$'dist/assets/app.css\ndist/assets/app.js\ndist/index.html'
built=$(find dist -type f | LC_ALL=C sort)
if [ "$built" != "$expected" ]; then
    echo "the build wrote other files than web.rs embeds:" >&2
    echo "$built" >&2
    exit 1
fi
sed 's|^|crates/ferrox-server/web/|' <<<"$built"
