#!/usr/bin/env bash
# mesh_script_test.sh BUILD_DIR: scripts/mesh.sh restarts a crashed tier and keeps the others.
#  1. mesh.sh serves the tiny rose-mkmodel model (token-id inputs) on free ports;
#  2. tulip killed with SIGKILL: restarted (a new pid; its rose with it, the stale shm segment
#     removed), ivy keeps its pid, the mesh serves again;
#  3. ivy killed with SIGKILL: restarted, tulip and rose keep their pids, the mesh serves again;
#  4. a tier that cannot start (a bad flag: exit status 2) is not restarted: mesh.sh exits 1;
#  5. SIGTERM to mesh.sh stops every process.
# Waits are bounded polls on observable state (the HTTP answer, the process list), never sleeps.
set -uo pipefail
build="$(cd "$1" && pwd)"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
work="$(mktemp -d /tmp/garden-mesh-script.XXXXXX)"
mesh=0
cleanup() { [ "$mesh" -gt 0 ] && kill -TERM "$mesh" 2>/dev/null && wait "$mesh" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
pass=0 fail=0
ok() { echo "ok   [${SECONDS}s] $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
# shellcheck source=../support/free_port.sh
FREE_PORT_DIR="$work" source "$repo/tests/integration/support/free_port.sh"

"$build/services/rose/rose-mkmodel" --out "$work/model" --repo "$repo/docs" --vocab-size 500 \
  > "$work/mkmodel.log" 2>&1 ||
  { cat "$work/mkmodel.log"; echo "FAIL rose-mkmodel"; exit 1; }
port="$(free_port)" tport="$(free_port)" mport="$(free_port)"
BUILD_DIR="$build" "$repo/scripts/mesh.sh" --model "$work/model" --port "$port" --tulip-port "$tport" \
  --metrics-port "$mport" --name tiny --rose-threads 1 > "$work/mesh.log" 2>&1 &
mesh=$!
body='{"model":"tiny","input":[[5,17,300,42],[1,2,3]]}'
serves() {  # up to 120 s for a 200 from /v1/embeddings
  for _ in $(seq 1 600); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' -m 10 -H 'content-type: application/json' -d "$body" \
      "http://127.0.0.1:$port/v1/embeddings")" = 200 ] && return 0
    kill -0 "$mesh" 2>/dev/null || return 1
    sleep 0.2
  done
  return 1
}
pid_of() {
  case "$1" in
    ivy) pgrep -f "^$build/services/ivy/ivy .*--port $port " | head -1 ;;
    tulip) pgrep -f "^$build/services/tulip/tulip .*--port $tport " | head -1 ;;
    rose) pgrep -f "^$build/services/rose/rose --shm-name /garden-mesh-$tport " | head -1 ;;
  esac
}
if serves; then ok "mesh.sh serves /v1/embeddings"; else
  cat "$work/mesh.log"; echo "FAIL mesh.sh never served"; exit 1; fi

for who in tulip ivy; do
  before="$(pid_of "$who")"
  keep=()
  for o in ivy tulip rose; do
    [ "$o" = "$who" ] && continue
    [ "$who" = tulip ] && [ "$o" = rose ] && continue  # tulip's rose dies and comes back with it
    keep+=("$o:$(pid_of "$o")")
  done
  [ -n "$before" ] || { bad "no $who process"; continue; }
  kill -KILL "$before"
  if ! serves; then bad "the mesh did not recover after $who was killed: $(tail -n 8 "$work/mesh.log")"; continue; fi
  after="$(pid_of "$who")"
  kept=1
  for k in "${keep[@]}"; do [ -n "${k#*:}" ] && [ "$(pid_of "${k%%:*}")" = "${k#*:}" ] || kept=0; done
  if [ -n "$after" ] && [ "$after" != "$before" ] && ((kept)) &&
     grep -q "garden: $who exited killed by signal 9" "$work/mesh.log"; then
    ok "$who killed with SIGKILL (pid $before) was restarted (pid $after); ${keep[*]} kept running; the mesh serves again"
  else
    bad "after killing $who (pid $before): now $after, kept ${keep[*]}? $(pgrep -fa "$build/services/" | cut -c1-80 | tr '\n' ';') log: $(tail -n 4 "$work/mesh.log")"
  fi
done
if grep -q "removed a stale shared-memory segment" "$work/mesh.log"; then
  ok "the restarted tulip removed the segment the killed one left"
else bad "no 'removed a stale shared-memory segment' line in the mesh's output"; fi

kill -TERM "$mesh"
wait "$mesh" 2>/dev/null
mesh=0
left="$(pgrep -fa "$build/services/.*(--port $port |--port $tport |/garden-mesh-$tport )" || true)"
if [ -z "$left" ]; then ok "SIGTERM to mesh.sh stopped every process"; else bad "left running: $left"; fi

# A tier that cannot start is not restarted in a loop: the mesh stops with status 1.
BUILD_DIR="$build" timeout 60 "$repo/scripts/mesh.sh" --model "$work/model" --port "$(free_port)" \
  --tulip-port "$(free_port)" --metrics-port "$(free_port)" --ivy-arg --no-such-flag \
  > "$work/bad.log" 2>&1
rc=$?
if [ "$rc" -eq 1 ] && grep -q "garden: ivy exited with status 2 right after starting" "$work/bad.log"; then
  ok "a tier with a bad flag is not restarted: mesh.sh stopped with status 1"
else bad "bad flag: mesh.sh status $rc: $(tail -n 5 "$work/bad.log")"; fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
