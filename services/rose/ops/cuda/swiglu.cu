#include <algorithm>

#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/fp8_dense.cuh"
#include "services/rose/ops/cuda/swiglu.cuh"

namespace garden::rose::cuda {
namespace {

// Grid-stride over 8-wide chunks of the output.
__global__ void swigluKernel(SwigluArgs a) {
  pdlWait();  // [TAG_PDL]
  const int64_t chunks_per_row = a.inter / 8;
  const int64_t total = a.num_tokens * chunks_per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / chunks_per_row;
    const int64_t c = (i % chunks_per_row) * 8;
    float gt[8], up[8];
    loadF32x8(a.gate_up + row * 2 * a.inter + c, gt);
    loadF32x8(a.gate_up + row * 2 * a.inter + a.inter + c, up);
#pragma unroll
    for (int k = 0; k < 8; ++k) gt[k] = roundBf16(gt[k] / (1.f + __expf(-gt[k]))) * up[k];
    if (a.out_fp8 != nullptr) {  // [TAG_EMBED_FP8] 16 consecutive chunks (a half-warp) per block
#pragma unroll
      for (int k = 0; k < 8; ++k) gt[k] = roundBf16(gt[k]);
      fp8QuantizeHalfWarp(gt, a.out_fp8 + row * a.inter + c, a.out_scales + (c / 128) * a.num_tokens + row);
      continue;
    }
    storeF32x8(a.out + row * a.inter + c, gt);
  }
}

}  // namespace

Status launchSwiglu(const SwigluArgs& a, cudaStream_t stream, bool pdl) {
  if (a.num_tokens == 0) return okStatus();
  if (a.inter <= 0 || a.inter % 8 != 0)
    return invalidArgument("swiglu: inter must be a multiple of 8");
  if ((reinterpret_cast<uintptr_t>(a.gate_up) | reinterpret_cast<uintptr_t>(a.out)) % 16 != 0)
    return invalidArgument("swiglu: pointers must be 16-byte aligned");
  if (a.out_fp8 != nullptr &&
      (a.out_scales == nullptr || a.inter % 128 != 0 ||
       (reinterpret_cast<uintptr_t>(a.out_fp8) | reinterpret_cast<uintptr_t>(a.out_scales)) % 16 != 0))
    return invalidArgument("swiglu: an fp8 output needs scales, inter a multiple of 128 and "
                           "16-byte aligned pointers");
  const int64_t total = a.num_tokens * (a.inter / 8);
  // Decode-like: 128-thread blocks, one chunk per thread. Prefill-like: 256-thread blocks, at most
  // 8 resident-block waves, grid-stride for the rest.
  const int threads = total < 128LL * smCount() ? 128 : 256;
  const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, 8LL * smCount());
  CUDA_RETURN_IF_ERROR(launchPdl(pdl, swigluKernel, dim3(static_cast<unsigned>(blocks)),
                                 dim3(threads), 0, stream, a));
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
