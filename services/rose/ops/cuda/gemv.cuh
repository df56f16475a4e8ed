#pragma once
// bf16 GEMV for a few rows (M <= 8 tokens): y[M, N] = x[M, K] . w[N, K]^T (+ bias[N]), row-major
// bf16 in and out, f32 accumulation on the CUDA cores [TAG_GEMV]. At one decode token a linear
// layer only streams its weights; cuBLASLt's best at M = 1 reads gpt-oss's QKV (29.5 MB) at
// ~1.8 TB/s (bench/results/gpu-llm-2026-12-03-h200-s3, call 5). Here each warp owns `rows`
// consecutive output columns and walks K in 16-byte chunks (lane l takes chunks l, l + 32, ...;
// `unroll` chunks per lane per step, so rows x unroll 16-byte weight loads are in flight per lane),
// multiplying each chunk by the same chunk of every token row (L1-resident after the first warp)
// into rows x M f32 sums; then a xor-butterfly over the lanes, bias, one rounding to bf16.
//
// Bits: an output (m, n) is lane sums in chunk order (each chunk's 8 products fused in element
// order), then the butterfly in a fixed order — the same operations for every M and every
// (rows, unroll) shape that gives lane l the same chunks, i.e. it depends on K only: rows of y do
// not change with M (GemmRunner's M/2 check holds by construction).
//
// A GemmRunner candidate for its M <= 8 buckets (gemm.h), off by default (GemmRunner::setGemv):
// verified on the H200 but it wins no bucket (bench/results/gpu-llm-2026-12-03-h200-s4). Deeper
// shapes (unroll 8 / 12 / 16, a lane's whole K = 2880 share in flight at once) were tried on
// 2026-12-03 (gpu-llm-2026-12-03-h200-s5, call 2): M = 1 QKV best 16.2 us vs cuBLASLt 15.2-16.4
// (the old 4 x 2 shape still the best of them), so they were not kept.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

inline constexpr int64_t kGemvMaxRows = 8;

struct GemvArgs {
  const __nv_bfloat16* x = nullptr;     // [m, k]
  const __nv_bfloat16* w = nullptr;     // [n, k]
  const __nv_bfloat16* bias = nullptr;  // [n] or null
  __nv_bfloat16* y = nullptr;           // [m, n]; must not overlap x, w, bias
  int64_t m = 0, n = 0, k = 0;
  int rows = 4;    // output columns per warp: 2, 4 or 8
  int unroll = 2;  // 16-byte chunks per lane per step: 2 or 4
  // [TAG_PDL_GEMV] Launched programmatically (CUDA graphs included): scheduled while the previous
  // kernel finishes (the norm and the attention before a decode step's QKV / O-proj let it go
  // from their first instruction), waiting for it before reading anything. Same arithmetic.
  bool pdl = false;
};

// 1 <= m <= 8, n >= 1, k % 8 == 0, (rows, unroll) one of the shapes gemvShapes() lists for
// M = 8, or for M = 4 when m <= 4.
bool gemvSupported(int64_t m, int64_t n, int64_t k, int rows, int unroll);
struct GemvShape {
  int rows = 4;
  int unroll = 2;
};
// The shapes worth timing at M = m (fewer columns per warp as M grows: the sums are rows x M
// registers); returns how many were written.
int gemvShapes(int64_t m, GemvShape (&out)[4]);

// Enqueues the GEMV on `stream`. Pointers 16-byte aligned. No allocation; capturable.
Status launchGemv(const GemvArgs& a, cudaStream_t stream);

}  // namespace garden::rose::cuda
