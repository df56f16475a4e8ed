#include "services/rose/ops/cuda/fp8_dense.cuh"

#include <algorithm>

#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/fp8_block.h"

namespace garden::rose::cuda {
namespace {

constexpr int kWeightThreads = 256;

// One CUDA block per 128 x 128 weight block (blockIdx.x: K block, blockIdx.y: row block); rows
// past n count as zeros. Thread t takes 8 consecutive inputs of rows t / 16, t / 16 + 16, ...
__global__ void __launch_bounds__(kWeightThreads) fp8WeightQuantKernel(Fp8WeightQuantArgs a) {
  __shared__ float s_max[kWeightThreads / 32];
  const int64_t b = blockIdx.x, p = blockIdx.y;
  const int col = (threadIdx.x % 16) * 8;
  constexpr int kRowsPerPass = kWeightThreads / 16;
  float amax = 0.f;
  for (int r = threadIdx.x / 16; r < kFp8Block; r += kRowsPerPass) {
    const int64_t row = p * kFp8Block + r;
    if (row >= a.n) break;
    float v[8];
    loadF32x8(a.w + row * a.k + b * kFp8Block + col, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
  }
  amax = warpMax(amax);
  if ((threadIdx.x & 31) == 0) s_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = 0.f;
#pragma unroll
  for (int w = 0; w < kWeightThreads / 32; ++w) amax = fmaxf(amax, s_max[w]);
  float inv;
  const float s = fp8BlockScale(amax, &inv);
  for (int r = threadIdx.x / 16; r < kFp8Block; r += kRowsPerPass) {
    const int64_t row = p * kFp8Block + r;
    if (row >= a.n) break;
    float v[8];
    loadF32x8(a.w + row * a.k + b * kFp8Block + col, v);
    *reinterpret_cast<uint2*>(a.codes + row * a.k + b * kFp8Block + col) = fp8Pack8(v, inv);
  }
  if (threadIdx.x == 0) {
    a.scales[fp8WeightScaleIndex(a.k, p, b)] = s;
    // The stride's padding blocks (L..L4) hold 0, written by the last K block.
    if (b == gridDim.x - 1)
      for (int64_t q = b + 1; q < fp8KBlocks4(a.k); ++q) a.scales[fp8WeightScaleIndex(a.k, p, q)] = 0.f;
  }
}

// Grid-stride over (row, K block) items, one per half-warp.
__global__ void fp8RowQuantKernel(Fp8RowQuantArgs a) {
  pdlWait();  // [TAG_PDL]
  const int64_t nb = a.k / kFp8Block;
  const int64_t items = a.rows * nb;
  const int64_t half = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 16;
  const int64_t halves = static_cast<int64_t>(gridDim.x) * blockDim.x / 16;
  const int col = (threadIdx.x % 16) * 8;
  for (int64_t it = half; it < items; it += halves) {
    const int64_t r = it / nb, b = it % nb;
    float v[8];
    loadF32x8(a.x + r * a.k + b * kFp8Block + col, v);
    fp8QuantizeHalfWarp(v, a.codes + r * a.k + b * kFp8Block + col, a.scales + b * a.rows + r);
  }
}

}  // namespace

Status launchFp8WeightQuant(const Fp8WeightQuantArgs& a, cudaStream_t stream) {
  if (a.n <= 0 || a.k <= 0 || a.k % kFp8Block != 0)
    return invalidArgument("fp8_weight_quant: n must be positive and k a positive multiple of 128");
  if ((reinterpret_cast<uintptr_t>(a.w) | reinterpret_cast<uintptr_t>(a.codes) |
       reinterpret_cast<uintptr_t>(a.scales)) % 16 != 0)
    return invalidArgument("fp8_weight_quant: pointers must be 16-byte aligned");
  const dim3 grid(static_cast<unsigned>(a.k / kFp8Block), static_cast<unsigned>(fp8RowBlocks(a.n)));
  fp8WeightQuantKernel<<<grid, kWeightThreads, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

Status launchFp8RowQuant(const Fp8RowQuantArgs& a, cudaStream_t stream, bool pdl) {
  if (a.rows == 0) return okStatus();
  if (a.rows < 0 || a.k <= 0 || a.k % kFp8Block != 0)
    return invalidArgument("fp8_row_quant: k must be a positive multiple of 128");
  if ((reinterpret_cast<uintptr_t>(a.x) | reinterpret_cast<uintptr_t>(a.codes) |
       reinterpret_cast<uintptr_t>(a.scales)) % 16 != 0)
    return invalidArgument("fp8_row_quant: pointers must be 16-byte aligned");
  const int64_t halves = a.rows * (a.k / kFp8Block);
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((halves * 16 + kThreads - 1) / kThreads, 8LL * smCount());
  CUDA_RETURN_IF_ERROR(launchPdl(pdl, fp8RowQuantKernel, dim3(static_cast<unsigned>(blocks)),
                                 dim3(kThreads), 0, stream, a));
  return okStatus();
}

}  // namespace garden::rose::cuda
