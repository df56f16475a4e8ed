#!/usr/bin/env bash
# Runs the embedding suites (1-4) against a running mesh, then renders the report:
#   bench/suites/run_all.sh --tulip HOST:PORT --ivy HOST:PORT --out DIR [--peer DIR] [--chat]
#                           [common flags, see common.sh]
# DIR gets one JSON per workload and report.md + *.svg (bench/render/render.py). --peer DIR adds
# the Hugging Face baseline's results (bench/peer/hf_embed_baseline.py --out DIR) to the report
# with ratios. --chat also runs the chat suite (needs ivy's chat endpoint and an LLM behind it).
# Without --ivy, suite 4 is skipped; without --tulip, suites 1-3 are.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
TULIP="" IVY="" OUT="" PEER="" CHAT=0
pass=()
while [ $# -gt 0 ]; do
  case "$1" in
    --tulip) TULIP="$2"; pass+=("$1" "$2"); shift 2 ;;
    --ivy) IVY="$2"; pass+=("$1" "$2"); shift 2 ;;
    --out) OUT="$2"; pass+=("$1" "$2"); shift 2 ;;
    --peer) PEER="$2"; shift 2 ;;
    --chat) CHAT=1; shift ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) pass+=("$1"); shift ;;
  esac
done
[ -n "$OUT" ] || { echo "run_all.sh: --out DIR is required" >&2; exit 2; }
[ -n "$TULIP$IVY" ] || { echo "run_all.sh: give --tulip and/or --ivy" >&2; exit 2; }
status=0
if [ -n "$TULIP" ]; then
  "$HERE/low_latency_embed.sh" "${pass[@]}" || status=1
  "$HERE/low_latency_score.sh" "${pass[@]}" || status=1
  "$HERE/throughput.sh" "${pass[@]}" || status=1
fi
if [ -n "$IVY" ]; then "$HERE/concurrency.sh" "${pass[@]}" || status=1; fi
if [ "$CHAT" = 1 ]; then "$HERE/chat.sh" "${pass[@]}" || status=1; fi
render=(python3 "$HERE/../render/render.py" --out "$OUT" "$OUT")
[ -n "$PEER" ] && render+=("$PEER")
"${render[@]}" || status=1
exit $status
