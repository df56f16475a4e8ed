#pragma once
// [TAG_L2_PREFETCH_NEXT] Pulls a weight's bytes into L2 ahead of the GEMM that reads them: a
// small grid issuing `prefetch.global.L2` (or `prefetch.global.L2::evict_last`, which marks the
// lines for the L2 set-aside of persisting accesses) over every 128-byte line of the range. It
// reads nothing into registers and writes nothing: a hint, so no result depends on it. Launched on
// a side stream while the main stream runs a latency-bound kernel (a decode step's MoE or
// attention), so the next projection's M = 1 GEMM finds its weights in L2 instead of HBM.
#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/status.h"

namespace garden::rose::cuda {

// `ctas` blocks of 128 threads (>= 1); any `p` and `bytes`: every 128-byte line the range touches
// is named once, by an address inside the range.
Status launchL2Prefetch(const void* p, size_t bytes, bool evict_last, int ctas,
                        cudaStream_t stream);

}  // namespace garden::rose::cuda
