#pragma once
// The index work around gpt-oss's grouped expert GEMMs (moe_gemm.cuh):
//   align:   the (token, k) assignments of topk_ids grouped by expert into "permuted rows", each
//            expert's rows padded to a multiple of the GEMM's M tile so that every tile belongs
//            to one expert. Deterministic: within an expert, rows keep (token, k) order. Writes
//            row_token (the source token of each permuted row, -1 for padding), row_of (the
//            permuted row of each assignment), tile_expert (the expert of each M tile, -1 past the
//            last) and num_tiles. One block for small steps; with a block_counts workspace,
//            steps of >= kMoeAlignMultiBlockMin assignments run on many blocks
//            [TAG_MOE_ALIGN_MULTIBLOCK] (the one block took ~70 µs at 32k assignments).
//   combine: out[t] = Σ_k w[t,k] · y[row_of[t,k]] in f32 in k order, rounded once to bf16.
// Pointers are device memory owned by the caller.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"
#include "services/rose/ops/cuda/moe_route.cuh"

namespace garden::rose::cuda {

inline constexpr int kMoeAlignMaxExperts = 256;
// [TAG_MOE_ALIGN_MULTIBLOCK] At most this many blocks count and rank a large step; the workspace
// MoeAlignArgs::block_counts holds kMoeAlignMaxBlocks x num_experts int32.
inline constexpr int kMoeAlignMaxBlocks = 128;
inline constexpr int64_t kMoeAlignMultiBlockMin = 4096;

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
  // [TAG_MOE_ALIGN_MULTIBLOCK] Optional workspace of kMoeAlignMaxBlocks * num_experts int32
  // (contents need no initialization): steps of >= kMoeAlignMultiBlockMin assignments then run
  // two multi-block kernels with the same output. nullptr: the one-block kernel.
  int32_t* block_counts = nullptr;
  // [TAG_PDL_GRAPH] Launched programmatically (common.cuh launchPdlAlways), in CUDA graphs too:
  // the kernels wait for the previous one in their first statement (CudaKernelOptions::pdl_graph).
  bool pdl = false;
};

// Upper bound on M tiles (and so rows = tiles · block_m) for T·k assignments over E experts:
// an expert with c > 0 rows takes ceil(c / bm) <= floor(c / bm) + 1 tiles, the floors add up to
// at most floor(T·k / bm), and at most min(T·k, E) experts have rows. (The grouped GEMMs launch
// this many tiles: at decode, T = 1 and top-4, 4 instead of the 33 of ceil(T·k / bm) + E.)
inline int64_t moeAlignMaxTiles(int64_t assignments, int32_t num_experts, int32_t block_m) {
  const int64_t busy = assignments < num_experts ? assignments : num_experts;
  return busy + assignments / block_m;
}

// [TAG_MOE_ALIGN_MULTIBLOCK] Process-global switch for A/B runs (rose_llm_bench
// --moe-align-multiblock on|off); on by default. Off: the workspace is ignored.
void setMoeAlignMultiBlock(bool on);

// Steps of at most 32 assignments run a one-warp kernel, larger ones a 1024-thread block, and
// with a block_counts workspace those of >= kMoeAlignMultiBlockMin assignments two multi-block
// kernels (per-block expert counts, then every block scans them and ranks its own range); all
// write the same output.
Status launchMoeAlign(const MoeAlignArgs& a, cudaStream_t stream);
// The 1024-thread kernel whatever the size (tests hold the one-warp path to its output).
Status launchMoeAlignOneBlock(const MoeAlignArgs& a, cudaStream_t stream);

// [TAG_ROUTE_ALIGN] launchMoeRoute(r) then launchMoeAlign(a) in one kernel for decode-sized
// steps: 1..kMoeRouteAlignMaxTokens tokens and at most 32 assignments (the one-warp align), `a`
// reading the route's ids (a.topk_ids == r.topk_ids; same tokens, top_k and experts). The same
// outputs as the two kernels; one launch less per layer. Programmatic when r.pdl or a.pdl.
inline constexpr int kMoeRouteAlignMaxTokens = 8;
Status launchMoeRouteAlign(const MoeRouteArgs& r, const MoeAlignArgs& a, cudaStream_t stream);

struct MoeCombineArgs {
  const __nv_bfloat16* y = nullptr;  // [rows, hidden] (permuted expert outputs)
  const int32_t* row_of = nullptr;   // [T, k]
  const float* weights = nullptr;    // [T, k]
  __nv_bfloat16* out = nullptr;      // [T, hidden]
  int64_t num_tokens = 0;
  int32_t top_k = 0;
  int32_t hidden = 0;  // multiple of 8
  bool f16 = false;    // y and out hold IEEE fp16 bits [TAG_ATTN_F16]
  bool out_f32 = false;  // out is float (not rounded): the MoE output kept in f32
  // [TAG_MOE_F16_OUT_SCALE] The weighted sum times this (exact: a power of two) before it is
  // stored: the inverse of the scale the expert GEMMs stored y with (kMoeF16OutUnscale for fp16).
  float y_scale = 1.f;
  // [TAG_PDL_GRAPH] Launched programmatically (common.cuh launchPdlAlways), in CUDA graphs too:
  // the kernels wait for the previous one in their first statement (CudaKernelOptions::pdl_graph).
  bool pdl = false;
};

Status launchMoeCombine(const MoeCombineArgs& a, cudaStream_t stream);

}  // namespace garden::rose::cuda
