#include <algorithm>

#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/embedding.cuh"

namespace garden::rose::cuda {
namespace {

// blockDim = (threads per row, rows per block); each thread moves 16-byte chunks of its row.
__global__ void embeddingKernel(EmbeddingArgs a) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= a.num_tokens) return;
  const int32_t id = a.ids[row];
  const int64_t chunks = a.hidden / 8;
  const bool ok = id >= 0 && id < a.vocab;
  const uint4* src = reinterpret_cast<const uint4*>(a.table + (ok ? id : 0) * a.hidden);
  uint4* dst = reinterpret_cast<uint4*>(a.out + row * a.hidden);
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    dst[c] = ok ? __ldg(src + c) : make_uint4(0, 0, 0, 0);
  }
}

}  // namespace

Status launchEmbedding(const EmbeddingArgs& a, cudaStream_t stream) {
  if (a.num_tokens == 0) return okStatus();
  if (a.hidden <= 0 || a.hidden % 8 != 0)
    return invalidArgument("embedding: hidden must be a multiple of 8");
  if ((reinterpret_cast<uintptr_t>(a.table) | reinterpret_cast<uintptr_t>(a.out)) % 16 != 0)
    return invalidArgument("embedding: table and out must be 16-byte aligned");
  const int64_t chunks = a.hidden / 8;
  const int tx =
      static_cast<int>(std::min<int64_t>(chunks <= 32 ? 32 : (chunks + 31) / 32 * 32, 256));
  // Decode-like (few tokens): one row per block spreads the rows over the SMs. Prefill-like:
  // 256 threads per block, several rows each.
  const bool few = a.num_tokens < 2 * smCount();
  const int ty = few ? 1 : std::max(1, 256 / tx);
  dim3 block(tx, ty);
  dim3 grid(static_cast<unsigned>((a.num_tokens + ty - 1) / ty));
  embeddingKernel<<<grid, block, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
