#!/usr/bin/env bash
# Packs the GPU test binaries, the kernel benches and the three servers of a CUDA build tree for the GPU host (input
# GPUBIN of bench/suites/gpu_embed_suites.sh): stripped executables plus lib/ with every shared
# library they need that is not glibc, libstdc++/libgcc or CUDA (the host has those).
#   bench/suites/gpu_pack.sh BUILD_DIR DEST      (DEST is recreated; prints its size)
set -euo pipefail
BUILD="$(cd "$1" && pwd)"; DEST="$2"
bins=(tests/gpu/gpu_kernels_test tests/gpu/gpu_graph_test tests/gpu/gpu_model_graph_test
      tests/gpu/gpu_llm_ops_test tests/gpu/gpu_llm_model_test tests/gpu/gpu_ipc_test
      tests/gpu/gpu_shard_test tests/gpu/gpu_ranks_test
      bench/kernels/rose_kernel_bench bench/kernels/rose_forward_bench bench/kernels/rose_llm_bench
      services/rose/rose services/tulip/tulip services/ivy/ivy bench/loadgen/loadgen
      bench/grammar/grammar_bench)
rm -rf "$DEST"; mkdir -p "$DEST/lib"
for b in "${bins[@]}"; do
  [ -x "$BUILD/$b" ] || { echo "gpu_pack.sh: $BUILD/$b missing: ninja -C $BUILD $(basename "$b")" >&2; exit 1; }
  strip -o "$DEST/$(basename "$b")" "$BUILD/$b"
  ldd "$BUILD/$b" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libstdc++*|libgcc_s*) ;;
      libcuda*|libcublas*|libcudart*|libnccl*|libcudnn*) ;;
      *) [ -e "$DEST/lib/$(basename "$lib")" ] || cp -L "$lib" "$DEST/lib/" ;;
    esac
  done
done
# The gpt-oss tokenizer (tests/conformance/tokenizer/fetch_assets.sh) for the mesh steps and
# grammar_bench, when this checkout has it.
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
tok="$ROOT/tests/assets/tokenizers/gptoss/tokenizer.json"
[ -f "$tok" ] && cp "$tok" "$DEST/tokenizer.json"
du -sh "$DEST"
ls "$DEST" "$DEST/lib"
