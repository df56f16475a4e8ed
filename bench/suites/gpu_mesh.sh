# Sourced by the GPU-host scripts that run a mesh from a release bundle (gpu_client_api.sh,
# gpu_suite4.sh, gpu_embed_suites.sh).
#   bundle_build_dir BUNDLE DIR   lays the bundle's binaries out as scripts/mesh.sh expects a build
#                                 tree (DIR/services/{ivy,tulip,rose}/..., DIR/bench/loadgen/loadgen)
#   start_bundle_mesh DIR LOG MODEL DEVICE [mesh.sh args...]
#                                 starts scripts/mesh.sh on ivy :18080, tulip :15051, metrics :19091
#                                 in the background (pid in MESH) and waits up to 180 s for ivy's
#                                 /ready; returns 1 (mesh stopped, log tail printed) if it never is
bundle_build_dir() {
  local b=$1 d=$2
  mkdir -p "$d/services/ivy" "$d/services/tulip" "$d/services/rose" "$d/bench/loadgen"
  ln -sf "$b/bin/ivy" "$d/services/ivy/ivy"; ln -sf "$b/bin/tulip" "$d/services/tulip/tulip"
  ln -sf "$b/bin/rose" "$d/services/rose/rose"; ln -sf "$b/bin/loadgen" "$d/bench/loadgen/loadgen"
}

start_bundle_mesh() {
  local d=$1 log=$2 model=$3 device=$4 i
  shift 4
  BUILD_DIR="$d" "$(dirname "${BASH_SOURCE[0]}")/../../scripts/mesh.sh" --model "$model" \
    --device "$device" --port 18080 --tulip-port 15051 --metrics-port 19091 "$@" > "$log" 2>&1 &
  MESH=$!
  for i in $(seq 360); do
    curl -sf http://127.0.0.1:18080/ready > /dev/null 2>&1 && return 0
    kill -0 $MESH 2>/dev/null || break
    sleep 0.5
  done
  echo "mesh not ready; the end of its log:"; tail -20 "$log"
  kill -TERM $MESH 2>/dev/null; wait $MESH 2>/dev/null
  return 1
}
