#pragma once
// The GEMM tuner's L2 flush by reading [TAG_GEMM_READ_FLUSH]: a kernel that reads `bytes` of a
// device buffer through L2 (ld.global.cg) and writes nothing (unless the data XORs to a fixed
// magic value, when it writes one word back into the buffer: the loads cannot be elided). Unlike
// a memset it leaves L2 holding clean lines, so the GEMM timed next pays only for its own
// weights, as in a forward pass — not also for writing back the flush's dirty lines (up to the
// whole 50 MB L2 on the H200, which at M = 1 cost as much as the GEMM's own reads).
#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/status.h"

namespace garden::rose::cuda {

// `buf` 16-byte aligned, `bytes` a multiple of 16.
Status launchL2FlushRead(void* buf, size_t bytes, cudaStream_t stream);

}  // namespace garden::rose::cuda
