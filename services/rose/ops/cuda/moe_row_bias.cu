#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/moe_row_bias.cuh"

namespace garden::rose::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) moeRowBiasKernel(MoeRowBiasArgs a) {
  const int64_t chunks = a.n / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= a.rows * chunks) return;
  const int64_t r = i / chunks, c = (i % chunks) * 8;
  if (a.row_token[r] < 0) return;
  const int e = a.tile_expert[r / a.block_m];
  if (e < 0 || e >= a.num_experts) return;
  float y[8], b[8];
  loadF32x8(a.y + r * a.n + c, y);
  loadF32x8(a.bias + static_cast<int64_t>(e) * a.n + c, b);
#pragma unroll
  for (int j = 0; j < 8; ++j) y[j] += b[j];
  storeF32x8(a.y + r * a.n + c, y);
}

}  // namespace

Status launchMoeRowBias(const MoeRowBiasArgs& a, cudaStream_t stream) {
  if (a.n <= 0 || a.n % 8 != 0) return invalidArgument("moe_row_bias: n must be a positive multiple of 8");
  if (a.block_m <= 0 || a.num_experts <= 0)
    return invalidArgument("moe_row_bias: block_m and num_experts must be positive");
  if (a.rows == 0 || a.bias == nullptr) return okStatus();
  const int64_t items = a.rows * (a.n / 8);
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks > 0x7fffffff) return invalidArgument("moe_row_bias: too many rows");
  moeRowBiasKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
