#pragma once
// Per-sequence pooling of the final hidden states (last token, mean, or first/CLS token) with
// optional L2 normalization (x / max(||x||, 1e-12), like torch.nn.functional.normalize), written
// as float32 rows. One block or one cluster of blocks per sequence (PoolVariant); the launch shape
// per sequence depends only on `hidden`, so a sequence's result does not depend on its batch.
// A zero-length sequence yields a zero row. Pointers are device memory owned by the caller.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

enum class PoolKind : int32_t { kLast = 1, kMean = 2, kCls = 3 };

struct PoolArgs {
  const __nv_bfloat16* hidden = nullptr;  // [num_tokens, hidden_size]
  const int32_t* cu_seqlens = nullptr;    // [num_seqs + 1]
  float* out = nullptr;                   // [num_seqs, hidden_size]
  int32_t num_seqs = 0;
  int64_t hidden_size = 0;  // multiple of 8, at most 8192; hidden 16-byte aligned
  PoolKind kind = PoolKind::kLast;
  bool normalize = true;
};

// The variants a pooling launch can run, named by their schedule. Both are batch-invariant;
// their mean results differ only by float summation order.
//   kBlockPerSequence:   one block per sequence (last/CLS read one row; mean sums token stripes
//                        in shared memory);
//   kClusterPerSequence: mean only: a cluster of 8 blocks per sequence (distributed shared memory
//                        for the final sum, 4 token rows of 16-byte loads in flight per thread),
//                        at most 65535 sequences (the grid's y dimension).
enum class PoolVariant : int32_t { kBlockPerSequence = 1, kClusterPerSequence = 2 };

// The variant launchPool runs — kClusterPerSequence for mean pooling when it can run it,
// kBlockPerSequence otherwise — or why `a` cannot be pooled (INVALID_ARGUMENT naming the field).
// Pure: reads the shapes, kind and pointer alignment of `a`, never device memory.
Result<PoolVariant> selectPoolVariant(const PoolArgs& a);
// OK when variant `v` can run `a` (the checks both share, then kClusterPerSequence's limits).
Status checkPoolVariant(const PoolArgs& a, PoolVariant v);
// A batch without sequences launches nothing.
Status launchPool(const PoolArgs& a, cudaStream_t stream);
// Runs variant `v` (tests, benchmarks); errors as checkPoolVariant.
Status launchPoolVariant(const PoolArgs& a, cudaStream_t stream, PoolVariant v);

// Scores from each sequence's last token: z = h.W[pos_row] - (neg_row >= 0 ? h.W[neg_row] : 0),
// out = sigmoid(z) when apply_sigmoid. One warp per sequence, f32 dot products.
struct ScoreArgs {
  const __nv_bfloat16* hidden = nullptr;  // [num_tokens, hidden_size]
  const int32_t* cu_seqlens = nullptr;    // [num_seqs + 1]
  const __nv_bfloat16* head = nullptr;    // [rows, hidden_size]
  float* out = nullptr;                   // [num_seqs]
  int32_t num_seqs = 0;
  int64_t hidden_size = 0;  // multiple of 8
  int32_t pos_row = 0;
  int32_t neg_row = -1;
  bool apply_sigmoid = true;
};

Status launchScore(const ScoreArgs& a, cudaStream_t stream);

}  // namespace garden::rose::cuda
