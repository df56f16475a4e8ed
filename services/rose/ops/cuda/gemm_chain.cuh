#pragma once
// bf16 GEMM for a few rows on the tensor cores with one K chain per output [TAG_GEMM_CHAIN]:
// y[M, N] = x[M, K] . w[N, K]^T (+ bias[N]), M <= 16, row-major bf16 in and out. Each warp owns 16
// output columns (weight rows: the mma.m16n8k16 A operand, through a per-warp cp.async ring of
// `stages` 64-wide K tiles in shared memory and ldmatrix), the token rows are the B operand (one
// n8 tile, two above 8 rows; staged whole once per block), and every output is one f32 chain:
// the k16 steps in K order, one mma each, from zero; then bias in f32 and one rounding.
//
// Why: at one decode token gpt-oss's O-proj and QKV stream their weights at 1.7-2.5 TB/s through
// cuBLASLt, and the CUDA-core GEMV that was faster at M = 1 rounded a row differently from the
// larger buckets (a sequence's tokens could then depend on its batch). A K chain of k16 mma steps
// in order is the summation a non-split tensor-core GEMM performs (wgmma's accumulation inside a
// k16 step is mma.sync's: measured for the MoE kernels, docs/gpt-oss-cuda.md [TAG_MOE_WGMMA]), so
// this kernel may give cuBLASLt's non-split rows bit for bit. It is offered to the GemmRunner's
// tuner only under row invariance (GemmRunner::setChainGemm, [TAG_GEMM_ROW_INVARIANT]), where a
// candidate wins only if its rows equal the reference algorithm's: if the sums differ it is
// refused, never used.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

inline constexpr int64_t kChainMaxRows = 16;

struct ChainGemmArgs {
  const __nv_bfloat16* x = nullptr;     // [m, k]
  const __nv_bfloat16* w = nullptr;     // [n, k]
  const __nv_bfloat16* bias = nullptr;  // [n] or null
  __nv_bfloat16* y = nullptr;           // [m, n]; must not overlap x, w, bias
  int64_t m = 0, n = 0, k = 0;
  int stages = 8;  // K tiles of the per-warp weight ring: 8 or 16
  // [TAG_CHAIN_PDL] A programmatic dependent launch (also inside CUDA graphs): the kernel streams
  // its first weight tiles (stages - 1 of them) before griddepcontrol.wait, so they overlap the
  // previous kernel's tail and the launch; x is read only after the wait. Same bits either way.
  // x must be the only operand an earlier kernel in the stream may still be writing.
  bool pdl = false;
};

// 1 <= m <= 16, n % 16 == 0, k % 64 == 0, stages 8 or 16, and the staged token rows fit the
// shared memory of a block.
bool chainGemmSupported(int64_t m, int64_t n, int64_t k, int stages);
// Sets the kernels' dynamic shared-memory limits (outside any capture; idempotent).
Status prepareChainGemm();
// Enqueues the GEMM on `stream`. Pointers 16-byte aligned. No allocation; capturable.
Status launchChainGemm(const ChainGemmArgs& a, cudaStream_t stream);

}  // namespace garden::rose::cuda
