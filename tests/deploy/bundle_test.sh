#!/usr/bin/env bash
# bundle_test.sh BUILD_DIR [ids|text]: the release bundle works on its own.
#  1. scripts/bundle.sh packs BUILD_DIR's binaries (bundle.sh's own verify: ldd, LD_LIBRARY_PATH
#     unset, resolves everything from lib/ except glibc/libstdc++/CUDA);
#  2. at run time (LD_DEBUG=libs, env -i) every library the binaries load comes from lib/ or the
#     allowed host set;
#  3. in a private mount namespace where every system copy of a bundled library is hidden (bound
#     over with /dev/null) and so is the build tree, from the bundle alone: rose-mkmodel makes the default tiny model,
#     run-mesh.sh starts ivy + tulip + rose on the CPU, POST /v1/embeddings returns one finite,
#     unit-norm vector of the model's hidden size per input, and tulip's /metrics exports the
#     metric the worker HPA scales on; then the same with --sidecar (rose creates the channel,
#     tulip attaches: the Kubernetes pod's arrangement);
#  4. a crashed process does not take the mesh down: tulip (spawn mode: its rose dies with it and
#     the next tulip removes the stale segment) or rose (sidecar mode), then ivy, are killed with
#     SIGKILL; run-mesh.sh restarts each, the others keep their pids, and the mesh serves again.
# Inputs: "ids" (default) sends token ids (ivy runs without a tokenizer); "text" sends text, which
# ivy tokenizes with the model's tokenizer.model (one mesh, spawn mode).
set -euo pipefail
build="$(cd "$1" && pwd)"
inputs="${2:-ids}"
case "$inputs" in ids|text) ;; *) echo "bundle_test.sh: inputs must be ids or text" >&2; exit 2 ;; esac
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work="$(mktemp -d /tmp/garden-bundle-test.XXXXXX)"
trap 'rm -rf "$work"' EXIT
pass=0 fail=0
ok() { echo "ok   $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }

# 1. pack + static verify
if "$repo/scripts/bundle.sh" --build-dir "$build" --no-build --out "$work/bundle" > "$work/bundle.log" 2>&1; then
  ok "bundle.sh: $(grep '^verify:' "$work/bundle.log")"
else
  cat "$work/bundle.log"; bad "bundle.sh failed"; echo "$pass passed, $fail failed"; exit 1
fi
B="$work/bundle"

# 2. runtime loader check
host_lib='^(linux-vdso|ld-linux[^/]*|libc|libm|libpthread|libdl|librt|libutil|libresolv|libanl|libmvec|libstdc\+\+|libgcc_s|libatomic|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-.*)\.so'
for b in ivy tulip rose rose-mkmodel; do
  loaded="$(env -i LD_DEBUG=libs "$B/bin/$b" --help 2>&1 >/dev/null | sed -n 's/.*calling init: //p' | sort -u)"
  loaded="$(while read -r p; do [ -n "$p" ] && readlink -f "$p"; done <<<"$loaded")"
  outside="$(while read -r p; do [ -n "$p" ] || continue; n="$(basename "$p")";
    [[ "$p" == "$B/lib/"* ]] || [[ "$n" =~ $host_lib ]] || echo "$p"; done <<<"$loaded")"
  n_b="$(grep -c "^$B/lib/" <<<"$loaded" || true)"
  if [ -n "$outside" ]; then bad "$b loads libraries from outside the bundle: $outside"
  elif [ "$n_b" -lt 1 ]; then bad "$b loaded nothing from the bundle's lib/ (LD_DEBUG gave: $loaded)"
  else ok "$b --help runs with LD_LIBRARY_PATH unset, $n_b libraries from lib/, the rest from the host (glibc, libstdc++, CUDA)"; fi
done

