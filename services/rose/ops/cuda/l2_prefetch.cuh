#pragma once
// [TAG_L2_PREFETCH] Weight prefetch into L2: a few-token forward is a chain of small kernels whose
// GEMMs stream their weights from HBM at ~1 TB/s, while the RMSNorms, QK-norm + RoPE, attention
// and SwiGLU between them leave HBM idle. A tiny kernel on a side branch issues bulk L2 prefetches
// (cp.async.bulk.prefetch.L2, sm_90) of a coming GEMM's weights while the current kernels run, so
// that GEMM reads them from L2. A hint only: it reads, never writes, and changes no result.
#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/status.h"

namespace garden::rose::cuda {

// The kernel's chunk: one bulk prefetch instruction per lane covers this many bytes.
inline constexpr size_t kL2PrefetchChunk = 16 * 1024;

// Blocks (one warp each) of the launch for `bytes`: ~256 KB per warp, 1 to 64 warps, so the
// requests leave from many SMs' copy engines at once.
int l2PrefetchBlocks(size_t bytes);

// How the lines are requested: kBulk, cp.async.bulk.prefetch.L2 of 16 KB per lane (a hint the
// copy engine carries out after the warp has moved on; the kernel ends at once); kLoad, one
// 4-byte load per 256 bytes with the .L2::256B prefetch size (the lines surely land, the warps
// wait for them: the kernel lasts about one HBM round trip per 16 loads in flight).
enum class L2PrefetchKind { kBulk = 0, kLoad = 1 };

// Prefetches [p, p + bytes) into L2 (the range widened to 16-byte bounds; kLoad: to 256-byte
// lines, never reading past the widened range). bytes == 0: nothing.
Status launchL2Prefetch(const void* p, size_t bytes, cudaStream_t stream,
                        L2PrefetchKind kind = L2PrefetchKind::kBulk);

}  // namespace garden::rose::cuda
