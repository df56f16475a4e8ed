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

// [TAG_QK_ROPE_VEC] The same arithmetic with 16-byte accesses: kL = head_dim / 8 lanes hold one
// head (8 consecutive dims each), so a warp works on 32 / kL heads at once, and all kIters passes of
// a warp's heads are loaded before any is computed (more bytes in flight per warp: the warp kernel
// above keeps one 8-byte load per lane and reaches ~46 % of HBM bandwidth at 8k tokens). Full
// rotary only (rotary_dim == head_dim) or none: the rotate-half partner of dim d (d +- D/2) sits
// kL / 2 lanes away, one shuffle instead of the shared-memory round trip. A head's sum of squares
// is each lane's 8 squares in order, then a butterfly over its kL lanes: the same for every token
// count, so a row's bits never depend on the batch.
template <int kD, int kIters>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    qkNormRopeVecKernel(QkNormRopeArgs a) {
  pdlWait();  // [TAG_PDL]
  constexpr int kL = kD / 8;          // lanes per head
  constexpr int kAtOnce = 32 / kL;    // heads a warp computes side by side
  constexpr int kPerWarp = kAtOnce * kIters;
  const int lane = threadIdx.x & 31;
  const int sub = lane / kL;          // which of the kAtOnce heads
  const int hl = lane % kL;           // lane within the head: dims [hl * 8, hl * 8 + 8)
  const int heads = a.num_q_heads + a.num_kv_heads;
  const int groups = (heads + kPerWarp - 1) / kPerWarp;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int64_t t = gw / groups;
  if (t >= a.num_tokens) return;
  const int h0 = static_cast<int>(gw % groups) * kPerWarp;
  const int64_t row_elems = static_cast<int64_t>(heads + a.num_kv_heads) * kD;
  __nv_bfloat16* row = a.qkv + t * row_elems + hl * 8;
  float x[kIters][8];
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int h = h0 + it * kAtOnce + sub;
    if (h < heads) loadF32x8(row + static_cast<int64_t>(h) * kD, x[it]);
  }
  constexpr int kHalf = kD / 2;
  float cs[8], sn[8];
  if (a.rotary_dim > 0) {
    const int pos = min(max(a.positions[t], 0), a.max_pos - 1);
    const int j = (hl * 8) % kHalf;
    const float4* c4 = reinterpret_cast<const float4*>(a.cos + static_cast<int64_t>(pos) * kHalf + j);
    const float4* s4 = reinterpret_cast<const float4*>(a.sin + static_cast<int64_t>(pos) * kHalf + j);
    const float4 c0 = c4[0], c1 = c4[1], s0 = s4[0], s1 = s4[1];
    // Hugging Face casts cos/sin to the activation dtype (bf16) before applying them.
    cs[0] = roundBf16(c0.x); cs[1] = roundBf16(c0.y); cs[2] = roundBf16(c0.z); cs[3] = roundBf16(c0.w);
    cs[4] = roundBf16(c1.x); cs[5] = roundBf16(c1.y); cs[6] = roundBf16(c1.z); cs[7] = roundBf16(c1.w);
    sn[0] = roundBf16(s0.x); sn[1] = roundBf16(s0.y); sn[2] = roundBf16(s0.z); sn[3] = roundBf16(s0.w);
    sn[4] = roundBf16(s1.x); sn[5] = roundBf16(s1.y); sn[6] = roundBf16(s1.z); sn[7] = roundBf16(s1.w);
  }
  const bool low = hl < kL / 2;  // dims < D/2: the partner is +D/2 and enters negated
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int h = h0 + it * kAtOnce + sub;
    // Every lane takes part in the shuffles, those past the last head with zeros.
    if (h >= heads) {
#pragma unroll
      for (int e = 0; e < 8; ++e) x[it][e] = 0.f;
    }
    if (a.apply_norm) {
      float ss = 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += x[it][e] * x[it][e];
#pragma unroll
      for (int o = kL / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      const float rstd = rsqrtf(ss / static_cast<float>(kD) + a.eps);
      float w[8];
      loadF32x8((h < a.num_q_heads ? a.q_weight : a.k_weight) + hl * 8, w);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[it][e] = roundBf16(roundBf16(x[it][e] * rstd) * w[e]);
    }
    if (a.rotary_dim > 0) {
      float y[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float other = __shfl_xor_sync(0xffffffffu, x[it][e], kL / 2);
        const float partner = low ? -other : other;
        // q*cos + rotate_half(q)*sin, each product and the sum rounded to bf16 as in HF.
        y[e] = roundBf16(x[it][e] * cs[e]) + roundBf16(partner * sn[e]);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) x[it][e] = y[e];
    }
    if (h < heads) storeF32x8(row + static_cast<int64_t>(h) * kD, x[it]);
  }
}

}  // namespace

