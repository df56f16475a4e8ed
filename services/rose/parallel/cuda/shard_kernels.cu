#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/parallel/cuda/shard_kernels.cuh"

namespace garden::rose::cuda {
namespace {

// One block per token row. A 16-bit value converted through f32 to f32 or to its own type is
// exact, so the lookup equals the unsharded embedding's row.
template <typename TT, typename OT>
__global__ void embeddingSliceKernel(const TT* table, int64_t table_rows, const int32_t* ids,
                                     int64_t vocab_begin, int64_t h, OT* out) {
  const int64_t t = blockIdx.x;
  const int64_t r = static_cast<int64_t>(ids[t]) - vocab_begin;
  const bool mine = r >= 0 && r < table_rows;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    out[t * h + c] = fromF32<OT>(mine ? toF32(table[r * h + c]) : 0.f);
  }
}

// Block (row, column chunk of 256).
template <typename T>
__global__ void combineRowsKernel(const T* in, const int32_t* offsets, const int32_t* order,
                                  int64_t h, T* out) {
  const int64_t r = blockIdx.x;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= h) return;
  float acc = 0.f;
  for (int32_t j = offsets[r]; j < offsets[r + 1]; ++j) {
    acc += toF32(in[static_cast<int64_t>(order[j]) * h + c]);
  }
  out[r * h + c] = fromF32<T>(acc);
}

// Calls fn(T{}) with the C++ type of `e`.
template <typename Fn>
void withElem(ShardElem e, Fn&& fn) {
  switch (e) {
    case ShardElem::kF32:
      return fn(float{});
    case ShardElem::kBF16:
      return fn(bf16{});
    case ShardElem::kF16:
      return fn(f16{});
  }
}

}  // namespace

Status launchEmbeddingSlice(const void* table, ShardElem table_type, int64_t table_rows,
                            const int32_t* ids, int64_t t, int64_t vocab_begin, int64_t h,
                            void* out, ShardElem out_type, cudaStream_t stream) {
  if (t == 0) return okStatus();
  if (h <= 0 || t > INT32_MAX) return invalidArgument("embedding slice: bad shape");
  withElem(table_type, [&](auto tt) {
    withElem(out_type, [&](auto ot) {
      using TT = decltype(tt);
      using OT = decltype(ot);
      embeddingSliceKernel<TT, OT><<<static_cast<unsigned>(t), 256, 0, stream>>>(
          static_cast<const TT*>(table), table_rows, ids, vocab_begin, h, static_cast<OT*>(out));
    });
  });
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

Status launchCombineRows(const void* in, const int32_t* offsets, const int32_t* order, int64_t rows,
                         int64_t h, void* out, ShardElem type, cudaStream_t stream) {
  if (rows == 0) return okStatus();
  if (h <= 0 || rows > INT32_MAX) return invalidArgument("combine rows: bad shape");
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>((h + 255) / 256));
  withElem(type, [&](auto e) {
    using T = decltype(e);
    combineRowsKernel<T><<<grid, 256, 0, stream>>>(static_cast<const T*>(in), offsets, order, h,
                                                   static_cast<T*>(out));
  });
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
