#include <cuda_fp8.h>

#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/fp8_block.h"
#include "services/rose/ops/cuda/fp8_requant.cuh"

namespace garden::rose::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kGroupsPerBlock = kFp8Block / 32;                 // 4 MXFP4 groups per 128 inputs
constexpr int kPairs = kFp8Block * kGroupsPerBlock;             // (row, group) pairs: 512
constexpr int kPairsPerThread = kPairs / kThreads;              // 2

// |E2M1 value| of a magnitude code 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
__device__ __forceinline__ float e2m1Magnitude(uint32_t mag) {
  const uint32_t e = mag >> 1, m = mag & 1u;
  return e == 0 ? 0.5f * static_cast<float>(m) : ldexpf(1.f + 0.5f * static_cast<float>(m), static_cast<int>(e) - 1);
}

__device__ __forceinline__ unsigned long long warpSumU64(unsigned long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void __launch_bounds__(kThreads) fp8RequantKernel(Fp8RequantArgs a) {
  const int b = blockIdx.x;   // K block
  const int p = blockIdx.y;   // row block
  const int64_t el = blockIdx.z;  // expert inside this batch
  const int64_t e = a.first + el;
  const int64_t groups = a.k / 32;
  const int64_t kp = fp8PaddedK(a.k);
  const int tid = threadIdx.x;
  __shared__ int s_max[kThreads / 32];
  __shared__ unsigned long long s_cnt[2][kThreads / 32];

  uint4 codes[kPairsPerThread];
  int sc[kPairsPerThread];
  bool live[kPairsPerThread];
  int local_max = kFp8NoWeight;
#pragma unroll
  for (int i = 0; i < kPairsPerThread; ++i) {
    const int pair = tid + i * kThreads;
    const int64_t row = static_cast<int64_t>(p) * kFp8Block + pair / kGroupsPerBlock;
    const int64_t g = static_cast<int64_t>(b) * kGroupsPerBlock + pair % kGroupsPerBlock;
    live[i] = row < a.n && g < groups;
    codes[i] = make_uint4(0, 0, 0, 0);
    sc[i] = 127;
    if (live[i]) {
      const int64_t at = (el * a.n + row) * groups + g;
      codes[i] = *reinterpret_cast<const uint4*>(a.src_codes + at * 16);
      sc[i] = a.src_scales[at];
      uint32_t mx = 0;
      const uint32_t w[4] = {codes[i].x, codes[i].y, codes[i].z, codes[i].w};
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int nib = 0; nib < 8; ++nib) mx = max(mx, (w[j] >> (4 * nib)) & 7u);
      if (mx != 0) local_max = max(local_max, e2m1Log2(mx) + sc[i] - 127);
    }
  }
  local_max = __reduce_max_sync(0xffffffffu, local_max);
  if ((tid & 31) == 0) s_max[tid / 32] = local_max;
  __syncthreads();
  int block_max = kFp8NoWeight;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) block_max = max(block_max, s_max[w]);
  const int ex = block_max == kFp8NoWeight ? 0 : fp8BlockExponent(block_max);

  unsigned long long inexact = 0, nonzero = 0;
#pragma unroll
  for (int i = 0; i < kPairsPerThread; ++i) {
    const int pair = tid + i * kThreads;
    const int64_t row = static_cast<int64_t>(p) * kFp8Block + pair / kGroupsPerBlock;
    const int64_t g = static_cast<int64_t>(b) * kGroupsPerBlock + pair % kGroupsPerBlock;
    if (row >= a.n || g * 32 >= kp) continue;
    uint32_t out[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (live[i]) {
      const uint32_t w[4] = {codes[i].x, codes[i].y, codes[i].z, codes[i].w};
      const int shift = sc[i] - 127 - ex;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const uint32_t nib = (w[j / 8] >> (4 * (j % 8))) & 15u;
        const uint32_t mag = nib & 7u;
        float v = ldexpf(e2m1Magnitude(mag), shift);
        if (nib & 8u) v = -v;
        const uint32_t q = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
        if (mag != 0) {
          ++nonzero;
          if (v == 0.f || fp8E4m3ToFloat(static_cast<uint8_t>(q)) != v) ++inexact;
        }
        out[j / 4] |= q << (8 * (j % 4));
      }
    }
    uint4* dst = reinterpret_cast<uint4*>(a.q + (e * a.n + row) * kp + g * 32);
    dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
    dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
  }
  inexact = warpSumU64(inexact);
  nonzero = warpSumU64(nonzero);
  if ((tid & 31) == 0) {
    s_cnt[0][tid / 32] = inexact;
    s_cnt[1][tid / 32] = nonzero;
  }
  __syncthreads();
  if (tid == 0) {
    unsigned long long ti = 0, tn = 0;
    for (int w = 0; w < kThreads / 32; ++w) {
      ti += s_cnt[0][w];
      tn += s_cnt[1][w];
    }
    if (ti != 0) atomicAdd(a.inexact, ti);
    if (tn != 0) atomicAdd(a.nonzero, tn);
    float* s = a.scales + e * fp8WeightScalesPerExpert(a.n, a.k);
    s[fp8WeightScaleIndex(a.k, p, b)] = ldexpf(1.f, ex);
    if (b == static_cast<int>(fp8KBlocks(a.k)) - 1) {
      for (int64_t x = b + 1; x < fp8KBlocks4(a.k); ++x) s[fp8WeightScaleIndex(a.k, p, x)] = 0.f;
    }
  }
}

}  // namespace

Status launchFp8Requant(const Fp8RequantArgs& a, cudaStream_t stream) {
  if (a.n <= 0 || a.k <= 0 || a.k % 32 != 0)
    return invalidArgument("fp8_requant: n must be positive and k a positive multiple of 32");
  if (a.first < 0 || a.count < 0 || a.first + a.count > a.experts)
    return invalidArgument("fp8_requant: expert range outside the weight");
  if (a.count == 0) return okStatus();
  if (reinterpret_cast<uintptr_t>(a.src_codes) % 16 != 0 || reinterpret_cast<uintptr_t>(a.q) % 16 != 0)
    return invalidArgument("fp8_requant: codes must be 16-byte aligned");
  if (a.count > 65535 || fp8RowBlocks(a.n) > 65535)
    return invalidArgument("fp8_requant: too many experts or rows for one launch");
  const dim3 grid(static_cast<unsigned>(fp8KBlocks(a.k)), static_cast<unsigned>(fp8RowBlocks(a.n)),
                  static_cast<unsigned>(a.count));
  fp8RequantKernel<<<grid, kThreads, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
