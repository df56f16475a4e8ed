#pragma once
// The MXFP4 expert GEMM on Hopper wgmma [TAG_MOE_WGMMA] (moe_wgmma.cu, docs/gpt-oss-cuda.md): one
// grouped launch per projection over a step's expert-sorted, gathered bf16 rows, reading the
// resident MXFP4 experts (the tiled layout, mxfp4_tiles.h) and dequantizing them in registers
// as the wgmma A operand — no bf16 weight scratch, no per-expert launches. An alternative to the
// per-call dequantization + per-expert cuBLASLt GEMMs of the bf16 prefill path [TAG_MOE_LT_BF16]
// (CudaLlmOps::moeExpertsLtBf16 picks it with moeLtWgmma()).
//
// out[r][c] for the rows r of tile t (expert e = tiles[t].expert) and the weight rows c:
//   plain:  bf16(sum_k x[r][k] W[e][c][k] + bias[e][c])                      (c < n)
//   swiglu: bf16(clampedSwiglu(h[2i] + bias[e][2i], h[2i+1] + bias[e][2i+1])) at c = i < n / 2,
//           h the f32 sums (the tiled kernel's epilogue: bias and SwiGLU on the f32 sums, one
//           rounding); rows whose row_token is negative (the align's padding) are written as 0.
// Sums in f32 over K in 64-wide tiles, k16 steps in order (wgmma's own order inside a step).
// Rows of x past x_rows read as zeros; tile rows past tiles[t].rows are computed and not written.
// Pointers are device memory owned by the caller; needs sm_90 and every scale byte <= 128.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"
#include "services/rose/ops/cuda/moe_wgmma_plan.h"

namespace garden::rose::cuda {

struct MoeWgmmaArgs {
  const __nv_bfloat16* x = nullptr;   // [x_rows][k], 16-byte aligned rows (k % 8 == 0)
  int64_t x_rows = 0;
  const uint8_t* codes = nullptr;     // tiled MXFP4 layout of W [experts][n][k]
  const uint8_t* scales = nullptr;
  const __nv_bfloat16* bias = nullptr;  // [experts][n] or null
  const MoeWgmmaTile* tiles = nullptr;  // device, [num_tiles] (moeWgmmaPlanTiles)
  int32_t num_tiles = 0;
  // [TAG_MOE_WGMMA_DEVICE_PLAN] Non-null: the plan's count on the device (launchMoeWgmmaDevicePlan);
  // num_tiles is then the bound the grid is sized by (moeWgmmaMaxTiles) and items past the
  // count return at once.
  const int32_t* num_tiles_dev = nullptr;
  const int32_t* row_token = nullptr;   // [x_rows], swiglu only: < 0 rows are written as 0
  __nv_bfloat16* out = nullptr;         // [x_rows][n] (plain) or [x_rows][n / 2] (swiglu)
  int32_t experts = 0;
  int32_t n = 0;  // weight rows; a multiple of 8 (16 with swiglu)
  int32_t k = 0;  // a multiple of 32
  bool swiglu = false;
  float limit = 7.f;
  float alpha = 1.702f;
  uint32_t max_scale = 255;  // the largest E8M0 byte: must be <= 128 (kMxfp4MaxDecodeScale)
  bool f16 = false;  // x, bias and out hold IEEE fp16 bits; weights dequantize to fp16 [TAG_ATTN_F16]
  // [TAG_MOE_F16_OUT_SCALE] Plain (not swiglu) outputs: the f32 sum, bias added, times this
  // before the rounding (MoeGemmArgs::out_scale).
  float out_scale = 1.f;
  // [TAG_MOE_WGMMA_SMEM_A] A warpgroup of its own dequantizes the weights into shared memory and
  // the consumers run shared-memory wgmmas only, one K tile in flight (moeWgmmaSmemA()).
  bool smem_a = false;
};

// [TAG_MOE_WGMMA_DEVICE_PLAN] The token tiles planned on the device from the align's output, so
// the host needs no expert ranges (no device-to-host copy and wait per layer): the same tiles as
// moeWgmmaPlanTiles over the align's row offsets, in the same order. One block.
inline constexpr int32_t kMoeWgmmaPlanMaxExperts = 1024;
struct MoeWgmmaDevicePlanArgs {
  const int32_t* tile_expert = nullptr;      // the align's tiles (block_m rows each), by expert
  const int32_t* num_align_tiles = nullptr;  // device [1]: the align's tile count
  int32_t max_align_tiles = 0;
  int32_t block_m = 0;
  int32_t experts = 0;                       // <= kMoeWgmmaPlanMaxExperts
  MoeWgmmaTile* tiles = nullptr;             // device [cap]
  int32_t* num_tiles = nullptr;              // device [1]
  int32_t cap = 0;                           // moeWgmmaMaxTiles(align rows bound, busy experts)
};
Status launchMoeWgmmaDevicePlan(const MoeWgmmaDevicePlanArgs& a, cudaStream_t stream);

// Whether the kernel can run here: an sm_90 device and a driver with tensor maps.
bool moeWgmmaSupported();
Status launchMoeWgmma(const MoeWgmmaArgs& a, cudaStream_t stream);
// Whether a launch since the last call gave up waiting on an mbarrier (the pipeline's watchdog,
// as the Hopper attention kernels'); synchronous, resets the flag. Tests call it.
Result<bool> moeWgmmaWatchdogFired();

}  // namespace garden::rose::cuda
