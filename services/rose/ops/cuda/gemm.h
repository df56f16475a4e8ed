#pragma once
// bf16 GEMMs through cuBLASLt for rose's linear layers: y[M, N] = x[M, K] . w[N, K]^T (+ bias[N]),
// row-major bf16 in and out, f32 accumulation. The matmul descriptor, layouts and algorithm are
// chosen once per (M, N, K, bias) shape and cached; the workspace is allocated once at creation,
// so the hot path never allocates and the calls are CUDA-graph capturable.
//
// Batch invariance: the algorithm is chosen once per (N, K, bias) — by the heuristic at a
// reference M of 2048 rows, with split-K turned off — and reused for every M, so a row of y is
// computed by the same kernel with the same reduction order whatever else is in the batch (a
// sequence's embedding does not depend on its batch). Only if that algorithm rejects some M does
// that M get its own heuristic choice (counted in variantFallbacks()).
//
// Threads: one thread (the backend's owner thread) uses a GemmRunner. Move-only owner of the
// cuBLASLt handle, the cached descriptors and the workspace.

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "common/status.h"

namespace garden::rose::cuda {

class GemmRunner {
 public:
  static Result<std::unique_ptr<GemmRunner>> create(size_t workspace_bytes = size_t{32} << 20);
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // Enqueues y = x . w^T (+ bias) on `stream`. Pointers 16-byte aligned, K and N multiples of 8.
  Status run(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
             __nv_bfloat16* y, int64_t m, int64_t n, int64_t k, cudaStream_t stream);

  size_t cachedPlans() const { return plans_.size(); }
  size_t variantFallbacks() const { return fallbacks_; }

 private:
  struct Plan {  // owns its descriptors
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    Plan() = default;
    Plan(const Plan&) = delete;
    Plan& operator=(const Plan&) = delete;
    ~Plan();
  };
  GemmRunner() = default;
  Result<Plan*> plan(int64_t m, int64_t n, int64_t k, bool bias);
  Status makeLayouts(Plan& p, int64_t m, int64_t n, int64_t k, bool bias);
  // Heuristic choice for this plan's shape with split-K disabled; false when none qualifies.
  Result<bool> pickAlgo(Plan& p, cublasLtMatmulAlgo_t* out);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<std::tuple<int64_t, int64_t, int64_t, bool>, std::unique_ptr<Plan>> plans_;
  std::map<std::tuple<int64_t, int64_t, bool>, cublasLtMatmulAlgo_t> algos_;  // per (N, K, bias)
  size_t fallbacks_ = 0;
};

}  // namespace garden::rose::cuda
