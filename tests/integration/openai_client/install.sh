#!/usr/bin/env bash
# Installs the official `openai` npm client (the version pinned in package.json/package-lock.json
# next to this script) into DEST/node_modules with `npm ci`, for openai_client_test.mjs.
#   install.sh DEST
# Does nothing when DEST already holds this exact lockfile's install. Needs node and npm and the
# npm registry (or a warm npm cache); exits non-zero with the reason otherwise, so the test that
# needs the client fails rather than skips.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DEST="${1:?usage: install.sh DEST}"
command -v node >/dev/null || { echo "install.sh: node is not installed (scripts/install-deps.sh installs it)" >&2; exit 1; }
command -v npm >/dev/null || { echo "install.sh: npm is not installed (scripts/install-deps.sh installs it)" >&2; exit 1; }
major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$major" -ge 18 ] || { echo "install.sh: node >= 18 is needed (found $(node --version))" >&2; exit 1; }
mkdir -p "$DEST"
stamp="$DEST/node_modules/.garden-lock.sha256"
want="$(cat "$HERE/package.json" "$HERE/package-lock.json" | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -f "$DEST/node_modules/openai/package.json" ]; then
  echo "openai client already installed in $DEST ($(node -p "require('$DEST/node_modules/openai/package.json').version"))"
  exit 0
fi
cp "$HERE/package.json" "$HERE/package-lock.json" "$DEST/"
if ! (cd "$DEST" && npm ci --no-audit --no-fund --loglevel=error); then
  echo "install.sh: npm ci failed (is the npm registry reachable? npm config get registry: $(npm config get registry))" >&2
  exit 1
fi
echo "$want" > "$stamp"
echo "openai client installed in $DEST ($(node -p "require('$DEST/node_modules/openai/package.json').version"))"
