# Sourced by scripts/mesh.sh and by the release bundle's run-mesh.sh (bundle.sh copies it to
# libexec/): keeps one tier of a one-host mesh running.
#
#   supervise NAME LOG CMD [ARG...] &
#
# Runs CMD (its output appended to LOG, or inherited when LOG is empty). When CMD exits without
# being asked to — a crash, an OOM kill, a `kill -9` — it says so on stderr and starts CMD again
# after a backoff (1 s, doubling up to 30 s; back to 1 s once a run lasted a minute), so one tier's
# crash neither takes the other tiers down nor leaves its own down. The exceptions end the
# supervision with CMD's status: exit status 2 within 10 s of a start (the binaries' "bad flag"
# status: restarting cannot help). SIGTERM or SIGINT to the supervisor stops CMD with SIGTERM,
# waits for it, and ends the supervision with status 0. rose needs no supervisor of its own when
# tulip spawns it: tulip restarts it.
supervise() {
  local name="$1" log="$2"
  shift 2
  local child=0 delay=1 rc started
  trap 'if [ "$child" -gt 0 ]; then kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; fi; exit 0' TERM INT
  while :; do
    started=$SECONDS
    if [ -n "$log" ]; then "$@" >>"$log" 2>&1 & else "$@" & fi
    child=$!
    rc=0
    wait "$child" || rc=$?
    child=0
    if [ "$rc" -eq 2 ] && [ $((SECONDS - started)) -lt 10 ]; then
      echo "garden: $name exited with status 2 right after starting (a flag error?); not restarting it" >&2
      exit 2
    fi
    [ $((SECONDS - started)) -ge 60 ] && delay=1
    local how="with status $rc"
    [ "$rc" -gt 128 ] && how="killed by signal $((rc - 128)) ($(kill -l $((rc - 128)) 2>/dev/null || echo '?'))"
    echo "garden: $name exited $how; restarting it in ${delay}s" >&2
    sleep "$delay" &
    child=$!
    wait "$child" || true
    child=0
    delay=$((delay * 2 > 30 ? 30 : delay * 2))
  done
}
