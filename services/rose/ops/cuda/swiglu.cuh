#pragma once
// SwiGLU: out[t, i] = silu(gate_up[t, i]) * gate_up[t, I + i] (bf16 in/out, f32 math; silu's
// result is rounded to bf16 before the product, like Hugging Face's bf16 MLP). Pointers are device
// memory owned by the caller.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

struct SwigluArgs {
  const __nv_bfloat16* gate_up = nullptr;  // [num_tokens, 2 * inter]
  __nv_bfloat16* out = nullptr;            // [num_tokens, inter]
  int64_t num_tokens = 0;
  int64_t inter = 0;  // multiple of 8; pointers 16-byte aligned
  // [TAG_EMBED_FP8] Or the output as FP8 e4m3 codes [num_tokens, inter] + scales [inter / 128,
  // num_tokens] (fp8_dense.cuh's activation layout; out then not written; inter a multiple of
  // 128): the bf16 output's values quantized, so the bits equal this op then launchFp8RowQuant.
  uint8_t* out_fp8 = nullptr;
  float* out_scales = nullptr;
};

// pdl: programmatic dependent launch for an eager launch (common.cuh [TAG_PDL]); the backend
// passes its CudaKernelOptions::pdl.
Status launchSwiglu(const SwigluArgs& a, cudaStream_t stream, bool pdl = true);

}  // namespace garden::rose::cuda
