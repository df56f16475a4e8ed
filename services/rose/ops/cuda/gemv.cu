#include "services/rose/ops/cuda/gemv.cuh"

#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"

namespace garden::rose::cuda {
namespace {

constexpr int kWarps = 8;

__device__ __forceinline__ float bf16Lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16Hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

// acc += the 8 products of one 16-byte chunk, in element order.
__device__ __forceinline__ float dot8(const uint4& w, const uint4& x, float acc) {
  acc = fmaf(bf16Lo(w.x), bf16Lo(x.x), acc);
  acc = fmaf(bf16Hi(w.x), bf16Hi(x.x), acc);
  acc = fmaf(bf16Lo(w.y), bf16Lo(x.y), acc);
  acc = fmaf(bf16Hi(w.y), bf16Hi(x.y), acc);
  acc = fmaf(bf16Lo(w.z), bf16Lo(x.z), acc);
  acc = fmaf(bf16Hi(w.z), bf16Hi(x.z), acc);
  acc = fmaf(bf16Lo(w.w), bf16Lo(x.w), acc);
  acc = fmaf(bf16Hi(w.w), bf16Hi(x.w), acc);
  return acc;
}

// kM: token rows the sums are sized for (a.m <= kM; rows past a.m are neither read nor stored).
template <int kM, int kR, int kU>
__global__ void __launch_bounds__(kWarps * 32) gemvKernel(GemvArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32) * kR;
  if (n0 >= a.n) return;  // warp-uniform
  pdlWait();  // [TAG_PDL_GEMV] x is the previous kernel's output (a no-op for a plain launch)
  pdlTrigger();
  const int64_t chunks = a.k / 8;
  const uint4* w = reinterpret_cast<const uint4*>(a.w);
  const uint4* x = reinterpret_cast<const uint4*>(a.x);
  float acc[kR][kM];
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int m = 0; m < kM; ++m) acc[r][m] = 0.f;
  for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kU) {
    uint4 wv[kU][kR];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t c = c0 + 32 * u;
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        wv[u][r] = c < chunks && n0 + r < a.n ? __ldg(w + (n0 + r) * chunks + c)
                                              : make_uint4(0u, 0u, 0u, 0u);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t c = c0 + 32 * u;
      if (c >= chunks) break;  // the lane's chunks end here (the others' may not)
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        if (m >= a.m) break;
        const uint4 xv = __ldg(x + m * chunks + c);
#pragma unroll
        for (int r = 0; r < kR; ++r) acc[r][m] = dot8(wv[u][r], xv, acc[r][m]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kR; ++r) {
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      acc[r][m] = v;
    }
  }
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const int64_t n = n0 + r;
    if (n >= a.n) break;
    const float b = a.bias != nullptr ? __bfloat162float(a.bias[n]) : 0.f;
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      if (m >= a.m) break;
      a.y[m * a.n + n] = __float2bfloat16(acc[r][m] + b);
    }
  }
}

template <int kM, int kR, int kU>
Status launchShape(const GemvArgs& a, cudaStream_t stream) {
  const int64_t warps = (a.n + kR - 1) / kR;
  const dim3 grid(static_cast<unsigned>((warps + kWarps - 1) / kWarps));
  CUDA_RETURN_IF_ERROR(
      launchPdlAlways(a.pdl, gemvKernel<kM, kR, kU>, grid, dim3(kWarps * 32), 0, stream, a));
  return okStatus();
}

// The shapes gemvShapes() lists for M = 8 at every M, and those it lists for M <= 4 up to 4: a
// bucket's shape also runs at smaller M (the tuner's M/2 bit check runs it at half its M).
template <int kM>
Status launchM(const GemvArgs& a, cudaStream_t stream) {
  if (a.rows == 2 && a.unroll == 4) return launchShape<kM, 2, 4>(a, stream);
  if (a.rows == 4 && a.unroll == 2) return launchShape<kM, 4, 2>(a, stream);
  if (a.rows == 2 && a.unroll == 2) return launchShape<kM, 2, 2>(a, stream);
  if constexpr (kM <= 4) {
    if (a.rows == 4 && a.unroll == 4) return launchShape<kM, 4, 4>(a, stream);
    if (a.rows == 8 && a.unroll == 2) return launchShape<kM, 8, 2>(a, stream);
  }
  return invalidArgument("gemv: unsupported (rows, unroll) for this M");
}

}  // namespace

int gemvShapes(int64_t m, GemvShape (&out)[4]) {
  if (m <= 4) {
    out[0] = {4, 2};
    out[1] = {4, 4};
    out[2] = {8, 2};
    out[3] = {2, 4};
    return 4;
  }
  out[0] = {2, 2};
  out[1] = {4, 2};
  out[2] = {2, 4};
  return 3;
}

bool gemvSupported(int64_t m, int64_t n, int64_t k, int rows, int unroll) {
  if (m < 1 || m > kGemvMaxRows || n < 1 || k < 8 || k % 8 != 0) return false;
  // launchM's shapes: those of M = 8 at every M, those of M <= 4 up to 4.
  for (int64_t mm : {int64_t{8}, int64_t{4}}) {
    if (mm == 4 && m > 4) break;
    GemvShape s[4];
    const int count = gemvShapes(mm, s);
    for (int i = 0; i < count; ++i) {
      if (s[i].rows == rows && s[i].unroll == unroll) return true;
    }
  }
  return false;
}

Status launchGemv(const GemvArgs& a, cudaStream_t stream) {
  if (!gemvSupported(a.m, a.n, a.k, a.rows, a.unroll))
    return invalidArgument("gemv: needs 1 <= m <= 8, k % 8 == 0 and a listed (rows, unroll)");
  if (reinterpret_cast<uintptr_t>(a.x) % 16 != 0 || reinterpret_cast<uintptr_t>(a.w) % 16 != 0)
    return invalidArgument("gemv: x and w must be 16-byte aligned");
  if (a.m <= 1) return launchM<1>(a, stream);
  if (a.m <= 2) return launchM<2>(a, stream);
  if (a.m <= 4) return launchM<4>(a, stream);
  return launchM<8>(a, stream);
}

}  // namespace garden::rose::cuda
