#!/usr/bin/env bash
# The thread-safety check (scripts/test.sh runs it): clang's -Wthread-safety analysis, as errors,
# over every C++ source of services/ and common/, checking the GUARDED_BY / REQUIRES / EXCLUDES
# contracts of common/thread_annotations.h (tests and benches carry none). It needs no object
# code, so instead of a full clang build it configures a clang tree ($BUILD_DIR/tsa; only the
# protoc headers are generated) and runs each compile command of its compile_commands.json with
# -fsyntax-only, in parallel. CUDA sources (.cu) are left out: nvcc, not clang, compiles them.
set -euo pipefail
source "$(dirname "$0")/common.sh"

TSA_DIR="$BUILD_DIR/tsa"
# Configured every time (cheap when nothing changed) so that new sources are checked too.
cmake -G Ninja -S "$GARDEN_ROOT" -B "$TSA_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DGARDEN_WERROR=ON \
  -DGARDEN_CUDA=OFF > /dev/null
# The generated headers (*.pb.h) the sources include; nothing is compiled.
# shellcheck disable=SC2046
ninja -C "$TSA_DIR" $(ninja -C "$TSA_DIR" -t targets all | sed -n 's/^\(.*\.pb\.h\): .*/\1/p') \
  > /dev/null

# Each translation unit's compile command with -fsyntax-only instead of -o (the project's own
# -Wthread-safety and -Werror come with GARDEN_WARN_FLAGS), run in parallel from its directory.
python3 - "$TSA_DIR/compile_commands.json" "$GARDEN_ROOT" "$(garden_jobs)" <<'PY'
import concurrent.futures, json, shlex, subprocess, sys

entries, root, jobs = json.load(open(sys.argv[1])), sys.argv[2].rstrip("/") + "/", int(sys.argv[3])

def argv(e):
    out, it = [], iter(shlex.split(e["command"]))
    for a in it:
        if a == "-o":
            next(it, None)
        else:
            out.append(a)
    return out + ["-fsyntax-only"]

def check(e):
    p = subprocess.run(argv(e), cwd=e["directory"], capture_output=True, text=True)
    return e["file"], p.returncode, p.stderr

# The annotated code is services/ and common/ (tests and benches hold no annotations; the
# compile-time regression test of tests/thread_safety runs clang on its own). Generated sources
# (protoc) are not ours; .cu files are nvcc's.
ours = [e for e in entries if e["file"].endswith(".cc") and
        (e["file"].startswith(root + "services/") or e["file"].startswith(root + "common/"))]
failed = 0
with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
    for f, rc, err in pool.map(check, ours):
        if rc != 0:
            failed += 1
            sys.stdout.write(f"--- {f}\n{err}")
if failed:
    sys.exit(f"thread-safety check: FAILED in {failed} of {len(ours)} translation units")
print(f"thread-safety check: {len(ours)} translation units clean under clang "
      "-Wthread-safety -Werror")
PY
