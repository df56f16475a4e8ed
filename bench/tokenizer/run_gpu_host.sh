#!/usr/bin/env bash
# One device call does both jobs that need the GPU host's Python (HF `tokenizers`):
#  1. the BPE conformance fixtures (tests/conformance/tokenizer/gen_bpe_fixtures.py);
#  2. the Unigram tokenizer.json fixtures (gen_unigram_json_fixtures.py --variants);
#  3. the side-by-side tokenizer benchmark: our tokenizer_bench (built here, carried with the
#     shared libraries it needs) vs libsentencepiece in-process (REPEATS runs, default 3), and
#     hf_bench.py on the same texts as our BPE, on the same core.
# Inputs under .carry/tok/: tokenizer_bench, lib/*.so*, qwen3.json, gptoss.json,
# bench_unigram_v8000.model, nfkc_v2000_bytes.model. Outputs under $OUT. GARDEN_COMMIT names the commit measured.
set -uo pipefail
C=.carry/tok
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/texts
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
python3 -c 'import tokenizers, sys; print("tokenizers", tokenizers.__version__, sys.version)'
python3 tests/conformance/tokenizer/gen_bpe_fixtures.py --tokenizer qwen3=$C/qwen3.json \
  --tokenizer gptoss=$C/gptoss.json --out "$OUT" || echo "FIXTURES FAILED"
# Unigram tokenizer.json fixtures, with the ByteFallback-decoder / added-token variant
# (nfkc_v2000_bytes_bytefb_added.*): unpack into tests/conformance/tokenizer/fixtures/unigram_json/.
mkdir -p /tmp/uni && python3 tests/conformance/tokenizer/gen_unigram_json_fixtures.py \
  --model $C/nfkc_v2000_bytes.model --variants --out /tmp/uni && tar -czf "$OUT/unigram_json.tar.gz" -C /tmp/uni . \
  || echo "UNIGRAM JSON FAILED"
PIN=""
CORE=$(( $(nproc) > 3 ? 3 : 1 ))
taskset -c $CORE true 2>/dev/null && PIN="taskset -c $CORE"
export LD_LIBRARY_PATH=$C/lib
# Unigram ours vs libsentencepiece, interleaved in-process, REPEATS times (ratios per run).
for r in $(seq "${REPEATS:-3}"); do
  $PIN $C/tokenizer_bench --corpus tests/conformance/tokenizer/corpus.jsonl \
    --sp-model $C/bench_unigram_v8000.model --seconds 2 >> "$OUT/bench_unigram.jsonl" \
    || echo "UNIGRAM BENCH FAILED"
done
$PIN $C/tokenizer_bench --corpus tests/conformance/tokenizer/corpus.jsonl \
  --bpe qwen3=$C/qwen3.json --bpe gptoss=$C/gptoss.json \
  --dump-texts /tmp/texts --seconds 3 > "$OUT/bench_ours.jsonl" || echo "OURS BENCH FAILED"
unset LD_LIBRARY_PATH
$PIN python3 bench/tokenizer/hf_bench.py --texts /tmp/texts --bpe qwen3=$C/qwen3.json \
  --bpe gptoss=$C/gptoss.json --seconds 3 > "$OUT/bench_hf.jsonl" || echo "HF BENCH FAILED"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: ${GARDEN_COMMIT:-unknown}"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "cores: $(nproc)"
  python3 -c 'import tokenizers; print("hf_tokenizers:", tokenizers.__version__)'
  echo "pinned: ${PIN:-no}"
} > "$OUT/env.txt"
cat "$OUT/env.txt" "$OUT/bench_unigram.jsonl" "$OUT/bench_ours.jsonl" "$OUT/bench_hf.jsonl"
ls -la "$OUT"
