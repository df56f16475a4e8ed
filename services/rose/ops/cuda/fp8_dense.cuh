#pragma once
// [TAG_EMBED_FP8] FP8 e4m3 operands of the dense linear layers (the Qwen3 path's `--weights
// fp8`), in cuBLASLt's Hopper block-scaling layouts (fp8_block.h) with K a multiple of 128:
//   weights  W [N][K] -> codes [N][K], one f32 scale per 128 x 128 block: [ceil(N/128)][L4]
//            (BLK128x128_32F; L = K/128 blocks, the stride L4 = L rounded up to 4, the padding 0);
//   activations X [M][K] -> codes [M][K], one f32 scale per (row, 128 inputs): [L][M], the row
//            fastest (VEC128_32F; M a multiple of 4 for the GEMM, 16-byte aligned scale rows).
// Each block (the 128 x 128 weight block, or a row's 128 inputs): amax = max |v|, scale =
// amax / 448 and q = e4m3_rn_satfinite(v * (448 / amax)), both quotients f32 and correctly
// rounded; an all-zero block has scale 1 and codes 0 (fp8_block.h's fp8BlockScale, the MoE
// activations' rule). tests/gpu/fp8_dense_test.cc compares the bits with a host computation.
// The fused producers (RMSNorm's and SwiGLU's fp8 outputs) use fp8QuantizeHalfWarp below.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

#include "services/rose/ops/cuda/fp8_block.h"

#if defined(__CUDACC__)
#include <cuda_fp8.h>
#endif

namespace garden::rose::cuda {

struct Fp8WeightQuantArgs {
  const __nv_bfloat16* w = nullptr;  // [n, k]
  uint8_t* codes = nullptr;          // [n, k]
  float* scales = nullptr;           // [ceil(n / 128), fp8KBlocks4(k)]
  int64_t n = 0;
  int64_t k = 0;  // a positive multiple of 128
};
Status launchFp8WeightQuant(const Fp8WeightQuantArgs& a, cudaStream_t stream);

struct Fp8RowQuantArgs {
  const __nv_bfloat16* x = nullptr;  // [rows, k]
  uint8_t* codes = nullptr;          // [rows, k]
  float* scales = nullptr;           // [k / 128, rows]
  int64_t rows = 0;
  int64_t k = 0;  // a positive multiple of 128; pointers 16-byte aligned
};
Status launchFp8RowQuant(const Fp8RowQuantArgs& a, cudaStream_t stream, bool pdl = true);

#if defined(__CUDACC__)
// One value times `inv` (fp8BlockScale's multiplier), rounded to e4m3: nearest even, saturating.
__device__ __forceinline__ uint32_t fp8Code(float v, float inv) {
  return __nv_cvt_float_to_fp8(__fmul_rn(v, inv), __NV_SATFINITE, __NV_E4M3);
}

// 8 values as fp8Code, packed in order.
__device__ __forceinline__ uint2 fp8Pack8(const float (&v)[8], float inv) {
  uint32_t w[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 8; ++i) w[i / 4] |= fp8Code(v[i], inv) << (8 * (i % 4));
  return make_uint2(w[0], w[1]);
}

// One 128-input block of a row held by the 16 lanes of a half-warp, 8 consecutive values per lane
// (lane l of the half: inputs 8l .. 8l+7 of the block). Every lane of the half-warp must call it
// together. Writes this lane's 8 codes to q (8-byte aligned) and, from the half's first lane, the
// block's scale to *scale.
__device__ __forceinline__ void fp8QuantizeHalfWarp(const float (&v)[8], uint8_t* q, float* scale) {
  const unsigned lane = threadIdx.x & 31u;  // blockDim.x is a multiple of 32 where this is used
  const unsigned mask = 0xFFFFu << (lane & 16u);
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(mask, amax, o));
  float inv;
  const float s = fp8BlockScale(amax, &inv);
  *reinterpret_cast<uint2*>(q) = fp8Pack8(v, inv);
  if ((lane & 15u) == 0) *scale = s;
}
#endif

}  // namespace garden::rose::cuda
