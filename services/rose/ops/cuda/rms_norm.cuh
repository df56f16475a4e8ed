#pragma once
// RMSNorm fused with the residual add (bf16 in and out, f32 sums):
//   with residual:    residual = bf16(x + residual); out = rmsnorm(residual) * weight
//   with residual_f32: the same with an f32 stream (residual_f32 = x + residual_f32, unrounded)
//   without (null):   out = rmsnorm(x) * weight
// Mirrors Hugging Face's Qwen3RMSNorm rounding by default (the normalized row is rounded to bf16
// before the weight multiply); round_normalized = false rounds once after it (gpt-oss). `out` may alias `x` (each row is read fully before it is written). The per-row
// reduction tree depends only on `hidden`, never on the number of rows, so a row's result does
// not depend on what else is in the batch (few rows run one row per block with one 8-wide chunk
// per thread, many rows several rows per block; both sum in the same order). Pointers are device
// memory owned by the caller.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

struct RmsNormArgs {
  const __nv_bfloat16* x = nullptr;       // [rows, hidden]
  __nv_bfloat16* residual = nullptr;      // [rows, hidden] or null
  const __nv_bfloat16* weight = nullptr;  // [hidden]
  __nv_bfloat16* out = nullptr;           // [rows, hidden]
  int64_t rows = 0;
  int64_t hidden = 0;  // multiple of 8, at most 32768; pointers 16-byte aligned
  float eps = 1e-6f;
  // Or an f32 stream (at most one of residual / residual_f32): residual_f32 = x + residual_f32,
  // not rounded.
  float* residual_f32 = nullptr;
  bool residual_init = false;  // residual = x (the residual's old contents are not read)
  // true: out = bf16(bf16(row * rstd) * weight) (Qwen3RMSNorm); false: bf16(row * rstd * weight)
  // in f32 (gpt-oss's norm).
  bool round_normalized = true;
  // Or x computed here as the MoE combine of permuted expert rows [TAG_COMBINE_NORM] (x null):
  // x[t] = bf16(sum over k of weights[t, k] * y[row_of[t, k]]), in f32 in k order with fmaf,
  // rounded once — moe_permute.cuh's combine, so the bits equal launchMoeCombine then this norm.
  const __nv_bfloat16* combine_y = nullptr;  // [rows of the expert GEMM, hidden]
  const int32_t* combine_row_of = nullptr;   // [rows, combine_top_k], -1: none
  const float* combine_weights = nullptr;    // [rows, combine_top_k]
  int32_t combine_top_k = 0;
  // [TAG_ATTN_F16] x / out hold IEEE fp16 bits instead of bf16 (the weight and a bf16 residual
  // stay bf16; an fp16 x goes with the f32 residual only).
  bool x_f16 = false;
  bool out_f16 = false;
  bool combine_f16 = false;  // combine_y holds fp16 rows (rounded to fp16, as its combine's store)
  // [TAG_MOE_F16_OUT_SCALE] The combine's sum times this before its rounding (MoeCombineArgs::y_scale).
  float combine_scale = 1.f;
  // The combine kept in f32 (not rounded: as an f32 moe tensor holds it), and an f32 x: gpt-oss's
  // MoE output in f32 (GptOssOptions::moe_out_f32).
  bool combine_f32 = false;
  bool x_f32 = false;
  // [TAG_EMBED_FP8] Or the output as FP8 e4m3 codes [rows, hidden] + scales [hidden / 128, rows]
  // (fp8_dense.cuh's activation layout; out then not written; bf16 x and out only, hidden a
  // multiple of 128): the bf16 output's values quantized, so the bits equal this norm followed by
  // launchFp8RowQuant.
  uint8_t* out_fp8 = nullptr;
  float* out_scales = nullptr;
  // [TAG_PDL_GRAPH] Launched programmatically in CUDA graphs too (launchRmsNorm's `pdl` covers
  // eager launches only): CudaKernelOptions::pdl_graph.
  bool pdl_graph = false;
};

// pdl: programmatic dependent launch for an eager launch (common.cuh [TAG_PDL]); the backend
// passes its CudaKernelOptions::pdl.
Status launchRmsNorm(const RmsNormArgs& a, cudaStream_t stream, bool pdl = true);

}  // namespace garden::rose::cuda
