#pragma once
// Grouped GEMMs of gpt-oss's experts over expert-sorted ("permuted") rows (moe_permute.cuh):
// every M tile of rows belongs to one expert (tile_expert), so block (m tile, n tile) computes
//   y[r, n] = Σ_k A[src(r), k] · W[e][n][k]  (+ bias[e][n])
// with mma.sync m16n8k16 bf16 and f32 accumulation, K in tiles of 64 streamed through shared
// memory (cp.async, 3 stages). A rows are gathered through a_rows (the permuted row's source
// token; -1 reads zeros) or read in place. Weights are either bf16 [E, N, K] or MXFP4 resident in
// the tiled layout below, dequantized to bf16 in shared memory per K tile (exact: every MXFP4
// value is a bf16). Epilogues:
//   kSwiglu (gate_up): columns come in (gate, up) pairs (interleaved rows of W1); each pair
//     becomes one output min(g,L)·σ(α·min(g,L))·(clamp(u,−L,L)+1), output width N/2;
//   kBias (down): y = acc + bias, output width N.
// A row's result does not depend on the tile shape or the other rows (same K order and mma
// chains in every configuration), so the launcher may pick the tile by size.
//
// Tiled MXFP4 layout [TAG_MXFP4_TILED] (mxfp4PackedBytes): for W [E, N, K] with G = K/32 groups,
// NP = N rounded up to 128, GP = G rounded up to 2, KT = GP/2:
//   codes  [E][NP/128][KT][128 rows][32 bytes]  (two groups of 16 code bytes, checkpoint order)
//   scales [E][NP/128][KT][128 rows][2]
// so one (expert, 128-row N tile, 64-wide K tile) is one contiguous 4 KiB of codes and 256 bytes
// of scales. Padding rows/groups hold code 0 (value 0) and scale 127.
// Pointers are device memory owned by the caller.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

inline constexpr int kMoeGemmTileN = 128;
inline constexpr int kMoeGemmTileK = 64;

struct Mxfp4PackedShape {
  int64_t experts = 0, n = 0, k = 0;
  int64_t n_tiles() const { return (n + kMoeGemmTileN - 1) / kMoeGemmTileN; }
  int64_t k_tiles() const { return ((k / 32) + 1) / 2; }
  size_t codeBytes() const {
    return static_cast<size_t>(experts * n_tiles() * k_tiles()) * kMoeGemmTileN * 32;
  }
  size_t scaleBytes() const {
    return static_cast<size_t>(experts * n_tiles() * k_tiles()) * kMoeGemmTileN * 2;
  }
};

// Repacks experts [first, first + count) of a checkpoint MXFP4 weight (codes [count, N, K/32, 16],
// scales [count, N, K/32], device memory, e.g. a staging copy) into the tiled layout of `shape`.
Status launchMxfp4Pack(const uint8_t* src_codes, const uint8_t* src_scales, int64_t first,
                       int64_t count, const Mxfp4PackedShape& shape, uint8_t* codes,
                       uint8_t* scales, unsigned* max_scale, cudaStream_t stream);

enum class MoeGemmEpilogue : int32_t { kSwiglu = 0, kBias = 1 };

struct MoeGemmArgs {
  const __nv_bfloat16* a = nullptr;   // [rows of A, K]
  const int32_t* a_rows = nullptr;    // [num_tiles * block_m] source row of A, or null (in place)
  const int32_t* tile_expert = nullptr;  // [max_tiles]
  const int32_t* num_tiles = nullptr;    // [1]
  const __nv_bfloat16* w = nullptr;   // bf16 weights [E, N, K] (or null)
  const uint8_t* codes = nullptr;     // MXFP4 tiled (or null)
  const uint8_t* scales = nullptr;
  const __nv_bfloat16* bias = nullptr;  // [E, N] or null
  __nv_bfloat16* out = nullptr;       // [num_tiles * block_m, N or N/2]
  // Rows of the tile that are real (>= 0) when a_rows is null (the down projection reads its
  // rows in place): the decode kernel skips all-padding halves of a tile. May be null.
  const int32_t* row_valid = nullptr;
  // MXFP4: the largest E8M0 scale byte of the weights (uploadMxfp4Experts records it); the
  // decode kernel needs <= 128. force_tiled: always the tiled kernel (tests).
  uint32_t mx_max_scale = 255;
  bool force_tiled = false;
  // Most rows any one expert can get (host bound: tokens of the step, as an expert appears at
  // most once in a token's top-k); the decode kernel stages fewer rows when it is <= 8.
  int32_t max_rows_per_expert = 1 << 30;
  // block_m 16 (the decode regime): K summed in moeKSlicing(kt, k_slices) fixed slices
  // [TAG_MOE_K_SLICES] by both the decode kernel (one CTA per slice, reduced in slice order inside
  // a thread-block cluster) and the tiled kernel, so their bits agree; 1..8. block_m 64/128 (the
  // tiled kernel's prefill tiles) always sum K in one chain: a row computed in the decode regime
  // and the same row in a prefill-sized step agree to f32 rounding, not bit for bit (with
  // k_slices = 1 they agree bit for bit, the previous contract).
  int32_t k_slices = 1;
  // MXFP4 decode kernel [TAG_MOE_L2_PREFETCH]: each warp asks L2 for its weight tiles this many
  // K tiles beyond its register ring (prefetch.global.L2: no register, no scoreboard), so more of
  // the weight stream is in flight than the ring holds. 0: off. Changes no arithmetic.
  int32_t l2_prefetch = 0;
  // [TAG_MOE_F16_OUT_SCALE] The kBias epilogue (the down projection) multiplies its f32 sum, bias
  // added, by this before its one rounding: an exact power of two, so only the range moves. fp16
  // experts store their outputs times kMoeF16OutScale (outputs up to 2^5 x 65,504 stay finite)
  // and the combine multiplies back (MoeCombineArgs::y_scale); 1 (bf16): as is.
  float out_scale = 1.f;
  int32_t max_tiles = 0;
  int32_t block_m = 0;  // 16, 64 or 128 (moeGemmBlockM)
  int32_t num_experts = 0;
  int32_t n = 0;  // even
  int32_t k = 0;  // multiple of 32 (MXFP4) or of 8 (bf16)
  MoeGemmEpilogue epilogue = MoeGemmEpilogue::kBias;
  float swiglu_limit = 7.f;
  float swiglu_alpha = 1.702f;
  // [TAG_ATTN_F16] a, out, bias and dense weights hold IEEE fp16 bits; MXFP4 weights dequantize
  // to fp16 (every scale byte must be <= 128).
  bool f16 = false;
  // [TAG_PDL_GRAPH] The MXFP4 / bf16 kernels launched programmatically (common.cuh
  // launchPdlAlways), in CUDA graphs too: each waits for the previous kernel in its first
  // statement and lets the next be scheduled once its products are done
  // (CudaKernelOptions::pdl_graph).
  bool pdl = false;
};

