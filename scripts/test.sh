#!/usr/bin/env bash
# The test entry point (CI runs it through .ci/run): installs what is missing, builds everything
# with warnings as errors, runs every CPU test through ctest (GPU tests carry the `gpu` label and
# run on the GPU host), then builds the libFuzzer targets with clang in build/fuzz and runs each
# for a short bounded time.
#   SKIP_FUZZ=1 skips the fuzz stage; extra arguments go to the main ctest run.
set -euo pipefail
source "$(dirname "$0")/common.sh"

"$GARDEN_ROOT/scripts/install-deps.sh"
GARDEN_CMAKE_ARGS="-DGARDEN_WERROR=ON ${GARDEN_CMAKE_ARGS:-}" garden_build
ctest --test-dir "$BUILD_DIR" -LE gpu --output-on-failure -j "$(garden_jobs)" "$@"

if [ "${SKIP_FUZZ:-0}" != 1 ]; then
  FUZZ_DIR="$BUILD_DIR/fuzz"
  if [ ! -f "$FUZZ_DIR/build.ninja" ]; then
    cmake -G Ninja -S "$GARDEN_ROOT" -B "$FUZZ_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DGARDEN_FUZZ=ON -DGARDEN_CUDA=OFF
  fi
  cmake --build "$FUZZ_DIR" -j "$(garden_jobs)" --target fuzzers
  ctest --test-dir "$FUZZ_DIR" -L fuzz --output-on-failure -j 1
fi
