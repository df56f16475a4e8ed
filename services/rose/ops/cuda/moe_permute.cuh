#pragma once
// The index work around gpt-oss's grouped expert GEMMs (moe_gemm.cuh):
//   align:   the (token, k) assignments of topk_ids grouped by expert into "permuted rows", each
//            expert's rows padded to a multiple of the GEMM's M tile so that every tile belongs
//            to one expert. Deterministic: within an expert, rows keep (token, k) order. Writes
//            row_token (the source token of each permuted row, -1 for padding), row_of (the
//            permuted row of each assignment), tile_expert (the expert of each M tile, -1 past the
//            last) and num_tiles. One block; its cost grows with T·k (tens of µs at 32k
//            assignments).
//   combine: out[t] = Σ_k w[t,k] · y[row_of[t,k]] in f32 in k order, rounded once to bf16.
// Pointers are device memory owned by the caller.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

inline constexpr int kMoeAlignMaxExperts = 256;

struct MoeAlignArgs {
  const int32_t* topk_ids = nullptr;  // [T, k]
  int32_t* row_token = nullptr;       // [max_rows]
  int32_t* row_of = nullptr;          // [T * k]
  int32_t* tile_expert = nullptr;     // [max_tiles]
  int32_t* num_tiles = nullptr;       // [1]
  int64_t num_tokens = 0;
  int32_t top_k = 0;
  int32_t num_experts = 0;  // <= kMoeAlignMaxExperts
  int32_t block_m = 0;      // the GEMM's M tile
  int32_t max_tiles = 0;    // moeAlignMaxTiles(...)
};

// Upper bound on M tiles (and so rows = tiles · block_m) for T·k assignments over E experts.
inline int64_t moeAlignMaxTiles(int64_t assignments, int32_t num_experts, int32_t block_m) {
  return (assignments + block_m - 1) / block_m + num_experts;
}

Status launchMoeAlign(const MoeAlignArgs& a, cudaStream_t stream);

struct MoeCombineArgs {
  const __nv_bfloat16* y = nullptr;  // [rows, hidden] (permuted expert outputs)
  const int32_t* row_of = nullptr;   // [T, k]
  const float* weights = nullptr;    // [T, k]
  __nv_bfloat16* out = nullptr;      // [T, hidden]
  int64_t num_tokens = 0;
  int32_t top_k = 0;
  int32_t hidden = 0;  // multiple of 8
};

Status launchMoeCombine(const MoeCombineArgs& a, cudaStream_t stream);

}  // namespace garden::rose::cuda
