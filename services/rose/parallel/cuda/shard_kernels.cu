#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/parallel/cuda/shard_kernels.cuh"

namespace garden::rose::cuda {
namespace {

template <ShardElem E>
struct Elem;
template <>
struct Elem<ShardElem::kF32> {
  using type = float;
  static __device__ __forceinline__ float load(const type* p, int64_t i) { return p[i]; }
  static __device__ __forceinline__ void store(type* p, int64_t i, float v) { p[i] = v; }
};
template <>
struct Elem<ShardElem::kBF16> {
  using type = __nv_bfloat16;
  static __device__ __forceinline__ float load(const type* p, int64_t i) {
    return __bfloat162float(p[i]);
  }
  static __device__ __forceinline__ void store(type* p, int64_t i, float v) {
    p[i] = __float2bfloat16_rn(v);
  }
};
template <>
struct Elem<ShardElem::kF16> {
  using type = __half;
  static __device__ __forceinline__ float load(const type* p, int64_t i) {
    return __half2float(p[i]);
  }
  static __device__ __forceinline__ void store(type* p, int64_t i, float v) {
    p[i] = __float2half_rn(v);
  }
};

// One block per token row. A 16-bit value converted through f32 to f32 or to its own type is
// exact, so the lookup equals the unsharded embedding's row.
template <ShardElem TE, ShardElem OE>
__global__ void embeddingSliceKernel(const typename Elem<TE>::type* table, int64_t table_rows,
                                     const int32_t* ids, int64_t vocab_begin, int64_t h,
                                     typename Elem<OE>::type* out) {
  const int64_t t = blockIdx.x;
  const int64_t r = static_cast<int64_t>(ids[t]) - vocab_begin;
  const bool mine = r >= 0 && r < table_rows;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    const float v = mine ? Elem<TE>::load(table, r * h + c) : 0.f;
    Elem<OE>::store(out, t * h + c, v);
  }
}

// Block (row, column chunk of 256).
template <ShardElem E>
__global__ void combineRowsKernel(const typename Elem<E>::type* in, const int32_t* offsets,
                                  const int32_t* order, int64_t h, typename Elem<E>::type* out) {
  const int64_t r = blockIdx.x;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= h) return;
  float acc = 0.f;
  for (int32_t j = offsets[r]; j < offsets[r + 1]; ++j) {
    acc += Elem<E>::load(in, static_cast<int64_t>(order[j]) * h + c);
  }
  Elem<E>::store(out, r * h + c, acc);
}

template <ShardElem TE>
Status embeddingFor(const void* table, int64_t table_rows, const int32_t* ids, int64_t t,
                    int64_t vocab_begin, int64_t h, void* out, ShardElem out_type,
                    cudaStream_t stream) {
  const auto* tb = static_cast<const typename Elem<TE>::type*>(table);
  const unsigned grid = static_cast<unsigned>(t);
  switch (out_type) {
    case ShardElem::kF32:
      embeddingSliceKernel<TE, ShardElem::kF32>
          <<<grid, 256, 0, stream>>>(tb, table_rows, ids, vocab_begin, h, static_cast<float*>(out));
      break;
    case ShardElem::kBF16:
      embeddingSliceKernel<TE, ShardElem::kBF16><<<grid, 256, 0, stream>>>(
          tb, table_rows, ids, vocab_begin, h, static_cast<__nv_bfloat16*>(out));
      break;
    case ShardElem::kF16:
      embeddingSliceKernel<TE, ShardElem::kF16><<<grid, 256, 0, stream>>>(
          tb, table_rows, ids, vocab_begin, h, static_cast<__half*>(out));
      break;
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace

Status launchEmbeddingSlice(const void* table, ShardElem table_type, int64_t table_rows,
                            const int32_t* ids, int64_t t, int64_t vocab_begin, int64_t h,
                            void* out, ShardElem out_type, cudaStream_t stream) {
  if (t == 0) return okStatus();
  if (h <= 0 || t > INT32_MAX) return invalidArgument("embedding slice: bad shape");
  switch (table_type) {
    case ShardElem::kF32:
      return embeddingFor<ShardElem::kF32>(table, table_rows, ids, t, vocab_begin, h, out, out_type,
                                           stream);
    case ShardElem::kBF16:
      return embeddingFor<ShardElem::kBF16>(table, table_rows, ids, t, vocab_begin, h, out,
                                            out_type, stream);
    case ShardElem::kF16:
      return embeddingFor<ShardElem::kF16>(table, table_rows, ids, t, vocab_begin, h, out, out_type,
                                           stream);
  }
  return invalidArgument("embedding slice: bad element type");
}

Status launchCombineRows(const void* in, const int32_t* offsets, const int32_t* order, int64_t rows,
                         int64_t h, void* out, ShardElem type, cudaStream_t stream) {
  if (rows == 0) return okStatus();
  if (h <= 0 || rows > INT32_MAX) return invalidArgument("combine rows: bad shape");
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>((h + 255) / 256));
  switch (type) {
    case ShardElem::kF32:
      combineRowsKernel<ShardElem::kF32><<<grid, 256, 0, stream>>>(
          static_cast<const float*>(in), offsets, order, h, static_cast<float*>(out));
      break;
    case ShardElem::kBF16:
      combineRowsKernel<ShardElem::kBF16>
          <<<grid, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(in), offsets, order, h,
                                     static_cast<__nv_bfloat16*>(out));
      break;
    case ShardElem::kF16:
      combineRowsKernel<ShardElem::kF16><<<grid, 256, 0, stream>>>(
          static_cast<const __half*>(in), offsets, order, h, static_cast<__half*>(out));
      break;
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
