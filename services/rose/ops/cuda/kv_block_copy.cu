// KV-block copy kernel (contract in kv_block_copy.cuh).

#include "services/rose/ops/cuda/kv_block_copy.cuh"

namespace garden::rose::cuda {
namespace {

// Layer l's first block in a pool of `full` blocks per ordinary layer and `win` per window layer.
__device__ __forceinline__ int64_t layerBlock(int32_t l, uint64_t mask, int32_t full,
                                              int32_t win) {
  const uint64_t below = l >= 64 ? mask : (mask & ((uint64_t{1} << l) - 1));
  const int32_t w = __popcll(below);
  return static_cast<int64_t>(l - w) * full + static_cast<int64_t>(w) * win;
}

// grid (max(n, n_window), layers, 2 = K/V): each CTA copies one block of one layer.
__global__ void kvBlockCopyKernel(const char* __restrict__ src_k, const char* __restrict__ src_v,
                                  char* __restrict__ dst_k, char* __restrict__ dst_v,
                                  KvCopyGeometry g, const int32_t* __restrict__ pairs, int32_t n,
                                  const int32_t* __restrict__ window_pairs, int32_t n_window) {
  const int32_t i = blockIdx.x, layer = blockIdx.y;
  const bool win = layer < 64 && ((g.window_layers >> layer) & 1u) != 0;
  if (i >= (win ? n_window : n)) return;
  const int32_t* p = (win ? window_pairs : pairs) + 2 * i;
  const int64_t sb = layerBlock(layer, g.window_layers, g.src_blocks, g.src_blocks_window) + p[0];
  const int64_t db = layerBlock(layer, g.window_layers, g.dst_blocks, g.dst_blocks_window) + p[1];
  const bool is_v = blockIdx.z == 1;
  const char* s = (is_v ? src_v : src_k) + sb * g.block_bytes;
  char* d = (is_v ? dst_v : dst_k) + db * g.block_bytes;
  if (g.block_bytes % 16 == 0) {
    const int64_t words = g.block_bytes / 16;
    const int4* s4 = reinterpret_cast<const int4*>(s);
    int4* d4 = reinterpret_cast<int4*>(d);
    for (int64_t w = threadIdx.x; w < words; w += blockDim.x) d4[w] = __ldcg(s4 + w);
  } else {
    for (int64_t b = threadIdx.x; b < g.block_bytes; b += blockDim.x) d[b] = s[b];
  }
}

}  // namespace

cudaError_t launchKvBlockCopy(const char* src_k, const char* src_v, char* dst_k, char* dst_v,
                              const KvCopyGeometry& g, const int32_t* pairs, int32_t n,
                              const int32_t* window_pairs, int32_t n_window, cudaStream_t stream) {
  if (src_k == nullptr || src_v == nullptr || dst_k == nullptr || dst_v == nullptr || n < 0 ||
      n_window < 0 || (n > 0 && pairs == nullptr) || (n_window > 0 && window_pairs == nullptr) ||
      g.layers <= 0 || g.layers > 65535 || g.block_bytes <= 0 || g.src_blocks <= 0 ||
      g.dst_blocks <= 0 ||
      (g.window_layers != 0 && (g.src_blocks_window <= 0 || g.dst_blocks_window <= 0))) {
    return cudaErrorInvalidValue;
  }
  const int32_t most = n > n_window ? n : n_window;
  if (most == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(most), static_cast<unsigned>(g.layers), 2);
  kvBlockCopyKernel<<<grid, 256, 0, stream>>>(src_k, src_v, dst_k, dst_v, g, pairs, n,
                                              window_pairs, n_window);
  return cudaGetLastError();
}

}  // namespace garden::rose::cuda
