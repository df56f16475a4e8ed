#pragma once
// The Hopper (sm_90a) kernel for gpt-oss prefill attention [TAG_PAGED_ATTN_SM90]: the query
// tokens of long chunks (planPagedAttention's `sm90` items, 192 query rows of one sequence each)
// attend to their sequence's keys in the paged KV cache with wgmma and bulk tensor copies, as
// attention_sm90.cu does for the embedding path (head_dim 64 here, learned sinks, sliding
// window, chunks with history). The mma.sync kernel (paged_attention.cu) keeps decode tokens and
// short chunks; launchPagedAttention runs both in one call, on disjoint output rows. Results
// agree with the mma.sync kernel within bf16 rounding, not bit for bit (other tiles and
// accumulation order); which kernel a sequence takes depends only on its own chunk length.
// Design notes in paged_attention_sm90.cu.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"
#include "services/rose/ops/cuda/paged_attention.cuh"

namespace garden::rose::cuda {

// Chunks of at least this many query tokens take the Hopper kernel (0: none).
inline constexpr int32_t kPagedAttnSm90DefaultMinTokens = 128;
// Process-global, set before a model runs (rose --attn-prefill, rose_llm_bench): the chunk
// length from which planPagedAttention's callers hand a sequence to the Hopper kernel (0 = never),
// whether it pipelines the softmax with the matrix products (false: one after the other), the
// K/V ring's depth (2 or 4 tiles), and whether sliding-window layers take it too (default no:
// at gpt-oss's window of 128 the mma.sync kernel's 64-key tiles waste less, 0.40 vs 0.67 ms for
// a 16k chunk on the H200, 2026-12-04; tests turn it on to check the window path).
// consumers: 3 (the default) or 2 consumer warpgroups per block (192 or 128 query rows per work
// item); a 4-tile ring exists for 2 consumers only.
void setPagedAttnSm90(int32_t min_tokens, bool pipelined, int32_t stages = 2,
                      bool windows = false, int32_t consumers = 3);
// Query rows per work item of the current setting (planPagedAttention's sm90_rows).
int32_t pagedAttnSm90Rows();
// The threshold for a launch with this sliding_window (0: full causal).
int32_t pagedAttnSm90MinTokens(int32_t sliding_window = 0);

// Whether the kernel can run on the current device with this cache layout: head_dim 64, a block
// size that divides 128 or is a multiple of it (>= 8), compute capability 9.0.
bool pagedAttnSm90Supports(int32_t block_size, int32_t head_dim);

// Launches the kernel over a.sm90_work[0 .. a.num_sm90_work) (nothing when empty).
Status launchPagedAttentionSm90(const PagedAttentionArgs& a, cudaStream_t stream);

// Whether a launch since the last call gave up waiting on an mbarrier (a pipeline protocol bug,
// reported instead of a hang; that launch's output is wrong). Synchronous; resets the flag.
Result<bool> pagedAttnSm90WatchdogFired();

}  // namespace garden::rose::cuda
