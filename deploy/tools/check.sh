#!/usr/bin/env bash
# Renders the kustomize base and every overlay with `kubectl kustomize` and validates the result
# offline against the Kubernetes OpenAPI schemas (validate.mjs). Writes the rendered manifests to
# OUTDIR (default: a temporary folder) as <name>.yaml, for the wiring test to read.
#   deploy/tools/check.sh [OUTDIR]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
k8s="$here/../k8s"
out="${1:-$(mktemp -d)}"
mkdir -p "$out"
kubectl="$("$here/kubectl.sh")"
[ -d "$here/node_modules/kubernetes-models" ] || { echo "run deploy/tools/install.sh first" >&2; exit 1; }
files=()
for dir in "$k8s/base" "$k8s"/overlays/*/; do
  name="$(basename "$dir")"
  "$kubectl" kustomize "$dir" > "$out/$name.yaml"
  echo "rendered $name: $(grep -c '^kind:' "$out/$name.yaml") objects"
  files+=("$out/$name.yaml")
done
# Objects operators copy and edit by hand are checked too.
for f in "$k8s"/examples/*.yaml; do [ -e "$f" ] && files+=("$f"); done
node "$here/validate.mjs" "${files[@]}"
