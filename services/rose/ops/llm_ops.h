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
// KV cache layout (per layer, see paged_kv_cache.h): K and V each
// [num_blocks, block_size, num_kv_heads, head_dim]; token slot = block_id * block_size + offset.
//
// Threads: as Backend (one launching thread).

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "services/rose/model/llm_step.h"
#include "services/rose/ops/backend.h"
#include "services/rose/ops/sampler.h"

namespace garden::rose {

// Packed qkv rows as Backend::qkNormRope uses them: [T, (Hq + 2·Hkv)·D], q heads, k heads, v heads.
struct RopeKvParams {
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t rotary_dim = 0;  // <= head_dim, even; pairs (i, i + rotary_dim/2) rotate (NeoX)
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
  // > 0: the call is part of a CUDA-graph body replayed for other plans of up to this many
  // single-token sequences (the step's counts are read on the device; fixed launch sizes).
  int32_t graph_seqs = 0;
};

// The host view of a step's queries, handed to planAttention() once per step before its
// pagedAttention calls (a backend may split the work from it; [TAG_PLAN_THEN_RUN]). Spans are
// read during the call only.
struct AttentionPlanInput {
  std::span<const int32_t> cu_q;       // [S + 1], as pagedAttention's cu_q
  std::span<const int32_t> positions;  // [T], as pagedAttention's positions
  std::span<const int32_t> windows;    // the sliding_window values this step's layers use
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
};

struct MoeRouteParams {
  int32_t top_k = 0;
  float norm_eps = 1e-5f;  // moeRouteF32: the folded RMSNorm's epsilon
};

// [TAG_MOE_LT_BF16] Whether one moeExperts call may take a backend's second path for
// prefill-sized MoE work (CUDA: bf16 cuBLASLt GEMMs over per-call dequantized MXFP4 experts).
//   kBySize: the backend decides by the call's size (its step threshold, if it has one);
//   kTake: the caller made this call one sequence's large chunk (moeChunkMinRowsPerExpert): take
//     the path where the backend has it;
//   kSkip: never.
enum class MoeLtChoice : uint8_t { kBySize = 0, kTake = 1, kSkip = 2 };

struct MoeExpertsParams {
  int32_t num_experts = 0;
  int32_t top_k = 0;
  int32_t hidden = 0;
  int32_t intermediate = 0;
  float swiglu_limit = 7.f;  // gate = min(gate, limit); up = clamp(up, -limit, limit)
  float swiglu_alpha = 1.702f;
  // Leave the weighted combine (`out`) to the next combineRmsNorm() [TAG_COMBINE_NORM]; needs
  // supportsCombineNorm(). `out` is then not written.
  bool defer_combine = false;
  MoeLtChoice lt = MoeLtChoice::kBySize;
};

// How the ops keep one expert projection W [E, rows (out), cols (in)] resident.
//   kDense: `dense` [E, rows, cols] in the backend's weight dtype.
//   kMxfp4: the checkpoint's MXFP4 codes and E8M0 scales, re-laid out by the ops that loaded
//           them (uploadMxfp4Experts); `codes` / `scales` are opaque U8 views of that layout.
enum class ExpertFormat : uint8_t { kDense = 0, kMxfp4 = 1 };
// A second resident copy of MXFP4 experts for the steps the ops choose (uploadMxfp4Experts).
enum class ExpertCopy : uint8_t { kNone = 0, kFp8 = 1, kBf16 = 2 };

struct ExpertWeights {
  ExpertFormat format = ExpertFormat::kDense;
  int64_t experts = 0, rows = 0, cols = 0;
  Tensor dense;
  Tensor codes, scales;
  uint32_t mx_max_scale = 255;  // kMxfp4: the largest E8M0 scale byte (the ops may use it)
  // kMxfp4 with an FP8 copy (uploadMxfp4Experts(..., ExpertCopy::kFp8)): e4m3 values and their block
  // scales in the ops' own layout (opaque U8 views), used by the steps the ops choose (CUDA:
  // prefill-sized ones); inexact / nonzero: weights the copy does not hold exactly / all
  // non-zero weights. Empty without a copy.
  Tensor fp8, fp8_scales;
  uint64_t fp8_inexact = 0, fp8_nonzero = 0;
  // kMxfp4 with a bf16 copy (ExpertCopy::kBf16) [TAG_MOE_BF16_COPY]: the exact weights dequantized
  // once at load, [E][rows][cols] bf16, which the CUDA ops' bf16 cuBLASLt prefill path reads
  // instead of dequantizing the experts per call. Empty without a copy.
  Tensor bf16_copy;
  std::vector<Buffer> storage;  // owns what the views point to (may be empty: borrowed views)
};

// Largest sizes a step will use, given once at load so the ops can size their workspaces. The
// router's calls use num_experts as given; a moeExperts call may take fewer experts and a smaller
// top_k (the sharded model's experts of one rank, its one-slot pairs).
struct LlmOpsLimits {
  int64_t max_tokens = 0;       // tokens per step
  int32_t max_seqs = 0;         // sequences per step
  int64_t max_logits_rows = 0;  // rows sampled / returned per step
  int64_t max_model_len = 0;
  int64_t vocab = 0;
  int32_t hidden = 0;
  int32_t intermediate = 0;
  int32_t num_experts = 0;
  int32_t top_k = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
};

// One row to sample from: logits row `row`, the sequence's params (params.state_slot >= 0: the
// sequence's sampler state, [TAG_LLM_SAMPLER_STATE]), the counter of its RNG stream (the
// absolute position of the token being drawn).
struct SampleRow {
  int32_t row = 0;
  uint64_t counter = 0;
  SamplingParams params;
  // Structured outputs [TAG_TOKEN_MASK]: host memory, ceil(V / 32) words, bit id % 32 of word
  // id / 32 set = allowed; only allowed ids are drawn (if every allowed logit is -inf or NaN:
  // the lowest allowed id). nullptr: no mask. Valid until the op has run.
  const uint32_t* mask = nullptr;
};

// A reload of sampler-state slot `slot` (< LlmOpsLimits.max_seqs) [TAG_LLM_SAMPLER_STATE]: its
// prompt tokens, generated tokens and logit_bias. Spans are read during the call only.
struct SamplerStateReset {
  int32_t slot = 0;
  std::span<const int32_t> prompt;
  std::span<const int32_t> output;
  std::span<const LogitBias> bias;
};

class LlmOps {
 public:
  virtual ~LlmOps() = default;

