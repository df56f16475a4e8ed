#pragma once
// Per-head RMSNorm of the q and k heads fused with rotary embedding (NeoX "rotate half": pairs
// (i, i + rotary_dim/2)), in place on a packed qkv tensor [T, (Hq + 2*Hkv) * D] (q heads, k heads,
// v heads per row; v is untouched). One warp handles several heads of one token: the head's sum
// of squares is a shuffle reduction, cos/sin are read once per token. Rounding mirrors Hugging
// Face Qwen3 in bf16 (normalized head rounded before the weight multiply and after it; cos/sin
// rounded to bf16; q*cos and rotate_half(q)*sin each rounded before the sum).
// Pointers are device memory owned by the caller; positions are clamped to [0, max_pos).

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

struct QkNormRopeArgs {
  __nv_bfloat16* qkv = nullptr;             // [num_tokens, (Hq + 2*Hkv) * head_dim]
  const __nv_bfloat16* q_weight = nullptr;  // [head_dim] (unused when !apply_norm)
  const __nv_bfloat16* k_weight = nullptr;  // [head_dim]
  const int32_t* positions = nullptr;       // [num_tokens]
  const float* cos = nullptr;               // [max_pos, rotary_dim / 2]
  const float* sin = nullptr;               // [max_pos, rotary_dim / 2]
  int64_t num_tokens = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;    // 64 or 128
  int32_t rotary_dim = 0;  // even, <= head_dim
  int32_t max_pos = 0;
  float eps = 1e-6f;
  bool apply_norm = true;
  // Which kernel [TAG_QK_ROPE_PAIR]: 0 = by size (the pair kernel where rotary_dim == head_dim,
  // 2 or 8 heads per warp), -1 = the legacy kernel, 1 / 2 / 4 / 8 = the pair kernel with that
  // many heads per warp (partial rotary always takes the legacy kernel).
  int32_t variant = 0;
};

// pdl: programmatic dependent launch for an eager launch (common.cuh [TAG_PDL]); the backend
// passes its CudaKernelOptions::pdl.
Status launchQkNormRope(const QkNormRopeArgs& a, cudaStream_t stream, bool pdl = true);

}  // namespace garden::rose::cuda
