#!/usr/bin/env bash
# Packs what the official `openai` client test (tests/integration/openai_client) needs to run
# against a CUDA mesh on the GPU host, which has neither node nor sentencepiece's spm_train:
# rose, rose-mkmodel, tulip and ivy of a CUDA build tree (stripped, in the build-tree layout the
# test expects) with their non-system libraries, this machine's node, the pinned client
# (BUILD/tests/integration/openai_client/npm: `ctest -R openai_client_npm` installs it), the
# gpt-oss tokenizer, and spm_train.
#   bench/suites/gpu_oai_pack.sh BUILD_DIR OUT.tar.xz
# On the GPU host (carry OUT.tar.xz):
#   tar xJf OUT.tar.xz -C /tmp && export PATH=/tmp/oai/spm:$PATH \
#     LD_LIBRARY_PATH=/tmp/oai/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH &&
#   /tmp/oai/node tests/integration/openai_client/openai_client_test.mjs --build /tmp/oai/build \
#     --modules /tmp/oai/npm --tokenizer /tmp/oai/tokenizer.json --source "$PWD" --device cuda
set -euo pipefail
BUILD="$(cd "$1" && pwd)"; OUT="$2"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
W=$(mktemp -d); D="$W/oai"
mkdir -p "$D/lib" "$D/spm"
copy_libs() {
  ldd "$1" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libstdc++*|libgcc_s*) ;;
      libcuda*|libcublas*|libcudart*|libnccl*|libcudnn*) ;;
      *) [ -e "$2/$(basename "$lib")" ] || cp -L "$lib" "$2/" ;;
    esac
  done
}
for b in services/rose/rose services/rose/rose-mkmodel services/tulip/tulip services/ivy/ivy; do
  [ -x "$BUILD/$b" ] || { echo "gpu_oai_pack.sh: $BUILD/$b missing" >&2; exit 1; }
  mkdir -p "$D/build/$(dirname "$b")"
  strip -o "$D/build/$b" "$BUILD/$b"
  copy_libs "$BUILD/$b" "$D/lib"
done
cp "$(command -v node)" "$D/node"
cp -r "$BUILD/tests/integration/openai_client/npm" "$D/npm"
cp "$ROOT/tests/assets/tokenizers/gptoss/tokenizer.json" "$D/"
cp "$(command -v spm_train)" "$D/spm/"
copy_libs "$(command -v spm_train)" "$D/lib"
tar -cJf "$OUT" -C "$W" oai
rm -rf "$W"
ls -la "$OUT"
