#pragma once
// Ragged (varlen) attention for embedding models: sequences packed back to back with no padding and
// no KV cache, causal or bidirectional, GQA, head_dim 64 or 128. FlashAttention-2 style: each block
// owns a tile of query rows of one (sequence, q head); K/V tiles of 64 keys stream through shared
// memory (cp.async, double-buffered) and an online softmax keeps the running max and sum in f32;
// the two matrix products run on tensor cores (mma.sync m16n8k16 bf16, f32 accumulation).
//
// Block -> (sequence, query tile) is found on the device from cu_seqlens, and the grid depends
// only on (num_tokens, num_seqs, heads), so one launch shape serves every batch of a CUDA-graph
// bucket. A row's result does not depend on the other sequences in the batch, nor on the variant
// the launcher picks (AttentionVariant below).

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
  // [TAG_ATTN_FP8_OUT] Instead of `out` (then unused): the output as the O-proj's e4m3 operand
  // (fp8_dense.cuh): codes [num_tokens, Hq * 128] and one f32 scale per (token, q head) at
  // out_scales[head * out_scale_rows + token]. The Hopper variants only (head_dim 128); the others
  // refuse it.
  uint8_t* out_fp8 = nullptr;
  float* out_scales = nullptr;
  int64_t out_scale_rows = 0;
};

// The variants one launch can run, named by their schedule. All compute bit-identical rows: the
// same 64-key tiles in the same order and the same f32 arithmetic per row (explicit roundings),
// so a choice changes the time, never a result.
//   Narrow warps: one m16 query tile (16 rows) per warp, Q fragments in registers; the q heads of
//   a GQA group share each K/V tile two per block when the group is even (one head per block
//   otherwise); the causal/length mask only on the tiles that need it; causal query tiles
//   longest-first. head_dim 64 or 128.
//     kNarrow16: 1 warp, 16 query rows per block (decode-like sizes: more blocks);
//     kNarrow64: 4 warps, 64 query rows per block.
//   Wide warps: two m16 tiles (32 rows) per warp share every K/V fragment read from shared
//   memory, the Q tile in shared memory; head_dim 128 only.
//     kWide64:  2 warps x the 2 q heads of a GQA pair (even groups only), 64 rows per head;
//     kWide128: 4 warps, one q head, 128 rows per block.
// (Benchmark history, bench/results/gpu-embed-2026-11-30-h200-s3: the wide 64-row tiles matched or
// beat the narrow ones at every prefill-like Qwen3 shape; a 4-warp shared 128-row wide tile and a
// 3-stage one lost and were removed, as was the first kernel, which masked every tile.)
//   Hopper (attention_sm90.cuh; head_dim 128, compute capability 9.0): wgmma + TMA, 128 query
//   rows per block, warp-specialized. NOT bit-identical to the four above (other tiles and
//   accumulation order; equal within bf16 rounding), so only the kSm90 policy picks them:
//     kSm90:      two consumer warpgroups, softmax overlapped with the matrix products;
//     kSm90Basic: the same, each step after the other (A/B, fallback);
//     kSm90CpAsync: kSm90Basic loading with cp.async instead of TMA (bisection aid).
enum class AttentionVariant : int32_t {
  kNarrow16 = 1,
  kNarrow64 = 2,
  kWide64 = 3,
  kWide128 = 4,
  kSm90 = 5,
  kSm90Basic = 6,
  kSm90CpAsync = 7,
};
const char* attentionVariantName(AttentionVariant v);  // "narrow16", ..., "sm90", "sm90basic", "sm90cpasync"
// The Hopper variants: the ones that can write an fp8 output (AttentionArgs::out_fp8).
constexpr bool attentionVariantIsSm90(AttentionVariant v) {
  return v == AttentionVariant::kSm90 || v == AttentionVariant::kSm90Basic ||
         v == AttentionVariant::kSm90CpAsync;
}

// Which variants the size policy may pick (rose: GARDEN_ATTENTION_KERNEL=auto|narrow|sm90, read
// into CudaKernelOptions at start-up).
//   kAuto:   narrow warps for head_dim 64 and for decode-like sizes (fewer 64-row query tiles,
//            over all q heads, than two per SM: kNarrow16), else wide: kWide64, or kWide128 for
//            an odd GQA group;
//   kNarrow: narrow warps only (kNarrow16 or kNarrow64 by the same size rule), for A/B runs;
//   kSm90:   the Hopper kernel (kSm90) for every head_dim 128 batch, whatever its size (so a
//            row's bits do not depend on its batch), else as kAuto. Opt-in until timed on the
//            GPU: kAuto stays the default.
enum class AttentionPolicy : int32_t { kAuto = 0, kNarrow = 1, kSm90 = 2 };

// The variant a launch of `a` runs under `policy` on a device with `sm_count` multiprocessors, or
// why `a` cannot run (INVALID_ARGUMENT / UNIMPLEMENTED naming the field). Pure: reads the shapes,
// flags and pointer alignment of `a`, never device memory. launchAttention() uses it, so it also
// answers "is this supported?".
Result<AttentionVariant> selectAttentionVariant(const AttentionArgs& a, AttentionPolicy policy,
                                                int sm_count);
// OK when variant `v` can run `a`: the checks every variant shares, then head_dim 128 for the
// wide variants and an even GQA group for kWide64.
Status checkAttentionVariant(const AttentionArgs& a, AttentionVariant v);

// pdl: programmatic dependent launch for an eager launch (common.cuh [TAG_PDL]); the backend
// passes its CudaKernelOptions::pdl. A batch without tokens or sequences launches nothing.
Status launchAttention(const AttentionArgs& a, cudaStream_t stream,
                       AttentionPolicy policy = AttentionPolicy::kAuto, bool pdl = true);
// Runs variant `v` (tests, benchmarks); errors as checkAttentionVariant.
Status launchAttentionVariant(const AttentionArgs& a, cudaStream_t stream, AttentionVariant v,
                              bool pdl = true);

}  // namespace garden::rose::cuda
