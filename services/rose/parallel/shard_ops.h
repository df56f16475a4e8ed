#pragma once
// The few ops the sharded gpt-oss needs beyond Backend and LlmOps (docs/multi-gpu.md), bound to
// one Backend and enqueued on its queue like LlmOps ([TAG_ROSE_LAZY]). Kept apart from LlmOps so
// the single-GPU model and its ops do not change.
//
// Implementations: "cpu" (shard_ops_cpu.cc, host memory, the reference) and "cuda"
// (parallel/cuda/shard_ops_cuda.cu, when the build has CUDA).
//
// Threads: as Backend (one launching thread).

#include <cstdint>
#include <memory>
#include <span>

#include "common/status.h"
#include "services/rose/ops/backend.h"

namespace garden::rose {

class ShardOps {
 public:
  virtual ~ShardOps() = default;

  // Vocabulary-split embedding: out[t] = table[ids[t] − vocab_begin] when that row is in this
  // shard (0 <= ids[t] − vocab_begin < rows(table)), else zeros. table [Vr, H] weight dtype,
  // ids I32 [T], out [T, H]. The ranks' outputs all-reduced give the full embedding.
  virtual void embeddingSlice(const Tensor& table, const Tensor& ids, int64_t vocab_begin,
                              const Tensor& out) = 0;

  // out [R, H] = 0, then out[rows[p]] += in[p] for p = 0, 1, ... in that order (deterministic
  // summation order; on a 16-bit out the sum is kept in f32 and rounded once). in [P, H], rows
  // I32 [P] with values in [0, R). `host_rows`: the same P values in host memory (the caller
  // computed them there; a device implementation plans the sum from them without a
  // synchronization). Expert combine.
  virtual void combineRows(const Tensor& in, const Tensor& rows,
                           std::span<const int32_t> host_rows, const Tensor& out) = 0;

  // in: parts stacked rank-major, part i = [R, cols[i]] (row-major, contiguous); out [R, Σ cols]
  // with part i in columns [Σ_{j<i} cols[j], ...). Gathered vocabulary slices of the logits.
  virtual void concatColumns(const Tensor& in, std::span<const int64_t> cols,
                             const Tensor& out) = 0;
};

// "cpu" → the reference; "cuda" (builds with CUDA) → the kernels; others: UNIMPLEMENTED.
Result<std::unique_ptr<ShardOps>> makeShardOps(Backend& backend);

#if defined(GARDEN_HAVE_CUDA) && GARDEN_HAVE_CUDA
Result<std::unique_ptr<ShardOps>> makeCudaShardOps(Backend& backend);  // shard_ops_cuda.cu
#endif

}  // namespace garden::rose
