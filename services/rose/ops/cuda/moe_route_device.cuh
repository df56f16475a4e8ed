#pragma once
// The per-token body of the router selection (moe_route.cuh), shared by the route kernel and the
// f32 router's fused finalize (moe_router_f32.cu, [TAG_ROUTER_FUSED_ROUTE]): one warp, token t.
// The logits (or the f32 router's slice partials and sums of squares) are read through L2 only
// (ld.global.cg): in the fused path other blocks of the same kernel wrote them, and a line this
// SM's L1 holds from a neighbouring token tile could be stale. Same values, same order, same
// bits in both callers.

#include <cuda_bf16.h>

#include <cmath>

#include "services/rose/ops/cuda/moe_route.cuh"

namespace garden::rose::cuda {

// Splits whose partials a lane loads all at once (hidden <= 4096); above, one at a time.
inline constexpr int kMoeRouteParallelSplits = 16;

__device__ __forceinline__ void moeRouteToken(const MoeRouteArgs& a, int64_t t, int lane) {
  constexpr int kPerLane = kMoeRouteMaxExperts / 32;
  const bool parallel = a.splits <= kMoeRouteParallelSplits;
  // Lane l holds experts l, l + 32, ... (NaN counts as -inf). Sums run in split order whichever
  // way the values are loaded: the same bits. The loads are issued before the sums (lane s loads
  // the sum of squares of split s; a lane loads all splits of an expert at once): a chain of
  // dependent L2 loads per split cost ~6 us per token at decode (ncu, 2026-12-03).
  float rstd = 1.f;
  if (a.splits > 0) {
    float ss = 0.f;
    if (parallel) {
      const float mine = lane < a.splits ? __ldcg(a.ss + lane * a.num_tokens + t) : 0.f;
      for (int s = 0; s < a.splits; ++s) ss += __shfl_sync(0xffffffffu, mine, s);
    } else {
      for (int s = 0; s < a.splits; ++s) ss += __ldcg(a.ss + s * a.num_tokens + t);
    }
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
        if (parallel) {
          float p[kMoeRouteParallelSplits];
#pragma unroll
          for (int s = 0; s < kMoeRouteParallelSplits; ++s)
            p[s] = s < a.splits ? __ldcg(a.logits + (s * a.num_tokens + t) * a.num_experts + e) : 0.f;
#pragma unroll
          for (int s = 0; s < kMoeRouteParallelSplits; ++s)
            if (s < a.splits) x += p[s];
        } else {
          for (int s = 0; s < a.splits; ++s)
            x += __ldcg(a.logits + (s * a.num_tokens + t) * a.num_experts + e);
        }
        x *= rstd;
      } else {
        x = __ldcg(a.logits + t * a.num_experts + e);
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

}  // namespace garden::rose::cuda
