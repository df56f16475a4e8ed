#pragma once
// gpt-oss's rotary embedding fused with the write of K and V into the paged cache: in place on
// the q and k heads of a packed qkv tensor [T, (Hq + 2*Hkv) * D] (NeoX "rotate half": pairs
// (i, i + rotary_dim/2), cos/sin tables in f32 with YaRN's concentration folded in), then the
// rotated k heads and the v heads of token t are copied into slot slot_mapping[t] of the layer's
// caches [num_blocks * block_size, Hkv, D]. The rotation is computed in f32 from the bf16 inputs
// and rounded once (the CPU reference computes it in f32). One warp per (token, head), or with
// 16-byte accesses where the shapes allow (rope_kv.cu [TAG_ROPE_KV_VEC]).
// Pointers are device memory owned by the caller; positions must lie in [0, max_pos) and slots in
// [0, num_slots) (the model validates both; out-of-range values are clamped/skipped, never
// written out of bounds).

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

struct RopeKvArgs {
  __nv_bfloat16* qkv = nullptr;         // [num_tokens, (Hq + 2*Hkv) * head_dim]
  const int32_t* positions = nullptr;   // [num_tokens]
  const float* cos = nullptr;           // [max_pos, rotary_dim / 2]
  const float* sin = nullptr;           // [max_pos, rotary_dim / 2]
  const int32_t* slots = nullptr;       // [num_tokens]
  __nv_bfloat16* k_cache = nullptr;     // [num_slots, Hkv, head_dim]
  __nv_bfloat16* v_cache = nullptr;     // [num_slots, Hkv, head_dim]
  int64_t num_tokens = 0;
  int64_t num_slots = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;    // even, <= 256
  int32_t rotary_dim = 0;  // even, <= head_dim (0: no rotation)
  int32_t max_pos = 0;
  // [TAG_ATTN_F16] qkv and the caches hold IEEE fp16 (__half) bits instead of bf16: the same
  // f32 arithmetic, rounded to fp16.
  bool f16 = false;
  // [TAG_PROJ_F32] When set: the unrotated q/k/v come from this f32 tensor of qkv's shape (the
  // QKV projection's f32 output), and every head is written to qkv as well as k/v to the caches,
  // rounded once (qkv's own contents are not read). 16-byte aligned for the vector kernel.
  const float* qkv_in = nullptr;
  // [TAG_PDL_GRAPH] Launched programmatically (common.cuh launchPdlAlways), in CUDA graphs too:
  // the kernel waits for the previous one in its first statement (CudaKernelOptions::pdl_graph).
  bool pdl = false;
};

// The shape rules launchRopeKv enforces (INVALID_ARGUMENT naming the field otherwise).
Status checkRopeKv(const RopeKvArgs& a);
Status launchRopeKv(const RopeKvArgs& a, cudaStream_t stream);
// The kernels' preferred shared-memory carveout (percent; -1 the driver's choice), for A/B runs
// of the decode attention's shared memory [TAG_ATTN_DECODE_WARPS] (rose_llm_bench
// --attn-carveout): neighbours in a programmatic chain share an SM only under one carveout.
Status setRopeKvCarveout(int percent);

}  // namespace garden::rose::cuda
