#pragma once
// Host-side CUDA helpers for rose's CUDA backend: the CUDA_CHECK / CUDA_RETURN_IF_ERROR macros that
// turn a cudaError_t into a garden::Status naming the statement, file and line (STYLE.md rule 5),
// and cached device facts (multiprocessor count) the kernel launchers plan with.
//
// Any thread may call these. A sticky CUDA error is reported as kInternal; the caller (rose's
// step loop) ends the process so it restarts clean.

#include <cuda_runtime_api.h>

#include "common/status.h"

namespace garden::rose::cuda {

// "cudaMemcpyAsync(...) failed at file:line: an illegal memory access (cudaErrorIllegalAddress)".
Status cudaStatus(cudaError_t err, const char* expr, const char* file, int line);
// Aborts with the same message (used where no Status can be returned: void op methods).
[[noreturn]] void cudaFatal(cudaError_t err, const char* expr, const char* file, int line);

// Multiprocessor count of the current device (queried once per device).
int smCount();

}  // namespace garden::rose::cuda

#define CUDA_RETURN_IF_ERROR(expr)                                                          \
  do {                                                                                      \
    cudaError_t garden_cuda_err_ = (expr);                                                  \
    if (garden_cuda_err_ != cudaSuccess)                                                    \
      return ::garden::rose::cuda::cudaStatus(garden_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define CUDA_CHECK(expr)                                                            \
  do {                                                                              \
    cudaError_t garden_cuda_err_ = (expr);                                          \
    if (garden_cuda_err_ != cudaSuccess)                                            \
      ::garden::rose::cuda::cudaFatal(garden_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)
