#pragma once
// [TAG_EMBED_FP8] Dense FP8 GEMMs through cuBLASLt with Hopper block scaling:
//   y[M][N] (bf16) = X[M][K] · W[N][K]^T, X and W e4m3 with f32 scales in fp8_dense.cuh's layouts
//   (W: BLK128x128_32F as the A operand; X: VEC128_32F as B), f32 accumulation.
// Algorithm choice: one per (M bucket, N, K) with GemmRunner::algoBucket's buckets (so a batch
// padded to its graph bucket and the same batch run eagerly share it), split-K candidates left
// out (a row's bits then do not depend on M inside a bucket). The first call of a bucket outside a
// capture times up to 8 of cuBLASLt's heuristic candidates on the call's operands (2 warm-ups, the
// mean of 5 runs, L2 flushed by a read before each) and keeps the fastest (logged as "fp8 gemm
// tuned"; the stream is synchronized once); a bucket first seen while capturing takes the first
// candidate untimed. The candidates write into y; the call then recomputes y with the winner.
// M and N multiples of 4, K a multiple of 128, operands 16-byte aligned.
//
// Threads: one launching thread (the backend's). Move-only owner of the handle, the workspace,
// the flush buffer and the cached descriptors.

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "common/status.h"

namespace garden::rose::cuda {

// The "TN" matmul attributes both FP8 paths set (A = weights transposed, B = activations) and,
// with block_scaled, the Hopper block-scaling modes (A BLK128x128_32F, B VEC128_32F); shared by
// Fp8Gemm and MoeLtGemm.
Status setTnMatmulDesc(cublasLtMatmulDesc_t desc, bool block_scaled);

struct Fp8GemmArgs {
  const uint8_t* x = nullptr;     // [m, k] e4m3
  const float* x_scales = nullptr;  // [k / 128, m]
  const uint8_t* w = nullptr;     // [n, k] e4m3
  const float* w_scales = nullptr;  // [ceil(n / 128), fp8KBlocks4(k)]
  __nv_bfloat16* y = nullptr;     // [m, n]
  int64_t m = 0, n = 0, k = 0;
};

class Fp8Gemm {
 public:
  static Result<std::unique_ptr<Fp8Gemm>> create(size_t workspace_bytes = size_t{32} << 20);
  ~Fp8Gemm();
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;

  Status run(const Fp8GemmArgs& a, cudaStream_t stream);

 private:
  struct Desc {  // one (n, k): the matmul descriptor and the weight layout
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr;
    ~Desc();
  };
  struct Shape {  // one exact m: the activation and output layouts
    cublasLtMatrixLayout_t b = nullptr, d = nullptr;
    ~Shape();
  };
  Fp8Gemm() = default;
  Result<Desc*> desc(int64_t n, int64_t k);
  Result<Shape*> shape(int64_t m, int64_t n, int64_t k);
  Result<cublasLtMatmulAlgo_t> choose(Desc& d, Shape& s, const Fp8GemmArgs& a, cudaStream_t stream);
  Status enqueue(Desc& d, Shape& s, const cublasLtMatmulAlgo_t& algo, const Fp8GemmArgs& a,
                 cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  void* flush_ = nullptr;
  size_t flush_bytes_ = 0;
  cudaEvent_t events_[10] = {};
  std::map<std::tuple<int64_t, int64_t>, std::unique_ptr<Desc>> descs_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<Shape>> shapes_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, cublasLtMatmulAlgo_t> algos_;  // (bucket, n, k)
};

}  // namespace garden::rose::cuda