bool qkNormRopeVectorized(const QkNormRopeArgs& a) {
  return a.vectorized && (a.rotary_dim == 0 || a.rotary_dim == a.head_dim) &&
         reinterpret_cast<uintptr_t>(a.qkv) % 16 == 0 &&
         (a.rotary_dim == 0 || (reinterpret_cast<uintptr_t>(a.cos) % 16 == 0 &&
                                reinterpret_cast<uintptr_t>(a.sin) % 16 == 0)) &&
         (!a.apply_norm || (reinterpret_cast<uintptr_t>(a.q_weight) % 16 == 0 &&
                            reinterpret_cast<uintptr_t>(a.k_weight) % 16 == 0));
}

Status launchQkNormRope(const QkNormRopeArgs& a, cudaStream_t stream, bool pdl) {
  if (a.num_tokens == 0) return okStatus();
  if (a.head_dim != 64 && a.head_dim != 128)
    return invalidArgument("qk_norm_rope: head_dim must be 64 or 128");
  if (a.rotary_dim < 0 || a.rotary_dim % 2 != 0 || a.rotary_dim > a.head_dim)
    return invalidArgument("qk_norm_rope: rotary_dim must be even and <= head_dim");
  if (a.vec_iters < 0 || a.vec_iters > 3)
    return invalidArgument("qk_norm_rope: vec_iters must be 0 (auto) or 1..3");
  if (a.num_q_heads <= 0 || a.num_kv_heads <= 0)
    return invalidArgument("qk_norm_rope: head counts must be positive");
  if (a.rotary_dim > 0 && a.max_pos <= 0)
    return invalidArgument("qk_norm_rope: empty cos/sin table");
  if (reinterpret_cast<uintptr_t>(a.qkv) % 4 != 0)
    return invalidArgument("qk_norm_rope: qkv must be 4-byte aligned");
  const int heads = a.num_q_heads + a.num_kv_heads;
  if (qkNormRopeVectorized(a)) {
    // Few tokens: one pass per warp (the most warps); otherwise two, their loads issued together.
    const bool few = a.num_tokens * heads < 64LL * smCount();
    const int iters = a.vec_iters > 0 ? a.vec_iters : few ? 1 : 2;
    const int at_once = 32 / (a.head_dim / 8);
    const int per_warp = at_once * iters;
    const int64_t warps = a.num_tokens * ((heads + per_warp - 1) / per_warp);
    dim3 grid(static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock));
    dim3 block(kWarpsPerBlock * 32);
    if (a.head_dim == 128) {
      CUDA_RETURN_IF_ERROR(
          iters == 1   ? launchPdl(pdl, qkNormRopeVecKernel<128, 1>, grid, block, 0, stream, a)
          : iters == 2 ? launchPdl(pdl, qkNormRopeVecKernel<128, 2>, grid, block, 0, stream, a)
                       : launchPdl(pdl, qkNormRopeVecKernel<128, 3>, grid, block, 0, stream, a));
    } else {
      CUDA_RETURN_IF_ERROR(
          iters == 1   ? launchPdl(pdl, qkNormRopeVecKernel<64, 1>, grid, block, 0, stream, a)
          : iters == 2 ? launchPdl(pdl, qkNormRopeVecKernel<64, 2>, grid, block, 0, stream, a)
                       : launchPdl(pdl, qkNormRopeVecKernel<64, 3>, grid, block, 0, stream, a));
    }
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return okStatus();
  }
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
