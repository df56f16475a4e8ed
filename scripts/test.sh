#!/usr/bin/env bash
# The test entry point (CI runs it through .ci/run): installs what is missing, builds everything
# with warnings as errors, and runs every CPU test through ctest (GPU tests carry the `gpu` label
# and run on the GPU host).
set -euo pipefail
source "$(dirname "$0")/common.sh"

"$GARDEN_ROOT/scripts/install-deps.sh"
GARDEN_CMAKE_ARGS="-DGARDEN_WERROR=ON ${GARDEN_CMAKE_ARGS:-}" garden_build
ctest --test-dir "$BUILD_DIR" -LE gpu --output-on-failure -j "$(garden_jobs)" "$@"