# 3. the mesh from the bundle, system copies of the bundled libraries hidden
hidden=()
for l in "$B"/lib/*; do
  for d in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /usr/local/lib; do
    [ -e "$d/$(basename "$l")" ] && hidden+=("$(readlink -f "$d/$(basename "$l")")")
  done
done
mapfile -t hidden < <(printf '%s\n' "${hidden[@]}" | sort -u)
if unshare -m --propagation private true 2>/dev/null; then
  isolate=(unshare -m --propagation private)
  ok "hiding ${#hidden[@]} system copies of bundled libraries and the build tree in a private mount namespace"
else
  isolate=()
  bad "cannot create a mount namespace (needs root): the mesh would run with system libraries visible"
fi
cat > "$work/inner.sh" <<'INNER'
#!/usr/bin/env bash
# Runs inside the namespace: hides the libraries, then checks the mesh in both arrangements.
set -uo pipefail
B="$1" work="$2" repo="$3" inputs="$4" build="$5"; shift 5
cd "$work"  # ctest runs us inside the build tree, which is about to be hidden
# Tools of the test itself (mount, curl, python3) may need a hidden library: they get the
# bundle's identical copy through LD_LIBRARY_PATH. Garden's processes run under env -i.
T=(env LD_LIBRARY_PATH="$B/lib")
for f in "$@"; do "${T[@]}" mount --bind /dev/null "$f" || { echo "FAIL cannot hide $f"; exit 1; }; done
# The build tree too: binaries know their build folders (ivy's shim fallback path, RPATHs).
"${T[@]}" mount -t tmpfs none "$build" || { echo "FAIL cannot hide $build"; exit 1; }
[ $# -eq 0 ] || ! cat "$1" | head -c1 | grep -q . || { echo "FAIL $1 still readable"; exit 1; }
pass=0 fail=0
ok() { echo "ok   $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
export -n LD_LIBRARY_PATH
E=(env -i PATH="$B/bin:/usr/bin:/bin" HOME="$work")
if "${E[@]}" "$B/bin/rose-mkmodel" --out "$work/model" --repo "$repo" > "$work/mkmodel.log" 2>&1 &&
   [ -f "$work/model/config.json" ]; then
  ok "rose-mkmodel (with the bundle's spm_train) made $(ls "$work/model" | tr '\n' ' ')"
else
  cat "$work/mkmodel.log"; bad "rose-mkmodel failed"; echo "$pass passed, $fail failed"; exit 1
fi
hidden_size="$("${T[@]}" python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["hidden_size"])' "$work/model/config.json")"
# Ports below the ephemeral range (an outgoing connection cannot take one between the check and
# the server's bind); python3 runs with the bundle's libraries, the system's being hidden here.
# shellcheck source=../integration/support/free_port.sh
FREE_PORT_DIR="$work" source "$repo/tests/integration/support/free_port.sh"
FREE_PORT_PREFIX="env LD_LIBRARY_PATH=$B/lib"
modes=(spawn sidecar); [ "$inputs" = text ] && modes=(spawn)
for mode in "${modes[@]}"; do
  port="$(free_port)"
  tport="$(free_port)"
  mport="$(free_port)"
  extra=(); [ "$mode" = sidecar ] && extra+=(--sidecar); [ "$inputs" = ids ] && extra+=(--no-tokenizer)
  "${E[@]}" "$B/run-mesh.sh" --model "$work/model" --device cpu --port "$port" --tulip-port "$tport" \
    --metrics-port "$mport" --shm-name "/garden-bt-$$-$mode" --served-model-name tiny \
    --logs "$work/logs-$mode" --ready-timeout 120 "${extra[@]}" > "$work/mesh-$mode.log" 2>&1 &
  mesh=$!
  for _ in $(seq 1 600); do
    grep -q "garden: ready" "$work/mesh-$mode.log" && break
    kill -0 "$mesh" 2>/dev/null || break
    sleep 0.2
  done
  if ! grep -q "garden: ready" "$work/mesh-$mode.log"; then
    cat "$work/mesh-$mode.log"; bad "$mode: mesh not ready"; kill "$mesh" 2>/dev/null; wait "$mesh"; continue
  fi
  body='{"model":"tiny","input":[[5,17,300,42],[1,2,3,4,5,6,7,8,9]]}'
  [ "$inputs" = text ] && body='{"model":"tiny","input":["hello from the bundle","a second, longer input to embed"]}'
  resp="$("${T[@]}" curl -sS -m 30 -H 'content-type: application/json' -d "$body" "http://127.0.0.1:$port/v1/embeddings")"
  if "${T[@]}" python3 - "$resp" "$hidden_size" <<'PY'
import json, math, sys
r = json.loads(sys.argv[1]); dim = int(sys.argv[2])
d = r["data"]
assert len(d) == 2, f"{len(d)} embeddings for 2 inputs"
for i, e in enumerate(d):
    v = e["embedding"]
    assert e["index"] == i, e["index"]
    assert len(v) == dim, f"dimension {len(v)} != hidden_size {dim}"
    assert all(math.isfinite(x) for x in v), "non-finite value"
    n = math.sqrt(sum(x * x for x in v))
    assert abs(n - 1) < 1e-3, f"norm {n}"
assert d[0]["embedding"] != d[1]["embedding"], "two inputs, one vector"
assert r["usage"]["prompt_tokens"] > 0
print(f"2 x {dim}-dim unit vectors, {r['usage']['prompt_tokens']} prompt tokens")
PY
  then ok "$mode: POST /v1/embeddings through ivy -> tulip -> rose from the bundle: $("${T[@]}" python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(len(r["data"]), "embeddings, first values", [round(x,4) for x in r["data"][0]["embedding"][:3]])' "$resp")"
  else bad "$mode: bad /v1/embeddings answer: ${resp:0:400}"; tail -n 5 "$work/logs-$mode"/*.log; fi
  metrics="$("${T[@]}" curl -sS -m 10 "http://127.0.0.1:$mport/metrics" || true)"
  hpa_metric="$(sed -n 's/^ *name: \(tulip_[a-z_]*\)$/\1/p' "$repo/deploy/k8s/components/queue-autoscaling/worker-hpa.yaml")"
  if [ -n "$hpa_metric" ] && grep -q "^$hpa_metric " <<<"$metrics"; then
    ok "$mode: tulip /metrics exports $hpa_metric (the worker HPA's metric): $(grep "^$hpa_metric " <<<"$metrics")"
  else bad "$mode: tulip /metrics lacks the HPA metric '$hpa_metric'"; fi
  # 4. crash one process at a time: it comes back, the others stay, the mesh serves again.
  pid_of() { pgrep -f "^$B/bin/$1 .*$2" | head -1; }
  serves() {
    for _ in $(seq 1 300); do
      code="$("${T[@]}" curl -s -o /dev/null -w '%{http_code}' -m 10 -H 'content-type: application/json' \
        -d "$body" "http://127.0.0.1:$port/v1/embeddings" || true)"
      [ "$code" = 200 ] && return 0
      sleep 0.2
    done
    return 1
  }
  victim=tulip; [ "$mode" = sidecar ] && victim=rose
  pat() { if [ "$1" = ivy ]; then echo "--port $port "; else echo "--shm-name /garden-bt-$$-$mode"; fi; }
  for who in "$victim" ivy; do
    before="$(pid_of "$who" "$(pat "$who")")"
    if [ -z "$before" ]; then bad "$mode: no $who process to kill"; continue; fi
    # Who must keep running: everyone else, but a rose that tulip spawned dies with it.
    keep=()
    for o in ivy tulip rose; do
      [ "$o" = "$who" ] && continue
      [ "$who" = tulip ] && [ "$o" = rose ] && continue
      p="$(pid_of "$o" "$(pat "$o")")"
      [ -n "$p" ] && keep+=("$o:$p")
    done
    kill -KILL "$before"
    after=""
    serves && after="$(pid_of "$who" "$(pat "$who")")"
    if [ -z "$after" ] || [ "$after" = "$before" ]; then
      bad "$mode: the mesh did not recover after $who was killed: $(tail -n 5 "$work/mesh-$mode.log"; tail -n 5 "$work/logs-$mode"/*.log)"
      continue
    fi
    kept=1
    for k in "${keep[@]}"; do [ "$(pid_of "${k%%:*}" "$(pat "${k%%:*}")")" = "${k#*:}" ] || kept=0; done
    if ((kept)) && grep -q "garden: $who exited killed by signal 9" "$work/mesh-$mode.log"; then
      ok "$mode: $who killed with SIGKILL (pid $before) was restarted (pid $after), ${keep[*]} kept running, and the mesh serves again"
    else
      bad "$mode: after killing $who: kept ${keep[*]}? now $(pgrep -fa "$B/bin/" | cut -c1-60 | tr '\n' ';'); log: $(tail -n 3 "$work/mesh-$mode.log")"
    fi
  done
  kill -TERM "$mesh"; wait "$mesh" 2>/dev/null
  if pgrep -f "$B/bin/" >/dev/null; then bad "$mode: processes left after run-mesh.sh stopped"; else ok "$mode: run-mesh.sh stopped every process on SIGTERM"; fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
INNER
set +e
inner_out="$("${isolate[@]}" bash "$work/inner.sh" "$B" "$work" "$repo" "$inputs" "$build" "${hidden[@]}" 2>&1)"
set -e
echo "$inner_out" | grep -v ' passed, .* failed$'
ip="$(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' <<<"$inner_out" | tail -1)"
if [ -n "$ip" ]; then pass=$((pass + ${ip% *})); fail=$((fail + ${ip#* })); else fail=$((fail + 1)); fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
