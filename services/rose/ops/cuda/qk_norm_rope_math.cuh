#pragma once
// The per-head arithmetic of qk_norm_rope.cu, shared with the Hopper attention's fused q path
// ([TAG_ATTN_QROPE], attention_sm90.cu) so that both round alike, bit for bit. Explicit roundings
// (no contraction choices left to the compiler): Hugging Face Qwen3's order in bf16.

#include "services/rose/ops/cuda/common.cuh"

namespace garden::rose::cuda {

// Sum of squares of the 4 (or 2) consecutive head dims one lane of the warp kernel holds, in its
// order; the lanes' partial sums then meet in warpSum's butterfly (16, 8, 4, 2, 1 lanes apart).
__device__ __forceinline__ float qkPartialSumSquares(const float* x, int n) {
  float ss = __fmul_rn(x[0], x[0]);
  for (int e = 1; e < n; ++e) ss = __fmaf_rn(x[e], x[e], ss);
  return ss;
}

// 1 / rms of a head of kD dims from its sum of squares.
template <int kD>
__device__ __forceinline__ float qkRstd(float ss, float eps) {
  return rsqrtf(__fadd_rn(__fmul_rn(ss, 1.f / static_cast<float>(kD)), eps));
}

// The normalized, weighted value: rounded to bf16 before the weight multiply and after it.
__device__ __forceinline__ float qkNormValue(float x, float rstd, float w) {
  return roundBf16(__fmul_rn(roundBf16(__fmul_rn(x, rstd)), w));
}

// RoPE of one dim: x*cos + partner*sin (partner = -x[d + half] below half, x[d - half] above),
// each product rounded to bf16 before the sum (the caller rounds the sum when it stores it).
__device__ __forceinline__ float qkRopeValue(float x, float partner, float cs, float sn) {
  return __fadd_rn(roundBf16(__fmul_rn(x, cs)), roundBf16(__fmul_rn(partner, sn)));
}

}  // namespace garden::rose::cuda
