#!/usr/bin/env bash
# rejects.sh CLANGXX SOURCE_DIR FILE FROM TO DIAGNOSTIC
# Checks that clang's thread-safety analysis rejects FILE (relative to SOURCE_DIR) with the one
# line FROM replaced by TO, reporting DIAGNOSTIC, and accepts FILE as it is. FROM must occur
# exactly once in FILE (so a refactoring that removes it fails this test instead of voiding it).
set -uo pipefail
clangxx="$1" src="$2" file="$3" from="$4" to="$5" diag="$6"
flags=(-std=c++20 -fsyntax-only -Wthread-safety -Werror -I"$src")

count=$(grep -cF -- "$from" "$src/$file")
if [ "$count" != 1 ]; then
  echo "FAIL: '$from' occurs $count times in $file (want exactly 1)"
  exit 1
fi
if ! out=$("$clangxx" "${flags[@]}" -x c++ "$src/$file" 2>&1); then
  echo "FAIL: $file as it is does not pass -Wthread-safety -Werror:"
  echo "$out"
  exit 1
fi
modified=$(python3 -c 'import sys; s=open(sys.argv[1]).read(); print(s.replace(sys.argv[2], sys.argv[3], 1), end="")' \
  "$src/$file" "$from" "$to")
if out=$(printf '%s' "$modified" | "$clangxx" "${flags[@]}" -x c++ - 2>&1); then
  echo "FAIL: $file with '$to' compiled; the analysis should have rejected it"
  exit 1
fi
if ! grep -qF -- "$diag" <<< "$out"; then
  echo "FAIL: $file with '$to' was rejected, but not with \"$diag\":"
  echo "$out"
  exit 1
fi
echo "ok: $file with '$to' is rejected:"
grep -F -- "$diag" <<< "$out"
