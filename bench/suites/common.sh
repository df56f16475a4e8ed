# Sourced by the suite scripts: flag parsing, the loadgen binary, the commit, and run_one.
# Every suite script takes the same flags:
#   --tulip HOST:PORT   tulip's gRPC endpoint (suites 1-3)
#   --ivy HOST:PORT     ivy's HTTP endpoint (suite 4, chat)
#   --out DIR           results directory (one JSON per workload; created)
#   --count N           measured requests per workload (overrides the suite's default)
#   --duration S        measured seconds per workload (throughput-style suites; 0 = use count)
#   --warmup N          warm-up requests per workload
#   --max-len N         skip workloads whose sequence length exceeds N (small CPU models)
#   --lengths "A B"     replace the suite's sequence lengths
#   --quick             CPU harness check: tiny counts (what the integration test and CI use)
#   --loadgen PATH      the loadgen binary (default $BUILD_DIR/bench/loadgen/loadgen)
# Exit status: 0 when every workload ran (request errors are recorded in the JSON, not fatal).
set -euo pipefail
SUITES_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
GARDEN_ROOT="$(cd "$SUITES_DIR/../.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$GARDEN_ROOT/build}"
TULIP="" IVY="" OUT="" COUNT="" DURATION="" WARMUP="" MAX_LEN=0 LENGTHS="" QUICK=0 LOADGEN=""
EXTRA=()

suite_usage() { sed -n '2,13p' "$SUITES_DIR/common.sh" | sed 's/^# \{0,1\}//'; }

parse_suite_flags() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --tulip) TULIP="$2"; shift 2 ;;
      --ivy) IVY="$2"; shift 2 ;;
      --out) OUT="$2"; shift 2 ;;
      --count) COUNT="$2"; shift 2 ;;
      --duration) DURATION="$2"; shift 2 ;;
      --warmup) WARMUP="$2"; shift 2 ;;
      --max-len) MAX_LEN="$2"; shift 2 ;;
      --lengths) LENGTHS="$2"; shift 2 ;;
      --quick) QUICK=1; shift ;;
      --loadgen) LOADGEN="$2"; shift 2 ;;
      --) shift; EXTRA+=("$@"); break ;;
      -h|--help) suite_usage; exit 0 ;;
      *) echo "$(basename "$0"): unknown argument $1" >&2; suite_usage >&2; exit 2 ;;
    esac
  done
  [ -n "$OUT" ] || { echo "$(basename "$0"): --out DIR is required" >&2; exit 2; }
  mkdir -p "$OUT"
  if [ -z "$LOADGEN" ]; then
    for c in "$BUILD_DIR/bench/loadgen/loadgen" "$GARDEN_ROOT/build/bench/loadgen/loadgen"; do
      [ -x "$c" ] && { LOADGEN="$c"; break; }
    done
  fi
  [ -n "$LOADGEN" ] && [ -x "$LOADGEN" ] || {
    echo "$(basename "$0"): loadgen not found; build it (ninja loadgen) or pass --loadgen" >&2; exit 2; }
  if [ -z "${GARDEN_COMMIT:-}" ]; then
    GARDEN_COMMIT="$(git -C "$GARDEN_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    if [ "$GARDEN_COMMIT" != unknown ] && [ -n "$(git -C "$GARDEN_ROOT" status --porcelain 2>/dev/null | head -1)" ]; then
      GARDEN_COMMIT="$GARDEN_COMMIT-dirty"
    fi
  fi
  export GARDEN_COMMIT
}

need() {  # need tulip|ivy
  case "$1" in
    tulip) [ -n "$TULIP" ] || { echo "$(basename "$0"): --tulip HOST:PORT is required" >&2; exit 2; } ;;
    ivy) [ -n "$IVY" ] || { echo "$(basename "$0"): --ivy HOST:PORT is required" >&2; exit 2; } ;;
  esac
}

# Measurement size for one workload: suite defaults, overridden by --count/--duration/--warmup,
# shrunk by --quick. Prints loadgen flags.
measure_flags() {  # measure_flags DEFAULT_COUNT DEFAULT_DURATION DEFAULT_WARMUP
  local count="$1" duration="$2" warmup="$3"
  if [ "$QUICK" = 1 ]; then count=8; duration=0; warmup=2; fi
  [ -n "$COUNT" ] && { count="$COUNT"; duration=0; }
  [ -n "$DURATION" ] && [ "$DURATION" != 0 ] && { duration="$DURATION"; count=0; }
  [ -n "$WARMUP" ] && warmup="$WARMUP"
  echo "--count $count --duration $duration --warmup $warmup"
}

# run_one SEQ_LEN LOADGEN-FLAGS...: runs one workload unless SEQ_LEN exceeds --max-len.
run_one() {
  local len="$1"; shift
  if [ "$MAX_LEN" -gt 0 ] && [ "$len" -gt "$MAX_LEN" ]; then
    echo "skip: sequence length $len > --max-len $MAX_LEN" >&2
    return 0
  fi
  "$LOADGEN" --seq-len "$len" "$@" "${EXTRA[@]}"
}
