#pragma once
// gpt-oss router selection: per token, the top-k of its f32 router logits (+ bias) — largest
// first, ties to the lower expert id — and the softmax over the k selected logits only. One warp
// per token; the logits of up to kMoeRouteMaxExperts experts sit in registers. Pointers are
// device memory owned by the caller.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

inline constexpr int kMoeRouteMaxExperts = 256;
inline constexpr int kMoeRouteMaxTopK = 8;

struct MoeRouteArgs {
  const float* logits = nullptr;         // [T, E]
  const __nv_bfloat16* bias = nullptr;   // [E] or null
  int32_t* topk_ids = nullptr;           // [T, k]
  float* topk_weights = nullptr;         // [T, k]
  int64_t num_tokens = 0;
  int32_t num_experts = 0;  // <= kMoeRouteMaxExperts
  int32_t top_k = 0;        // <= min(kMoeRouteMaxTopK, num_experts)
  // splits > 0: `logits` holds the f32 router's slice partials [splits, T, E] and ss the slices'
  // sums of squares [splits, T] (moe_router_f32.cuh); the logit is the sum of the slices in
  // order times rsqrt(sum(ss) / hidden + eps), then the bias joins.
  int32_t splits = 0;
  const float* ss = nullptr;
  int32_t hidden = 0;
  float eps = 0.f;
  // [TAG_PDL_GRAPH] Launched programmatically (common.cuh launchPdlAlways), in CUDA graphs too:
  // the kernel waits for the previous one in its first statement (CudaKernelOptions::pdl_graph).
  bool pdl = false;
};

Status checkMoeRoute(const MoeRouteArgs& a);
Status launchMoeRoute(const MoeRouteArgs& a, cudaStream_t stream);

}  // namespace garden::rose::cuda
