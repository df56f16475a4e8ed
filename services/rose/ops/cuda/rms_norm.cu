#include <algorithm>

#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/fp8_dense.cuh"
#include "services/rose/ops/cuda/rms_norm.cuh"

namespace garden::rose::cuda {
namespace {

// [TAG_ATTN_F16] x and out may hold IEEE fp16 bits (RmsNormArgs::x_f16 / out_f16): a uniform
// branch per 8-value chunk.
__device__ __forceinline__ void loadX8(const bf16* p, bool f16, float (&v)[8]) {
  if (f16) {
    loadF32x8(reinterpret_cast<const cuda::f16*>(p), v);
  } else {
    loadF32x8(p, v);
  }
}
__device__ __forceinline__ void storeOut8(bf16* p, bool f16, const float (&v)[8]) {
  if (f16) {
    storeF32x8(reinterpret_cast<cuda::f16*>(p), v);
  } else {
    storeF32x8(p, v);
  }
}
// The 8 output values of chunk c of `row`: stored to out, or [TAG_EMBED_FP8] rounded as that
// store would and quantized with the other 15 chunks of their 128-input block (the half-warp).
__device__ __forceinline__ void storeRow8(const RmsNormArgs& a, int64_t row, int c, float (&v)[8]) {
  if (a.out_fp8 != nullptr) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = roundBf16(v[i]);
    fp8QuantizeHalfWarp(v, a.out_fp8 + row * a.hidden + c * 8, a.out_scales + (c / 16) * a.rows + row);
    return;
  }
  storeOut8(a.out + row * a.hidden + c * 8, a.out_f16, v);
}

// The normalized value rounded to the output type (Qwen3RMSNorm's intermediate rounding).
__device__ __forceinline__ float roundOut(float x, bool f16) {
  return f16 ? __half2float(__float2half_rn(x)) : roundBf16(x);
}

// v (8 values of x at element i) += the residual there, and the residual = the sum: bf16 stream
// rounded, f32 stream not; residual_init: the residual = x.
__device__ __forceinline__ void addResidual(const RmsNormArgs& a, int64_t i, float (&v)[8]) {
  if (a.residual_f32 != nullptr) {
    float4* p = reinterpret_cast<float4*>(a.residual_f32 + i);
    if (!a.residual_init) {
      const float4 r0 = p[0], r1 = p[1];
      v[0] += r0.x; v[1] += r0.y; v[2] += r0.z; v[3] += r0.w;
      v[4] += r1.x; v[5] += r1.y; v[6] += r1.z; v[7] += r1.w;
    }
    p[0] = make_float4(v[0], v[1], v[2], v[3]);
    p[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else if (a.residual != nullptr) {
    if (!a.residual_init) {
      float r[8];
      loadF32x8(a.residual + i, r);
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = roundBf16(v[k] + r[k]);
    }
    storeF32x8(a.residual + i, v);
  }
}

// The 8 values of row `row`'s chunk `c` of x: read, or the MoE combine (RmsNormArgs::combine_y)
// computed as moeCombineKernel does and rounded as its bf16 store would.
// kCombine is a template argument so that the plain kernels compile exactly as before.
template <bool kCombine>
__device__ __forceinline__ void loadX(const RmsNormArgs& a, int64_t row, int c, float (&v)[8]) {
  if constexpr (!kCombine) {
    if (a.x_f32) {  // an f32 x (the MoE output kept in f32)
      const float4* p = reinterpret_cast<const float4*>(reinterpret_cast<const float*>(a.x) +
                                                        row * a.hidden + c * 8);
      const float4 p0 = p[0], p1 = p[1];
      v[0] = p0.x; v[1] = p0.y; v[2] = p0.z; v[3] = p0.w;
      v[4] = p1.x; v[5] = p1.y; v[6] = p1.z; v[7] = p1.w;
      return;
    }
    loadX8(a.x + row * a.hidden + c * 8, a.x_f16, v);
    return;
  }
  float acc[8];
  if (a.combine_f16) {  // [TAG_ATTN_F16] fp16 expert rows, the combine rounded to fp16
    moeCombineChunk(reinterpret_cast<const cuda::f16*>(a.combine_y), a.combine_row_of,
                    a.combine_weights, a.combine_top_k, a.hidden, row, c, a.combine_scale, acc);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = a.combine_f32 ? acc[j] : roundOut(acc[j], true);
    return;
  }
  moeCombineChunk(a.combine_y, a.combine_row_of, a.combine_weights, a.combine_top_k, a.hidden,
                  row, c, a.combine_scale, acc);
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = a.combine_f32 ? acc[j] : roundBf16(acc[j]);
}

// blockDim = (tx threads per row, ty rows per block); tx is a multiple of 32 and depends only on
// hidden. Each thread keeps kChunks 8-wide chunks of its row in registers.
template <int kChunks, bool kCombine>
__global__ void rmsNormKernel(RmsNormArgs a) {
  pdlWait();                      // [TAG_PDL]
  pdlTrigger();                   // [TAG_PDL_GEMV] a programmatic GEMV may be scheduled
  extern __shared__ float red[];  // [ty][tx / 32] partial sums
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool active = row < a.rows;
  const int chunks = static_cast<int>(a.hidden / 8);
  const int64_t off = active ? row * a.hidden : 0;
  float v[kChunks][8];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (active && c < chunks) {
      loadX<kCombine>(a, row, c, v[k]);
      addResidual(a, off + c * 8, v[k]);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += v[k][i] * v[k][i];
    }
  }
  ss = warpSum(ss);
  const int nw = blockDim.x / 32;
  if (nw > 1) {
    if ((threadIdx.x & 31) == 0) red[threadIdx.y * nw + threadIdx.x / 32] = ss;
    __syncthreads();
    ss = 0.f;
    for (int w = 0; w < nw; ++w) ss += red[threadIdx.y * nw + w];
  }
  const float rstd = rsqrtf(ss / static_cast<float>(a.hidden) + a.eps);
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (active && c < chunks) {
      float w[8];
      loadF32x8(a.weight + c * 8, w);
#pragma unroll
      for (int i = 0; i < 8; ++i)
        v[k][i] = (a.round_normalized ? roundOut(v[k][i] * rstd, a.out_f16) : v[k][i] * rstd) * w[i];
      storeRow8(a, row, c, v[k]);
    }
  }
}

// Few rows (one row per block): the same arithmetic as rmsNormKernel with tx threads per row,
// spread over blockDim.y = chunk groups so each thread loads one 8-wide chunk (4x the loads in
// flight for hidden 1024). Thread (x, k) owns chunk x + k * tx; lane x of group 0 then sums the
// squares of its chunks k = 0, 1, ... in the order rmsNormKernel's thread x does, and the
// cross-lane / cross-warp reductions are the same, so every row's bits equal rmsNormKernel's.
template <bool kCombine>
__global__ void rmsNormSplitKernel(RmsNormArgs a) {
  pdlWait();                     // [TAG_PDL]
  pdlTrigger();                  // [TAG_PDL_GEMV]
  extern __shared__ float sm[];  // [groups][8][tx] values, then [tx / 32] warp sums, then rstd
  const int tx = blockDim.x, groups = blockDim.y;
  float* sv = sm;
  float* red = sm + static_cast<size_t>(groups) * 8 * tx;
  const int64_t off = static_cast<int64_t>(blockIdx.x) * a.hidden;
  const int chunks = static_cast<int>(a.hidden / 8);
  const int c = threadIdx.x + threadIdx.y * tx;
  float v[8], w[8];
  if (c < chunks) {
    loadF32x8(a.weight + c * 8, w);
    loadX<kCombine>(a, blockIdx.x, c, v);
    addResidual(a, off + c * 8, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) sv[(threadIdx.y * 8 + i) * tx + threadIdx.x] = v[i];
  }
  __syncthreads();
  const int nw = tx / 32;
  if (threadIdx.y == 0) {
    float ss = 0.f;
    for (int k = 0; k < groups; ++k) {
      if (threadIdx.x + k * tx < chunks) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float x = sv[(k * 8 + i) * tx + threadIdx.x];
          ss += x * x;
        }
      }
    }
    ss = warpSum(ss);
    if (nw > 1) {
      if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = ss;
    } else if (threadIdx.x == 0) {
      red[nw] = ss;
    }
  }
  __syncthreads();
  if (nw > 1 && threadIdx.y == 0 && threadIdx.x == 0) {
    float t = 0.f;
    for (int i = 0; i < nw; ++i) t += red[i];
    red[nw] = t;
  }
  if (nw > 1) __syncthreads();
  const float rstd = rsqrtf(red[nw] / static_cast<float>(a.hidden) + a.eps);
  if (c < chunks) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      v[i] = (a.round_normalized ? roundOut(v[i] * rstd, a.out_f16) : v[i] * rstd) * w[i];
    storeRow8(a, blockIdx.x, c, v);
  }
}

}  // namespace

