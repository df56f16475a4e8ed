#!/usr/bin/env bash
# bundle.sh: builds Garden's release bundle, a self-contained tree for GPU hosts without build tools
# (see docs/deploy.md):
#
#   garden-<version>-linux-x86_64/
#     bin/ivy bin/tulip bin/rose bin/rose-mkmodel   RPATH $ORIGIN/../lib (DT_RPATH, so it also
#                                                   covers the libraries' own dependencies)
#     lib/                                          every shared library the binaries need that is
#                                                   not glibc, libstdc++/libgcc or CUDA (gRPC,
#                                                   protobuf, abseil, re2, c-ares, OpenSSL, zlib,
#                                                   Boost, simdjson, sentencepiece, ...)
#     bin/libgarden_spm_shim.so                     ivy's dlopen'ed sentencepiece shim (ivy looks
#                                                   for it next to its executable)
#     bin/spm_train, libexec/spm_train              sentencepiece's trainer (Debian's), which
#                                                   rose-mkmodel runs to make the default model
#     run-mesh.sh                                   starts ivy + tulip + rose on one host
#     libexec/supervise.sh                          (run-mesh.sh's tier supervisor, scripts/supervise.sh)
#     systemd/                                      units + example env files for /opt/garden (deploy/systemd)
#     MANIFEST                                      version, build settings, sha256 of every file
#
# The host supplies glibc (>= the build machine's 2.36), libstdc++ (GCC >= 12), the NVIDIA driver
# and, for a CUDA build, cuBLAS/cuBLASLt (and NCCL when used): hundreds of MB that every GPU host
# already has, and that must match its driver.
#
# Usage: scripts/bundle.sh [options]
#   --out DIR        bundle folder to (re)create (default: dist/garden-<version>-linux-x86_64)
#   --build-dir DIR  build tree to take the binaries from (env BUILD_DIR). Default: configure and
#                    build build-bundle/ here with the right RPATH (no patchelf needed). A tree
#                    configured without it is fixed up with patchelf.
#   --cuda AUTO|ON|OFF  GARDEN_CUDA for the build this script configures (env GARDEN_CUDA; AUTO)
#   --jobs N         ninja -j (env JOBS; default 2)
#   --no-build       use the binaries already in the build tree as they are
#   --tar            also write <out>.tar.gz
#   --verify DIR     only check an existing bundle (see verify below) and exit
# verify: every binary resolves all its libraries (its whole dependency tree), with LD_LIBRARY_PATH unset
# (env -i), either from the bundle's lib/ or from the allowed host set (glibc, libstdc++, libgcc,
# CUDA); CUDA libraries may be absent on a machine without them.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out=""
build_dir="${BUILD_DIR:-}"
cuda="${GARDEN_CUDA:-AUTO}"
jobs="${JOBS:-2}"
do_build=1
do_tar=0
verify_only=""
while (($#)); do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    --cuda) cuda="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --tar) do_tar=1; shift ;;
    --verify) verify_only="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bundle.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

die() { echo "bundle.sh: $*" >&2; exit 1; }

BINARIES=(services/ivy/ivy services/tulip/tulip services/rose/rose services/rose/rose-mkmodel)
TARGETS=(ivy tulip rose rose-mkmodel)
# Shared objects a binary dlopen()s (ldd cannot see them): copied next to the binaries when the
# build has them, with their dependencies bundled like the binaries'.
MODULES=(services/ivy/libgarden_spm_shim.so)
RPATH='$ORIGIN/../lib'

# Libraries the host provides: the C library and loader, the C++ runtime, and the NVIDIA stack
# (driver, CUDA runtime and math libraries, NCCL, cuDNN). Everything else is bundled.
is_host_lib() {
  case "$1" in
    linux-vdso.so.*|ld-linux*.so.*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|\
    libutil.so.*|libresolv.so.*|libanl.so.*|libnsl.so.*|libmvec.so.*|libBrokenLocale.so.*|\
    libstdc++.so.*|libgcc_s.so.*|libatomic.so.*) return 0 ;;
    libcuda.so.*|libnvidia-*.so.*|libcudart.so.*|libcublas.so.*|libcublasLt.so.*|libnccl.so.*|\
    libcudnn*.so.*|libnvrtc*.so.*|libnvJitLink.so.*|libcufft*.so.*|libcurand.so.*|\
    libcusparse*.so.*|libcusolver*.so.*|libnvToolsExt.so.*|libcupti.so.*) return 0 ;;
  esac
  return 1
}
is_cuda_lib() {
  case "$1" in
    libcuda.so.*|libnvidia-*.so.*|libcudart.so.*|libcublas*.so.*|libnccl.so.*|libcudnn*.so.*|\
    libnvrtc*.so.*|libnvJitLink.so.*|libcufft*.so.*|libcurand.so.*|libcusparse*.so.*|\
    libcusolver*.so.*|libnvToolsExt.so.*|libcupti.so.*) return 0 ;;
  esac
  return 1
}

