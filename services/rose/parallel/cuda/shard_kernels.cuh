#pragma once
// Kernels of the sharded gpt-oss's own ops on CUDA (parallel/shard_ops.h; the class is in
// shard_ops_cuda.cc). Element types: 0 = F32, 1 = BF16, 2 = F16 (ShardElem). Pointers are device
// memory owned by the caller; launches are enqueued on `stream`.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

enum class ShardElem : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

// out[t] = table[ids[t] − vocab_begin] converted to out's type when 0 <= ids[t] − vocab_begin <
// table_rows, else zeros. table [table_rows, h], out [t, h].
Status launchEmbeddingSlice(const void* table, ShardElem table_type, int64_t table_rows,
                            const int32_t* ids, int64_t t, int64_t vocab_begin, int64_t h,
                            void* out, ShardElem out_type, cudaStream_t stream);

// out[r] = Σ_{j in [offsets[r], offsets[r+1])} in[order[j]] per column, in j order, accumulated
// in f32 and rounded once into `type` (in and out share it). offsets [rows + 1], order [P].
Status launchCombineRows(const void* in, const int32_t* offsets, const int32_t* order, int64_t rows,
                         int64_t h, void* out, ShardElem type, cudaStream_t stream);

}  // namespace garden::rose::cuda
