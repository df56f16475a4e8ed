#pragma once
// The online-softmax step both Hopper attention kernels run on a wgmma m64n128 S accumulator
// (attention_sm90.cu: the embedding path; paged_attention_sm90.cu: gpt-oss prefill), after each
// has masked S its own way, and the P and O bookkeeping around it. Device code only.

#include <cmath>
#include <cstdint>

#include "services/rose/ops/cuda/attention_sm90_layout.h"
#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/sm90_ptx.cuh"

namespace garden::rose::cuda::ptx90 {

// On this thread's S elements of one 128-key tile (rows accRow(tid, e): two rows, 32 keys each;
// masked keys already -inf): updates the running max m (of raw scores) and this thread's part of
// the running sum l, turns S into P = exp2(S * scale_log2 - m * scale_log2) and sets alpha, the
// factor for O.
__device__ __forceinline__ void onlineSoftmax(float (&s)[64], float (&m)[2], float (&l)[2],
                                              float (&alpha)[2], float scale_log2) {
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    mx[0] = fmaxf(mx[0], fmaxf(s[4 * i], s[4 * i + 1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[4 * i + 2], s[4 * i + 3]));
  }
  float ms[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    ms[r] = mx[r] == -INFINITY ? 0.f : mx[r] * scale_log2;  // a row with no visible key yet
    alpha[r] = exp2Ftz(fmaf(m[r], scale_log2, -ms[r]));      // m = -inf (first tile): 0
    m[r] = mx[r];
  }
  float rs[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 16; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e / 2;
      s[4 * i + e] = exp2Ftz(fmaf(s[4 * i + e], scale_log2, -ms[r]));
      rs[r] += s[4 * i + e];
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = fmaf(l[r], alpha[r], rs[r]);
}

// P (f32, in S's registers) -> bf16 (T = f16: fp16) A fragments of O += P V over the tile's
// 128 keys.
template <typename T = bf16>
__device__ __forceinline__ void toP(const float (&s)[64], uint32_t (&p)[32]) {
#pragma unroll
  for (int kk = 0; kk < 128 / 16; ++kk) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int e = sm90::pSourceElement(kk, r);
      p[4 * kk + r] = pack16x2<T>(s[e], s[e + 1]);
    }
  }
}

// O (a wgmma m64nN f32 accumulator, kN = N / 2 registers) *= alpha of its row.
template <int kN>
__device__ __forceinline__ void rescaleO(float (&o)[kN], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < kN / 4; ++i) {
    o[4 * i] *= alpha[0];
    o[4 * i + 1] *= alpha[0];
    o[4 * i + 2] *= alpha[1];
    o[4 * i + 3] *= alpha[1];
  }
}

}  // namespace garden::rose::cuda::ptx90
