#pragma once
// The kernels around the bf16 cuBLASLt expert GEMMs of the MXFP4 prefill path [TAG_MOE_LT_BF16]
// (CudaLlmOps::moeExpertsLtBf16, docs/gpt-oss-cuda.md): the resident MXFP4 experts are
// dequantized once per prefill step and projection into a bf16 [E][N][K] scratch (exact: every
// MXFP4 value is a bf16 value), the expert-sorted rows gathered into a dense bf16 matrix
// (launchGatherRows, gather.cuh: the align step's padding rows, row_token -1, keep whatever the
// matrix held — a GEMM row depends on its own input row only, and the SwiGLU below writes those
// rows as zeros), and per-expert cuBLASLt bf16 matmuls (moe_lt_gemm.h) run over them; the gate_up
// output then takes bias + clamped SwiGLU here, the down output its bias in moe_row_bias.cuh.
// Pointers are device memory owned by the caller.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

// out[e][n][k] = the MXFP4 weight (n, k) of expert e, from the tiled layout [TAG_MXFP4_TILED]
// (moe_gemm.cuh), for every expert e with rows: expert_off[e + 1] > expert_off[e] (device,
// [experts + 1]; null: every expert). Experts without rows are not written.
struct Mxfp4DequantArgs {
  const uint8_t* codes = nullptr;   // tiled layout of W [experts, n, k]
  const uint8_t* scales = nullptr;
  const int32_t* expert_off = nullptr;
  __nv_bfloat16* out = nullptr;     // [experts][n][k]
  int32_t experts = 0;
  int32_t n = 0;
  int32_t k = 0;  // a multiple of 32
  uint32_t max_scale = 255;  // the largest E8M0 byte (uploadMxfp4Experts): <= 128 takes one multiply
};
Status launchMxfp4Dequant(const Mxfp4DequantArgs& a, cudaStream_t stream);

// The gate_up epilogue over expert-sorted rows: out[r][i] = clampedSwiglu(h[r][2i] + b[e][2i],
// h[r][2i + 1] + b[e][2i + 1]) in f32 (interleaved (gate, up) pairs, the tiled kernel's formula),
// rounded once; e = tile_expert[r / block_m]. Padding rows (row_token -1) are written as zeros.
struct MoeBiasSwigluArgs {
  const __nv_bfloat16* h = nullptr;      // [rows][2 * inter]
  const __nv_bfloat16* bias = nullptr;   // [num_experts][2 * inter] or null
  const int32_t* row_token = nullptr;    // [rows]
  const int32_t* tile_expert = nullptr;  // [rows / block_m]
  __nv_bfloat16* out = nullptr;          // [rows][inter]
  int64_t rows = 0;
  int32_t inter = 0;  // a multiple of 8
  int32_t block_m = 0;
  int32_t num_experts = 0;
  float limit = 7.f;
  float alpha = 1.702f;
};
Status launchMoeBiasSwiglu(const MoeBiasSwigluArgs& a, cudaStream_t stream);

}  // namespace garden::rose::cuda
