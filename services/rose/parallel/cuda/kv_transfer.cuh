#pragma once
// KV-block handoff between rose processes of one node (prefill/decode disaggregation,
// docs/multi-gpu.md): copies a request's paged KV blocks from another process's cache, mapped here
// through CUDA IPC (IpcMapping in ipc_comm.h), into this process's cache, every layer, K and V,
// in one launch. Block ids of the two caches differ (each tulip-side pool allocates its own); the
// pairs say which source block lands in which destination block.
//
// Cache layout (services/rose/ops/paged_kv_cache.h): K and V are each one allocation
// [layers][num_blocks][block_size][kv_heads][head_dim]; one block of one layer is block_bytes
// contiguous bytes. Source and destination must have the same block_bytes (same block size, kv
// heads, head dim, dtype) and layer count.
//
// Threads: launcher on the stream's thread; the kernel owns nothing. The source blocks must stay
// unchanged until the copy completes (the exporter frees them only after the importer's ack).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace garden::rose::cuda {

struct KvPoolView {
  const char* k = nullptr;  // device pointers (own memory or an IPC mapping of a peer's)
  const char* v = nullptr;
  int32_t layers = 0;
  int32_t num_blocks = 0;
  int64_t block_bytes = 0;  // block_size · kv_heads · head_dim · element size (multiple of 16)
};

// For every layer l and pair i (pairs: device I32 [n, 2] = (src block, dst block)):
// dst.k[l][pairs[i][1]] = src.k[l][pairs[i][0]], same for v. Destination blocks distinct.
cudaError_t launchKvBlockCopy(const KvPoolView& src, char* dst_k, char* dst_v,
                              int32_t dst_num_blocks, const int32_t* pairs, int32_t n,
                              cudaStream_t stream);

}  // namespace garden::rose::cuda
