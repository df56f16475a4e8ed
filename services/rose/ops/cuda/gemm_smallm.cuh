#pragma once
// Weight-streaming bf16 GEMM for few rows (M <= 256 tokens): y[M, N] = x[M, K] . w[N, K]^T
// (+ bias[N]), row-major bf16, f32 accumulation — the same contract as GemmRunner (gemm.h), which
// times it as one more candidate for its M buckets <= 256.
//
// At few tokens a linear layer is bound by reading its weights once from HBM. The grid is
// (splits, N / tile_n): each CTA owns a tile_n-column tile of w (64 or 128) and one K slice of
// K / splits, and streams it through shared memory in 64-wide K stages (cp.async 16-byte
// coalesced loads, 4-6 stage pipeline) together with the matching x slice (L2-resident); 8 warps
// (2 along M x 4 along N, tile_n / 4 columns each) multiply on tensor cores (ldmatrix + mma.sync
// m16n8k16 bf16, f32 accumulators). tile_n 128 halves the x re-reads from L2 (each N tile reads
// all of x) at half the CTAs. The M padding (32, 64, 128 or 256 rows) picks a kernel
// instantiation; rows past M are masked (zero-filled, never stored).
//
// Split-K reduction: the `splits` CTAs of one N tile form a thread-block cluster (Hopper, at most
// 8). Each writes its f32 partial tile to its own shared memory; after a cluster barrier every CTA
// reduces a disjoint share of the tile's outputs, reading the partials of ranks 0, 1, ...,
// splits-1 in that fixed order through distributed shared memory, adds the bias, rounds once to
// bf16 and stores y. No global workspace, no counters, nothing that persists between launches:
// deterministic and CUDA-graph replayable as is.
//
// Bits: an output element is the f32 sum over splits (in rank order) of f32 mma accumulations
// over its split's K range in ascending 16-wide steps; it depends on its own row of x, w, bias and
// `splits` only — never on M, the other rows, tile_n or the M instantiation. So for a fixed
// `splits` a row's bits are the same for every M in 1..256 and both tiles (GemmRunner keeps its
// choice fixed per M bucket).

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

constexpr int64_t kSmallMMaxRows = 256;
constexpr int kSmallMTileK = 64;     // K per pipeline stage
constexpr int kSmallMMaxSplits = 8;  // portable cluster size

struct SmallMGemmArgs {
  const __nv_bfloat16* x = nullptr;     // [m, k]
  const __nv_bfloat16* w = nullptr;     // [n, k]
  const __nv_bfloat16* bias = nullptr;  // [n] or null
  __nv_bfloat16* y = nullptr;           // [m, n]; must not overlap x, w, bias
  int64_t m = 0, n = 0, k = 0;
  int splits = 1;   // K slices (1, 2, 4 or 8); K % (64 * splits) == 0
  int tile_n = 64;  // output columns per CTA: 64 or 128; N % tile_n == 0
};

// The shape rules: 1 <= m <= 256, tile_n in {64, 128}, n % tile_n == 0, splits in {1, 2, 4, 8},
// k % (64 * splits) == 0.
bool smallMGemmSupported(int64_t m, int64_t n, int64_t k, int splits, int tile_n = 64);

struct SmallMConfig {
  int tile_n = 64;
  int splits = 1;
};
// The configurations worth timing for (n, k) on a device with `num_sms` SMs (CTAs between
// num_sms / 4 and 4 * num_sms, at least two K stages per split): tile 64 then 128, splits
// ascending; returns how many were written (0: the kernel does not apply to this (n, k)).
int smallMGemmCandidates(int64_t n, int64_t k, int num_sms, SmallMConfig (&out)[8]);

// Sets the kernels' shared-memory limits (once per process; idempotent). Call before the first
// launch outside stream capture (GemmRunner::create does); launchSmallMGemm calls it too.
Status prepareSmallMGemm();

// Enqueues the GEMM on `stream`. Pointers 16-byte aligned. No allocation, no sync; capturable.
// invalidArgument if the shape rules or alignment do not hold.
Status launchSmallMGemm(const SmallMGemmArgs& a, cudaStream_t stream);

}  // namespace garden::rose::cuda