  // Graph support (backends with GraphExecutor): stageSample() copies the rows' parameters to
  // the device outside a captured body; sampleStaged() samples the first `num_rows` staged rows
  // (capturable: nothing but kernels). sample() is both. Backends without graphs keep the
  // defaults, which fail: the model only calls them when the backend has graphs.
  virtual void stageSample(std::span<const SampleRow> rows);
  virtual void sampleStaged(const Tensor& logits, int32_t num_rows, const Tensor& out_ids);

  // Sizes workspaces (load time, before any op). RESOURCE_EXHAUSTED when memory runs out.
  virtual Status reserve(const LlmOpsLimits& limits) { return okStatus(); }

  // Expert formats moeExperts() accepts.
  virtual bool supportsExpertFormat(ExpertFormat f) const { return f == ExpertFormat::kDense; }
  // Load time: MXFP4 experts as published (codes [E, rows, cols/32, 16], scales [E, rows,
  // cols/32], host memory) into this backend's resident kMxfp4 layout. UNIMPLEMENTED when the ops
  // do not support kMxfp4. copy: also keep an FP8 copy of the weights (kFp8: fields fp8*; only
  // where supportsFp8Experts()) or a bf16 one (kBf16: bf16_copy; only where
  // supportsBf16ExpertCopy()).
  virtual Result<ExpertWeights> uploadMxfp4Experts(const uint8_t* codes, const uint8_t* scales,
                                                   int64_t experts, int64_t rows, int64_t cols,
                                                   ExpertCopy copy = ExpertCopy::kNone) {
    return unimplemented("these LLM ops keep experts dense only");
  }
  // Whether uploadMxfp4Experts can add an FP8 copy that moeExperts uses.
  virtual bool supportsFp8Experts() const { return false; }
  // Whether uploadMxfp4Experts can add a bf16 copy that moeExperts uses.
  virtual bool supportsBf16ExpertCopy() const { return false; }

