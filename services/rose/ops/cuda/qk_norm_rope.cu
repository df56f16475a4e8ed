#include <algorithm>

#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/qk_norm_rope.cuh"

namespace garden::rose::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

// Lane l holds dims [l*kE, l*kE + kE) of a head (kE = head_dim / 32). Warp w of the grid handles
// token w / groups and heads [g*heads_per_warp, ...) of the token's Hq + Hkv q/k heads.
template <int kD>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    qkNormRopeKernel(QkNormRopeArgs a, int heads_per_warp) {
  pdlWait();  // [TAG_PDL]
  constexpr int kE = kD / 32;
  __shared__ float head_buf[kWarpsPerBlock]
                           [kD];  // the normalized head, for the rotate-half partner
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  const int heads = a.num_q_heads + a.num_kv_heads;
  const int groups = (heads + heads_per_warp - 1) / heads_per_warp;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  const int64_t t = gw / groups;
  if (t >= a.num_tokens) return;
  const int h_begin = static_cast<int>(gw % groups) * heads_per_warp;
  const int h_end = min(heads, h_begin + heads_per_warp);
  const int half = a.rotary_dim / 2;
  const int pos = min(max(a.positions[t], 0), a.max_pos - 1);
  float cs[kE], sn[kE];
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    const int d = lane * kE + e;
    cs[e] = 1.f;
    sn[e] = 0.f;
    if (d < a.rotary_dim) {
      const int j = d < half ? d : d - half;
      // Hugging Face casts cos/sin to the activation dtype (bf16) before applying them.
      cs[e] = roundBf16(a.cos[static_cast<int64_t>(pos) * half + j]);
      sn[e] = roundBf16(a.sin[static_cast<int64_t>(pos) * half + j]);
    }
  }
  const int64_t row_elems = static_cast<int64_t>(heads + a.num_kv_heads) * kD;
  float* buf = head_buf[warp];
  for (int h = h_begin; h < h_end; ++h) {
    __nv_bfloat16* p = a.qkv + t * row_elems + static_cast<int64_t>(h) * kD + lane * kE;
    const __nv_bfloat16* w = h < a.num_q_heads ? a.q_weight : a.k_weight;
    float x[kE];
#pragma unroll
    for (int e = 0; e < kE; e += 2) {
      float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p + e));
      x[e] = f.x;
      x[e + 1] = f.y;
    }
    if (a.apply_norm) {
      float ss = 0.f;
#pragma unroll
      for (int e = 0; e < kE; ++e) ss += x[e] * x[e];
      ss = warpSum(ss);
      const float rstd = rsqrtf(ss / static_cast<float>(kD) + a.eps);
#pragma unroll
      for (int e = 0; e < kE; ++e)
        x[e] = roundBf16(roundBf16(x[e] * rstd) * __bfloat162float(w[lane * kE + e]));
    }
#pragma unroll
    for (int e = 0; e < kE; ++e) buf[lane * kE + e] = x[e];
    __syncwarp();
    float y[kE];
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      const int d = lane * kE + e;
      if (d < a.rotary_dim) {
        const float partner = d < half ? -buf[d + half] : buf[d - half];
        // q*cos + rotate_half(q)*sin, each product and the sum rounded to bf16 as in HF.
        y[e] = roundBf16(x[e] * cs[e]) + roundBf16(partner * sn[e]);
      } else {
        y[e] = x[e];
      }
    }
    __syncwarp();  // buf is rewritten by the next head
#pragma unroll
    for (int e = 0; e < kE; e += 2)
      *reinterpret_cast<__nv_bfloat162*>(p + e) = __floats2bfloat162_rn(y[e], y[e + 1]);
  }
}

}  // namespace

Status launchQkNormRope(const QkNormRopeArgs& a, cudaStream_t stream, bool pdl) {
  if (a.num_tokens == 0) return okStatus();
  if (a.head_dim != 64 && a.head_dim != 128)
    return invalidArgument("qk_norm_rope: head_dim must be 64 or 128");
  if (a.rotary_dim < 0 || a.rotary_dim % 2 != 0 || a.rotary_dim > a.head_dim)
    return invalidArgument("qk_norm_rope: rotary_dim must be even and <= head_dim");
  if (a.num_q_heads <= 0 || a.num_kv_heads <= 0)
    return invalidArgument("qk_norm_rope: head counts must be positive");
  if (a.rotary_dim > 0 && a.max_pos <= 0)
    return invalidArgument("qk_norm_rope: empty cos/sin table");
  if (reinterpret_cast<uintptr_t>(a.qkv) % 4 != 0)
    return invalidArgument("qk_norm_rope: qkv must be 4-byte aligned");
  const int heads = a.num_q_heads + a.num_kv_heads;
  // Decode-like (few tokens): one head per warp for parallelism. Prefill-like: 4 heads per warp,
  // cos/sin loads amortized over them.
  const bool few = a.num_tokens * heads < 64LL * smCount();
  const int hpw = few ? 1 : std::min(heads, 4);
  const int groups = (heads + hpw - 1) / hpw;
  const int64_t warps = a.num_tokens * groups;
  dim3 grid(static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock));
  dim3 block(kWarpsPerBlock * 32);
  if (a.head_dim == 128) {
    CUDA_RETURN_IF_ERROR(launchPdl(pdl, qkNormRopeKernel<128>, grid, block, 0, stream, a, hpw));
  } else {
    CUDA_RETURN_IF_ERROR(launchPdl(pdl, qkNormRopeKernel<64>, grid, block, 0, stream, a, hpw));
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
