#pragma once
// The LLM extension of rose's op interface (services/rose/ops/backend.h): what a decoder with a
// paged KV cache and mixture-of-experts layers (gpt-oss) needs beyond Backend. An LlmOps is bound
// to one Backend and enqueues on that backend's queue, in order with its ops: the same
// [TAG_ROSE_LAZY] contract (called inside Backend::launch() on the compute thread, or directly
// from the launching thread with the work of earlier launches finished first). Tensors are
// Backend tensors; counts come from the params (host values); inconsistent views CHECK-fail.
//
// Implementations: "cpu" (services/rose/ops/cpu/llm_ops_cpu.*, fp32, the reference) and "cuda"
// (services/rose/ops/cuda/).
//
// KV cache layout (per layer, see kv/paged_kv_cache.h): K and V each
// [num_blocks, block_size, num_kv_heads, head_dim]; token slot = block_id * block_size + offset.
//
// Threads: as Backend (one launching thread).

#include <cstdint>
#include <memory>
#include <span>

#include "common/status.h"
#include "services/rose/model/llm_step.h"
#include "services/rose/ops/backend.h"

namespace garden::rose {

// Packed qkv rows as Backend::qkNormRope uses them: [T, (Hq + 2·Hkv)·D], q heads, k heads, v heads.
struct KvWriteParams {
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
};

struct PagedAttentionParams {
  int32_t num_seqs = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;  // divides num_q_heads; q head h reads kv head h / (Hq / Hkv)
  int32_t head_dim = 0;
  int32_t block_size = 0;
  int32_t max_blocks_per_seq = 0;  // row stride of block_tables
  int32_t max_context = 0;         // host-known longest (position + 1) of any query (planning)
  int32_t sliding_window = 0;      // 0: full causal; W > 0: keys j with i - W < j <= i
  float scale = 0.f;               // logit scale (1/sqrt(head_dim)); the sink is not scaled
};

struct MoeRouteParams {
  int32_t top_k = 0;
};

struct MoeExpertsParams {
  int32_t num_experts = 0;
  int32_t top_k = 0;
  int32_t hidden = 0;
  int32_t intermediate = 0;
  float swiglu_limit = 7.f;  // gate = min(gate, limit); up = clamp(up, -limit, limit)
  float swiglu_alpha = 1.702f;
};

// One row to sample from: logits row `row`, the sequence's params, the counter of its RNG
// stream (the absolute position of the token being drawn).
struct SampleRow {
  int32_t row = 0;
  uint64_t counter = 0;
  SamplingParams params;
};

class LlmOps {
 public:
  virtual ~LlmOps() = default;

  // Writes the k and v heads of each qkv row t into slot slot_mapping[t] (I32 [T]) of the
  // layer's caches k_cache / v_cache [num_blocks, block_size, Hkv, D]. Slots are distinct.
  virtual void kvWrite(const Tensor& qkv, const Tensor& slot_mapping, const Tensor& k_cache,
                       const Tensor& v_cache, const KvWriteParams& p) = 0;

  // out [T, Hq·D]: attention of each query token over its sequence's cached keys. Sequence s
  // owns query rows [cu_q[s], cu_q[s+1]) (I32 [S+1]); positions I32 [T] is each query's absolute
  // position i; keys j = 0..i (sliding: i - W < j) are read through block_tables I32
  // [S, max_blocks_per_seq] (key j lives in block block_tables[s][j / block_size], offset
  // j % block_size). sinks F32 [Hq] (may be empty): a per-head logit that joins the softmax
  // denominator only. q comes from the q heads of qkv (packed as in KvWriteParams).
  virtual void pagedAttention(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                              const Tensor& cu_q, const Tensor& positions,
                              const Tensor& block_tables, const Tensor& sinks, const Tensor& out,
                              const PagedAttentionParams& p) = 0;

  // router_logits [T, E] → topk_ids I32 [T, k] (largest first; ties: lower expert id first) and
  // topk_weights F32 [T, k] = softmax over the k selected logits only.
  virtual void moeRoute(const Tensor& router_logits, const Tensor& topk_ids,
                        const Tensor& topk_weights, const MoeRouteParams& p) = 0;

  // out [T, H] = Σ_k w[t,k] · (W2[e] · a + b2[e]), e = ids[t,k], with h = W1[e] · x[t] + b1[e],
  // gate = h[0::2], up = h[1::2] (interleaved rows), a = min(gate, L) · sigmoid(α · min(gate, L))
  // · (clamp(up, −L, L) + 1). x [T, H]; w1 [E, 2I, H]; b1 [E, 2I]; w2 [E, H, I]; b2 [E, H] (weight
  // dtype; biases may be empty). out must not alias x.
  virtual void moeExperts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                          const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2,
                          const Tensor& out, const MoeExpertsParams& p) = 0;

  // out[r, :] = in[rows[r], :]; rows I32 [R].
  virtual void gatherRows(const Tensor& in, const Tensor& rows, const Tensor& out) = 0;

  // out_ids I32 [rows.size()]: one token per SampleRow from logits F32 [R, V] (see
  // services/rose/ops/sampler.h for the exact procedure). `rows` must stay valid until the op has
  // run.
  virtual void sample(const Tensor& logits, std::span<const SampleRow> rows,
                      const Tensor& out_ids) = 0;
};

// The LlmOps implementation for `backend` (by backend.name()): "cpu" → the fp32 reference;
// others UNIMPLEMENTED. threads: CPU worker threads (0 = hardware concurrency).
Result<std::unique_ptr<LlmOps>> makeLlmOps(Backend& backend, int32_t threads = 0);

}  // namespace garden::rose
