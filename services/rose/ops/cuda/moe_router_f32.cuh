#pragma once
// gpt-oss router logits in f32 from the f32 residual stream (the post-attention norm folded in):
//   logits[t, e] = rsqrt(mean_k(res[t, k]^2) + eps) * sum_k res[t, k] * wt[k, e]
// where wt = (router ⊙ norm weight)ᵀ in f32 (a bf16 × bf16 product is exact in f32), i.e. the
// router GEMM of Hugging Face's fp32 model (f32 normalized row · f32 weights) without the bf16
// rounding of the normalized row that the experts' input carries.
//
// Two passes. launchRouterF32Partials: K is cut into fixed slices of kRouterF32SliceK columns
// (the split depends on the hidden size only, never on the number of tokens, so a token's bits
// do not depend on its batch); block (token tile of 16, expert tile of 32, slice) writes its
// partial dot products to part[slice][t][e] and, for the first expert tile, the slice's sum of
// squares to ss[slice][t]. The route kernel (moe_route.cuh, MoeRouteArgs::splits) sums the slices
// in order, scales by the row's rsqrt and adds the bias before the top-k. Pointers are device
// memory owned by the caller; residual and wt 16-byte aligned.
//
// Fused route [TAG_ROUTER_FUSED_ROUTE]: with RouterF32Args::route_counters set, the route runs in
// the same kernel: each block counts itself done on its token tile's counter (after a fence), and
// the tile's last block sums the slices and takes the top-k for the tile's tokens with the route
// kernel's own per-token code (moe_route_device.cuh: the same loads in the same order, so the same
// bits), then resets the counter for the next launch (graph replays included). Off by default:
// measured on the H200 (bench/results/gpu-llm-2026-12-03-h200-s5, call 2) it lost to the two
// kernels in the graphed decode step (b1@8k 2.513 vs 2.465 ms, b64@1k 7.609 vs 7.424 ms): the
// route's own latency moved into the router kernel's last block (ncu: router 11.0 us per layer
// fused vs 5.1 + 8.7 apart), and every block pays a fence and an atomic.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"
#include "services/rose/ops/cuda/moe_route.cuh"

namespace garden::rose::cuda {

inline constexpr int kRouterF32SliceK = 256;

// Slices of the K dimension for `hidden` columns.
inline int32_t routerF32Splits(int64_t hidden) {
  return static_cast<int32_t>((hidden + kRouterF32SliceK - 1) / kRouterF32SliceK);
}

struct RouterF32Args {
  const float* residual = nullptr;  // [T, H]
  const float* wt = nullptr;        // [H, E]
  float* part = nullptr;            // [splits, T, E]
  float* ss = nullptr;              // [splits, T]
  int64_t num_tokens = 0;
  int32_t hidden = 0;       // multiple of 4
  int32_t num_experts = 0;  // multiple of 4
  // [TAG_ROUTER_FUSED_ROUTE] Non-null: routerF32TileCounters(num_tokens) zeroed counters (the
  // kernel leaves them zeroed), and `route` the route of these partials (logits = part, ss, splits,
  // hidden, num_tokens as above; bias, outputs, top_k, eps), checked by checkMoeRoute.
  unsigned int* route_counters = nullptr;
  MoeRouteArgs route;
  // [TAG_PDL_GRAPH] The CUDA-core kernels launched programmatically (common.cuh
  // launchPdlAlways), in CUDA graphs too: the router's weights are loaded before its pdlWait(),
  // the residual after (CudaKernelOptions::pdl_graph).
  bool pdl = false;
};

// The tensor-core router [TAG_ROUTER_MMA]: the same partials and sums of squares (same slices,
// same layout, for the same route kernel) from bf16 mma.sync with f32 sums. Each residual value
// is split in registers into three bf16 parts (hi + mid + lo == x exactly), each weight is given
// as its exact bf16 hi + lo split (services/rose/ops/router_split.h: BF16 [2, Ep, Hp]), and the
// five products that matter (hi·hi, hi·lo, mid·hi, mid·lo, lo·hi; lo·lo is below f32 rounding)
// are exact in f32 — only the order of the f32 sums differs from the SIMT kernel's, and that
// order depends on the hidden size alone (a token's bits do not depend on its batch). Block
// (64 tokens, 64 experts, slice): 4 warps of 16 tokens, each 8 n-tiles of 8 experts.
struct RouterMmaArgs {
  const float* residual = nullptr;  // [T, H], 16-byte aligned
  const uint16_t* w = nullptr;      // bf16 bits [2, Ep, Hp] (router_split.h), 16-byte aligned
  float* part = nullptr;            // [splits, T, E]
  float* ss = nullptr;              // [splits, T]
  int64_t num_tokens = 0;
  int32_t hidden = 0;       // multiple of 4
  int32_t num_experts = 0;  // multiple of 4
};

Status launchRouterMmaPartials(const RouterMmaArgs& a, cudaStream_t stream);

// Counters the fused route needs for up to `max_tokens` tokens (one per 16-token tile).
inline int64_t routerF32TileCounters(int64_t max_tokens) { return (max_tokens + 15) / 16; }

Status launchRouterF32Partials(const RouterF32Args& a, cudaStream_t stream);

// [TAG_ROUTER_FUSED_ROUTE] Whether the CUDA LLM ops route inside the router kernel (default off,
// see above; on: for A/B runs and the test that compares the two bit for bit).
// Process-global, read at each moeRouteF32 call (a captured graph keeps what it captured).
void setRouterFusedRoute(bool on);
bool routerFusedRoute();

// [TAG_ROUTER_F32_TILED] Steps of at least this many tokens run launchRouterF32Partials on a
// register-tiled kernel (64 tokens x 64 experts per block, the slice staged once in shared
// memory) that repeats routerF32Kernel's chains in their order: the same bits (checked bit for
// bit by MoeRouteF32TiledKernelGivesTheSameBits), so the choice may follow the step's size. 0: the
// original kernel for every step. Process-global (rose_llm_bench --router-tiled-min N).
inline constexpr int64_t kRouterF32TiledMinTokens = 128;
void setRouterF32TiledMinTokens(int64_t tokens);
// [TAG_ROUTER_F32_TILED_ROWS] The tiled kernel with its f32 rows staged as they lie (coalesced
// reads, rows padded in shared memory) — the same chains, so the same bits. Off: measured on the
// H200 (2026-12-04 s12) without a gain (rose_llm_bench --router-tiled-rows on; gpu_llm.sh rowsab).
void setRouterF32TiledRows(bool on);
// [TAG_ROUTER_F32_TILED_TOK] The tiled kernel's token tile: 64 (16 warps, one block per SM) or
// 32 (8 warps, several blocks per SM: one block's staging overlaps another's sums). The same
// chains, so the same bits. Process-global (rose_llm_bench --router-tiled-tok 32|64).
inline constexpr int kRouterF32TiledTok = 64;
void setRouterF32TiledTok(int tokens);

// [TAG_ROUTER_MMA] Whether the CUDA LLM ops ask for the split router weights (routerF32Split():
// the model then uploads them and moeRouteF32 runs the tensor-core kernel) — CudaKernelOptions::
// router_mma, set by the backend at creation. Process-global, read at upload.
void setRouterMma(bool on);
bool routerMma();

}  // namespace garden::rose::cuda
