#include "services/rose/ops/backend.h"

#include <string>

#include "services/rose/ops/cpu/llm_ops_cpu.h"
#include "services/rose/ops/llm_ops.h"

namespace garden::rose {

Result<std::unique_ptr<Backend>> makeBackend(std::string_view device, const BackendOptions& opts) {
  if (device == "cpu") return makeCpuBackend(opts);
  if (device == "cuda") {
#if defined(GARDEN_HAVE_CUDA) && GARDEN_HAVE_CUDA
    return makeCudaBackend(opts);
#else
    return failedPrecondition(
        "--device cuda: this rose was built without CUDA (GARDEN_HAVE_CUDA is off); rebuild on a "
        "machine with nvcc or use --device cpu");
#endif
  }
  return invalidArgument("--device: unknown device '" + std::string(device) +
                         "' (expected cpu or cuda)");
}

Result<std::unique_ptr<LlmOps>> makeLlmOps(Backend& backend, int32_t threads) {
  if (backend.name() == "cpu") return cpu::createLlmOps(backend, threads);
#if defined(GARDEN_HAVE_CUDA) && GARDEN_HAVE_CUDA
  if (backend.name() == "cuda") return makeCudaLlmOps(backend);
#endif
  return unimplemented("no LLM ops for backend '" + std::string(backend.name()) + "'");
}

}  // namespace garden::rose
