#pragma once
// The fp32 CPU implementation of LlmOps (services/rose/ops/llm_ops.h): the reference the CUDA
// kernels will be tested against. Bound to a "cpu" Backend (all tensors F32, I32 for ids);
// runs on that backend's queue (inside launch() on its compute thread, or on the calling
// thread after waiting for launched work), splitting loops over its own fork-join pool.
//
// Threads: as Backend. The pool is owned and joined on destruction.

#include <memory>

#include "services/rose/ops/llm_ops.h"

namespace garden::rose::cpu {

// `backend` must be a cpu backend and outlive the ops. threads: 0 = hardware concurrency.
Result<std::unique_ptr<LlmOps>> createLlmOps(Backend& backend, int32_t threads);

}  // namespace garden::rose::cpu
