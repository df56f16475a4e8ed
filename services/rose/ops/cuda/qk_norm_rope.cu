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

// [TAG_QK_ROPE_PAIR] Full rotary (rotary_dim == head_dim): lane l holds the kP dims
// [l*kP, l*kP + kP) of the head's first half and the same dims + kD/2 of the second, so the
// rotate-half partner of every value is in the same thread (no shared-memory round trip, no
// sync). A warp handles kH heads of one token: all of their loads are issued before the first
// reduction, and the kH shuffle reductions are independent chains (the legacy kernel above
// does one head at a time: load, reduce, store). cos/sin (one kP-wide load each, the same j for
// both halves) and both norm weights are read once per warp. Rounding as the legacy kernel;
// only the order of the sum of squares differs (within a lane: first half then second; then
// the same butterfly), so values can differ from it by one bf16 ulp.
template <int kD, int kH>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    qkNormRopePairKernel(QkNormRopeArgs a) {
  pdlWait();  // [TAG_PDL]
  constexpr int kHalf = kD / 2;
  constexpr int kP = kHalf / 32;  // 2 for head_dim 128, 1 for 64
  const int lane = threadIdx.x & 31;
  const int heads = a.num_q_heads + a.num_kv_heads;
  const int groups = (heads + kH - 1) / kH;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int64_t t = gw / groups;
  if (t >= a.num_tokens) return;
  const int h0 = static_cast<int>(gw - t * groups) * kH;
  const int64_t row_elems = static_cast<int64_t>(heads + a.num_kv_heads) * kD;
  __nv_bfloat16* base = a.qkv + t * row_elems + static_cast<int64_t>(h0) * kD + lane * kP;
  // Loads first: every head's two halves, then the table and the weights.
  float lo[kH][kP], hi[kH][kP];
#pragma unroll
  for (int i = 0; i < kH; ++i) {
    if (h0 + i < heads) {
      const __nv_bfloat16* p = base + i * kD;
      if constexpr (kP == 2) {
        const float2 l2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
        const float2 h2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p + kHalf));
        lo[i][0] = l2.x;
        lo[i][1] = l2.y;
        hi[i][0] = h2.x;
        hi[i][1] = h2.y;
      } else {
        lo[i][0] = __bfloat162float(p[0]);
        hi[i][0] = __bfloat162float(p[kHalf]);
      }
    } else {
#pragma unroll
      for (int e = 0; e < kP; ++e) lo[i][e] = hi[i][e] = 0.f;
    }
  }
  const int pos = min(max(a.positions[t], 0), a.max_pos - 1);
  const int64_t tab = static_cast<int64_t>(pos) * kHalf + lane * kP;
  float cs[kP], sn[kP];
#pragma unroll
  for (int e = 0; e < kP; ++e) {
    // Hugging Face casts cos/sin to the activation dtype (bf16) before applying them.
    cs[e] = roundBf16(a.cos[tab + e]);
    sn[e] = roundBf16(a.sin[tab + e]);
  }
  if (a.apply_norm) {
    float wq_lo[kP], wq_hi[kP], wk_lo[kP], wk_hi[kP];
#pragma unroll
    for (int e = 0; e < kP; ++e) {
      wq_lo[e] = __bfloat162float(a.q_weight[lane * kP + e]);
      wq_hi[e] = __bfloat162float(a.q_weight[kHalf + lane * kP + e]);
      wk_lo[e] = __bfloat162float(a.k_weight[lane * kP + e]);
      wk_hi[e] = __bfloat162float(a.k_weight[kHalf + lane * kP + e]);
    }
    float ss[kH];
#pragma unroll
    for (int i = 0; i < kH; ++i) {
      ss[i] = 0.f;
#pragma unroll
      for (int e = 0; e < kP; ++e) ss[i] += lo[i][e] * lo[i][e];
#pragma unroll
      for (int e = 0; e < kP; ++e) ss[i] += hi[i][e] * hi[i][e];
    }
    // kH independent butterflies, interleaved level by level.
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
      for (int i = 0; i < kH; ++i) ss[i] += __shfl_xor_sync(0xffffffffu, ss[i], o);
    }
#pragma unroll
    for (int i = 0; i < kH; ++i) {
      const float rstd = rsqrtf(ss[i] / static_cast<float>(kD) + a.eps);
      const bool q = h0 + i < a.num_q_heads;
#pragma unroll
      for (int e = 0; e < kP; ++e) {
        lo[i][e] = roundBf16(roundBf16(lo[i][e] * rstd) * (q ? wq_lo[e] : wk_lo[e]));
        hi[i][e] = roundBf16(roundBf16(hi[i][e] * rstd) * (q ? wq_hi[e] : wk_hi[e]));
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kH; ++i) {
    if (h0 + i < heads) {
      float yl[kP], yh[kP];
#pragma unroll
      for (int e = 0; e < kP; ++e) {
        // q*cos + rotate_half(q)*sin, each product and the sum rounded to bf16 as in HF.
        yl[e] = roundBf16(lo[i][e] * cs[e]) + roundBf16(-hi[i][e] * sn[e]);
        yh[e] = roundBf16(hi[i][e] * cs[e]) + roundBf16(lo[i][e] * sn[e]);
      }
      __nv_bfloat16* p = base + i * kD;
      if constexpr (kP == 2) {
        *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(yl[0], yl[1]);
        *reinterpret_cast<__nv_bfloat162*>(p + kHalf) = __floats2bfloat162_rn(yh[0], yh[1]);
      } else {
        p[0] = __float2bfloat16(yl[0]);
        p[kHalf] = __float2bfloat16(yh[0]);
      }
    }
  }
}

template <int kD>
cudaError_t launchPair(const QkNormRopeArgs& a, int hpw, cudaStream_t stream, bool pdl) {
  const int heads = a.num_q_heads + a.num_kv_heads;
  const int64_t warps = a.num_tokens * ((heads + hpw - 1) / hpw);
  dim3 grid(static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock));
  dim3 block(kWarpsPerBlock * 32);
  switch (hpw) {
    case 1: return launchPdl(pdl, qkNormRopePairKernel<kD, 1>, grid, block, 0, stream, a);
    case 2: return launchPdl(pdl, qkNormRopePairKernel<kD, 2>, grid, block, 0, stream, a);
    case 4: return launchPdl(pdl, qkNormRopePairKernel<kD, 4>, grid, block, 0, stream, a);
    default: return launchPdl(pdl, qkNormRopePairKernel<kD, 8>, grid, block, 0, stream, a);
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
  if (a.variant < -1 || a.variant == 3 || (a.variant > 4 && a.variant != 8))
    return invalidArgument("qk_norm_rope: variant must be -1 (legacy), 0 (auto), 1, 2, 4 or 8");
  const int heads = a.num_q_heads + a.num_kv_heads;
  // [TAG_QK_ROPE_PAIR] full rotary takes the pair kernel unless the legacy one is asked for.
  if (a.variant >= 0 && a.rotary_dim == a.head_dim) {
    int hpw = a.variant;
    if (hpw == 0) hpw = a.num_tokens * heads < 128LL * smCount() ? 2 : 8;
    CUDA_RETURN_IF_ERROR(a.head_dim == 128 ? launchPair<128>(a, hpw, stream, pdl)
                                           : launchPair<64>(a, hpw, stream, pdl));
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
