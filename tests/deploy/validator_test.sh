#!/usr/bin/env bash
# Proves the offline validator can fail: every manifest under invalid/ carries one known mistake
# and an "# expect: REGEX" line; validate.mjs must exit 1 and print a line matching REGEX.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
validate="$here/../../deploy/tools/validate.mjs"
pass=0 fail=0
for f in "$here"/invalid/*.yaml; do
  expect="$(sed -n 's/^# expect: //p' "$f" | head -1)"
  out="$(node "$validate" "$f" 2>&1)"; rc=$?
  if [ -z "$expect" ]; then
    echo "FAIL $(basename "$f"): no '# expect:' line"; fail=$((fail + 1))
  elif [ "$rc" -ne 1 ]; then
    echo "FAIL $(basename "$f"): validate.mjs exited $rc, expected 1"; echo "$out"; fail=$((fail + 1))
  elif ! grep -Eq -- "$expect" <<<"$out"; then
    echo "FAIL $(basename "$f"): no error matching /$expect/"; echo "$out"; fail=$((fail + 1))
  else
    echo "ok   $(basename "$f"): $(grep -E -- "$expect" <<<"$out" | head -1 | sed 's/^[^:]*: //')"; pass=$((pass + 1))
  fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