  // In place on qkv [T, (Hq + 2·Hkv)·D]: rotary embedding of the q and k heads with the position
  // of each token (positions I32 [T]; cos, sin F32 [max_pos, rotary_dim/2], any scaling such as
  // YaRN's folded in), then the rotated k heads and the v heads of row t go into slot
  // slot_mapping[t] (I32 [T]) of the layer's caches k_cache / v_cache [num_blocks, block_size,
  // Hkv, D]. Slots are distinct.
  virtual void ropeKvWrite(const Tensor& qkv, const Tensor& positions, const Tensor& cos,
                           const Tensor& sin, const Tensor& slot_mapping, const Tensor& k_cache,
                           const Tensor& v_cache, const RopeKvParams& p) = 0;
  // [TAG_PROJ_F32] The same with the unrotated q/k/v read from qkv_in (F32, qkv's shape: the QKV
  // projection kept in f32): every head of row t is written to qkv (16-bit) rounded once, q and
  // k rotated, and k, v go into the caches. The default fails (only the CUDA ops are asked: the
  // model takes the f32 projections with fp16 attention only).
  virtual void ropeKvWriteF32In(const Tensor& qkv_in, const Tensor& qkv, const Tensor& positions,
                                const Tensor& cos, const Tensor& sin, const Tensor& slot_mapping,
                                const Tensor& k_cache, const Tensor& v_cache,
                                const RopeKvParams& p);

  // Host planning for the step's attention (see AttentionPlanInput); no-op by default.
  virtual void planAttention(const AttentionPlanInput& in) {}

  // out [T, Hq·D]: attention of each query token over its sequence's cached keys. Sequence s
  // owns query rows [cu_q[s], cu_q[s+1]) (I32 [S+1]); positions I32 [T] is each query's absolute
  // position i (consecutive within a sequence); keys j = 0..i (sliding: i - W < j) are read
  // through block_tables I32 [S, max_blocks_per_seq] (key j lives in block
  // block_tables[s][j / block_size], offset j % block_size). sinks F32 [Hq] (may be empty): a
  // per-head logit that joins the softmax denominator only. q comes from the q heads of qkv.
  // A backend that plans (planAttention) requires the plan of this step to cover
  // p.sliding_window.
  virtual void pagedAttention(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                              const Tensor& cu_q, const Tensor& positions,
                              const Tensor& block_tables, const Tensor& sinks, const Tensor& out,
                              const PagedAttentionParams& p) = 0;

  // router_logits F32 [T, E] (+ bias [E], weight dtype, may be empty) → topk_ids I32 [T, k]
  // (largest first; ties: lower expert id first) and topk_weights F32 [T, k] = softmax over the
  // k selected logits only.
  virtual void moeRoute(const Tensor& router_logits, const Tensor& bias, const Tensor& topk_ids,
                        const Tensor& topk_weights, const MoeRouteParams& p) = 0;

  // The f32 router [TAG_ROUTER_F32]: moeRoute's selection on logits computed from the f32
  // residual stream with the RMSNorm before the router folded into the weights:
  //   logits[t, e] = rsqrt(mean_k(residual[t, k]²) + p.norm_eps) · Σ_k residual[t, k] · wt[k, e]
  // residual F32 [T, H]; wt F32 [H, E] = (router[e, k] · norm_weight[k])ᵀ — or, for ops whose
  // routerF32Split() is true, that wt split into exact bf16 halves, BF16 [2, Ep, Hp]
  // (router_split.h routerSplitWeights) [TAG_ROUTER_MMA]; bias as moeRoute's.
  // A model whose residual stream is wider than its activations (gpt-oss on CUDA: f32 stream,
  // bf16 activations) routes with this instead of a router GEMM on the bf16 normalized row. The
  // default fails (ops without it are never given such a model).
  virtual void moeRouteF32(const Tensor& residual, const Tensor& wt, const Tensor& bias,
                           const Tensor& topk_ids, const Tensor& topk_weights,
                           const MoeRouteParams& p);
  // Whether moeRouteF32 wants its weights as the bf16 split (read when a model uploads them).
  virtual bool routerF32Split() const { return false; }

  // out [T, H] = Σ_k w[t,k] · (W2[e] · a + b2[e]), e = ids[t,k], with h = W1[e] · x[t] + b1[e],
  // gate = h[0::2], up = h[1::2] (interleaved rows), a = min(gate, L) · sigmoid(α · min(gate, L))
  // · (clamp(up, −L, L) + 1). x [T, H]; w1 [E, 2I, H]; b1 [E, 2I]; w2 [E, H, I]; b2 [E, H]
  // (biases weight dtype, may be empty). out must not alias x.
  virtual void moeExperts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                          const ExpertWeights& w1, const Tensor& b1, const ExpertWeights& w2,
                          const Tensor& b2, const Tensor& out, const MoeExpertsParams& p) = 0;

