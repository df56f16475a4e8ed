#include <cmath>

#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/moe_route.cuh"

namespace garden::rose::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kPerLane = kMoeRouteMaxExperts / 32;

__global__ void __launch_bounds__(kWarpsPerBlock * 32) moeRouteKernel(MoeRouteArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (t >= a.num_tokens) return;
  // Lane l holds experts l, l + 32, ... (NaN counts as -inf).
  float rstd = 1.f;
  if (a.splits > 0) {
    float ss = 0.f;
    for (int s = 0; s < a.splits; ++s) ss += a.ss[s * a.num_tokens + t];
    rstd = rsqrtf(ss / static_cast<float>(a.hidden) + a.eps);
  }
  float v[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    float x = -INFINITY;
    if (e < a.num_experts) {
      if (a.splits > 0) {
        x = 0.f;
        for (int s = 0; s < a.splits; ++s)
          x += a.logits[(s * a.num_tokens + t) * a.num_experts + e];
        x *= rstd;
      } else {
        x = a.logits[t * a.num_experts + e];
      }
      if (a.bias != nullptr) x += __bfloat162float(a.bias[e]);
      if (isnan(x)) x = -INFINITY;
    }
    v[i] = x;
  }
  float sel[kMoeRouteMaxTopK];
  int ids[kMoeRouteMaxTopK];
  bool taken[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) taken[i] = false;
#pragma unroll
  for (int k = 0; k < kMoeRouteMaxTopK; ++k) {
    if (k >= a.top_k) break;
    // Lane-local best among the experts not taken yet (lowest id among equals).
    float best = -INFINITY;
    int best_id = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < a.num_experts && !taken[i] && (v[i] > best || (v[i] == best && e < best_id))) {
        best = v[i];
        best_id = e;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, best_id, o);
      if (ob > best || (ob == best && oi < best_id)) {
        best = ob;
        best_id = oi;
      }
    }
    sel[k] = best;
    ids[k] = best_id;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (lane + 32 * i == best_id) taken[i] = true;
    }
  }
  if (lane == 0) {
    float mx = sel[0];
    float w[kMoeRouteMaxTopK];
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < kMoeRouteMaxTopK; ++k) {
      if (k >= a.top_k) break;
      w[k] = mx == -INFINITY ? 1.f : expf(sel[k] - mx);
      sum += w[k];
    }
#pragma unroll
    for (int k = 0; k < kMoeRouteMaxTopK; ++k) {
      if (k >= a.top_k) break;
      a.topk_ids[t * a.top_k + k] = ids[k];
      a.topk_weights[t * a.top_k + k] = w[k] / sum;
    }
  }
}

}  // namespace

Status checkMoeRoute(const MoeRouteArgs& a) {
  if (a.num_experts <= 0 || a.num_experts > kMoeRouteMaxExperts)
    return invalidArgument("moe_route: num_experts must be in [1, 256]");
  if (a.top_k <= 0 || a.top_k > kMoeRouteMaxTopK || a.top_k > a.num_experts)
    return invalidArgument("moe_route: top_k must be in [1, min(8, num_experts)]");
  if (a.splits < 0 || (a.splits > 0 && (a.ss == nullptr || a.hidden <= 0)))
    return invalidArgument("moe_route: splits needs ss and hidden");
  return okStatus();
}

Status launchMoeRoute(const MoeRouteArgs& a, cudaStream_t stream) {
  RETURN_IF_ERROR(checkMoeRoute(a));
  if (a.num_tokens == 0) return okStatus();
  const dim3 grid(static_cast<unsigned>((a.num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock));
  moeRouteKernel<<<grid, kWarpsPerBlock * 32, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
