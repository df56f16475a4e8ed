#pragma once
// Paged attention for gpt-oss (prefill chunks and decode in one launch): each query token of a
// sequence attends to its sequence's cached keys through the block table, causal, optionally
// restricted to a sliding window, with a per-head sink logit that joins the softmax denominator
// only (no value). GQA: the q heads of one kv head are packed as rows of one tile, so a K/V tile
// in shared memory serves every q head of the group (for gpt-oss 8 heads x 8 tokens = 64 rows per
// block). FlashAttention-2 schedule: K/V tiles of 64 keys stream through shared memory
// (cp.async, double-buffered, gathered through the block table), online softmax in f32
// (exp2 domain), both products on tensor cores (mma.sync m16n8k16 bf16, f32 accumulation).
//
// Plan, then run [TAG_PLAN_THEN_RUN]: the host turns the step's query layout (cu_q, positions)
// into work items (planPagedAttention) — one per (sequence, tile of query tokens), or, for a
// single-token (decode) sequence whose key range is long, one per chunk of keys (split-KV) whose
// partial results combine in a second kernel. The split decision depends only on the sequence's
// own position and window, never on the rest of the batch, so a token's result does not depend
// on what it is batched with.
//
// Pointers are device memory owned by the caller.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace garden::rose::cuda {

// One block's work: query tokens [tok0, tok0 + tokens-per-block) of sequence `seq` (clipped to
// the sequence), keys [key_begin, key_end) of it; part >= 0: write un-normalized partial results
// to partial slot `part` (split-KV, single-token sequences only) instead of `out`.
struct PagedAttnWork {
  int32_t seq = 0;
  int32_t tok0 = 0;
  int32_t key_begin = 0;
  int32_t key_end = 0;
  int32_t part = -1;
  // 1: the item's sequence has one query token in the step (a decode token, split or not): the
  // kernel may run it on the single-token path [TAG_ATTN_DECODE_WARPS].
  int32_t single = 0;
  int32_t pad[2] = {0, 0};
};
static_assert(sizeof(PagedAttnWork) == 32);

// The partial results of one split token: rows (token row in the step) whose q heads combine
// num_parts partials starting at part_begin.
struct PagedAttnCombine {
  int32_t row = 0;
  int32_t part_begin = 0;
  int32_t num_parts = 0;
  int32_t pad = 0;
};

struct PagedAttnPlan {
  std::vector<PagedAttnWork> work;
  std::vector<PagedAttnCombine> combine;
  int32_t num_parts = 0;
  // Items of the Hopper kernel (paged_attention_sm90.cuh): sm90_rows query tokens [tok0, tok0 + rows)
  // of one sequence's chunk (clipped to it), keys [key_begin, key_end) — everything its rows can
  // see — most keys first (the longest blocks start first).
  std::vector<PagedAttnWork> sm90;
};

// A decode token that sees `keys` keys splits them into chunks of at least
// pagedAttnSplitKeysFor(keys) keys, at most kPagedAttnMaxSplits chunks: kPagedAttnSplitKeys, or
// kPagedAttnSplitKeysLong from kPagedAttnLongContext keys on (more, shorter chunks where one
// sequence's chunks are all the work of a step; measured on the H200, 2026-12-03: decode b1@8k
// 3.072 -> 3.033 ms with 256-key chunks, while b64@1k lost 1.5 % with them). The rule reads
// only the token's own key count, so a sequence's attention does not depend on its batch.
inline constexpr int32_t kPagedAttnSplitKeys = 512;
inline constexpr int32_t kPagedAttnSplitKeysLong = 256;
inline constexpr int32_t kPagedAttnLongContext = 4096;
inline constexpr int32_t kPagedAttnMaxSplits = 32;
int32_t pagedAttnSplitKeysFor(int32_t keys);
// [TAG_ATTN_DECODE_WARPS] Single-token items (decode) on the path whose four warps each take
// every fourth key tile at once, merged in warp order (GQA group 8, gpt-oss's; other groups keep
// the one-warp path), instead of one warp
// streaming the item's tiles through two shared stages. Off by default: measured slower at
// batch 1 (H200, 2026-12-06: b1@8k 2.635 / 2.570 ms against 2.515 / 2.483; b8 and b64 within
// noise; docs/gpt-oss-cuda.md). Process-global, for A/B runs (rose_llm_bench
// --attn-decode-warps), set before a model is loaded: it changes the f32 rounding of a decode
// token's attention, never which keys it sees, and depends on nothing but the token's own key
// range.
inline constexpr bool kPagedAttnDecodeWarpsDefault = false;
void setPagedAttnDecodeWarps(bool on);
// A fixed minimum chunk for every token instead (a multiple of 64, >= 64; 0: the rule above),
// process-global: benchmarks only (rose_llm_bench --attn-split-keys), set before a model is
// loaded. It changes how a decode token's keys are partitioned (f32 rounding of the combine),
// never which keys it sees.
void setPagedAttnSplitKeys(int32_t keys);
// Whether planPagedAttention can split some decode token of a launch with this sliding_window
// (0 = full causal: yes) under the current rule: a window no longer than every chunk never
// splits, so a graph launch of such a layer needs no combine kernel and one work item per
// sequence (the gpt-oss sliding layers, window 128).
bool pagedAttnWindowCanSplit(int32_t sliding_window);

