#pragma once
// gpt-oss router logits in f32 from the f32 residual stream (the post-attention norm folded in):
//   logits[t, e] = rsqrt(mean_k(res[t, k]^2) + eps) * sum_k res[t, k] * wt[k, e]
// where wt = (router ⊙ norm weight)ᵀ in f32 (a bf16 × bf16 product is exact in f32), i.e. the
// router GEMM of Hugging Face's fp32 model (f32 normalized row · f32 weights) without the bf16
// rounding of the normalized row that the experts' input carries.
//
// Two passes. launchRouterF32Partials: K is cut into fixed slices of kRouterF32SliceK columns
// (the split depends on the hidden size only, never on the number of tokens, so a token's bits
// do not depend on its batch); block (token tile of 16, expert tile of 32, slice) writes its
// partial dot products to part[slice][t][e] and, for the first expert tile, the slice's sum of
// squares to ss[slice][t]. The route kernel (moe_route.cuh, MoeRouteArgs::splits) sums the slices
// in order, scales by the row's rsqrt and adds the bias before the top-k. Pointers are device
// memory owned by the caller; residual and wt 16-byte aligned.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

inline constexpr int kRouterF32SliceK = 256;

// Slices of the K dimension for `hidden` columns.
inline int32_t routerF32Splits(int64_t hidden) {
  return static_cast<int32_t>((hidden + kRouterF32SliceK - 1) / kRouterF32SliceK);
}

struct RouterF32Args {
  const float* residual = nullptr;  // [T, H]
  const float* wt = nullptr;        // [H, E]
  float* part = nullptr;            // [splits, T, E]
  float* ss = nullptr;              // [splits, T]
  int64_t num_tokens = 0;
  int32_t hidden = 0;       // multiple of 4
  int32_t num_experts = 0;  // multiple of 4
};

Status launchRouterF32Partials(const RouterF32Args& a, cudaStream_t stream);

}  // namespace garden::rose::cuda
