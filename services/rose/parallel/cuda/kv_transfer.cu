// KV-block handoff kernel (contract in kv_transfer.cuh).

#include "services/rose/parallel/cuda/kv_transfer.cuh"

namespace garden::rose::cuda {
namespace {

// grid (pairs, layers, 2 = K/V); each block copies one block of one layer in 16-byte words.
__global__ void kvBlockCopyKernel(KvPoolView src, char* dst_k, char* dst_v, int32_t dst_blocks,
                                  const int32_t* __restrict__ pairs) {
  const int32_t i = blockIdx.x, layer = blockIdx.y;
  const bool is_v = blockIdx.z == 1;
  const int32_t sb = pairs[2 * i], db = pairs[2 * i + 1];
  const char* s = (is_v ? src.v : src.k) +
                  (static_cast<int64_t>(layer) * src.num_blocks + sb) * src.block_bytes;
  char* d =
      (is_v ? dst_v : dst_k) + (static_cast<int64_t>(layer) * dst_blocks + db) * src.block_bytes;
  const int64_t words = src.block_bytes / 16;
  const int4* s4 = reinterpret_cast<const int4*>(s);
  int4* d4 = reinterpret_cast<int4*>(d);
  for (int64_t w = threadIdx.x; w < words; w += blockDim.x) d4[w] = __ldcg(s4 + w);
}

}  // namespace

cudaError_t launchKvBlockCopy(const KvPoolView& src, char* dst_k, char* dst_v,
                              int32_t dst_num_blocks, const int32_t* pairs, int32_t n,
                              cudaStream_t stream) {
  if (src.k == nullptr || src.v == nullptr || dst_k == nullptr || dst_v == nullptr ||
      pairs == nullptr || n < 0 || src.layers <= 0 || src.layers > 65535 || src.block_bytes <= 0 ||
      src.block_bytes % 16 != 0 || dst_num_blocks <= 0) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(src.layers), 2);
  kvBlockCopyKernel<<<grid, 256, 0, stream>>>(src, dst_k, dst_v, dst_num_blocks, pairs);
  return cudaGetLastError();
}

}  // namespace garden::rose::cuda
