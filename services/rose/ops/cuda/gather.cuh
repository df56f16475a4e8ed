#pragma once
// Row gather (out[r] = in[rows[r]], any element size; the gpt-oss lm_head input) and the token
// copy of two steps in flight (ids[dst] = src[row] for (dst, row) pairs, [TAG_LLM_PREV_TOKEN]).
// Indices outside their arrays are skipped (the model validates them). Pointers are device memory
// owned by the caller.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

Status launchGatherRows(const void* in, int64_t in_rows, const int32_t* rows, int64_t num_rows,
                        int64_t row_bytes, void* out, cudaStream_t stream);

Status launchCopyTokens(const int32_t* src, int64_t src_len, const int32_t* pairs,
                        int64_t num_pairs, int32_t* ids, int64_t ids_len, cudaStream_t stream);

}  // namespace garden::rose::cuda
