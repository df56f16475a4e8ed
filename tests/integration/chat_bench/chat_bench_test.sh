#!/usr/bin/env bash
# The chat benchmark harness end to end on CPU: bench/suites/chat_host.sh starts a chat mesh on a
# tiny random gpt-oss (real o200k_harmony tokenizer), runs the chat suite at 2 concurrent streams with
# the loadgen's SSE client, and renders the report. Checks the recorded JSON: every stream
# succeeded, was exactly --max-tokens long (ignore_eos), the prompts were calibrated through
# /tokenize to the target, TTFT/ITL/TPOT were measured, and the report has the chat table.
# Inter-token gaps are not asserted here (the unit tests time them against a scripted server): a
# random model never closes a Harmony header, so ivy's lenient parser holds its first 256 tokens
# as header text (max_header_tokens) and a short stream arrives as one event.
#   chat_bench_test.sh BUILD_DIR SOURCE_DIR TOKENIZER_JSON
set -euo pipefail
BUILD="$1" SRC="$2" TOKJSON="$3"
work="$(mktemp -d "${TMPDIR:-/tmp}/garden-chat-bench.XXXXXX")"
trap 'rm -rf "$work"' EXIT
"$BUILD/services/rose/rose-mkmodel" --kind gpt-oss --out "$work/model" --tokenizer-json "$TOKJSON" \
  > "$work/mkmodel.log"
# shellcheck source=../support/free_port.sh
FREE_PORT_DIR="$work" source "$SRC/tests/integration/support/free_port.sh"
BENCH_IVY_PORT="$(free_port)"
BENCH_TULIP_PORT="$(free_port)"
BENCH_METRICS_PORT="$(free_port)"
export BENCH_IVY_PORT BENCH_TULIP_PORT BENCH_METRICS_PORT
status=0
BUILD_DIR="$BUILD" GARDEN_COMMIT=test "$SRC/bench/suites/chat_host.sh" --model "$work/model" \
  --out "$work/out" --device cpu --rose-threads 2 --streams 2 --max-tokens 16 --lengths 96 \
  --quick --warmup 0 --loadgen "$BUILD/bench/loadgen/loadgen" > "$work/host.log" 2>&1 || status=$?
if [ "$status" != 0 ]; then
  echo "chat_host.sh failed ($status)"; tail -n 40 "$work/host.log"; tail -n 40 "$work/out/logs/mesh.log" 2>/dev/null
  exit 1
fi
python3 - "$work/out" <<'PY'
import json, os, sys
out = sys.argv[1]
fails = []
def check(cond, msg):
    if not cond:
        fails.append(msg)
for c in (2,):
    path = os.path.join(out, f"chat_text96_c{c}.json")
    r = json.load(open(path))
    w = r["workload"]
    check(r["schema"] == "garden.bench.result.v1", f"{w}: schema")
    check(r["suite"] == "chat_streaming" and r["config"]["mode"] == "chat", f"{w}: suite/mode")
    check(r["config"]["concurrency"] == c, f"{w}: concurrency")
    req = r["requests"]
    check(req["ok"] == c and req["errors"] == 0, f"{w}: requests {req}")
    ch = r["chat"]
    check(ch["output_tokens"] == 16 * c, f"{w}: output_tokens {ch['output_tokens']} != {16 * c}")
    check(ch["finish_reasons"] == {"length": c}, f"{w}: finish_reasons {ch['finish_reasons']}")
    check(ch["ttft_ms"]["count"] == c and ch["ttft_ms"]["min"] > 0, f"{w}: ttft {ch['ttft_ms']}")
    # TPOT needs two events with text; a short answer of the random model is one (see above).
    check(ch["tpot_ms"]["count"] <= c, f"{w}: tpot {ch['tpot_ms']}")
    check(ch["output_tokens_per_s"] > 0, f"{w}: output tokens/s")
    # Prompts calibrated through /tokenize: within 1% (at least one token) of the target, and the
    # server's usage.prompt_tokens is what the throughput counts.
    it = r["input_tokens"]
    check(abs(it["per_input_mean"] - 96) <= 1.5 and it["per_input_min"] >= 95 and it["per_input_max"] <= 97,
          f"{w}: input tokens {it}")
    tp = r["throughput"]["tokens_per_s"] * r["duration_s"]
    check(abs(tp / c - it["per_input_mean"]) <= 2, f"{w}: prompt tokens per request {tp / c} vs {it}")
    check(r["flags"]["ignore_eos"] == "true", f"{w}: ignore_eos flag")
    check(r["model"]["name"] != "", f"{w}: model name")
md = open(os.path.join(out, "report.md")).read()
check("Chat streaming" in md and "chat_text96_c2" in md and "TTFT p50" in md, "report.md has the chat table")
check("CPU harness check" in md, "report.md flags the CPU run")
for f in ("logs/tulip_metrics.txt", "logs/ivy_metrics.txt"):
    check(os.path.getsize(os.path.join(out, f)) > 0, f"{f} saved")
if fails:
    print("\n".join("FAIL " + f for f in fails))
    sys.exit(1)
print("chat harness: all checks passed")
PY
