#pragma once
// Device-side helpers shared by rose's CUDA kernels (include only from .cu files): 16-byte bf16
// vectors converted to/from float, warp reductions, and the raw PTX wrappers (cp.async, ldmatrix,
// mma.sync m16n8k16 bf16) the attention kernel uses. Stateless; owns nothing.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "services/rose/ops/cuda/cuda_utils.h"

namespace garden::rose::cuda {

using bf16 = __nv_bfloat16;
using f16 = __half;

// Programmatic dependent launch [TAG_PDL]. The elementwise/attention kernels that follow another
// kernel are launched with launchPdl(): when `pdl` is on (the backend's CudaKernelOptions::pdl,
// from GARDEN_PDL at rose's start-up) and the stream is not being captured, their blocks may be
// scheduled while the previous kernel's last blocks still run, and each kernel's first statement
// is pdlWait(), which blocks until the previous grid has completed and its writes are visible (a
// no-op for a normal launch). So nothing
// is read early (except by the opt-in four-warp decode attention [TAG_ATTN_DECODE_WARPS], which
// reads the step's uploaded plan and the cache rows of earlier steps before its wait); only the
// launch latency and the previous kernel's tail overlap. Measured on the
// H200 (bench/results/gpu-embed-2026-11-30-h200-s3/pdl): eager forward 1x128 1.54 -> 1.40 ms,
// 1x512 2.37 -> 2.16 ms; inside CUDA graphs no gain (1x128 1.20 vs 1.23 ms), so captured launches
// stay plain — except those of launchPdlAlways: the gpt-oss kernels and the RMSNorm with
// CudaKernelOptions::pdl_graph [TAG_PDL_GRAPH], whose predecessors trigger early (pdlTrigger).
// Results are bit-identical either way.
__device__ __forceinline__ void pdlWait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
// [TAG_PDL_GEMV] Lets the next kernel, when it was launched programmatically, be scheduled now (it
// still waits for this grid's completion in its own pdlWait()); a no-op otherwise.
__device__ __forceinline__ void pdlTrigger() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// The cudaLaunchKernelEx configuration of a plain launch (no attributes yet).
inline cudaLaunchConfig_t launchConfig(dim3 grid, dim3 block, size_t smem, cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  return cfg;
}

// [TAG_PDL_GEMV] A programmatic dependent launch when `pdl`, also while the stream is being captured
// (the graph keeps it as a programmatic edge), for a kernel whose first statement is pdlWait().
template <typename... KernelArgs, typename... Args>
cudaError_t launchPdlAlways(bool pdl, void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
                            size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg = launchConfig(grid, block, smem, stream);
  cudaLaunchAttribute attr[1];
  if (pdl) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// [TAG_PDL] launchPdlAlways for eager launches only: a captured launch stays plain.
template <typename... KernelArgs, typename... Args>
cudaError_t launchPdl(bool pdl, void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args&&... args) {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  const bool eager_pdl = pdl && cudaStreamIsCapturing(stream, &capturing) == cudaSuccess &&
                         capturing == cudaStreamCaptureStatusNone;
  return launchPdlAlways(eager_pdl, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

// A launch in thread-block clusters of `cluster_x` CTAs along x (0: no cluster attribute, the
// hardware's implicit cluster of one), programmatic when `pdl` (as launchPdlAlways: the kernel's
// first statement is pdlWait()). A refused launch (e.g. no room for a cluster) is cleared, not
// left sticky for the next call.
template <typename... KernelArgs, typename... Args>
cudaError_t launchClustered(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                            cudaStream_t stream, unsigned cluster_x, bool pdl, Args&&... args) {
  cudaLaunchConfig_t cfg = launchConfig(grid, block, smem, stream);
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster_x > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster_x;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = n > 0 ? attr : nullptr;
  cfg.numAttrs = n;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess) (void)cudaGetLastError();
  return err;
}

// Eight bf16 (or fp16 [TAG_ATTN_F16]) values, one 16-byte load or store, to/from float.
template <typename T>
struct Pair16;
template <>
struct Pair16<bf16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ float2 toFloat2(type v) { return __bfloat1622float2(v); }
  static __device__ __forceinline__ type fromFloats(float lo, float hi) {
    return __floats2bfloat162_rn(lo, hi);
  }
};
template <>
struct Pair16<f16> {
  using type = __half2;
  static __device__ __forceinline__ float2 toFloat2(type v) { return __half22float2(v); }
  static __device__ __forceinline__ type fromFloats(float lo, float hi) {
    return __floats2half2_rn(lo, hi);
  }
};
template <typename T>
struct alignas(16) Vec8 {
  typename Pair16<T>::type h[4];
};
template <typename T>
__device__ __forceinline__ void loadF32x8(const T* p, float (&f)[8]) {
  Vec8<T> v = *reinterpret_cast<const Vec8<T>*>(p);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 t = Pair16<T>::toFloat2(v.h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}
template <typename T>
__device__ __forceinline__ void storeF32x8(T* p, const float (&f)[8]) {
  Vec8<T> v;
#pragma unroll
  for (int i = 0; i < 4; ++i) v.h[i] = Pair16<T>::fromFloats(f[2 * i], f[2 * i + 1]);
  *reinterpret_cast<Vec8<T>*>(p) = v;
}

// Scalar conversions of either 16-bit type (round to nearest even).
__device__ __forceinline__ float toF32(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float toF32(f16 v) { return __half2float(v); }
template <typename T>
__device__ __forceinline__ T fromF32(float v);
template <>
__device__ __forceinline__ bf16 fromF32<bf16>(float v) { return __float2bfloat16(v); }
template <>
__device__ __forceinline__ f16 fromF32<f16>(float v) { return __float2half_rn(v); }

// One 8-wide chunk (elements c*8 .. c*8+7) of token t's MoE combine: sum over k of
// weights[t, k] * y[row_of[t, k]] (row -1: none), in f32 in k order with fmaf, not rounded.
// moeCombineKernel stores it as bf16; the fused norm [TAG_COMBINE_NORM] rounds it the same way.
// T: y's element type (bf16, or fp16 with the MoE side in fp16 [TAG_ATTN_F16]). The sum is then
// multiplied by `scale`, the inverse of the power of two the expert GEMMs stored y scaled by (1,
// or kMoeF16OutUnscale for fp16 rows [TAG_MOE_F16_OUT_SCALE]): exact, only the range moves.
template <typename T>
__device__ __forceinline__ void moeCombineChunk(const T* y, const int32_t* row_of,
                                                const float* weights, int top_k, int64_t hidden,
                                                int64_t t, int c, float scale, float (&acc)[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = 0.f;
  for (int k = 0; k < top_k; ++k) {
    const int32_t row = row_of[t * top_k + k];
    if (row < 0) continue;
    const float w = weights[t * top_k + k];
    float v[8];
    loadF32x8(y + static_cast<int64_t>(row) * hidden + c * 8, v);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = fmaf(w, v[j], acc[j]);
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] *= scale;
}

// gpt-oss's clamped SwiGLU of one (gate, up) pair (the spec's alpha 1.702, limit 7): the gate
// clamped above at `limit`, up to [-limit, limit]; the MoE GEMM epilogues
// (moe_gemm.cu, moe_lt_bf16.cu) use it.
__device__ __forceinline__ float clampedSwiglu(float gate, float up, float limit, float alpha) {
  const float g = fminf(gate, limit);
  const float u = fminf(fmaxf(up, -limit), limit);
  return g / (1.f + expf(-alpha * g)) * (u + 1.f);
}

// Rounds through bf16 (mirrors where the reference model stores a bf16 intermediate).
__device__ __forceinline__ float roundBf16(float x) {
  return __bfloat162float(__float2bfloat16(x));
}

__device__ __forceinline__ float warpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ uint32_t packBf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Two floats rounded to T (bf16, or fp16 [TAG_ATTN_F16]) as one 32-bit pattern (packBf16x2's form).
template <typename T>
__device__ __forceinline__ uint32_t pack16x2(float lo, float hi) {
  typename Pair16<T>::type v = Pair16<T>::fromFloats(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t smemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; when !valid the destination is zero-filled and nothing is
// read (src must still be a mapped address).
__device__ __forceinline__ void cpAsync16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smemAddr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void ldmatrixX4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smemAddr(p)));
}
__device__ __forceinline__ void ldmatrixX4Trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smemAddr(p)));
}

// c[16x8 f32] += a[16x16 bf16, row] * b[16x8 bf16, col].
__device__ __forceinline__ void mmaBf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c[16x8 f32] += a[16x16 f16, row] * b[16x8 f16, col] [TAG_ATTN_F16].
__device__ __forceinline__ void mmaF16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// mmaBf16 or mmaF16 by the element type of both operands.
template <typename T>
__device__ __forceinline__ void mma16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                      uint32_t b1) {
  if constexpr (std::is_same_v<T, f16>) {
    mmaF16(c, a, b0, b1);
  } else {
    mmaBf16(c, a, b0, b1);
  }
}

}  // namespace garden::rose::cuda
