#!/usr/bin/env bash
# The test entry point (CI runs it through .ci/run): installs what is missing, builds everything
# with warnings as errors, runs every CPU test through ctest (GPU tests carry the `gpu` label and
# run on the GPU host; the bounded mesh soak, label `soak`, runs alone), then clang's
# thread-safety analysis over services/ and common/ (scripts/check-thread-safety.sh), then the concurrent
# code of ivy and tulip under ThreadSanitizer in build/tsan, then the unit and integration tests
# again under ASan+UBSan in build/asan, then builds the libFuzzer targets with clang in build/fuzz
# and runs each for a short bounded time.
#   RUN_ASAN=0 skips the sanitizer stage (on by default; on a loaded 2-core machine without a
#   compiler cache its build took ~16 min and its 40 tests ~2.5 min); RUN_TSAN=0 skips the
#   ThreadSanitizer stage (on by default; ~14 min on CI's 2 cores, see below);
#   RUN_THREAD_SAFETY=0 skips the -Wthread-safety check; SKIP_FUZZ=1 skips the fuzz stage; extra
#   arguments go to the main ctest run.
set -euo pipefail
source "$(dirname "$0")/common.sh"

"$GARDEN_ROOT/scripts/install-deps.sh"
GARDEN_CMAKE_ARGS="-DGARDEN_WERROR=ON ${GARDEN_CMAKE_ARGS:-}" garden_build
ctest --test-dir "$BUILD_DIR" -LE gpu --output-on-failure -j "$(garden_jobs)" "$@"

# Concurrency contracts: clang -Wthread-safety -Werror over services/ and common/, syntax only.
if [ "${RUN_THREAD_SAFETY:-1}" = 1 ]; then
  "$GARDEN_ROOT/scripts/check-thread-safety.sh"
fi

# ThreadSanitizer: ivy's and tulip's concurrent code (and common/shm, common/metrics) built with
# -DGARDEN_TSAN=ON in build/tsan: the unit tests of their threaded parts and the integration
# tests that drive tulip's gRPC server and ivy's replica pool concurrently over fake-rose
# (TSAN_TESTS; why these and not the rose-backed ones: docs/concurrency.md). Only the targets
# those tests need are built (no rose: its model code is most of a TSan build's time). Every
# process writes its reports under build/tsan/tsan-reports (the tests' children too: ivy and
# tulip inherit TSAN_OPTIONS); any report fails the stage, whether or not the test noticed.
# Debian's gRPC and abseil are not instrumented and their synchronization is invisible to TSan:
# tests/tsan/suppressions.txt names those libraries (called_from_lib) and exact gRPC frames,
# each with its reason, and our side of every hand-off to a gRPC callback is annotated
# (common/tsan_handoff.h). history_size=7: the longest per-thread history, so that the earlier
# access of a report is found (and matched against the suppressions) also on a slow machine.
# RUN_TSAN=0 skips it; TSAN_TESTS=<ctest regex> runs other tests (e.g. the rose-backed pool,
# disconnect and soak tests, which still report gRPC client-side hand-offs: docs/concurrency.md).
# On by default: ~750 s build (uncached) + ~80 s tests on CI's 2 cores; the last whole CI run
# without it took 2,596 s of its 5,400 s, so with it about 3,430 s (docs/concurrency.md, "Stage
# time"). It prints its build and test times separately.
if [ "${RUN_TSAN:-1}" = 1 ]; then
  tsan_t0=$SECONDS
  TSAN_DIR="$BUILD_DIR/tsan"
  tsan_unit='unit_(ivy_(balance|http|chat)|tulip_(sched|llm|worker)|common_(shm|metrics|grammar))'
  tsan_integration='integration_(tulip_grpc|tulip_batching|generate|spread)'
  TSAN_TESTS="${TSAN_TESTS:-^($tsan_unit|$tsan_integration)\$}"
  cmake -G Ninja -S "$GARDEN_ROOT" -B "$TSAN_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DGARDEN_TSAN=ON -DGARDEN_WERROR=ON -DGARDEN_CUDA=OFF > /dev/null
  tsan_targets=$(ctest --test-dir "$TSAN_DIR" -N -R "$TSAN_TESTS" |
    sed -n 's/^ *Test *#[0-9]*: *//p' |
    while read -r t; do if ninja -C "$TSAN_DIR" -t query "$t" >/dev/null 2>&1; then echo "$t"; fi; done)
  # shellcheck disable=SC2086
  cmake --build "$TSAN_DIR" -j "$(garden_jobs)" --target $tsan_targets
  tsan_build_s=$((SECONDS - tsan_t0))
  reports="$TSAN_DIR/tsan-reports"
  rm -rf "$reports" && mkdir -p "$reports"
  tsan_rc=0
  TSAN_OPTIONS="log_path=$reports/tsan:second_deadlock_stack=1:history_size=7:suppressions=$GARDEN_ROOT/tests/tsan/suppressions.txt" \
    GARDEN_SOAK_SECONDS="${GARDEN_SOAK_SECONDS:-20}" \
    ctest --test-dir "$TSAN_DIR" -R "$TSAN_TESTS" --output-on-failure -j "$(garden_jobs)" ||
    tsan_rc=$?
  if compgen -G "$reports/tsan.*" > /dev/null; then
    cat "$reports"/tsan.*
    echo "ThreadSanitizer: reports above (one file per process in $reports)" >&2
    exit 1
  fi
  [ "$tsan_rc" = 0 ] || exit "$tsan_rc"
  echo "ThreadSanitizer stage: no reports; build ${tsan_build_s} s, tests $((SECONDS - tsan_t0 - tsan_build_s)) s"
