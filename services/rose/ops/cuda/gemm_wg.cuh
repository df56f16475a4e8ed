#pragma once
// [TAG_GEMM_WG] Hopper weight-streaming bf16 GEMM for a few hundred rows (tokens): y[M, N] =
// x[M, K] . w[N, K]^T (+ bias[N]), row-major bf16, f32 accumulation — GemmRunner's contract
// (gemm.h), which times it as one more candidate for its M buckets <= kWgGemmMaxRows.
//
// Why: at 128-512 tokens the embedding model's linear layers are short (a few microseconds of
// weights at HBM speed) and cuBLASLt's tuned choice streams them at ~1 TB/s (profile:
// bench/results/gpu-embed-2026-12-07-s30/call3). This kernel is built for that regime:
//   - Operands swapped: the weight rows are wgmma's M side (64 per consumer warpgroup) and the
//     tokens its N side (a token tile of 64, 128 or 256), so a CTA multiplies a 64 x W weight tile
//     (W = 64 or 128 rows, one or two consumer warpgroups) with a whole token tile from shared
//     memory (wgmma m64nTk16, both operands K-major, 128-byte swizzle).
//   - A producer warpgroup's one thread streams both operands with bulk tensor copies (TMA) into
//     a ring of 64-wide K stages under full/empty mbarriers; rows of x past M read zeros.
//   - Split-K over a thread-block cluster (splits = 1, 2, 4 or 8 CTAs along x), reduced through
//     distributed shared memory in rank order as gemm_smallm does: no workspace, no state.
//   - Programmatic launch (WgGemmArgs::pdl): the first stages' weight tiles are requested before
//     griddepcontrol.wait, so they stream while the previous kernel finishes; x is read only after.
// Grid (splits, N / (64 W), ceil(M / T)), cluster (splits, 1, 1), 128 (W + 1) threads.
//
// Bits: an output is the f32 sum over splits (rank order) of the f32 wgmma accumulation of its
// split's K range in ascending 16-wide steps; it depends on its row of x, its row of w, the bias
// and `splits` only — not on M, the other rows, W or T. GemmRunner keeps one choice per M bucket.
//
// Needs an sm_90 device and the driver's tensor-map encoder (wgGemmAvailable()).

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

constexpr int64_t kWgGemmMaxRows = 512;  // M buckets GemmRunner offers it for
constexpr int kWgGemmTileK = 64;         // K per pipeline stage
constexpr int kWgGemmMaxSplits = 8;      // portable cluster size

struct WgGemmArgs {
  const __nv_bfloat16* x = nullptr;     // [m, k]
  const __nv_bfloat16* w = nullptr;     // [n, k]
  const __nv_bfloat16* bias = nullptr;  // [n] or null
  __nv_bfloat16* y = nullptr;           // [m, n]; must not overlap x, w, bias
  int64_t m = 0, n = 0, k = 0;
  int splits = 1;       // K slices (1, 2, 4 or 8); k % (64 * splits) == 0
  int warpgroups = 2;   // consumer warpgroups (1 or 2): 64 or 128 weight rows per CTA
  int tok_tile = 128;   // tokens per CTA: 64, 128 or 256
  bool pdl = false;     // programmatic launch (weights requested before the wait)
};

struct WgGemmConfig {
  int splits = 1;
  int warpgroups = 2;
  int tok_tile = 128;
};

// The shape rules: m >= 1, n % (64 * warpgroups) == 0, splits in {1, 2, 4, 8},
// k % (64 * splits) == 0, warpgroups in {1, 2}, tok_tile in {64, 128, 256}, sizes below 2^31.
bool wgGemmSupported(int64_t m, int64_t n, int64_t k, const WgGemmConfig& c);
// The token tile for an M bucket: 64 up to 64 rows, 128 up to 128, 256 above.
int wgGemmTokTile(int64_t bucket_m);
// The configurations worth timing for an M bucket of (n, k) on `num_sms` SMs: CTAs between
// num_sms / 4 and 2 * num_sms, at least two K stages per split; returns how many were written.
int wgGemmCandidates(int64_t bucket_m, int64_t n, int64_t k, int num_sms, WgGemmConfig (&out)[8]);

// An sm_90 device and the tensor-map encoder are there.
bool wgGemmAvailable();
// Sets the kernels' shared-memory limits (once per process). Call outside stream capture
// (GemmRunner::create does); launchWgGemm calls it too.
Status prepareWgGemm();
// Enqueues the GEMM. Pointers 16-byte aligned. No allocation, no sync; capturable (the tensor
// maps are kernel parameters, encoded on the host per call).
Status launchWgGemm(const WgGemmArgs& a, cudaStream_t stream);
// Whether a pipeline wait gave up (a protocol bug: the launch then ends with wrong numbers
// instead of hanging); the tests read it.
Result<bool> wgGemmWatchdogFired();

}  // namespace garden::rose::cuda
