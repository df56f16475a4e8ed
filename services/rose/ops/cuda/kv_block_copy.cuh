#pragma once
// KV-block copy between two paged KV caches [TAG_KV_PULL_CUDA]: the prefill/decode handoff
// (docs/multi-gpu.md) copies a request's blocks from another process's cache, mapped here through
// CUDA IPC (Backend::openPeerMemory), into this process's cache; every layer, K and V, one launch.
// Layout (ops/paged_kv_cache.h): K and V each one allocation, layer after layer; a layer holds
// `blocks` blocks, or `blocks_window` when it is a window layer [TAG_KV_WINDOW_GROUP] (its pairs
// are then the window pairs: the two pools number their blocks apart). Source and destination
// have the same layers, block bytes and window layers; block counts and ids differ.
//
// Threads: launcher on the stream's thread; the kernel owns nothing. The source blocks must not
// change until the copy completed (tulip frees them on the prefill side only after the pull's
// completion).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace garden::rose::cuda {

struct KvCopyGeometry {
  int32_t layers = 0;
  uint64_t window_layers = 0;  // bit l: layer l in the window pool; 0 without one
  int32_t src_blocks = 0, src_blocks_window = 0;
  int32_t dst_blocks = 0, dst_blocks_window = 0;
  int64_t block_bytes = 0;  // > 0; 16-byte words when a multiple of 16, bytes otherwise
};

// pairs: device I32 [n, 2] (src, dst) of the full pool; window_pairs: [n_window, 2] of the
// window pool (may be null when n_window == 0). For every layer l and pair of its pool:
// dst_k[l][dst] = src_k[l][src], the same for v. cudaErrorInvalidValue on a bad geometry.
cudaError_t launchKvBlockCopy(const char* src_k, const char* src_v, char* dst_k, char* dst_v,
                              const KvCopyGeometry& g, const int32_t* pairs, int32_t n,
                              const int32_t* window_pairs, int32_t n_window, cudaStream_t stream);

}  // namespace garden::rose::cuda
