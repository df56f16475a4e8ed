# Sourced by the scripts: repository root, the one shared build tree, and the build step.
GARDEN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$GARDEN_ROOT/build}"
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$GARDEN_ROOT/$BUILD_DIR" ;; esac
export BUILD_DIR

garden_jobs() { nproc 2>/dev/null || echo 2; }

# garden_build [targets...]: configure (once) and build the shared tree.
garden_build() {
  if [ ! -f "$BUILD_DIR/build.ninja" ]; then
    cmake -G Ninja -S "$GARDEN_ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      ${GARDEN_CMAKE_ARGS:-}
  fi
  cmake --build "$BUILD_DIR" -j "$(garden_jobs)" ${1:+--target "$@"}
}
