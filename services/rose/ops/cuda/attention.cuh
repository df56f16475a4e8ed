#pragma once
// Ragged (varlen) attention for embedding models: sequences packed back to back with no padding and
// no KV cache, causal or bidirectional, GQA, head_dim 64 or 128. FlashAttention-2 style: each block
// owns a tile of query rows of one (sequence, q head); K/V tiles of 64 keys stream through shared
// memory (cp.async, double-buffered) and an online softmax keeps the running max and sum in f32;
// the two matrix products run on tensor cores (mma.sync m16n8k16 bf16, f32 accumulation).
//
// Block -> (sequence, query tile) is found on the device from cu_seqlens, and the grid depends
// only on (num_tokens, num_seqs, heads), so one launch shape serves every batch of a CUDA-graph
// bucket. A row's result does not depend on the other sequences in the batch, nor on the tile
// size the launcher picks (decode-like 16-row tiles or prefill-like 64-row tiles).

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

struct AttentionArgs {
  const __nv_bfloat16* qkv = nullptr;   // [num_tokens, (Hq + 2*Hkv) * head_dim]
  const int32_t* cu_seqlens = nullptr;  // [num_seqs + 1], device
  __nv_bfloat16* out = nullptr;         // [num_tokens, Hq * head_dim]
  int64_t num_tokens = 0;
  int32_t num_seqs = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  float scale = 0.f;
  bool causal = true;
};

// Kernel variants, kept side by side for the benchmarks; both compute bit-identical results.
//   kV1: one q head per block, every K/V tile masked, tiles in sequence order.
//   kV2: the q heads of a GQA group share K/V tiles in one block, masks only where needed,
//        causal tiles longest-first (see attention.cu).
enum class AttentionKernel : int32_t { kDefault = 0, kV1 = 1, kV2 = 2 };
// The kernel kDefault means (kV2 unless changed; rose reads GARDEN_ATTENTION_KERNEL=v1|v2 at
// backend creation). Not thread-safe: set before launching.
void setDefaultAttentionKernel(AttentionKernel k);
AttentionKernel defaultAttentionKernel();

// Tile choice: 0 = by problem size (default), 16 or 64 query rows per block (tests use both).
Status launchAttention(const AttentionArgs& a, cudaStream_t stream, int force_rows = 0,
                       AttentionKernel kernel = AttentionKernel::kDefault);

}  // namespace garden::rose::cuda