Status launchRmsNorm(const RmsNormArgs& a, cudaStream_t stream, bool pdl) {
  if (a.rows == 0) return okStatus();
  if (a.residual != nullptr && a.residual_f32 != nullptr)
    return invalidArgument("rms_norm: a bf16 and an f32 residual at once");
  if ((a.x_f16 || a.x_f32) && a.residual != nullptr)
    return invalidArgument("rms_norm: an fp16 or f32 x needs the f32 residual (or none)");
  if ((a.combine_y == nullptr) == (a.x == nullptr))
    return invalidArgument("rms_norm: exactly one of x and the MoE combine");
  if (a.combine_y != nullptr &&
      (a.combine_row_of == nullptr || a.combine_weights == nullptr || a.combine_top_k <= 0 ||
       a.residual_init || (reinterpret_cast<uintptr_t>(a.combine_y) % 16) != 0))
    return invalidArgument("rms_norm: the MoE combine needs row_of, weights, top_k > 0, a "
                           "16-byte aligned y and no residual_init");
  if (a.hidden <= 0 || a.hidden % 8 != 0 || a.hidden > 32768)
    return invalidArgument("rms_norm: hidden must be a multiple of 8 in [8, 32768]");
  if ((reinterpret_cast<uintptr_t>(a.x) | reinterpret_cast<uintptr_t>(a.out) |
       reinterpret_cast<uintptr_t>(a.weight) | reinterpret_cast<uintptr_t>(a.residual) |
       reinterpret_cast<uintptr_t>(a.residual_f32)) %
          16 !=
      0)
    return invalidArgument("rms_norm: pointers must be 16-byte aligned");
  if (a.out_fp8 != nullptr &&
      (a.out_scales == nullptr || a.hidden % 128 != 0 || a.out_f16 || a.x_f16 || a.x_f32 ||
       (reinterpret_cast<uintptr_t>(a.out_fp8) | reinterpret_cast<uintptr_t>(a.out_scales)) % 16 != 0))
    return invalidArgument("rms_norm: an fp8 output needs scales, bf16 x, hidden a multiple of "
                           "128 and 16-byte aligned pointers");
  const bool combine = a.combine_y != nullptr;  // [TAG_COMBINE_NORM]
  const int chunks = static_cast<int>(a.hidden / 8);
  // Threads per row from hidden alone (batch invariance): up to 4 chunks per thread, at most
  // 1024 threads. hidden 1024 -> 32 threads x 4 chunks (one warp per row).
  int tx = std::max(32, ((chunks + 3) / 4 + 31) / 32 * 32);
  tx = std::min(tx, 1024);
  const int per_thread = (chunks + tx - 1) / tx;
  // Decode-like: one row per block. Prefill-like: fill 128..256-thread blocks with rows.
  const bool few = a.rows < 4 * smCount();
  // Programmatic in graphs too with pdl_graph [TAG_PDL_GRAPH], else for eager launches per `pdl`.
  auto launch = [&](void (*kernel)(RmsNormArgs), dim3 grid, dim3 block, size_t smem) {
    return a.pdl_graph ? launchPdlAlways(true, kernel, grid, block, smem, stream, a)
                       : launchPdl(pdl, kernel, grid, block, smem, stream, a);
  };
  if (few && per_thread > 1 && tx * per_thread <= 1024) {
    // One row per block, one chunk per thread (same bits, see rmsNormSplitKernel).
    const size_t smem = sizeof(float) * (static_cast<size_t>(per_thread) * 8 * tx + tx / 32 + 1);
    auto kernel = combine ? rmsNormSplitKernel<true> : rmsNormSplitKernel<false>;
    CUDA_RETURN_IF_ERROR(
        launch(kernel, dim3(static_cast<unsigned>(a.rows)), dim3(tx, per_thread), smem));
    return okStatus();
  }
  const int ty = few ? 1 : std::max(1, 128 / tx);
  dim3 block(tx, ty);
  dim3 grid(static_cast<unsigned>((a.rows + ty - 1) / ty));
  const size_t smem = sizeof(float) * static_cast<size_t>(ty * (tx / 32));
  void (*kernel)(RmsNormArgs) = nullptr;
  switch (per_thread) {
    case 1: kernel = combine ? rmsNormKernel<1, true> : rmsNormKernel<1, false>; break;
    case 2: kernel = combine ? rmsNormKernel<2, true> : rmsNormKernel<2, false>; break;
    case 3: kernel = combine ? rmsNormKernel<3, true> : rmsNormKernel<3, false>; break;
    case 4: kernel = combine ? rmsNormKernel<4, true> : rmsNormKernel<4, false>; break;
    default: return invalidArgument("rms_norm: unsupported hidden size");
  }
  CUDA_RETURN_IF_ERROR(launch(kernel, grid, block, smem));
  return okStatus();
}

}  // namespace garden::rose::cuda
