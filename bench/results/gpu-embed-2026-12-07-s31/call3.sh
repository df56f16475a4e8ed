#!/usr/bin/env bash
# s31 call 3: ncu --set full of the first two tuning launches at 1x128 (the QKV GEMM, M = 128):
# the Hopper GEMM (GARDEN_GEMM_WG=1) and cuBLASLt's first candidates (GARDEN_GEMM_WG=0), to see
# where their ~10 us go. Full reports in ncu_full_*.txt, the key lines in ncu_key_*.txt.
set -o pipefail
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
tar xJf .carry/all.tar.xz -C /tmp || exit 9
export LD_LIBRARY_PATH=/tmp/gpubin/lib:/usr/local/cuda/lib64 PATH=/usr/local/cuda/bin:$PATH
python3 bench/suites/make_random_qwen3.py --out /tmp/q3emb > /dev/null 2>&1 || exit 8
for v in 1 0; do
  k=$([ $v = 1 ] && echo wgGemm || echo nvjet)
  GARDEN_GEMM_WG=$v GARDEN_FORWARD_SHAPES=1x128 timeout 100 ncu --set full -k regex:$k -c 2 \
    /tmp/gpubin/rose_forward_bench /tmp/q3emb --iters 2 2>&1 | grep -v 'gemm tuned' > $OUT/ncu_full_$k.txt
  echo "== $k rc=$?"
  grep -E "wgGemm|nvjet|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Registers Per|Dynamic Shared|Achieved Occupancy|Grid Size|Cluster Size|Block Size|L2 Hit Rate|Eligible|Issued Warp|Warp Cycles Per Issued|stall" $OUT/ncu_full_$k.txt | tee $OUT/ncu_key_$k.txt | head -60
done
