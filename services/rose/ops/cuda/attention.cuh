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

// Kernel variants, kept side by side for the benchmarks; all compute bit-identical results.
//   kV1: one q head per block, every K/V tile masked, tiles in sequence order.
//   kV2: the q heads of a GQA group share K/V tiles in one block, masks only where needed,
//        causal tiles longest-first (see attention.cu).
//   kV3: as kV2 but 32 query rows per warp (two m16 tiles share every K/V fragment read from
//        shared memory) with the Q tile in shared memory; 64- or 128-row tiles per head. It is
//        a policy: prefill-like sizes with head_dim 128 run the kV3 kernel, decode-like sizes
//        (few query tiles) and head_dim 64 run kV2 (see launchV3Auto in attention.cu).
enum class AttentionKernel : int32_t { kDefault = 0, kV1 = 1, kV2 = 2, kV3 = 3 };
// The kernel kDefault means (kV3, the policy, unless changed; rose reads
// GARDEN_ATTENTION_KERNEL=v1|v2|v3 at backend creation). Not thread-safe: set before launching.
void setDefaultAttentionKernel(AttentionKernel k);
AttentionKernel defaultAttentionKernel();

// Tile choice: 0 = by problem size (default), 16 or 64 query rows per block (tests use both).
// kV3 picks its own tiles: force_rows must be 0 (launchAttentionV3 forces one).
Status launchAttention(const AttentionArgs& a, cudaStream_t stream, int force_rows = 0,
                       AttentionKernel kernel = AttentionKernel::kDefault);

// kV3 with a forced tile shape (tests, benchmarks). kAuto is the kV3 policy launchAttention uses.
// "Shared": two q heads of a GQA group per block share the K/V tiles; 4 warps per head = 128
// rows, 2 warps = 64 rows. An odd group runs one head per block with 128 rows (k128PerHead).
// K/V tiles are double-buffered, except k128Shared3Stage (3 stages). head_dim 64 always runs
// kV2 (64-row tiles).
enum class AttentionV3Tile : int32_t {
  kAuto = 0,
  k128Shared = 1,
  k128PerHead = 2,
  k64Shared = 3,
  k128Shared3Stage = 4,
};
Status launchAttentionV3(const AttentionArgs& a, cudaStream_t stream, AttentionV3Tile tile);

}  // namespace garden::rose::cuda
