#pragma once
// Token embedding gather: out[t, :] = table[ids[t], :] (bf16). Host-callable launcher; the kernel
// lives in embedding.cu. Ids outside [0, vocab) produce a zero row (callers validate ids first;
// this only keeps a bad id from reading out of bounds). Pointers are device memory owned by the
// caller; the launch is enqueued on `stream`.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

struct EmbeddingArgs {
  const __nv_bfloat16* table = nullptr;  // [vocab, hidden]
  const int32_t* ids = nullptr;          // [num_tokens]
  __nv_bfloat16* out = nullptr;          // [num_tokens, hidden]
  int64_t num_tokens = 0;
  int64_t hidden = 0;  // multiple of 8, pointers 16-byte aligned
  int64_t vocab = 0;
};

Status launchEmbedding(const EmbeddingArgs& a, cudaStream_t stream);

}  // namespace garden::rose::cuda
