#!/usr/bin/env bash
# s30 call 1: the pair QK-norm + RoPE kernel [TAG_QK_ROPE_PAIR]: tests, kernel bench, forward A/B.
set -uo pipefail
T0=$(date +%s)
tar xJf .carry/gpu4.tar.xz -C /tmp || exit 9
export LD_LIBRARY_PATH=/tmp/gpubin/lib:/usr/local/cuda/lib64
B=/tmp/gpubin
S=$OUT/summary.txt
el() { echo "$(( $(date +%s) - T0 ))s"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee $OUT/gpu.txt
$B/gpu_kernels_test --gtest_filter='*QkNormRope*' > $OUT/qk_test.txt 2>&1; echo "qk_test rc=$? $(el)" | tee -a $S
tail -4 $OUT/qk_test.txt
timeout 150 $B/rose_kernel_bench elementwise > $OUT/elem.txt 2>&1; echo "elem rc=$? $(el)" | tee -a $S
grep -E "qk_|CHECK|fail" $OUT/elem.txt
python3 bench/suites/make_random_qwen3.py --out /tmp/q3emb > /dev/null 2>&1 || echo "mkmodel failed" | tee -a $S
GARDEN_FORWARD_SHAPES=1x128,1x512,16x512,8x1024,2x4096 timeout 200 $B/rose_forward_bench /tmp/q3emb --iters 20 --ab qklegacy,qkauto,qkpair4,qkpair2,qklegacy 2>&1 | grep -v 'gemm tuned' > $OUT/fwd_ab.txt; echo "fwd_ab rc=$? $(el)" | tee -a $S
cat $OUT/fwd_ab.txt
$B/gpu_kernels_test --gtest_brief=1 2>&1 | grep -vE 'gemm tuned|launching|^  sm90|^  narrow|^  wide|^case ' > $OUT/kernels_test.txt; echo "kernels_test rc=$? $(el)" | tee -a $S
tail -3 $OUT/kernels_test.txt
$B/gpu_model_graph_test --gtest_brief=1 2>&1 | grep -v 'gemm tuned' > $OUT/model_graph_test.txt; echo "model_graph_test rc=$? $(el)" | tee -a $S
tail -3 $OUT/model_graph_test.txt
cat $S