// Query tokens one block takes for a GQA group of `group` q heads per kv head (64 rows).
int32_t pagedAttnTokensPerBlock(int32_t group);

// The work of one launch (one sliding_window value; 0 = full causal) for the step's queries.
// cu_q [num_seqs + 1] and positions [T] as given to the kernel (host copies). sm90_min_tokens >
// 0: a sequence with at least that many query tokens at consecutive positions goes to the Hopper
// kernel (plan.sm90) instead of the mma.sync one; the choice reads only the sequence itself.
// sm90_rows: query tokens per Hopper work item (pagedAttnSm90Rows(): 128 or 192).
PagedAttnPlan planPagedAttention(const int32_t* cu_q, int32_t num_seqs, const int32_t* positions,
                                 int32_t group, int32_t sliding_window,
                                 int32_t sm90_min_tokens = 0, int32_t sm90_rows = 128);

struct PagedAttentionArgs {
  const __nv_bfloat16* qkv = nullptr;      // [T, (Hq + 2*Hkv) * head_dim]
  const __nv_bfloat16* k_cache = nullptr;  // [num_blocks * block_size, Hkv, head_dim]
  const __nv_bfloat16* v_cache = nullptr;
  const int32_t* cu_q = nullptr;           // [S + 1]
  const int32_t* positions = nullptr;      // [T]
  const int32_t* block_tables = nullptr;   // [S, max_blocks]
  const float* sinks = nullptr;            // [Hq] or null
  const PagedAttnWork* work = nullptr;     // [num_work]
  const PagedAttnCombine* combine = nullptr;  // [num_combine]
  __nv_bfloat16* out = nullptr;            // [T, Hq * head_dim]
  float* part_o = nullptr;                 // [num_parts, Hq, head_dim] (split-KV workspace)
  float* part_ml = nullptr;                // [num_parts, Hq, 2]: running max (log2 units), sum
  int32_t num_work = 0;
  int32_t num_combine = 0;
  // Some item of work has `single` set (graph launches: always, they run decode steps): the work
  // kernel gets the single-token path and its shared memory [TAG_ATTN_DECODE_WARPS].
  bool has_single = false;
  // The Hopper kernel's items (paged_attention_sm90.cuh; eager launches only) and the rows of
  // qkv (its tensor map's extent).
  const PagedAttnWork* sm90_work = nullptr;
  int32_t num_sm90_work = 0;
  int64_t num_tokens = 0;
  // Graph launches (captured once, replayed with other plans): counts [2] = {num_work,
  // num_combine} read on the device, and fixed grids of grid_work / grid_combine blocks that loop
  // over them. Null: grids of exactly num_work / num_combine.
  const int32_t* counts = nullptr;
  int32_t grid_work = 0;
  int32_t grid_combine = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;  // 64
  int32_t block_size = 0;
  int32_t max_blocks = 0;
  int32_t num_blocks = 0;      // of the cache (block ids outside are never read)
  int32_t sliding_window = 0;  // 0: full causal
  float scale = 0.f;           // logit scale (the sink is not scaled)
  // [TAG_ATTN_F16] qkv, the caches and out hold IEEE fp16 (__half) bits instead of bf16: both
  // products on fp16 tensor cores (P rounded to fp16), the rest as with bf16.
  bool f16 = false;
  // [TAG_PDL_GRAPH] The mma.sync work and combine kernels launched programmatically (common.cuh
  // launchPdlAlways), in CUDA graphs too: each waits for the previous kernel in its first
  // statement (CudaKernelOptions::pdl_graph). The Hopper kernel always launches plainly.
  bool pdl = false;
};

// INVALID_ARGUMENT naming what the kernels do not support (head_dim != 64, a GQA group that is
// not a power of two <= 64, ...). The launcher shares it.
Status checkPagedAttention(const PagedAttentionArgs& a);
// The attention kernel, then (num_combine > 0) the combine kernel, then (num_sm90_work > 0) the
// Hopper kernel for the long chunks.
Status launchPagedAttention(const PagedAttentionArgs& a, cudaStream_t stream);
// Sets the work kernels' shared memory attributes (load time: LlmOps reserve), so that a launch
// being captured into a graph makes no attribute call [TAG_ATTN_DECODE_WARPS].
Status preparePagedAttention();
// The gpt-oss (GQA 8) work and combine kernels' preferred shared-memory carveout (percent; -1 the
// driver's choice): A/B runs only (rose_llm_bench --attn-carveout, with setRopeKvCarveout).
Status setPagedAttnCarveout(int percent);

}  // namespace garden::rose::cuda