// The M tile for `assignments` rows over `num_experts` experts (the align step must use it).
// mx_wide: the experts are MXFP4 with every scale <= 128 (both projections), so block_m 64 tiles
// run the wide kernel [TAG_MOE_WIDE]; then block_m 64 starts above moeWideMinAvg rows per expert
// on average (with one K chain) instead of 24.
// Measured (MoE op alone, 20b shapes, gpu-llm-2026-12-03-h200-s4 call 1): at 8 rows per expert
// (T = 64) the decode kernel wins (279 vs 305 us), at 16 (T = 128) the wide kernel (322 vs 383).
int32_t moeGemmBlockM(int64_t assignments, int32_t num_experts, bool mx_wide = false);
// [TAG_MOE_WIDE] Rows per expert on average above which MXFP4 experts take block_m 64 and the
// wide kernel (at every larger size since 2026-12-04; before, block_m 128 and the tiled kernel
// took over above 96).
inline constexpr int kMoeWideDefaultMinAvg = 12;
void setMoeWideMinAvg(int rows);
// Benchmarks only (rose_llm_bench --moe-gemm): the wide kernel's shape (0: the default, 8 warps,
// weight ring depth 4, 4 token stages; 1: depth 2, 6 token stages; 2: depth 2, 16 warps; 3: depth 2;
// -1: off, block_m 64 takes the tiled kernel), and a fixed block_m for every step (0: moeGemmBlockM's
// choice). Every shape gives the same bits. Process-global, like setMoeDecodeVariant.
void setMoeWideVariant(int variant);
void setMoeBlockMOverride(int block_m);

Status checkMoeGemm(const MoeGemmArgs& a);
// [TAG_MOE_F16_OUT_SCALE] The scale of fp16 experts' stored down-projection outputs (2^-5), and
// its inverse for the combine. Real gpt-oss-120b experts are reported to output ~±100,000
// (ROCm hip-ep PR 168), past fp16's 65,504; scaled, fp16 holds up to ~2.1M, and values below
// 2^-9 lose precision to fp16's subnormals (an absolute error under 2^-20 added to an f32
// residual of order 1 or more).
inline constexpr float kMoeF16OutScale = 1.f / 32.f;
inline constexpr float kMoeF16OutUnscale = 32.f;
// Benchmarks only (rose_llm_bench --moe-gemm): which shape of the decode kernel block_m-16 MXFP4
// launches take (0: the default, prefetch depth 8 at one token and 4 above; 1: depth 4; 2: half
// the warps per CTA, depth 8; 3: half the warps, depth 4; 4: depth 8; 5: the default shapes
// without the branch-free steady loop (every slot checked, as before 2026-12-03); -1: the tiled kernel, for
// block_m 64 too, and moeGemmBlockM's pre-wide choice of block_m). Every shape gives the same
// bits. Process-global; not for use while another thread launches.
void setMoeDecodeVariant(int variant);
// The K slice count the CUDA LLM ops put in MoeGemmArgs::k_slices [TAG_MOE_K_SLICES]
// (process-global, set before loading a model: it changes the model's numerics slightly;
// rose_llm_bench --moe-k-slices). Default 1 (one chain): on the H200 slicing made the MoE op
// faster only at 1-2 tokens (2 slices: 49 vs 60 us at T = 1) and slower from T = 16 on (T = 64:
// 322 vs 272 us), bench/results/gpu-llm-2026-12-03-h200.
inline constexpr int kMoeDefaultKSlices = 1;
void setMoeKSlices(int slices);
int moeKSlices();
// [TAG_MOE_L2_PREFETCH] The prefetch distance the CUDA LLM ops put in MoeGemmArgs::l2_prefetch
// (process-global; rose_llm_bench --moe-prefetch). Same bits at every distance. Off by default:
// it paid only while the decode kernel copied its register ring (MoE op alone, 20b shapes,
// bench/results/gpu-llm-2026-12-03-h200-s4 call 1, distance 0 / 8: T = 1 60.4 / 53.1 us, T = 64
// 307 / 279); with the slot refilled in place (call 3) it costs: T = 1 45.1 / 50.4 us, T = 16
// 200.6 / 222.6, T = 64 237.8 / 261.4.
inline constexpr int kMoeDefaultL2Prefetch = 0;
void setMoeL2Prefetch(int kt);
int moeL2Prefetch();
Status launchMoeGemm(const MoeGemmArgs& a, cudaStream_t stream);

}  // namespace garden::rose::cuda
