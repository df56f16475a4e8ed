#pragma once
// y[r] += bias[e(r)] over expert-sorted ("permuted") rows, in f32, rounded once to bf16: the down
// projection's bias for the FP8 expert path [TAG_FP8_EXPERTS] (its cuBLASLt matmuls run without
// an epilogue). e(r) = tile_expert[r / block_m]; rows whose row_token is -1 (padding) are left
// as they are. Pointers are device memory owned by the caller.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

struct MoeRowBiasArgs {
  __nv_bfloat16* y = nullptr;            // [rows, n]
  const __nv_bfloat16* bias = nullptr;   // [num_experts, n]
  const int32_t* row_token = nullptr;    // [rows]
  const int32_t* tile_expert = nullptr;  // [rows / block_m]
  int64_t rows = 0;
  int32_t n = 0;  // a multiple of 8
  int32_t block_m = 0;
  int32_t num_experts = 0;
};

Status launchMoeRowBias(const MoeRowBiasArgs& a, cudaStream_t stream);

}  // namespace garden::rose::cuda
