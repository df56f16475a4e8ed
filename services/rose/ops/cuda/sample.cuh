#pragma once
// Token sampling on the GPU, one block per sampled row of f32 logits [R, V]:
//   temperature 0: the argmax, lowest id among equal maxima, NaN never wins (all NaN: id 0),
//     reduced over kSampleGreedySlices blocks per row then one warp —
//     the same token the CPU sampler (services/rose/ops/sampler.h) picks;
//   temperature > 0: z = logits / T; top_k > 0 keeps the k largest (exactly k: ties at the
//     threshold go to the lower ids, as the CPU's stable order); min_p > 0 keeps those with
//     double(z) >= double(z_max) + log(min_p) (the CPU's test); top_p < 1 then keeps the
//     largest z whose softmax mass (over the kept set) reaches top_p — the whole tie group at
//     the threshold is kept (the CPU may keep part of it); then one draw by the Gumbel-max
//     trick: argmax over kept i of z_i + G_i, G_i = −log(−log(u_i)), u_i uniform from
//     (seed, counter, i) by the CPU sampler's SplitMix64 mix. That samples exactly the
//     renormalized softmax over the kept set, deterministic in (seed, counter) and independent
//     of the batch. It is not the CPU's draw (which inverts the cumulative mass in sorted order):
//     the two backends agree in distribution, not token for token.
// Thresholds are found by bisection over the order-preserving integer image of the floats
// (32 counting passes over the row in the worst case), so nothing is sorted.
// A row may carry a token bitmask (SampleRowDev.mask): masked ids never win.
// Pointers are device memory owned by the caller.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

struct SampleRowDev {
  int32_t row = 0;      // logits row
  float temperature = 0.f;
  float top_p = 1.f;
  int32_t top_k = 0;
  uint64_t seed = 0;
  uint64_t counter = 0;
  float min_p = 0.f;  // 0 = off
  int32_t mask = -1;  // [TAG_TOKEN_MASK] >= 0: row of SampleArgs.masks restricting the draw
};
static_assert(sizeof(SampleRowDev) == 40);

// Greedy rows are reduced by kSampleGreedySlices blocks each (a row is 0.8 MB of logits for
// o200k: one block alone reads it at a fraction of the bandwidth), then one warp per row.
inline constexpr int kSampleGreedySlices = 32;

struct SampleArgs {
  const float* logits = nullptr;      // [R, V]
  const SampleRowDev* rows = nullptr;  // [num_rows]
  int32_t* out = nullptr;             // [num_rows]
  void* partial = nullptr;            // workspace: sampleWorkspaceBytes(num_rows)
  int32_t num_rows = 0;
  int64_t vocab = 0;
  // Structured outputs [TAG_TOKEN_MASK]: token bitmasks [*, mask_words] (bit i % 32 of word
  // i / 32 set = allowed). A row with mask >= 0 draws only allowed ids (greedy: the argmax over
  // them; all allowed logits -inf/NaN: the lowest allowed id), as the CPU sampler does.
  const uint32_t* masks = nullptr;
  int64_t mask_words = 0;
};

size_t sampleWorkspaceBytes(int64_t num_rows);

Status launchSample(const SampleArgs& a, cudaStream_t stream);

}  // namespace garden::rose::cuda