fi

# ASan+UBSan: the unit and integration tests again, built with -DGARDEN_SANITIZE=ON in build/asan (only the targets those tests need: no benchmarks, conformance data or CUDA).
# UBSan findings abort the test (-fno-sanitize-recover); leak checking is off (gRPC and protobuf
# keep process-lifetime allocations that LeakSanitizer reports). RUN_ASAN=0 skips the stage;
# ASAN_LABELS narrows it (default "unit|integration"); tests labelled `long` (integration_structured:
# minutes under ASan on 2 cores; its grammar code is in unit_common_grammar) are left out of it.
if [ "${RUN_ASAN:-1}" = 1 ]; then
  ASAN_DIR="$BUILD_DIR/asan"
  ASAN_LABELS="${ASAN_LABELS:-unit|integration}"
  # Configured every time (cheap when nothing changed): the target list below is read from
  # ctest, which only knows the tests of the last configure.
  cmake -G Ninja -S "$GARDEN_ROOT" -B "$ASAN_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DGARDEN_SANITIZE=ON -DGARDEN_WERROR=ON -DGARDEN_CUDA=OFF > /dev/null
  # The test executables of those labels that are build targets (their CMake dependencies bring
  # the binaries the integration tests start).
  asan_targets=$(ctest --test-dir "$ASAN_DIR" -N -L "$ASAN_LABELS" -LE "gpu|long" |
    sed -n 's/^ *Test *#[0-9]*: *//p' |
    while read -r t; do if ninja -C "$ASAN_DIR" -t query "$t" >/dev/null 2>&1; then echo "$t"; fi; done)
  # shellcheck disable=SC2086
  cmake --build "$ASAN_DIR" -j "$(garden_jobs)" --target $asan_targets
  ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:strict_string_checks=1" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    ctest --test-dir "$ASAN_DIR" -L "$ASAN_LABELS" -LE "gpu|long" --output-on-failure -j "$(garden_jobs)"
fi

if [ "${SKIP_FUZZ:-0}" != 1 ]; then
  FUZZ_DIR="$BUILD_DIR/fuzz"
  if [ ! -f "$FUZZ_DIR/build.ninja" ]; then
    cmake -G Ninja -S "$GARDEN_ROOT" -B "$FUZZ_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DGARDEN_FUZZ=ON -DGARDEN_CUDA=OFF
  fi
  cmake --build "$FUZZ_DIR" -j "$(garden_jobs)" --target fuzzers
  ctest --test-dir "$FUZZ_DIR" -L fuzz --output-on-failure -j 1
fi