# `ldd` lines of FILE as "soname<TAB>path" ("not found" as the path), in a clean environment.
ldd_pairs() {
  env -i PATH=/usr/bin:/bin ${LDPATH:+LD_LIBRARY_PATH=$LDPATH} ldd "$1" 2>/dev/null | awk '
    /=>/ { name=$1; path=$3; if ($3 == "not") path="not found"; print name "\t" path; next }
    /^\t\/.*ld-linux/ { n=split($1, a, "/"); print a[n] "\t" $1 }'
}

# Checks bundle DIR; prints a summary, returns non-zero with the reasons on failure.
verify_bundle() {
  local dir bad=0 f name path nbundled
  dir="$(cd "$1" && pwd)"
  [ -d "$dir/bin" ] && [ -d "$dir/lib" ] || die "$dir is not a bundle (no bin/ or lib/)"
  # ldd on an executable lists its whole dependency tree as the loader resolves it when that
  # executable runs (the libraries' own dependencies found through the executable's DT_RPATH).
  for f in "$dir"/bin/* "$dir"/libexec/*; do
    [ -f "$f" ] || continue
    readelf -h "$f" >/dev/null 2>&1 || continue
    if [[ "$f" == "$dir/bin/"* ]]; then
      readelf -d "$f" | grep -q "(RPATH).*\[\$ORIGIN/../lib\]\$" ||
        { echo "  $f: DT_RPATH is not exactly \$ORIGIN/../lib"; bad=1; }
    fi
    while IFS=$'\t' read -r name path; do
      if is_host_lib "$name"; then
        if [ "$path" = "not found" ] && ! is_cuda_lib "$name"; then
          echo "  $f: host library $name not found"; bad=1
        fi
        continue
      fi
      if [ "$path" = "not found" ]; then
        echo "  $f: $name not found"; bad=1
      elif [[ "$(readlink -f "$path")" != "$dir/lib/"* ]]; then
        echo "  $f: $name resolves outside the bundle: $path"; bad=1
      fi
    done < <(if [[ "$f" == "$dir/libexec/"* ]]; then LDPATH="$dir/lib" ldd_pairs "$f"; else ldd_pairs "$f"; fi)
  done
  nbundled=$(find "$dir/lib" -maxdepth 1 -type f | wc -l)
  if ((bad)); then
    echo "verify: FAILED ($dir)"; return 1
  fi
  echo "verify: ok: $(ls "$dir/bin" | wc -l) programs, $nbundled bundled libraries," \
       "$(du -sh "$dir" | cut -f1) ($dir)"
}

if [ -n "$verify_only" ]; then
  verify_bundle "$verify_only"
  exit
fi

version="$(git -C "$repo" describe --always --dirty 2>/dev/null || echo unknown)"
[ -n "$out" ] || out="$repo/dist/garden-$version-linux-$(uname -m)"

# --- build -----------------------------------------------------------------------------------
own_build=0
if [ -z "$build_dir" ]; then
  build_dir="$repo/build-bundle"
  own_build=1
fi
if ((do_build)); then
  if ((own_build)) && [ ! -f "$build_dir/CMakeCache.txt" ]; then
    cmake -G Ninja -S "$repo" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DGARDEN_CUDA="$cuda" \
      -DCMAKE_BUILD_RPATH="$RPATH" -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags \
      -DCMAKE_MODULE_LINKER_FLAGS=-Wl,--disable-new-dtags
  fi
  [ -f "$build_dir/CMakeCache.txt" ] || die "$build_dir is not a configured build tree"
  ninja -C "$build_dir" -j"$jobs" "${TARGETS[@]}"
fi
modules=()
for m in "${MODULES[@]}"; do
  [ -f "$build_dir/$m" ] && modules+=("$m")
done
for b in "${BINARIES[@]}"; do
  [ -x "$build_dir/$b" ] || die "$build_dir/$b missing (build targets: ${TARGETS[*]})"
done
cuda_built=OFF
for b in "${BINARIES[@]}"; do
  if ldd_pairs "$build_dir/$b" | cut -f1 | grep -Eq '^lib(cuda|cudart|cublas|cublasLt)\.so'; then cuda_built=ON; fi
done

# --- assemble --------------------------------------------------------------------------------
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for b in "${BINARIES[@]}" "${modules[@]}"; do
  cp "$build_dir/$b" "$out/bin/"
done
# A binary that names a module it dlopen()s needs it in the bundle.
for m in "${MODULES[@]}"; do
  for b in "$out"/bin/*; do
    if grep -qF "$(basename "$m")" "$b" && [ ! -f "$out/bin/$(basename "$m")" ]; then
      die "$(basename "$b") loads $(basename "$m"), which $build_dir lacks (build its target)"
    fi
  done
done
# spm_train is Debian's binary (no RPATH of ours): it runs through a wrapper that points the loader
# at lib/.
spm="$(command -v spm_train || true)"
[ -n "$spm" ] || die "spm_train not found (Debian package sentencepiece): rose-mkmodel needs it"
mkdir -p "$out/libexec"
cp "$spm" "$out/libexec/spm_train"
cat > "$out/bin/spm_train" <<'SPM'
#!/bin/sh
# sentencepiece's trainer from the bundle (for rose-mkmodel); its libraries are in ../lib.
root="$(cd "$(dirname "$0")/.." && pwd)"
LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$root/libexec/spm_train" "$@"
SPM
chmod +x "$out/bin/spm_train"
declare -A copied=()
for f in "$out"/bin/* "$out"/libexec/*; do
  readelf -h "$f" >/dev/null 2>&1 || continue
  while IFS=$'\t' read -r name path; do
    is_host_lib "$name" && continue
    [ "$path" != "not found" ] || die "$f needs $name, which this machine cannot resolve"
    [ -n "${copied[$name]:-}" ] && continue
    cp -L "$path" "$out/lib/$name"
    chmod 0644 "$out/lib/$name"
    copied[$name]="$path"
  done < <(ldd_pairs "$f")
done
if command -v strip >/dev/null; then
  for f in "$out"/bin/* "$out"/lib/*; do
    readelf -h "$f" >/dev/null 2>&1 && strip --strip-debug "$f"
  done
fi

# RPATH: DT_RPATH (not DT_RUNPATH) so that it also applies to the bundled libraries' own
# dependencies (DT_RUNPATH applies only to an object's direct ones). Exactly $ORIGIN/../lib: a
# build tree's own folders must not leak into the bundle.
for f in "$out"/bin/*; do
  readelf -h "$f" >/dev/null 2>&1 || continue
  if ! readelf -d "$f" | grep -q "(RPATH).*\[\$ORIGIN/../lib\]\$" ||
     readelf -d "$f" | grep -q "(RUNPATH)"; then
    command -v patchelf >/dev/null ||
      die "$f: RPATH is not exactly $RPATH and patchelf is not installed (apt-get install patchelf, or let bundle.sh build its own tree)"
    patchelf --remove-rpath "$f"
    patchelf --force-rpath --set-rpath "$RPATH" "$f"
  fi
done
# A bundled library with a RUNPATH (one built in a build tree) would not see the executable's
# RPATH for its own dependencies: point it at lib/ itself.
for f in "$out"/lib/*; do
  if readelf -d "$f" 2>/dev/null | grep -qE "\((RPATH|RUNPATH)\)"; then
    command -v patchelf >/dev/null || die "$f has an RPATH/RUNPATH and patchelf is not installed"
    patchelf --remove-rpath "$f"
    patchelf --force-rpath --set-rpath '$ORIGIN' "$f"
  fi
done

# --- run script ------------------------------------------------------------------------------
cp "$repo/scripts/supervise.sh" "$out/libexec/supervise.sh"
mkdir -p "$out/systemd"
cp "$repo"/deploy/systemd/* "$out/systemd/"
cat > "$out/run-mesh.sh" <<'RUN'
#!/usr/bin/env bash
# run-mesh.sh: starts Garden from this bundle on one host: tulip (gRPC scheduler) spawning rose
# (model worker) — or, with --sidecar, rose and tulip as two processes the way a Kubernetes worker
# pod runs them — and ivy (HTTP gateway) in front. Stops everything on Ctrl-C / SIGTERM.
#
#   ./run-mesh.sh --model DIR [--tokenizer FILE] [--device cuda|cpu] [--port 8080]
#                 [--host 127.0.0.1] [--tulip-port 50051] [--metrics-port 9091] [--shm-name NAME]
#                 [--sidecar] [--served-model-name NAME] [--rose-threads N] [--no-tokenizer]
#                 [--logs DIR] [--ready-timeout SECONDS]
#
# DIR is a Hugging Face model folder (config.json, *.safetensors, tokenizer.json); the tokenizer
# is ivy's default for DIR unless --tokenizer names one (--no-tokenizer: ivy accepts token-id
# inputs only). Everything binds 127.0.0.1; --host 0.0.0.0 serves ivy's HTTP API to other
# machines (tulip and the metrics stay on 127.0.0.1). Prints "garden: ready on http://HOST:PORT"
# once ivy's /ready answers 200, then runs until Ctrl-C / SIGTERM. A process that dies is started
# again after a backoff (libexec/supervise.sh; tulip restarts a rose it spawned itself), and the
# others keep running; the script exits non-zero only when a process cannot start at all (exit
# status 2: a flag error).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$root/libexec/supervise.sh"
model="" tokenizer="" device="cuda" port=8080 host=127.0.0.1 tport=50051 mport=9091 shm="garden-$$"
sidecar=0 logs="" ready_timeout=300 name="" rose_threads=0 no_tok=0
while (($#)); do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --tokenizer) tokenizer="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --host) host="$2"; shift 2 ;;
    --tulip-port) tport="$2"; shift 2 ;;
    --metrics-port) mport="$2"; shift 2 ;;
    --shm-name) shm="$2"; shift 2 ;;
    --sidecar) sidecar=1; shift ;;
    --served-model-name) name="$2"; shift 2 ;;
    --rose-threads) rose_threads="$2"; shift 2 ;;
    --no-tokenizer) no_tok=1; shift ;;
    --logs) logs="$2"; shift 2 ;;
    --ready-timeout) ready_timeout="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run-mesh.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -n "$model" ] || { echo "run-mesh.sh: --model DIR is required" >&2; exit 2; }
[ -f "$model/config.json" ] || { echo "run-mesh.sh: $model/config.json not found" >&2; exit 2; }
model="$(cd "$model" && pwd)"
[ -z "$tokenizer" ] || [ -f "$tokenizer" ] || { echo "run-mesh.sh: $tokenizer not found" >&2; exit 2; }
[ -n "$logs" ] || logs="$(mktemp -d)"
mkdir -p "$logs"
# The host's CUDA libraries, when the loader does not know them already.
if [ "$device" = cuda ] && ! /sbin/ldconfig -p 2>/dev/null | grep -q 'libcublasLt\.so\.'; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d" && break
  done
fi
pids=()
cleanup() {
  trap - EXIT INT TERM
  for ((i=${#pids[@]}-1; i>=0; i--)); do kill -TERM "${pids[i]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# Each process under a supervisor (libexec/supervise.sh): restarted when it dies, its log appended.
if ((sidecar)); then
  supervise rose "$logs/rose.log" "$root/bin/rose" --model "$model" --device "$device" \
    --shm-name "$shm" --create-shm --depth 4 --max-batch-tokens 8192 &
  pids+=($!)
  supervise tulip "$logs/tulip.log" "$root/bin/tulip" --host 127.0.0.1 --port "$tport" \
    --metrics-port "$mport" --model "$model" --device "$device" --shm-name "$shm" --attach \
    --depth 4 --max-batch-tokens 8192 ${name:+--served-model-name "$name"} &
  pids+=($!)
else
  supervise tulip "$logs/tulip.log" "$root/bin/tulip" --host 127.0.0.1 --port "$tport" \
    --metrics-port "$mport" --model "$model" --device "$device" --shm-name "$shm" \
    --rose-bin "$root/bin/rose" --rose-threads "$rose_threads" ${name:+--served-model-name "$name"} &
  pids+=($!)
fi
tok_args=(--model-dir "$model" ${tokenizer:+--tokenizer "$tokenizer"})
((no_tok)) && tok_args=()
supervise ivy "$logs/ivy.log" "$root/bin/ivy" --host "$host" --port "$port" \
  --tulip "127.0.0.1:$tport" "${tok_args[@]}" &
pids+=($!)
echo "garden: logs in $logs"
# GET http://127.0.0.1:$1$2 answered 200? (bash's /dev/tcp: the host needs no curl)
http_ok() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1" && printf 'GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n' "$2" >&3 &&
    IFS= read -r -t 5 line <&3 && [[ "$line" == *" 200 "* ]]) 2>/dev/null
}
deadline=$((SECONDS + ready_timeout))
until http_ok "$port" /ready; do
  for p in "${pids[@]}"; do
    if ! kill -0 "$p" 2>/dev/null; then
      echo "garden: a process could not start; last log lines:" >&2
      tail -n 20 "$logs"/*.log >&2
      exit 1
    fi
  done
  if ((SECONDS > deadline)); then
    echo "garden: not ready after ${ready_timeout}s; last log lines:" >&2
    tail -n 20 "$logs"/*.log >&2
    exit 1
  fi
  sleep 0.2
done
echo "garden: ready on http://$host:$port (tulip 127.0.0.1:$tport, metrics 127.0.0.1:$mport)"
# Runs until a signal arrives; a supervisor ends on its own only when its process cannot start.
rc=0
wait -n "${pids[@]}" || rc=$?
echo "garden: a process could not be started (status $rc); last log lines:" >&2
tail -n 20 "$logs"/*.log >&2
exit 1
RUN
chmod +x "$out/run-mesh.sh"

# --- manifest --------------------------------------------------------------------------------
{
  echo "garden $version"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(ldd --version | head -1 | awk '{print $NF}')"
  echo "cuda_backend $cuda_built"
  echo "build_dir $build_dir"
  echo "host_libraries glibc libstdc++ libgcc_s$( [ "$cuda_built" = ON ] && echo ' libcuda cuBLAS cuBLASLt')"
  echo
  (cd "$out" && find . -type f ! -name MANIFEST | sort | xargs sha256sum)
} > "$out/MANIFEST"

verify_bundle "$out"
if ((do_tar)); then
  tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"
  echo "wrote $out.tar.gz ($(du -h "$out.tar.gz" | cut -f1))"
fi
echo "bundle: $out"