  // [TAG_COMBINE_NORM] The deferred combine of the last moeExperts(defer_combine) fused into the
  // next RMSNorm: moe = the combine (rounded as moeExperts' out), residual += moe, out =
  // rmsNorm(residual) * weight — the bits of moeExperts then Backend::rmsNorm(moe, residual,
  // weight, out, p), with one kernel instead of two and no moe tensor. residual [T, H] (the
  // backend's rmsNorm residual dtypes), p.residual_init false. The default fails (ops without
  // supportsCombineNorm() are never asked).
  virtual bool supportsCombineNorm() const { return false; }
  // [TAG_MOE_LT_BF16] > 0: the ops want each layer's MoE work split by sequence chunk — every
  // chunk of at least this many rows per expert on average (tokens x top_k >= this x experts) as
  // its own moeExperts call with MoeLtChoice::kTake, the other rows (in runs of adjacent
  // sequences) with kSkip, none deferring its combine. 0: one call per layer.
  virtual int64_t moeChunkMinRowsPerExpert() const { return 0; }
  // [TAG_MOE_PREFILL_AUTO] With a chunk floor: whether a whole step may be one run instead (the
  // large-call path gives every row the bits the small-call path would): the model then makes
  // the step one call, large when it has the floor's rows per expert.
  virtual bool moeWholeStep() const { return false; }
  virtual void combineRmsNorm(const Tensor& residual, const Tensor& weight, const Tensor& out,
                              const RmsNormParams& p);

  // out[r, :] = in[rows[r], :]; rows I32 [R].
  virtual void gatherRows(const Tensor& in, const Tensor& rows, const Tensor& out) = 0;

  // ids[pairs[i][0]] = src[pairs[i][1]] for every row i of pairs I32 [P, 2]; src, ids I32.
  // Two steps in flight [TAG_LLM_PREV_TOKEN]: src is the previous step's sampled ids.
  virtual void copyTokens(const Tensor& src, const Tensor& pairs, const Tensor& ids) = 0;

  // out_ids I32 [rows.size()]: one token per SampleRow from logits F32 [R, V]. Greedy
  // (temperature 0) is the argmax with the lowest id among equal maxima on every backend. With
  // temperature > 0 each backend draws from the same distribution ([TAG_SAMPLER_ORDER]: bias →
  // penalties → token mask → temperature → min-p → top-k → top-p, sampler.h) with its own procedure,
  // deterministic in (seed, counter, state): the CPU one is sampler.h's; the CUDA one is in
  // ops/cuda/sample.cuh. A row with a state slot adds its drawn token to the slot.
  // out_logprobs (U8 [rows.size() * sizeof(llm::LlmTokenLogprobs)], may be empty when no row has
  // params.logprobs >= 0): one llm::LlmTokenLogprobs per row (num_top -1 where not asked).
  // `rows` must stay valid until the op has run. Penalties, logit_bias, min_p and logprobs need
  // supportsSamplerState(); SampleRow.mask needs supportsTokenMask().
  virtual void sample(const Tensor& logits, std::span<const SampleRow> rows,
                      const Tensor& out_ids, const Tensor& out_logprobs) = 0;
  void sample(const Tensor& logits, std::span<const SampleRow> rows, const Tensor& out_ids) {
    sample(logits, rows, out_ids, Tensor());
  }

  // Whether sample() implements state slots, penalties, logit_bias, min_p and logprobs.
  virtual bool supportsSamplerState() const { return false; }
  // Whether sample() / stageSample() honour SampleRow.mask [TAG_TOKEN_MASK].
  virtual bool supportsTokenMask() const { return false; }
  // Whether the masks may come late [TAG_LATE_MASKS]: sampling (stageSample() + sampleStaged()
  // on a graph decode) runs after the forward pass, outside its graph, once the model's host
  // thread has them (GptOssModel::enqueueStep). The ops need nothing new for it; a backend
  // announces it once its tests have run it.
  virtual bool supportsLateMask() const { return supportsTokenMask(); }
  // Reloads sampler-state slots, in order with the other ops (before a sample() that reads them).
  virtual void resetSamplerState(std::span<const SamplerStateReset> resets) {}
};

// The LlmOps implementation for `backend` (by backend.name()): "cpu" → the fp32 reference,
// "cuda" → ops/cuda/llm_ops_cuda.h (builds with CUDA). threads: CPU worker threads (0 = hardware
// concurrency).
Result<std::unique_ptr<LlmOps>> makeLlmOps(Backend& backend, int32_t threads = 0);
#if defined(GARDEN_HAVE_CUDA) && GARDEN_HAVE_CUDA
Result<std::unique_ptr<LlmOps>> makeCudaLlmOps(Backend& backend);  // llm_ops_cuda.cc
#endif

}  // namespace garden::rose
