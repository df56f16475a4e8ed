#pragma once
// Activations of the FP8 expert GEMMs [TAG_FP8_EXPERTS] quantized to e4m3 per permuted row and
// 128 inputs (fp8_block.h: cuBLASLt's VEC128_32F layout per expert range). For row r and K block
// b: amax = max |v| over the block's inputs (the K padding counts as 0), scale = amax / 448,
// q = e4m3_rn_satfinite(v * (448 / amax)) (both quotients f32, correctly rounded); an all-zero
// block has scale 1 and codes 0. Rows whose row_token is -1 (the align step's padding) are zero.
// Two input forms (one op: "the input rows of an expert GEMM"):
//   gather  (gate_up input): v = x[row_token[r]][c], x bf16 [tokens, k];
//   swiglu  (down input): v = min(g,L)·σ(α·min(g,L))·(clamp(u,−L,L)+1) with g = h[r][2c] +
//           bias[e][2c], u = h[r][2c+1] + bias[e][2c+1] (h: the gate_up GEMM's bf16 output
//           [rows, 2k], interleaved gate/up; e: the expert of row r), computed in f32.
// The expert of a row is tile_expert[r / block_m]; its range [expert_off[e], expert_off[e+1]).
// One warp per (row, 128 inputs), four inputs per lane. Pointers are device memory owned by the
// caller.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

struct Fp8ActQuantArgs {
  const __nv_bfloat16* in = nullptr;     // gather: x [tokens, k]; swiglu: h [rows, 2k]
  const int32_t* row_token = nullptr;    // [rows]: source token (gather) / >= 0 real (swiglu)
  const int32_t* tile_expert = nullptr;  // [rows / block_m]
  const int32_t* expert_off = nullptr;   // [num_experts + 1]
  const __nv_bfloat16* bias = nullptr;   // swiglu: [num_experts, 2k] or null
  uint8_t* q = nullptr;                  // [rows, fp8PaddedK(k)] e4m3
  float* scales = nullptr;               // [rows * fp8KBlocks(k)]
  int64_t rows = 0;                      // permuted rows (expert_off[num_experts])
  int32_t k = 0;                         // inputs per row, a multiple of 4
  int32_t block_m = 0;
  int32_t num_experts = 0;
  bool swiglu = false;
  float swiglu_limit = 7.f;
  float swiglu_alpha = 1.702f;
};

Status launchFp8ActQuant(const Fp8ActQuantArgs& a, cudaStream_t stream);

}  // namespace garden::rose::cuda
