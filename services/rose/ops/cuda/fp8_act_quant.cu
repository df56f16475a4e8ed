#include <cuda_fp8.h>

#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/fp8_act_quant.cuh"
#include "services/rose/ops/cuda/fp8_block.h"
#include "services/rose/ops/cuda/fp8_dense.cuh"

namespace garden::rose::cuda {
namespace {

constexpr int kWarps = 8;

template <bool kSwiglu>
__global__ void __launch_bounds__(kWarps * 32) fp8ActQuantKernel(Fp8ActQuantArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t nb = fp8KBlocks(a.k);
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (item >= a.rows * nb) return;
  const int64_t r = item / nb, b = item % nb;
  const int64_t kp = fp8PaddedK(a.k);
  const int e = a.tile_expert[r / a.block_m];
  if (e < 0 || e >= a.num_experts) return;  // past the last tile: never launched over
  const int64_t r0 = a.expert_off[e], cnt = a.expert_off[e + 1] - r0;
  const int32_t src = a.row_token[r];
  const int64_t c = b * kFp8Block + lane * 4;
  float v[4] = {0.f, 0.f, 0.f, 0.f};
  if (src >= 0 && c < a.k) {  // k % 4 == 0: the four inputs are all real or all padding
    if constexpr (kSwiglu) {
      const Vec8<bf16> h = *reinterpret_cast<const Vec8<bf16>*>(a.in + r * 2 * a.k + 2 * c);
      float bi[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      if (a.bias != nullptr) loadF32x8(a.bias + static_cast<int64_t>(e) * 2 * a.k + 2 * c, bi);
      const float lim = a.swiglu_limit, alpha = a.swiglu_alpha;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 gu = __bfloat1622float2(h.h[j]);
        v[j] = clampedSwiglu(gu.x + bi[2 * j], gu.y + bi[2 * j + 1], lim, alpha);
      }
    } else {
      const uint2 raw = *reinterpret_cast<const uint2*>(a.in + static_cast<int64_t>(src) * a.k + c);
      const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
      const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
      v[0] = lo.x;
      v[1] = lo.y;
      v[2] = hi.x;
      v[3] = hi.y;
    }
  }
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  amax = warpMax(amax);
  float inv;
  const float scale = fp8BlockScale(amax, &inv);
  uint32_t packed = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    packed |= fp8Code(v[j], inv) << (8 * j);
  }
  *reinterpret_cast<uint32_t*>(a.q + r * kp + c) = packed;  // c < kp always
  if (lane == 0) a.scales[fp8ActScaleIndex(a.k, r0, cnt, r, b)] = scale;
}

}  // namespace

Status launchFp8ActQuant(const Fp8ActQuantArgs& a, cudaStream_t stream) {
  if (a.k <= 0 || a.k % 4 != 0) return invalidArgument("fp8_act_quant: k must be a positive multiple of 4");
  if (a.block_m <= 0 || a.num_experts <= 0)
    return invalidArgument("fp8_act_quant: block_m and num_experts must be positive");
  if (a.swiglu && a.k % 4 != 0) return invalidArgument("fp8_act_quant: swiglu needs k % 4 == 0");
  if (reinterpret_cast<uintptr_t>(a.in) % 16 != 0 || reinterpret_cast<uintptr_t>(a.q) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.bias) % 16 != 0)
    return invalidArgument("fp8_act_quant: input, bias and output must be 16-byte aligned");
  if (a.rows == 0) return okStatus();
  const int64_t items = a.rows * fp8KBlocks(a.k);
  const int64_t blocks = (items + kWarps - 1) / kWarps;
  if (blocks > 0x7fffffff) return invalidArgument("fp8_act_quant: too many rows");
  if (a.swiglu) {
    fp8ActQuantKernel<true><<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(a);
  } else {
    fp8ActQuantKernel<false><<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(a);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
